"""Admission primitives: native vs pure-Python twin vs the obvious stdlib structure.

Run from the repo root (after ``python setup.py build_ext --inplace``), or with the package
installed: ``python -m benchmarks.bench_admission [--ops N] [--repeat R]``. Every round
runs each implementation once, in an order rotated from round to round, so all rows share
the machine's state of the moment; a row's ops/s is its median over R rounds and its
ratios are medians of the per-round ratios (this machine is shared and noisy: absolute
rates drift, ratios measured in the same round hold). Methods are pre-bound, as a hot loop
would have them, and every loop also pays for its own ``for`` (about 20 ns a step here).

- Ring, push+pop: a queue kept 256 deep, then N/2 push+pop pairs, so it wraps many times;
  against ``collections.deque`` (``append``/``popleft``).
- Ring, closed-loop drain: what ``ClosedLoopAdmission`` does with it, ``FifoRing.range(N)``
  then ``len`` and ``pop`` per finished agent until empty; against ``deque(range(N))``
  (which first builds N int objects, the ring keeps C integers).
- Allocator: 256 slots held; each cycle releases a random batch of 1-64 of them in random
  order and re-acquires as many (they come back lowest first), like agents finishing and
  being replaced in open loop; against a ``heapq`` allocator without the double-release
  check the real one makes.
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


def drain_run(make_full: Callable[[int], Any], pop_name: str, ops: int) -> float:
    """Seconds to build a queue of plans 0 .. ops-1 and pop them all, checking its length
    before each pop as ``ClosedLoopAdmission.on_finish`` does."""
    start = time.perf_counter()
    queue = make_full(ops)
    pop = getattr(queue, pop_name)
    while len(queue):
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


def interleaved(runs: dict[str, Callable[[], float]], repeat: int) -> dict[str, list[float]]:
    """Seconds per round for each run, all runs in every round, the order rotated."""
    names = list(runs)
    seconds: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(repeat):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            seconds[name].append(runs[name]())
    return seconds


def table(title: str, seconds: dict[str, list[float]], ops: int, baseline: str) -> None:
    """One block: median ops/s, then median per-round speed vs the baseline and the twin."""
    twin = next((name for name in seconds if name.startswith("twin ")), None)

    def ratio(name: str, other: str | None) -> str:
        if other is None:
            return "n/a"
        per_round = [b / a for a, b in zip(seconds[name], seconds[other], strict=True)]
        return f"{statistics.median(per_round):.2f}x"

    print(f"\n{title}")
    print(f"  {'implementation':<24}{'ops/s':>14}  {'vs ' + baseline:>22}  {'vs twin':>8}")
    for name, runs in seconds.items():
        rate = ops / statistics.median(runs)
        print(f"  {name:<24}{rate:>14,.0f}  {ratio(name, baseline):>22}  {ratio(name, twin):>8}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=1_000_000, help="operations per run")
    parser.add_argument("--repeat", type=int, default=7, help="rounds (median taken)")
    args = parser.parse_args()
    ops, repeat = args.ops, args.repeat

    native = _impl.native_module("admission")
    twin = _impl.twin_module("admission")
    impls = [("native", native), ("twin", twin)] if native is not None else [("twin", twin)]
    if native is None:
        print("native admission module not built: only the twin is measured")
    print(f"{ops:,} operations per run, median of {repeat} interleaved rounds")

    rings: dict[str, Callable[[], float]] = {
        f"{name} FifoRing": lambda m=mod: ring_run(m.FifoRing, "push", "pop", ops)
        for name, mod in impls
    }
    rings["collections.deque"] = lambda: ring_run(lambda _n: deque(), "append", "popleft", ops)
    table("FIFO ring: push+pop pairs", interleaved(rings, repeat), ops, "collections.deque")

    drains: dict[str, Callable[[], float]] = {
        f"{name} FifoRing.range": lambda m=mod: drain_run(m.FifoRing.range, "pop", ops)
        for name, mod in impls
    }
    drains["deque(range(n))"] = lambda: drain_run(lambda n: deque(range(n)), "popleft", ops)
    table(
        "FIFO ring: closed-loop drain (build, then len+pop until empty)",
        interleaved(drains, repeat),
        ops,
        "deque(range(n))",
    )

    batches = allocator_pattern(ops)
    n_ops = 2 * sum(len(batch) for batch in batches)
    pools: dict[str, Callable[[], float]] = {
        f"{name} SlotAllocator": lambda m=mod: allocator_run(m.SlotAllocator, batches)
        for name, mod in impls
    }
    pools["heapq allocator"] = lambda: allocator_run(HeapqAllocator, batches)
    table(
        f"Slot allocator: {HELD} held, batches of 1-{MAX_BATCH} released in random order",
        interleaved(pools, repeat),
        n_ops,
        "heapq allocator",
    )


if __name__ == "__main__":
    main()
