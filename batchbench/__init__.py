"""batchbench: replay agent trajectories against OpenAI-compatible serving stacks.

From Python: ``batchbench.run(RunConfig(...)) -> RunResult`` (``run_async`` inside an event
loop); ``batchbench.capacity(config, slo=..., output_dir=...) -> CapacityResult`` (the
capacity search); ``RunConfig.from_args([...])`` takes ``batchbench-agent`` options;
``batchbench.load(path)`` reads a results or capacity JSON back as its typed document.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = [
    "ApiKey",
    "CapacityDocument",
    "RunConfig",
    "RunResult",
    "Summary",
    "SummaryDocument",
    "__version__",
    "capacity",
    "load",
    "run",
    "run_async",
]

if TYPE_CHECKING:
    from batchbench.api import RunResult, run, run_async
    from batchbench.config import ApiKey, RunConfig
    from batchbench.documents import CapacityDocument, SummaryDocument, load
    from batchbench.results.summary import Summary

_EXPORTS = {
    "ApiKey": "batchbench.config",
    "RunConfig": "batchbench.config",
    "RunResult": "batchbench.api",
    "run": "batchbench.api",
    "run_async": "batchbench.api",
    "Summary": "batchbench.results.summary",
    "load": "batchbench.documents",
    "SummaryDocument": "batchbench.documents",
    "CapacityDocument": "batchbench.documents",
}


def __getattr__(name: str) -> Any:
    """Import the API on first use, so ``import batchbench`` stays cheap for the simulator
    and the command-line tools."""
    import importlib

    if name == "capacity":  # the package, callable: see batchbench.capacity
        return importlib.import_module("batchbench.capacity")
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'batchbench' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
