"""Manifest parsing: seconds to parse and bytes held per request at 1,000,000 requests.

Run from the repository root (package installed, or ``PYTHONPATH=.``):
``python benchmarks/bench_manifest.py [--trajectories N] [--requests-per-trajectory K]``.
Generates realistic growing-prompt trajectories (occasional compaction resets, tool
latencies, metadata) into a temp file, parses it three times (median), and measures with
tracemalloc the memory the returned ``Manifest`` keeps once the parse's temporaries are gone.
The fast-path / full-validator ratio is measured side by side because absolute times drift.

``--baseline OLD.py`` times another version of ``batchbench/plan/manifest.py`` (for example
``git show REF:batchbench/plan/manifest.py > OLD.py``) against this tree's, alternating
run by run on the same bytes, and prints the ratio of the medians: the cost of a change
to the loader, measured side by side.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import os
import random
import statistics
import sys
import tempfile
import time
import tracemalloc

import orjson

from batchbench.plan import manifest as manifest_module
from batchbench.plan.manifest import Manifest, load_manifest

RUNS = 3
BUDGET_BYTES_PER_REQUEST = 64


def write_manifest(path: str, trajectories: int, per_trajectory: int, seed: int = 7) -> int:
    """Write a v1 manifest with growing prompts; returns the file size in bytes."""
    rng = random.Random(seed)
    with open(path, "wb") as out:
        for t in range(trajectories):
            requests: list[dict[str, object]] = []
            prompt = rng.randint(2_000, 12_000)
            output = 0
            for i in range(per_trajectory):
                request: dict[str, object] = {}
                if i and rng.random() < 0.01:
                    prompt = rng.randint(2_000, 12_000)  # compaction: start a fresh context
                    request["reset_before"] = True
                elif i:
                    prompt += output + rng.randint(0, 3_000)  # reply plus tool result
                output = rng.randint(20, 800)
                request["prompt_tokens"] = prompt
                request["output_tokens"] = output
                if rng.random() < 0.3:
                    request["delay_after_ms"] = rng.randint(0, 5_000)
                requests.append(request)
            line = {
                "schema_version": 1,
                "trajectory_id": f"traj-{t:07d}",
                "metadata": {"source": "bench", "index": t},
                "requests": requests,
            }
            out.write(orjson.dumps(line, option=orjson.OPT_APPEND_NEWLINE))
    return os.path.getsize(path)


def time_parse(path: str, fast: bool) -> tuple[float, Manifest]:
    """Median wall-clock seconds of RUNS parses (reading included)."""
    seconds = []
    result = None
    for run in range(RUNS):
        gc.collect()
        start = time.perf_counter()
        if fast:
            result = load_manifest(path)
        else:
            with open(path, "rb") as handle:
                data = handle.read()
            result = manifest_module._parse(data, path, "", fast=False)
        seconds.append(time.perf_counter() - start)
        if run < RUNS - 1:
            result = None  # free it before the next run
    assert result is not None
    return statistics.median(seconds), result


def compare(path: str, baseline: str, runs: int) -> list[tuple[str, str]]:
    """Rows for this tree's parser against the module at ``baseline``, runs alternating."""
    spec = importlib.util.spec_from_file_location("baseline_manifest", baseline)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {baseline}")
    old = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = old  # dataclasses look their module up while it loads
    spec.loader.exec_module(old)
    with open(path, "rb") as handle:
        data = handle.read()
    rows = []
    for fast in (True, False):
        seconds: dict[str, list[float]] = {"baseline": [], "this tree": []}
        for _ in range(runs):
            for name, module in (("baseline", old), ("this tree", manifest_module)):
                gc.collect()
                start = time.perf_counter()
                module._parse(data, path, "", fast=fast)
                seconds[name].append(time.perf_counter() - start)
        base, new = (statistics.median(seconds[name]) for name in ("baseline", "this tree"))
        label = "fast path" if fast else "full validator"
        rows += [
            (f"{label}, baseline (median of {runs})", f"{base:.3f} s"),
            (f"{label}, this tree (median of {runs})", f"{new:.3f} s"),
            (f"{label}, this tree / baseline", f"{new / base:.3f}"),
        ]
    return rows


def held_bytes(path: str) -> tuple[int, int]:
    """(bytes still allocated by the loaded Manifest, peak bytes during the parse)."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        loaded = load_manifest(path)
        gc.collect()
        current, peak = tracemalloc.get_traced_memory()
        assert loaded.n_requests > 0
        return current - before, peak - before
    finally:
        tracemalloc.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trajectories", type=int, default=10_000)
    parser.add_argument("--requests-per-trajectory", type=int, default=100)
    parser.add_argument("--baseline", metavar="OLD.py", help="another manifest.py to compare")
    parser.add_argument("--runs", type=int, default=7, help="alternating runs of --baseline")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "manifest.jsonl")
        size = write_manifest(path, args.trajectories, args.requests_per_trajectory)
        if args.baseline:
            rows = compare(path, args.baseline, args.runs)
            width = max(len(name) for name, _ in rows)
            for name, value in rows:
                print(f"{name:<{width}}  {value}")
            return
        fast_s, loaded = time_parse(path, fast=True)
        n = loaded.n_requests
        checked_s, _ = time_parse(path, fast=False)
        del loaded
        held, peak = held_bytes(path)
    per_request = held / n
    rows = [
        ("trajectories x requests", f"{args.trajectories:,} x {args.requests_per_trajectory:,}"),
        ("requests", f"{n:,}"),
        ("file size", f"{size / 2**20:.1f} MiB"),
        (f"parse, fast path (median of {RUNS})", f"{fast_s:.2f} s"),
        (f"parse, full validator only (median of {RUNS})", f"{checked_s:.2f} s"),
        ("fast-path speed-up", f"{checked_s / fast_s:.2f}x"),
        ("parse rate, fast path", f"{n / fast_s / 1e6:.2f} M requests/s"),
        ("Manifest held after parse", f"{held / 2**20:.1f} MiB"),
        ("Manifest bytes / request", f"{per_request:.1f} (budget {BUDGET_BYTES_PER_REQUEST})"),
        ("peak traced during parse", f"{peak / 2**20:.1f} MiB"),
    ]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")


if __name__ == "__main__":
    main()
