"""Admission primitives: native vs pure-Python twin vs the obvious stdlib structure.

Run from the repo root (after ``build_ext --inplace``), or with the package installed:
``python -m benchmarks.bench_admission [--ops N] [--repeat R]``. Each row is the median
of R runs of N operations (a push or a pop; an acquire or a release), methods pre-bound as
a hot loop would have them. Ratios are speed relative to the stdlib baseline and to the twin.

- Ring: a queue kept 256 deep, then push+pop pairs, so it wraps many times.
- Allocator: 256 slots held; each cycle releases a random batch of 1-64 of them in random
  order and re-acquires as many (they come back lowest first), like agents finishing and
  being replaced in open loop.
"""

from __future__ import annotations

import argparse
import heapq
import random
import statistics
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from batchbench import _impl

HELD = 256
MAX_BATCH = 64


class HeapqAllocator:
    """Baseline: lowest-free-slot allocation the way one would write it with ``heapq``."""

    def __init__(self) -> None:
        self.free: list[int] = []
        self.peak = 0

    def acquire(self) -> int:
        if self.free:
            return heapq.heappop(self.free)
        self.peak += 1
        return self.peak - 1

    def release(self, slot: int) -> None:
        heapq.heappush(self.free, slot)


def ring_run(make: Callable[[int], Any], push_name: str, pop_name: str, ops: int) -> float:
    """Seconds for ``ops`` operations (``ops // 2`` push+pop pairs) on a 256-deep queue."""
    ring = make(HELD + 1)
    push, pop = getattr(ring, push_name), getattr(ring, pop_name)
    for i in range(HELD):
        push(i)
    pairs = range(ops // 2)
    start = time.perf_counter()
    for i in pairs:
        push(i)
        pop()
    return time.perf_counter() - start


def allocator_pattern(ops: int, seed: int = 7) -> list[list[int]]:
    """Release batches (slot lists in release order) totalling about ``ops`` operations."""
    rng = random.Random(seed)
    batches, total = [], 0
    while total < ops:
        size = rng.randint(1, MAX_BATCH)
        batches.append(rng.sample(range(HELD), size))
        total += 2 * size
    return batches


def allocator_run(make: Callable[[], Any], batches: list[list[int]]) -> float:
    """Seconds to replay ``batches``: release each batch, then acquire the same count."""
    pool = make()
    acquire, release = pool.acquire, pool.release
    for _ in range(HELD):
        acquire()
    start = time.perf_counter()
    for batch in batches:
        for slot in batch:
            release(slot)
        for _ in batch:
            acquire()
    elapsed = time.perf_counter() - start
    assert pool.peak == HELD  # released slots always come back; nothing new was needed
    return elapsed


def median_rate(run: Callable[[], float], ops: int, repeat: int) -> float:
    return ops / statistics.median(run() for _ in range(repeat))


def table(title: str, rows: list[tuple[str, float]], baseline: str) -> None:
    """One block: ops/s, then speed relative to the stdlib baseline and to the twin."""
    rates = dict(rows)
    base = rates[baseline]
    twin = next((rate for name, rate in rows if name.startswith("twin ")), None)
    print(f"\n{title}")
    print(f"  {'implementation':<22}{'ops/s':>14}  {'vs ' + baseline:>20}  {'vs twin':>8}")
    for name, rate in rows:
        vs_twin = f"{rate / twin:.2f}x" if twin else "n/a"
        print(f"  {name:<22}{rate:>14,.0f}  {rate / base:>19.2f}x  {vs_twin:>8}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=1_000_000, help="operations per run")
    parser.add_argument("--repeat", type=int, default=5, help="runs per row (median taken)")
    args = parser.parse_args()
    ops, repeat = args.ops, args.repeat

    native = _impl.native_module("admission")
    twin = _impl.twin_module("admission")
    impls = [("native", native), ("twin", twin)] if native is not None else [("twin", twin)]
    if native is None:
        print("native admission module not built: only the twin is measured")
    print(f"{ops:,} operations per run, median of {repeat} runs")

    ring_rows = [
        (
            f"{name} FifoRing",
            median_rate(lambda m=mod: ring_run(m.FifoRing, "push", "pop", ops), ops, repeat),
        )
        for name, mod in impls
    ]
    ring_rows.append(
        (
            "collections.deque",
            median_rate(
                lambda: ring_run(lambda _n: deque(), "append", "popleft", ops), ops, repeat
            ),
        )
    )
    table("FIFO ring: push+pop pairs", ring_rows, "collections.deque")

    batches = allocator_pattern(ops)
    n_ops = 2 * sum(len(batch) for batch in batches)
    alloc_rows = [
        (
            f"{name} SlotAllocator",
            median_rate(lambda m=mod: allocator_run(m.SlotAllocator, batches), n_ops, repeat),
        )
        for name, mod in impls
    ]
    alloc_rows.append(
        (
            "heapq allocator",
            median_rate(lambda: allocator_run(HeapqAllocator, batches), n_ops, repeat),
        )
    )
    table(
        f"Slot allocator: {HELD} held, batches of 1-{MAX_BATCH} released in random order",
        alloc_rows,
        "heapq allocator",
    )


if __name__ == "__main__":
    main()
