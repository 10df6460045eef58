"""Capacity search: how many concurrent agents a deployment holds while its service-level
objectives hold (``batchbench capacity``, or ``run_capacity`` from Python).

The same workload runs at increasing active-agent caps, doubling until a step breaks the
objectives, then bisecting to a stated resolution; every step has a warm-up left out of
its figures and a fixed measured window, and its verdict carries its confidence.
"""

from __future__ import annotations

from batchbench.capacity.api import CapacityResult, run_capacity
from batchbench.capacity.search import (
    CLIENT_BOUND,
    FAIL,
    PASS,
    UNRESOLVED,
    Bounds,
    Search,
    StepRecord,
    run_search,
)
from batchbench.capacity.steps import StepInterrupted, WindowPlan

__all__ = [
    "CLIENT_BOUND",
    "FAIL",
    "PASS",
    "UNRESOLVED",
    "Bounds",
    "CapacityResult",
    "Search",
    "StepInterrupted",
    "StepRecord",
    "WindowPlan",
    "run_capacity",
    "run_search",
]
