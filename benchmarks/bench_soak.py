"""Soak: a long run at a low rate of mixed faults; memory must stay flat and every planned
request must be accounted for.

Run from the repository root: ``python -m benchmarks.bench_soak [--requests N]
[--fault-rate F] [--agents-active C]``. The client is the real ``batchbench-agent`` against
the embedded simulator (``--sim``, zero latency) injecting errors, 429s with Retry-After
0, dropped connections, truncated streams, malformed bodies and missing usage, each at
F/6 of requests (default F = 1 %), on streamed requests. Trajectories are short (5
requests), so the client reaches a steady state: its resident memory is sampled from
/proc every half second and must not grow after warm-up beyond what it keeps per
trajectory by design (the lifecycle records the run returns). At the end the run's JSON
must satisfy planned = succeeded + failed + cancelled + skipped, the request events must
hold one line per sent request with matching statuses, and the attempts must add up.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

TURNS = 5
FAULTS = ("error", "429", "drop", "truncate", "malformed", "missing-usage")


def rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--fault-rate", type=float, default=0.01)
    parser.add_argument("--agents-active", type=int, default=64)
    parser.add_argument(
        "--max-growth-kb-per-request",
        type=float,
        default=0.5,
        help="allowed RSS growth after warm-up per request (default %(default)g KB: what the "
        "run keeps by design, about 0.35 KB: its latency samples and lifecycle records)",
    )
    args = parser.parse_args(argv)
    agents = max(args.requests // TURNS, 1)
    rate = args.fault_rate / len(FAULTS)
    sim_args = (
        f"--speed 0 --fault-seed 7 --fault-error-rate {rate} --fault-429-rate {rate} "
        f"--fault-retry-after-s 0 --fault-drop-rate {rate} --fault-truncate-rate {rate} "
        f"--fault-malformed-rate {rate} --fault-missing-usage-rate {rate}"
    )
    with tempfile.TemporaryDirectory() as work:
        summary = Path(work) / "s.json"
        events = Path(work) / "r.jsonl"
        command = [
            sys.executable, "-m", "batchbench", "agent", "--sim", "--sim-args", sim_args,
            "--agents", str(agents), "--tool-invocations", str(TURNS),
            "--input-tokens", "64", "--output-tokens", "16", "--environment-tokens", "16",
            "--max-active-agents", str(args.agents_active), "--stream", "--seed", "1",
            "--retry-delay-ms", "0", "--max-failure-rate", "1", "--no-progress",
            "--no-preflight",  # a fault on the check request would stop the soak
            "--results-json", str(summary), "--request-events-jsonl", str(events),
        ]  # fmt: skip
        started = time.perf_counter()
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        samples: list[tuple[float, int, float]] = []  # (seconds, event bytes, RSS MB)

        def sample() -> None:
            while process.poll() is None:
                rss = rss_mb(process.pid)
                size = events.stat().st_size if events.exists() else 0
                if rss is not None:
                    samples.append((time.perf_counter() - started, size, rss))
                time.sleep(0.5)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        _, err = process.communicate()
        sampler.join()
        wall = time.perf_counter() - started
        if process.returncode not in (0, 3):
            print(err.decode(errors="replace"), file=sys.stderr)
            print(f"FAIL: batchbench-agent exited with {process.returncode}")
            return 1
        metrics = json.loads(summary.read_text())["metrics"]
        statuses: dict[str, int] = {}
        attempts = 0
        with events.open("rb") as handle:
            for line in handle:
                record = json.loads(line)
                statuses[record["status"]] = statuses.get(record["status"], 0) + 1
                attempts += record["attempts"]
        final_size = events.stat().st_size
    buckets = {
        b: metrics[f"{b}_requests"] for b in ("successful", "failed", "cancelled", "skipped")
    }
    planned = metrics["planned_tool_invocations"]
    checks = {
        "planned = succeeded + failed + cancelled + skipped": planned == sum(buckets.values()),
        "request events match the buckets": statuses.get("ok", 0) == buckets["successful"]
        and statuses.get("failed", 0) == buckets["failed"]
        and statuses.get("cancelled", 0) == buckets["cancelled"],
        "attempts add up": attempts == metrics["attempts"],
    }
    # Steady state: from 20 % to 90 % of the requests (the end adds the reports' work).
    warm = [s for s in samples if 0.2 * final_size <= s[1] <= 0.9 * final_size]
    growth = (warm[-1][2] - warm[0][2]) if len(warm) >= 2 else 0.0
    after_warm_up = planned * (warm[-1][1] - warm[0][1]) / final_size if len(warm) >= 2 else 0
    per_request_kb = growth * 1024 / after_warm_up if after_warm_up else 0.0
    checks[f"RSS growth after warm-up <= {args.max_growth_kb_per_request:g} KB per request"] = (
        per_request_kb <= args.max_growth_kb_per_request
    )
    print(
        f"soak: {planned} planned requests ({agents} trajectories of {TURNS}), faults "
        f"{args.fault_rate * 100:g}% mixed, streamed, {args.agents_active} active; "
        f"{wall:.1f}s wall, exit {process.returncode}"
    )
    print(
        "buckets: "
        + ", ".join(f"{k} {v}" for k, v in buckets.items())
        + f"; attempts {metrics['attempts']} (retries {metrics['retries']})"
    )
    print("errors by kind: " + ", ".join(
        f"{kind} {entry['count']}" for kind, entry in metrics["errors_by_kind"].items()
    ))  # fmt: skip
    if warm:
        print(
            f"RSS: {samples[0][2]:.0f} MB at start, {warm[0][2]:.0f} MB after warm-up, "
            f"peak {max(s[2] for s in samples):.0f} MB (the end builds the reports), growth "
            f"from 20% to 90% of the requests {growth:.1f} MB ({per_request_kb:.2f} KB per "
            "request)"
        )
    if final_size:
        steps = []
        for fraction in (0.2, 0.4, 0.6, 0.8, 1.0):
            reached = [x for x in samples if x[1] >= fraction * final_size * 0.999]
            if reached:
                steps.append(f"{fraction * 100:.0f}% {reached[0][2]:.0f} MB")
        print("RSS by progress: " + ", ".join(steps))
    for label, ok in checks.items():
        print(f"  {'PASS' if ok else 'FAIL'}  {label}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
