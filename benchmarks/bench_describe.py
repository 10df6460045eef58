"""The workload description: seconds to describe a manifest the size of the Mooncake
conversation trace (12,000 requests, 300,000 block references), and its memory.

Run from the repository root (package installed, or ``PYTHONPATH=.``):
``python benchmarks/bench_describe.py [--trajectories N] [--requests-per-trajectory K]
[--repeat R] [--html PATH]``.

The plans are agent conversations as ``batchbench import`` writes them: ten tool
definitions shared by every trajectory, one of 50 system prompts, three user blocks, then
each turn appends the live reply to the previous request and a user block (512, 300 and
200 tokens), arriving 1 to 30 s apart. 1,000 x 12 gives 12,000 requests averaging 25
blocks. ``describe`` runs R times (median and best); tracemalloc then gives its peak
allocation and what the returned description keeps, and ``--html`` also times the page.
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import sys
import time
import tracemalloc
from typing import Any

from batchbench.ingest.describe import describe, format_description


def block(seed: str, tokens: int, role: str, live: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {"seed": seed, "tokens": tokens, "role": role}
    if live:
        out["live"] = True
    return out


def conversations(trajectories: int, turns: int, seed: int = 1) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    plans = []
    for t in range(trajectories):
        blocks = [block(f"tool{i}", 512, "tool_definition") for i in range(10)]
        blocks.append(block(f"system{t % 50}", 512, "system"))
        blocks += [block(f"t{t}-u0-{i}", 512, "user") for i in range(3)]
        start = arrival = t * 3000
        requests = []
        for k in range(turns):
            if k:
                blocks = [block(b["seed"], b["tokens"], b["role"]) for b in blocks]  # not live
                blocks += [block(f"t{t}-r{k}", 300, "assistant", True),
                           block(f"t{t}-u{k}", 200, "user")]  # fmt: skip
            request: dict[str, Any] = {
                "prompt_tokens": sum(b["tokens"] for b in blocks),
                "output_tokens": 300,
                "recorded_start_after_ms": arrival,
                "blocks": blocks,
            }
            gap = rng.randint(1000, 30000)
            if k + 1 < turns:
                request["delay_after_ms"] = gap - 500
            requests.append(request)
            arrival += gap
        plans.append(
            {"schema_version": 2, "trajectory_id": f"t{t}", "start_after_ms": start,
             "requests": requests}
        )  # fmt: skip
    return plans


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trajectories", type=int, default=1000)
    parser.add_argument("--requests-per-trajectory", type=int, default=12)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--html", metavar="PATH", help="also time the --describe-html page")
    args = parser.parse_args()
    plans = conversations(args.trajectories, args.requests_per_trajectory)
    requests = sum(len(p["requests"]) for p in plans)
    references = sum(len(r["blocks"]) for p in plans for r in p["requests"])
    print(f"{requests:,} requests, {references:,} block references")
    times = []
    for _ in range(args.repeat):
        started = time.perf_counter()
        desc = describe(plans)
        times.append(time.perf_counter() - started)
    print(
        f"describe: median {statistics.median(times) * 1000:.0f} ms, best "
        f"{min(times) * 1000:.0f} ms ({args.repeat} runs)"
    )
    gc.collect()
    tracemalloc.start()
    desc = describe(plans)
    gc.collect()
    kept, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    print(f"memory: peak {peak / 2**20:.1f} MiB while describing, {kept / 2**10:.1f} KiB kept")
    print(format_description(desc))
    if args.html:
        from batchbench.report.workload import write_workload_html

        started = time.perf_counter()
        write_workload_html(desc, args.html, "bench_describe")
        print(f"page: {time.perf_counter() - started:.2f} s to write {args.html}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
