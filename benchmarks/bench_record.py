"""What ``batchbench record`` adds to time to first token, and its CPU per request.

Run from the repository root: ``python -m benchmarks.bench_record [--agents A]
[--turns T] [--tool-latency-ms D] [--warmup S] [--repeat N]``.

One zero-latency simulator (``batchbench sim --speed 0``) and one recording proxy in front
of it (``batchbench record --upstream <sim>``) run for the whole benchmark. Each round the
real ``batchbench agent`` runs the same kind of workload twice, once straight to the
simulator and once through the proxy, in alternating order, each run with prompts of its
own: A agents at once (64 by default), each a streamed conversation of T requests that
starts at 1,024 prompt tokens and grows by every reply, tool call and tool result (64
output tokens a request), with log-normal tool time between requests (median D ms, sigma
0.5, so that the agents drift apart instead of all asking at once). Requests sent in the
first S seconds (when every agent sends its first, longest new prompt at the same moment)
are left out of the measured window. Compared side by side:

* TTFT p50 and p99 of the measured window (``--results-json``), direct and through the
  proxy, and what the proxy adds: the median of the rounds' differences;
* the proxy's CPU (user + system of its process and threads, from ``/proc/<pid>/stat``)
  per request it forwarded and recorded.

Every figure is the median of N rounds. The client, the simulator and the proxy share the
machine's cores, so the proxy's CPU shows in the client's latency as it would on a loaded
host: a p99 is set by moments when several requests arrive together and queue for it.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from batchbench.drive.simlaunch import SimProcess, sim_command

LISTENING = "batchbench record listening on "
TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User plus system CPU of a live process (fields 14 and 15 of /proc/<pid>/stat; the
    command name, which may hold spaces, ends at the last parenthesis)."""
    with open(f"/proc/{pid}/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS_PER_SECOND


def start_proxy(upstream: str, rows: Path) -> tuple[subprocess.Popen[str], str]:
    """The proxy in a child process and the URL its first line gives."""
    command = [
        sys.executable, "-m", "batchbench", "record", "--upstream", upstream,
        "--listen", "127.0.0.1:0", "--rows-jsonl", str(rows),
    ]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line.startswith(LISTENING):
        process.kill()
        raise SystemExit(f"batchbench record did not start: {line!r}")
    return process, line[len(LISTENING) :].strip()


def run(host: str, args: argparse.Namespace, seed: int, work: Path) -> dict[str, float]:
    """One agent run against ``host``: TTFT p50 and p99 of the measured window (ms), the
    requests sent and the peak of requests in flight."""
    results = work / "results.json"
    command = [
        sys.executable, "-m", "batchbench", "agent", "--host", host,
        "--model", "batchbench-sim", "--tokenizer-model", "deepseek-v3", "--no-preflight",
        "--stream", "--agents", str(args.agents), "--max-active-agents", str(args.agents),
        "--tool-invocations", str(args.turns), "--input-tokens", "1024",
        "--output-tokens", "64", "--warmup", str(args.warmup),
        "--tool-call-latency-lognorm-median-ms", str(args.tool_latency_ms),
        "--tool-call-latency-lognorm-sigma", "0.5",
        "--seed", str(seed), "--no-progress", "--results-json", str(results),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"run failed ({done.returncode}): {done.stderr.strip()[-500:]}")
    document = json.loads(results.read_text())
    ttft = document["window"]["latency"]["ttft_ms"]["percentiles"]
    return {
        "p50": ttft["p50"],
        "p99": ttft["p99"],
        "requests": document["metrics"]["successful_requests"],
        "in flight": document["client_health"]["peak_in_flight"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=64)
    parser.add_argument("--turns", type=int, default=16)
    parser.add_argument("--tool-latency-ms", type=float, default=500.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    runs: dict[str, list[dict[str, float]]] = {"direct": [], "proxy": []}
    cpu_ms: list[float] = []
    with (
        tempfile.TemporaryDirectory() as name,
        SimProcess(sim_command("deepseek-v3", None, "--speed 0")) as sim,
    ):
        work = Path(name)
        proxy, url = start_proxy(sim.url, work / "rows.jsonl")
        hosts = {"direct": sim.url, "proxy": url}
        try:
            run(url, args, 0, work)  # warms both: connections, tokenizer, the simulator
            for round_ in range(args.repeat):
                order = ["direct", "proxy"] if round_ % 2 == 0 else ["proxy", "direct"]
                for k, label in enumerate(order):
                    before = cpu_seconds(proxy.pid)
                    result = run(hosts[label], args, 1 + 2 * round_ + k, work)  # fresh prompts
                    runs[label].append(result)
                    if label == "proxy":
                        used = cpu_seconds(proxy.pid) - before
                        cpu_ms.append(used / result["requests"] * 1000)
        finally:
            proxy.send_signal(signal.SIGINT)
            proxy.communicate(timeout=30)

    def median(label: str, key: str) -> float:
        return statistics.median(result[key] for result in runs[label])

    print(
        f"{args.agents} agents at once, streamed, {args.turns} requests each, tool time "
        f"log-normal (median {args.tool_latency_ms:g} ms), first {args.warmup:g} s left out; "
        f"median of {args.repeat} rounds"
    )
    print(
        f"  peak requests in flight: direct {median('direct', 'in flight'):g}, "
        f"proxy {median('proxy', 'in flight'):g}"
    )
    for key in ("p50", "p99"):
        added = statistics.median(
            p[key] - d[key] for d, p in zip(runs["direct"], runs["proxy"], strict=True)
        )
        print(
            f"  TTFT {key} (ms)   direct {median('direct', key):7.2f}   "
            f"proxy {median('proxy', key):7.2f}   added {added:+6.2f} (median of the rounds')"
        )
    print(f"  proxy CPU: {statistics.median(cpu_ms):.3f} ms per request (user + system)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
