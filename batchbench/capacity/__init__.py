"""Capacity search: how many concurrent agents a deployment holds while its service-level
objectives hold (``batchbench capacity``; from Python ``batchbench.capacity(config,
slo=..., output_dir=...)``, or ``run_capacity``).

The same workload runs at increasing active-agent caps, doubling until a step breaks the
objectives, then bisecting to a stated resolution; every step has a warm-up left out of
its figures and a fixed measured window, and its verdict carries its confidence.
"""

from __future__ import annotations

import sys
import types
from typing import Any

from batchbench.capacity.api import CapacityResult, capacity, run_capacity
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
    "capacity",
    "run_capacity",
    "run_search",
]


class _CallableModule(types.ModuleType):
    """``batchbench.capacity`` is this package and the search function at once:
    ``batchbench.capacity(config, slo=..., output_dir=...)`` calls ``capacity``."""

    def __call__(self, *args: Any, **kwargs: Any) -> CapacityResult:
        return capacity(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
