"""Where requests really went behind the smg gateway, next to where the client sent them.

Run from the repository root: ``python -m benchmarks.bench_placement [--agents A]
[--turns T] [--policies P ...]``. Needs the ``smg`` binary (``pip install '.[test]'``).

For each smg policy (``consistent_hashing`` and ``cache_aware`` by default), two fresh
zero-latency simulators behind a fresh gateway, and one ``batchbench agent`` run with
perfect routing over two ranks: A agents (16) of T requests (4) on 8 slots, 256-token
prompts growing by each reply. Printed per rank:

* the client's figures: the requests and input tokens it sent to the rank, the worker its
  replies named most often (``usual_worker``) and the requests another worker served
  (``misplaced``);
* the workers' own counts: chat completions and prompt tokens that the rank's usual
  worker's ``/metrics`` says it served during the run (its counters before the run
  subtracted; the run has no preflight, so every request counted is one of the run's).

Equal columns mean the gateway honoured ``X-SMG-Target-Worker``. When it did not, both
ranks may share a usual worker, whose counts then show on both rows.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from smggateway import smg_gateway  # noqa: E402  (the tests' fixture: sims + smg)


def worker_counts(url: str) -> tuple[int, int]:
    """(chat completions, prompt tokens) a simulator has served, from its own /metrics."""
    with urllib.request.urlopen(url + "/metrics", timeout=5) as response:
        text = response.read().decode()

    def total(name: str) -> int:
        found = re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M)
        return sum(int(float(value)) for value in found)

    return total("batchbench_sim_requests_total"), total("batchbench_sim_prompt_tokens_total")


def run_policy(policy: str, agents: int, turns: int) -> tuple[list[dict], dict[str, tuple]]:
    """One run behind ``policy``: the client's per-rank rows, and per worker its own
    (requests, prompt tokens) during the run."""
    with smg_gateway(2, policy) as gateway, tempfile.TemporaryDirectory() as folder:
        before = {url: worker_counts(url) for url in gateway.worker_urls}
        results = Path(folder) / "run.json"
        command = [
            sys.executable, "-m", "batchbench", "agent", "--host", gateway.url,
            "--model", "batchbench-sim", "--tokenizer-model", "deepseek-v3", "--no-progress",
            "--agents", str(agents), "--max-active-agents", "8",
            "--tool-invocations", str(turns), "--input-tokens", "256", "--output-tokens", "16",
            "--seed", "11", "--user-prefix", "bench", "--no-preflight",
            "--dp-rank-perfect-routing", "--dp-rank-perfect-routing-num", "2",
            "--results-json", str(results),
        ]  # fmt: skip
        subprocess.run(command, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
        document = json.loads(results.read_text())
        after = {url: worker_counts(url) for url in gateway.worker_urls}
    own = {url: (after[url][0] - before[url][0], after[url][1] - before[url][1]) for url in after}
    return document["ranks"], own


def port(url: str | None) -> str:
    return url.rsplit(":", 1)[-1] if url else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=16)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--policies", nargs="+", default=["consistent_hashing", "cache_aware"])
    args = parser.parse_args()
    runs = [(policy, *run_policy(policy, args.agents, args.turns)) for policy in args.policies]
    print("Per rank, the client's figures (served by: the worker each reply named, by port)")
    print("| policy | rank | requests | input tokens | served by | usual worker | misplaced "
          "| switching agents |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for policy, ranks, _ in runs:
        for index, rank in enumerate(ranks):
            served = ", ".join(f"{port(w)}: {n}" for w, n in sorted(rank["workers"].items()))
            print(
                f"| {policy} | {index} | {rank['requests']} | {rank['input_tokens']} | {served} "
                f"| {port(rank['usual_worker'])} | {rank['misplaced']} "
                f"| {rank['switching_agents']} |"
            )
    print()
    print("Per worker, its own counts (/metrics) and the client's")
    print("| policy | worker | own requests | own prompt tokens | replies naming it "
          "| rank it is usual for | that rank's requests |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for policy, ranks, own in runs:
        for url, (requests, prompt) in own.items():
            named = sum(rank["workers"].get(url, 0) for rank in ranks)
            usual = [i for i, rank in enumerate(ranks) if rank["usual_worker"] == url]
            sent = sum(ranks[i]["requests"] for i in usual)
            print(
                f"| {policy} | {port(url)} | {requests} | {prompt} | {named} "
                f"| {', '.join(map(str, usual)) or '-'} | {sent if usual else '-'} |"
            )


if __name__ == "__main__":
    main()
