"""``--workers 2`` against ``--workers 1`` on the same workload, side by side.

Run from the repository root: ``python -m benchmarks.bench_workers [--agents A]
[--requests-per-agent R] [--repeat N] [--stream] [--server fast|sim]``.

The zero-latency server of ``bench_client`` (``benchmarks/_fastserver.py``) answers in
its own process; the client is the real ``batchbench agent`` with a sampled workload of A
agents x R requests and no tool delay, so the client is the bottleneck and its request
rate is what one (or two) client processes can send. Rounds alternate 1 and 2 workers;
each row is the median of N rounds: req/s, event-loop lag p99 (over every worker's
samples), client CPU per 1000 requests (summed over workers), the run's wall time and the
server's share of a core. On a 2-core machine the server and two workers share two cores,
so the speed-up is bounded by what the server leaves free; the row says how busy it was.
"""

from __future__ import annotations

import argparse
import sys
import time

from benchmarks.bench_client import Server, median, raise_nofile, run_agent, sampled_flags


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=256)
    parser.add_argument("--requests-per-agent", type=int, default=24)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--stream", action="store_true", help="stream replies (50 chunks)")
    parser.add_argument("--server", choices=("fast", "sim"), default="fast")
    args = parser.parse_args(argv)
    raise_nofile()
    server = Server(args.server, 1)
    started = time.perf_counter()
    runs: dict[int, list] = {1: [], 2: []}
    flags = sampled_flags(args.agents, args.requests_per_agent, args.stream)
    try:
        run_agent(server, sampled_flags(8, 4, args.stream))  # warm-up
        for round_index in range(args.repeat):
            for workers in (1, 2):
                runs[workers].append(run_agent(server, [*flags, "--workers", str(workers)]))
            print(f"  round {round_index + 1}/{args.repeat} done", file=sys.stderr, flush=True)
    finally:
        server.stop()
    kind = "streamed (50 chunks)" if args.stream else "non-streamed"
    print(
        f"{args.agents} agents x {args.requests_per_agent} requests, no tool delay, {kind}, "
        f"{server.kind} server, median of {args.repeat} alternating rounds"
    )
    print(
        f"{'workers':>7} {'req/s':>8} {'lag p99 ms':>10} {'CPU-s/1000':>10} {'wall s':>7} "
        f"{'server':>7}"
    )
    for workers, measured in runs.items():
        print(
            f"{workers:>7} {median(r.rate for r in measured):>8,.0f} "
            f"{median(r.extra['lag_p99_ms'] for r in measured):>10.2f} "
            f"{median(r.in_run_per_k for r in measured):>10.3f} "
            f"{median(r.extra['duration'] for r in measured):>7.2f} "
            f"{median(r.server_busy for r in measured) * 100:>6.0f}%"
        )
    ratios = [two.rate / one.rate for one, two in zip(runs[1], runs[2], strict=True) if one.rate]
    print(f"req/s, 2 workers / 1 (median of per-round ratios): {median(ratios):.2f}x")
    print(f"(benchmark took {time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
