"""FIFO ring, slot allocator and closed-loop admission (docs/manifest.md, Admission).

Every case runs against the compiled module and its pure-Python twin.
"""

from __future__ import annotations

import heapq
import os
import subprocess
import sys
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType

import pytest
from conftest import implementations
from hypothesis import given, settings
from hypothesis import strategies as st

from batchbench import _impl
from batchbench.drive import admission
from batchbench.drive.admission import ClosedLoopAdmission, simulate_closed_loop

IMPLS = implementations("admission")
impl = pytest.mark.parametrize("mod", IMPLS)


@contextmanager
def using(mod: ModuleType) -> Iterator[None]:
    """Run ``batchbench.drive.admission`` on ``mod``'s ring and allocator for the block."""
    saved = admission.FifoRing, admission.SlotAllocator
    admission.FifoRing, admission.SlotAllocator = mod.FifoRing, mod.SlotAllocator
    try:
        yield
    finally:
        admission.FifoRing, admission.SlotAllocator = saved


def drain(ring) -> list[int]:
    return [ring.pop() for _ in range(len(ring))]


# --- FifoRing ---------------------------------------------------------------------------


@impl
def test_ring_is_fifo(mod):
    ring = mod.FifoRing(4)
    assert (len(ring), ring.capacity) == (0, 4)
    for value in (5, 3, 9):
        ring.push(value)
    assert len(ring) == 3
    assert ring.pop() == 5
    assert len(ring) == 2
    assert drain(ring) == [3, 9]
    assert len(ring) == 0


@impl
def test_ring_wraps_around(mod):
    ring = mod.FifoRing(3)
    for value in (0, 1, 2):
        ring.push(value)
    assert ring.pop() == 0
    ring.push(3)  # lands in the cell freed at the front
    assert ring.pop() == 1
    ring.push(4)
    assert drain(ring) == [2, 3, 4]
    # Many laps of a nearly full ring keep order and length.
    ring = mod.FifoRing(4)
    for value in range(3):
        ring.push(value)
    popped = []
    for value in range(3, 40):
        ring.push(value)
        popped.append(ring.pop())
        assert len(ring) == 3
    assert popped == list(range(37))
    assert drain(ring) == [37, 38, 39]


@impl
def test_ring_overflow_leaves_contents_intact(mod):
    ring = mod.FifoRing(2)
    ring.push(7)
    ring.push(8)
    with pytest.raises(OverflowError, match="full"):
        ring.push(9)
    assert len(ring) == 2
    assert drain(ring) == [7, 8]


@impl
def test_ring_underflow(mod):
    ring = mod.FifoRing(2)
    with pytest.raises(IndexError):
        ring.pop()
    ring.push(1)
    assert ring.pop() == 1
    with pytest.raises(IndexError):
        ring.pop()
    assert len(ring) == 0


@impl
def test_ring_zero_capacity(mod):
    ring = mod.FifoRing(0)
    assert (len(ring), ring.capacity) == (0, 0)
    with pytest.raises(OverflowError):
        ring.push(0)
    with pytest.raises(IndexError):
        ring.pop()
    empty = mod.FifoRing.range(0)
    assert (len(empty), empty.capacity) == (0, 0)


@impl
def test_ring_range(mod):
    ring = mod.FifoRing.range(5)
    assert isinstance(ring, mod.FifoRing)
    assert (len(ring), ring.capacity) == (5, 5)
    with pytest.raises(OverflowError):
        ring.push(5)
    assert drain(ring) == [0, 1, 2, 3, 4]
    with pytest.raises(IndexError):
        ring.pop()
    ring = mod.FifoRing.range(3)
    assert ring.pop() == 0
    ring.push(7)
    assert drain(ring) == [1, 2, 7]
    assert drain(mod.FifoRing.range(100_000))[-3:] == [99_997, 99_998, 99_999]


@impl
def test_ring_argument_checks(mod):
    with pytest.raises(ValueError, match="non-negative"):
        mod.FifoRing(-1)
    with pytest.raises(ValueError, match="non-negative"):
        mod.FifoRing.range(-1)
    ring = mod.FifoRing(capacity=2)
    with pytest.raises(ValueError, match="non-negative"):
        ring.push(-1)
    with pytest.raises(TypeError):
        ring.push(1.0)
    with pytest.raises(OverflowError):
        ring.push(2**64)
    assert len(ring) == 0
    ring.push(i=sys.maxsize)
    assert ring.pop() == sys.maxsize
    assert repr(ring) == "FifoRing(len=0, capacity=2)"


# --- SlotAllocator ------------------------------------------------------------------------


@impl
def test_lowest_free_slot_and_peak(mod):
    pool = mod.SlotAllocator()
    assert [pool.acquire() for _ in range(3)] == [0, 1, 2]
    pool.release(1)
    pool.release(0)
    assert (pool.active, pool.peak) == (1, 3)
    assert [pool.acquire() for _ in range(3)] == [0, 1, 3]
    assert pool.peak == 4
    assert pool.active == 4


@impl
def test_allocator_starts_empty(mod):
    pool = mod.SlotAllocator()
    assert (pool.active, pool.peak, len(pool)) == (0, 0, 0)
    assert 0 not in pool
    assert repr(pool) == "SlotAllocator(active=0, peak=0)"


@impl
def test_allocator_reuses_lowest_after_scattered_releases(mod):
    pool = mod.SlotAllocator()
    assert [pool.acquire() for _ in range(10)] == list(range(10))
    for slot in (7, 2, 5):
        pool.release(slot)
    assert (pool.active, len(pool), pool.peak) == (7, 7, 10)
    assert [s in pool for s in range(11)] == [s not in (2, 5, 7, 10) for s in range(11)]
    assert [pool.acquire() for _ in range(4)] == [2, 5, 7, 10]
    assert (pool.active, pool.peak) == (11, 11)


@impl
def test_release_of_unheld_slot(mod):
    pool = mod.SlotAllocator()
    with pytest.raises(ValueError, match="slot 0 is not held"):
        pool.release(0)
    assert [pool.acquire(), pool.acquire()] == [0, 1]
    pool.release(1)
    with pytest.raises(ValueError, match="slot 1 is not held"):
        pool.release(1)  # double release
    with pytest.raises(ValueError, match="slot -1 is not held"):
        pool.release(-1)
    with pytest.raises(ValueError, match="slot 2 is not held"):
        pool.release(2)  # never allocated
    with pytest.raises(TypeError):
        pool.release(0.0)
    with pytest.raises(OverflowError):
        pool.release(2**64)
    assert (pool.active, pool.peak) == (1, 2)
    assert pool.acquire() == 1  # the failed releases did not corrupt the free heap
    assert pool.acquire() == 2
    assert "0" not in pool
    assert 1.0 not in pool


@impl
def test_allocator_grows_past_initial_capacity(mod):
    pool = mod.SlotAllocator()
    assert [pool.acquire() for _ in range(1000)] == list(range(1000))
    for slot in range(999, -1, -1):
        pool.release(slot)
    assert (pool.active, pool.peak) == (0, 1000)
    assert [pool.acquire() for _ in range(1001)] == list(range(1001))
    assert pool.peak == 1001


@impl
@settings(max_examples=300, deadline=None)
@given(
    capacity=st.integers(0, 12),
    ops=st.lists(st.one_of(st.none(), st.integers(0, 1000)), max_size=120),
)
def test_ring_matches_deque(mod, capacity, ops):
    """``None`` pops, an int pushes; the ring must agree with a bounded deque throughout."""
    ring = mod.FifoRing(capacity)
    model: deque[int] = deque()
    for op in ops:
        if op is None:
            if model:
                assert ring.pop() == model.popleft()
            else:
                with pytest.raises(IndexError):
                    ring.pop()
        elif len(model) == capacity:
            with pytest.raises(OverflowError):
                ring.push(op)
        else:
            ring.push(op)
            model.append(op)
        assert len(ring) == len(model)
    assert drain(ring) == list(model)


@impl
@settings(max_examples=200, deadline=None)
@given(
    plans=st.integers(0, 12),
    ops=st.lists(st.one_of(st.none(), st.integers(0, 2**62)), max_size=120),
)
def test_ring_from_range_matches_deque(mod, plans, ops):
    """A ring from ``range`` (the compiled one keeps C indices there and references to the
    ints pushed later) agrees with a deque through mixed pushes and pops."""
    ring = mod.FifoRing.range(plans)
    model: deque[int] = deque(range(plans))
    for op in ops:
        if op is None:
            if model:
                assert ring.pop() == model.popleft()
        elif len(model) < plans:
            ring.push(op)
            model.append(op)
        assert len(ring) == len(model)
    assert drain(ring) == list(model)


class Index:
    def __index__(self) -> int:
        return 6


@impl
def test_ring_pops_plain_ints(mod):
    """Whatever stood for an index when pushed comes back as the plain int."""
    ring = mod.FifoRing(4)
    for value in (True, Index(), 2**40, sys.maxsize):
        ring.push(value)
    popped = drain(ring)
    assert popped == [1, 6, 2**40, sys.maxsize]
    assert all(type(value) is int for value in popped)


@pytest.mark.skipif(
    _impl.extensions_disabled() or _impl.native_module("admission") is None,
    reason="the compiled module is not built or not enabled",
)
def test_native_ring_releases_what_it_holds():
    """The compiled ring holds a reference to each int pushed and gives it back on pop, or
    drops it with the ring."""
    ring_type = _impl.native_module("admission").FifoRing
    value = int("1000000007")  # a fresh object, not a shared constant
    before = sys.getrefcount(value)
    ring = ring_type(4)
    for _ in range(3):
        ring.push(value)
    assert sys.getrefcount(value) == before + 3
    assert ring.pop() is value
    assert sys.getrefcount(value) == before + 2
    del ring
    assert sys.getrefcount(value) == before
    ring = ring_type.range(2)
    ring.pop()
    ring.push(value)
    assert (ring.pop(), ring.pop()) == (1, value)
    assert sys.getrefcount(value) == before


class HeapqSlots:
    """Reference model: the set of held slots plus a heapq of freed ones."""

    def __init__(self) -> None:
        self.held: set[int] = set()
        self.free: list[int] = []
        self.peak = 0

    def acquire(self) -> int:
        if self.free:
            slot = heapq.heappop(self.free)
        else:
            slot, self.peak = self.peak, self.peak + 1
        self.held.add(slot)
        return slot

    def release(self, slot: int) -> None:
        self.held.remove(slot)
        heapq.heappush(self.free, slot)


ALLOCATOR_OPS = st.lists(
    st.one_of(
        st.just(("acquire", 0)),
        st.tuples(st.just("release_held"), st.integers(0, 10**6)),  # the k-th held slot
        st.tuples(st.just("release"), st.integers(-2, 70)),  # any slot, often not held
    ),
    max_size=200,
)


@impl
@settings(max_examples=400, deadline=None)
@given(ops=ALLOCATOR_OPS)
def test_allocator_matches_heapq_model(mod, ops):
    """Random acquire/release sequences agree with the heapq model, errors included."""
    pool = mod.SlotAllocator()
    model = HeapqSlots()
    for kind, value in ops:
        if kind == "acquire":
            assert pool.acquire() == model.acquire()
            continue
        if kind == "release_held" and not model.held:
            continue
        slot = sorted(model.held)[value % len(model.held)] if kind == "release_held" else value
        if slot in model.held:
            pool.release(slot)
            model.release(slot)
        else:
            with pytest.raises(ValueError, match="not held"):
                pool.release(slot)
        assert (pool.active, len(pool), pool.peak) == (len(model.held), len(model.held), model.peak)
        assert {s for s in range(-2, model.peak + 2) if s in pool} == model.held
    # Draining afterwards must hand back every free slot in ascending order.
    expected = sorted(model.free)
    assert [pool.acquire() for _ in expected] == expected


# --- ClosedLoopAdmission ------------------------------------------------------------------


@impl
def test_rolling_admission_refills_freed_slot_in_fifo_order(mod):
    with using(mod):
        loop = ClosedLoopAdmission(4, 2)  # plans a, b, c, d = 0, 1, 2, 3
        assert loop.initial() == [(0, 0), (1, 1)]
        assert (loop.effective_max, loop.remaining, loop.active) == (2, 2, 2)
        assert loop.on_finish(1) == 2  # (slot 1, c)
        assert loop.on_finish(0) == 3  # (slot 0, d)
        assert (loop.remaining, loop.active) == (0, 2)
        assert loop.on_finish(1) is None
        assert loop.on_finish(0) is None
        assert (loop.remaining, loop.active) == (0, 0)
        assert simulate_closed_loop(4, 2, finish_slots=[1, 0]) == [(0, 0), (1, 1), (1, 2), (0, 3)]


@impl
def test_limit_is_validated(mod):
    with using(mod):
        with pytest.raises(ValueError, match="greater than zero"):
            ClosedLoopAdmission(3, 0)
        with pytest.raises(ValueError, match="greater than zero"):
            ClosedLoopAdmission(3, -1)
        with pytest.raises(ValueError, match="non-negative"):
            ClosedLoopAdmission(-1, None)
        loop = ClosedLoopAdmission(1, 2)
        assert loop.effective_max == 1
        assert loop.initial() == [(0, 0)]
        assert loop.remaining == 0
        assert loop.on_finish(0) is None
        assert loop.active == 0


@impl
def test_no_limit_admits_every_plan_at_once(mod):
    with using(mod):
        loop = ClosedLoopAdmission(5, None)
        assert loop.effective_max == 5
        assert loop.initial() == [(s, s) for s in range(5)]
        assert loop.remaining == 0
        empty = ClosedLoopAdmission(0, 3)
        assert (empty.effective_max, empty.initial(), empty.remaining) == (0, [], 0)
        assert simulate_closed_loop(0, None) == []


@impl
def test_shapes(mod):
    with using(mod):
        # 8 agents, max 4: 0-3 start in slots 0-3, 4-7 refill the slots in order.
        assert simulate_closed_loop(8, 4) == [(s % 4, s) for s in range(8)]
        assert ClosedLoopAdmission(8, 4).effective_max == 4
        # Two trajectories, max 1: both run in slot 0, one after the other.
        assert simulate_closed_loop(2, 1) == [(0, 0), (0, 1)]


@impl
def test_on_finish_of_unoccupied_slot(mod):
    with using(mod):
        loop = ClosedLoopAdmission(2, 2)
        with pytest.raises(ValueError, match="routing slot 2 is not occupied"):
            loop.on_finish(2)
        assert loop.on_finish(0) is None
        with pytest.raises(ValueError, match="routing slot 0 is not occupied"):
            loop.on_finish(0)
        assert loop.active == 1
        with pytest.raises(ValueError, match="not occupied"):
            simulate_closed_loop(3, 2, finish_slots=[1, 1, 1])


@impl
def test_initial_is_a_copy(mod):
    with using(mod):
        loop = ClosedLoopAdmission(3, 2)
        loop.initial().clear()
        assert loop.initial() == [(0, 0), (1, 1)]


@impl
def test_simulate_mixes_scripted_and_oldest_first(mod):
    with using(mod):
        # Slot 1 finishes first (c into 1); then oldest first: a (slot 0) -> d, b is stale,
        # c (slot 1) -> e.
        assert simulate_closed_loop(5, 2, finish_slots=[1]) == [
            (0, 0),
            (1, 1),
            (1, 2),
            (0, 3),
            (1, 4),
        ]


@impl
@settings(max_examples=200, deadline=None)
@given(
    n_plans=st.integers(0, 30),
    max_active=st.one_of(st.none(), st.integers(1, 10)),
    data=st.data(),
)
def test_closed_loop_properties(mod, n_plans, max_active, data):
    """Whatever finishes when, plans are admitted once each, in order, into the freed slot."""
    with using(mod):
        loop = ClosedLoopAdmission(n_plans, max_active)
        k = min(max_active or n_plans, n_plans)
        assert loop.effective_max == k
        assert loop.initial() == [(s, s) for s in range(k)]
        occupant = dict(loop.initial())
        next_plan = k
        while occupant:
            slot = data.draw(st.sampled_from(sorted(occupant)))
            following = loop.on_finish(slot)
            if next_plan < n_plans:
                assert following == next_plan
                occupant[slot] = following
                next_plan += 1
            else:
                assert following is None
                del occupant[slot]
            assert (loop.active, loop.remaining) == (len(occupant), n_plans - next_plan)
            assert loop.active <= k
        assert next_plan == n_plans


# --- implementation selection -------------------------------------------------------------


def test_admission_uses_the_selected_implementation():
    native = None if _impl.extensions_disabled() else _impl.native_module("admission")
    chosen = native or _impl.twin_module("admission")
    assert admission.FifoRing is chosen.FifoRing
    assert admission.SlotAllocator is chosen.SlotAllocator
    assert admission.SlotPool is admission.SlotAllocator


def test_native_and_twin_expose_the_same_api():
    native = _impl.native_module("admission")
    if native is None:
        pytest.skip("the native admission module is not built")
    twin = _impl.twin_module("admission")
    for name in ("FifoRing", "SlotAllocator"):
        public = {a for a in dir(getattr(twin, name)) if not a.startswith("_")}
        assert public == {a for a in dir(getattr(native, name)) if not a.startswith("_")}
    assert public == {"acquire", "release", "active", "peak"}


def test_no_extensions_environment_selects_the_twin():
    env = {**os.environ, "BATCHBENCH_NO_EXTENSIONS": "1"}
    code = "from batchbench.drive import admission; print(admission.FifoRing.__module__)"
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "batchbench.drive._admission_py"
