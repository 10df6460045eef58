"""Open-loop admission timing: how close to its scheduled arrival each agent starts.

Run from the repository root: ``python -m benchmarks.bench_open_loop [--agents N]
[--rate R] [--process {constant,poisson}] [--target-p99-ms MS] [--repeat K]``. Each run
is the real client (``batchbench.run``, the code path of ``batchbench-agent``: uvloop, the
HTTP driver, the collector) against the embedded simulator in zero-latency mode (``--sim
--sim-args "--speed 0"``), in the sampled mode with one short request per agent (32 prompt
tokens, 4 output tokens) and no ``--max-active-agents``: 10,000 agents arriving at 500
per second by default, evenly spaced (``--process poisson`` for independent arrivals).

An agent's admission lag is when it started minus when it was due, on the run's clock.
Each run prints its lag p50 / p99 / max in milliseconds, the late admissions (arrivals
that waited for a cap; 0 without one), admissions before their time (must be 0), the run's
duration and whether every request succeeded. With ``--repeat K`` the last line gives the
medians over the K runs. Exit status 1 when the (median) p99 lag misses the target
(default 2 ms), an agent started early, or a request failed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np

from batchbench import RunConfig, run
from batchbench.results.lifecycle import admission_lags


def one_run(args: argparse.Namespace, seed: int) -> dict[str, float]:
    config = RunConfig(
        agents=args.agents,
        arrival_rate=args.rate,
        arrival_process=args.process,
        shape_options=(
            ("input-tokens", args.input_tokens),
            ("output-tokens", args.output_tokens),
            ("tool-invocations", 1),
        ),
        sim=True,
        sim_args="--speed 0",
        seed=seed,
        progress=False,
    )
    started = time.perf_counter()
    result = run(config)
    wall = time.perf_counter() - started
    engine = result.engine
    lags_ms = np.array(admission_lags(engine)) * 1000.0
    early = sum(1 for r in engine.records if r.admitted_at < r.scheduled_at)
    summary = result.summary
    figures = {
        "p50": float(np.percentile(lags_ms, 50)),
        "p99": float(np.percentile(lags_ms, 99)),
        "max": float(lags_ms.max()),
        "late": engine.late_admissions,
        "early": early,
        "duration": engine.total_duration,
        "failed": summary.planned_tool_invocations - summary.successful_requests,
    }
    last_due = max(r.scheduled_at for r in engine.records)
    print(
        f"{len(engine.records)} agents, {args.process} arrivals at {args.rate:g}/s "
        f"(last due at {last_due:.2f}s): admission lag p50 {figures['p50']:.3f} ms, "
        f"p99 {figures['p99']:.3f} ms, max {figures['max']:.3f} ms; "
        f"{figures['late']} late admissions, {early} admitted early; "
        f"run {engine.total_duration:.2f}s ({wall:.1f}s with setup), peak "
        f"{engine.max_active_agents} active, {summary.successful_requests}/"
        f"{summary.planned_tool_invocations} requests succeeded",
        flush=True,
    )
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=10_000)
    parser.add_argument("--rate", type=float, default=500.0, help="arrivals per second")
    parser.add_argument("--process", choices=("constant", "poisson"), default="constant")
    parser.add_argument("--target-p99-ms", type=float, default=2.0)
    parser.add_argument("--repeat", type=int, default=1, help="runs; the verdict uses medians")
    parser.add_argument("--seed", type=int, default=1, help="seed of the first run (then +1)")
    parser.add_argument("--input-tokens", type=int, default=32)
    parser.add_argument("--output-tokens", type=int, default=4)
    args = parser.parse_args(argv)
    runs = [one_run(args, args.seed + k) for k in range(args.repeat)]
    median = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
    if args.repeat > 1:
        print(
            f"median of {args.repeat} runs: admission lag p50 {median['p50']:.3f} ms, "
            f"p99 {median['p99']:.3f} ms, max {median['max']:.3f} ms; "
            f"late admissions {median['late']:g}; run {median['duration']:.2f}s"
        )
    checks = {
        f"p99 admission lag {median['p99']:.3f} ms <= {args.target_p99_ms:g} ms": median["p99"]
        <= args.target_p99_ms,
        "no agent started before its arrival": all(r["early"] == 0 for r in runs),
        "every request succeeded": all(r["failed"] == 0 for r in runs),
    }
    for label, ok in checks.items():
        print(f"  {'PASS' if ok else 'FAIL'}  {label}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
