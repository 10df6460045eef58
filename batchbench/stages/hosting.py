"""How a run treats the process it runs in: blocking steps in place or in threads, the
signal handlers, the garbage collector, and (for a worker) a start gate and a monitor.

``run`` owns its process (``OWN_PROCESS``); ``run_async`` is a guest in its caller's loop
(``GUEST``); a ``--workers`` child owns its process and answers to its parent
(``worker``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

from batchbench.drive.engine import StartGate
from batchbench.results.recording import Recorder
from batchbench.results.summary import RunSetup

BlockingCall = Callable[..., Awaitable[Any]]  # call(function, *args): its result, awaited
# monitor(recorder, (trajectories, requests), setup): runs beside a live run until cancelled
Monitor = Callable[[Recorder, tuple[int, int], RunSetup], Awaitable[None]]


async def in_place(function: Callable[..., Any], *args: Any) -> Any:
    """A blocking step run on the loop's thread (the loop has nothing else to do yet)."""
    return function(*args)


async def in_thread(function: Callable[..., Any], *args: Any) -> Any:
    """A blocking step run in a thread (the caller's loop keeps serving its other tasks)."""
    return await asyncio.to_thread(function, *args)


@dataclass(frozen=True)
class Hosting:
    """What a run may do to its process."""

    call: BlockingCall
    handle_signals: bool  # SIGINT/SIGTERM stop the run gracefully (main thread only)
    tune_gc: bool  # the collector tuned for many short-lived objects during a live run
    gate: StartGate | None = None  # awaited just before the clock starts
    monitor: Monitor | None = None


OWN_PROCESS = Hosting(call=in_place, handle_signals=True, tune_gc=True)
GUEST = Hosting(call=in_thread, handle_signals=False, tune_gc=False)


def guest(handle_signals: bool) -> Hosting:
    """A run inside its caller's loop; ``handle_signals`` lends it the loop's signals."""
    return replace(GUEST, handle_signals=handle_signals)


def worker(gate: StartGate, monitor: Monitor) -> Hosting:
    """A ``--workers`` child: its own process, started and watched by its parent."""
    return replace(OWN_PROCESS, gate=gate, monitor=monitor)


def event_loop_runner() -> asyncio.Runner:
    """A runner on uvloop when installed."""
    try:
        import uvloop  # lazy: only a run that owns its loop needs it
    except ImportError:  # pragma: no cover - uvloop is a dependency; keep running without it
        return asyncio.Runner()
    return asyncio.Runner(loop_factory=uvloop.new_event_loop)
