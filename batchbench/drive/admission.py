"""Admission bookkeeping for closed and open loop (docs/manifest.md), free of clocks and I/O.

The engine owns time and preparation; this module only decides *which* plan goes into
*which* routing slot. It runs on the compiled ``FifoRing`` and ``SlotAllocator`` when they
are built, else on their pure-Python twins (``BATCHBENCH_NO_EXTENSIONS=1`` forces those).

API:

- ``FifoRing(capacity)``: fixed-capacity FIFO of plan indices. ``push(i)`` (``ValueError``
  if ``i < 0``, ``OverflowError`` when full), ``pop() -> int`` (``IndexError`` when empty),
  ``len()``, ``capacity``, and ``FifoRing.range(n)``, a full ring holding 0 .. n-1.
- ``SlotAllocator()`` (alias ``SlotPool``, used by open loop): ``acquire() -> int`` takes
  the lowest free slot, ``release(slot)`` (``ValueError`` if the slot is not held),
  ``active`` (held now, also ``len()``), ``peak`` (distinct slots ever allocated, which
  equals the peak concurrency, reported as ``max_active_agents``), ``slot in pool``.
- ``ClosedLoopAdmission(n_plans, max_active)``: ``effective_max``, ``initial()`` (the
  ``(slot, plan)`` pairs admitted at t = 0), ``on_finish(slot) -> plan | None`` (the next
  queued plan, which inherits the slot), ``remaining``, ``active``, ``n_plans``.
- ``simulate_closed_loop(n_plans, max_active, finish_slots=None)``: every admission as
  ``(slot, plan)`` in order, when agents finish instantly (in ``finish_slots`` order, then
  oldest first); for dry-run previews and tests.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from batchbench import _impl

if _impl.NO_EXTENSIONS:
    from batchbench.drive import _admission_py as _backend
else:
    try:
        # mypy types _backend as the twin (same API, batchbench/_native/_admission.pyi)
        from batchbench._native import _admission as _backend  # type: ignore[no-redef]
    except ImportError:  # not built: the twin has the same API and errors
        from batchbench.drive import _admission_py as _backend

FifoRing = _backend.FifoRing
SlotAllocator = _backend.SlotAllocator
# Open loop uses the allocator as-is: a wrapper would add a Python call per operation.
SlotPool = SlotAllocator

__all__ = [
    "ClosedLoopAdmission",
    "FifoRing",
    "SlotAllocator",
    "SlotPool",
    "simulate_closed_loop",
]


def _check_max_active(max_active: int | None) -> None:
    if max_active is not None and max_active <= 0:
        raise ValueError(f"max_active_agents must be greater than zero, got {max_active}")


class ClosedLoopAdmission:
    """Closed loop: the first ``effective_max`` plans take slots 0 .. k-1; a freed slot goes
    to the next plan in queue order.

    The initial wave is admitted at construction; ``initial()`` reports it. The caller
    must call ``on_finish`` once per finished agent (completed or failed) with that
    agent's slot. Admitting replacements in the order ``on_finish`` returns them is the
    caller's job, even when a later replacement is prepared first; this class hands them
    out in FIFO order.
    """

    __slots__ = ("_effective_max", "_n_plans", "_queue", "_slots")

    def __init__(self, n_plans: int, max_active: int | None) -> None:
        if n_plans < 0:
            raise ValueError(f"the number of plans must be non-negative, got {n_plans}")
        _check_max_active(max_active)
        self._n_plans = n_plans
        self._effective_max = n_plans if max_active is None else min(max_active, n_plans)
        self._queue = FifoRing.range(n_plans)
        self._slots = SlotAllocator()
        acquire, pop = self._slots.acquire, self._queue.pop
        # A fresh allocator hands out 0, 1, ... and the ring pops 0, 1, ...: the initial
        # wave is slot s for plan s, kept as its size (a million pairs would be 100 MB).
        for expected in range(self._effective_max):
            if (acquire(), pop()) != (expected, expected):
                raise AssertionError("the initial wave must be slot s for plan s")

    @property
    def n_plans(self) -> int:
        """Plans in the run."""
        return self._n_plans

    @property
    def effective_max(self) -> int:
        """min(max_active or all, n_plans): the slot count, reported as ``max_active_agents``."""
        return self._effective_max

    @property
    def remaining(self) -> int:
        """Plans still waiting for a slot."""
        return len(self._queue)

    @property
    def active(self) -> int:
        """Slots occupied by an admitted agent that has not finished."""
        return self._slots.active

    def initial(self) -> list[tuple[int, int]]:
        """``(slot, plan)`` for the plans admitted at t = 0: slots 0 .. k-1, plans 0 .. k-1."""
        return [(slot, slot) for slot in range(self._effective_max)]

    def on_finish(self, slot: int) -> int | None:
        """The agent in ``slot`` finished: the next queued plan takes the slot, or None.

        ``ValueError`` if ``slot`` is not occupied (a double finish is a bug upstream).
        """
        if slot not in self._slots:
            raise ValueError(f"routing slot {slot} is not occupied")
        if len(self._queue):
            return self._queue.pop()
        self._slots.release(slot)
        return None

    def __repr__(self) -> str:
        return (
            f"ClosedLoopAdmission(n_plans={self._n_plans}, effective_max={self._effective_max}, "
            f"active={self.active}, remaining={self.remaining})"
        )


def simulate_closed_loop(
    n_plans: int, max_active: int | None, finish_slots: Iterable[int] | None = None
) -> list[tuple[int, int]]:
    """Every closed-loop admission as ``(slot, plan)``, in order, when agents finish instantly.

    FIFO admission means entry ``i`` is always plan ``i``; what the schedule decides is the
    slot. ``finish_slots`` gives the slots in the order their agents finish; once it runs
    out (or without it) the longest-running agent finishes next, which is what equal,
    instant agents do. A slot in ``finish_slots`` that is not occupied is a ``ValueError``.
    """
    admission = ClosedLoopAdmission(n_plans, max_active)
    admitted = admission.initial()
    running: deque[tuple[int, int]] = deque(admitted)  # (slot, plan), oldest first
    plan_in_slot = dict(admitted)  # the plan occupying each slot now
    scripted = iter(finish_slots if finish_slots is not None else ())
    while admission.active:
        slot = next(scripted, None)
        if slot is None:
            # Oldest first, skipping entries whose agent already finished by script.
            slot, plan = running.popleft()
            while plan_in_slot.get(slot) != plan:
                slot, plan = running.popleft()
        following = admission.on_finish(slot)
        if following is None:
            del plan_in_slot[slot]
        else:
            admitted.append((slot, following))
            running.append((slot, following))
            plan_in_slot[slot] = following
    return admitted
