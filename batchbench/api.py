"""Run a benchmark from Python: ``run(config) -> RunResult`` (``run_async`` inside a loop).

A run goes one way through ``batchbench.stages``: the plans, the target (the simulator
started when asked), preparation (tokenizer, reply accounting, calibration), execution
(dry or live) and the result with its files. It prints nothing unless given a
``RunOutput``, and writes files only where the config names them. With ``workers`` above 1
the run is split over processes (``batchbench.scale.workers``) and their results merged.
"""

from __future__ import annotations

import asyncio
import threading

from batchbench.config import RunConfig
from batchbench.errors import UsageError
from batchbench.stages.console import RunOutput
from batchbench.stages.finish import RunResult
from batchbench.stages.hosting import OWN_PROCESS, event_loop_runner, guest
from batchbench.stages.outputs import OutputError
from batchbench.stages.sequence import run_stages

__all__ = ["OutputError", "RunOutput", "RunResult", "run", "run_async"]


def run(config: RunConfig, *, output: RunOutput | None = None) -> RunResult:
    """Run the benchmark ``config`` describes on a new event loop (uvloop when installed);
    Ctrl+C and SIGTERM stop admission, let requests in flight finish for the grace period,
    and return what was measured (``exit_status`` 130/143). For its duration the garbage
    collector is tuned for many short-lived objects. With ``workers`` above 1 the run is
    split over that many processes and their results merged.

    Called while this thread runs an event loop (a Jupyter notebook, an async program) it
    raises UsageError before anything starts: ``await run_async(config)`` is the way
    there."""
    if _loop_running():
        raise UsageError(
            "run() cannot start a run while an event loop is running in this thread (as in a "
            "Jupyter notebook): use `await run_async(config)` instead"
        )
    if config.worker_count > 1:
        from batchbench.scale.workers import run_workers  # lazy: multiprocessing only for workers

        return run_workers(config, output)
    with event_loop_runner() as runner:
        return runner.run(run_stages(config, output, OWN_PROCESS))


async def run_async(
    config: RunConfig, *, output: RunOutput | None = None, handle_signals: bool = False
) -> RunResult:
    """``run`` for callers that own the event loop: slow setup steps (manifest, tokenizer,
    simulator start) run in threads, and process-wide state is left alone unless asked:
    ``handle_signals`` replaces the loop's SIGINT/SIGTERM handlers with a graceful stop for
    the run (main thread only)."""
    if handle_signals and threading.current_thread() is not threading.main_thread():
        raise UsageError("handle_signals needs the main thread's event loop")
    if config.worker_count > 1:
        from batchbench.scale.workers import run_workers  # lazy: multiprocessing only for workers

        return await asyncio.to_thread(run_workers, config, output)
    return await run_stages(config, output, guest(handle_signals))


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True
