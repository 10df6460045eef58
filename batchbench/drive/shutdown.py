"""Graceful interruption, outputs still written: stop admission, a grace period, then cancel.

The first SIGINT or SIGTERM stops admission and ends every pending tool sleep at once;
requests in flight get ``grace`` seconds to finish. When the grace period ends, or at a
second signal, ``cancelled`` is set and the engine cancels whatever still runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import FrameType

    # What signal.getsignal returns (a Handlers value is an int).
    _Handler = Callable[[int, FrameType | None], Any] | int | None

EXIT_STATUS = {"SIGINT": 130, "SIGTERM": 143}
CANCELLED_IN_FLIGHT = "cancelled in flight when the grace period ended"
CANCELLED_WAITING = "cancelled by the shutdown while waiting to retry"

_stopped_by_signal = False  # a signal stopped a run of this process (see signal_stopped_a_run)


def note_signal_stop() -> None:
    """A signal stopped a run of this process (its graceful stop, or a worker run's)."""
    global _stopped_by_signal
    _stopped_by_signal = True


def signal_stopped_a_run() -> bool:
    """Whether a signal stopped a run of this process: a console then takes a late signal,
    which arrives after the run gave its handlers back, as part of the same interruption."""
    return _stopped_by_signal


async def abandon(task: asyncio.Future | None) -> None:
    """Cancel a half-built next request and collect its outcome, so no error of it goes
    unretrieved."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(BaseException):
        await task


class Shutdown:
    """Shared stop state of one run; create it inside the running event loop."""

    def __init__(self, grace_seconds: float = 5.0) -> None:
        self.grace_seconds = grace_seconds
        self.stopped = False
        self.signal_name: str | None = None
        self.finished_by: str | None = None  # a planned end: "duration", "window"
        self.finished_at: float | None = None  # perf_counter time of that end
        self.stop_event = asyncio.Event()
        self.cancel_event = asyncio.Event()
        self._sleepers: set[asyncio.Future] = set()
        self._grace_timer: asyncio.TimerHandle | None = None
        self._loop = asyncio.get_running_loop()
        self._previous: dict[int, _Handler] = {}

    def request(self, signal_name: str) -> None:
        """A signal arrived: the first stops admission, a later one ends the grace period."""
        note_signal_stop()
        if self.stopped:
            if self.signal_name is None:
                self.signal_name = signal_name
            self.cancel_now()
            return
        self.signal_name = signal_name
        self._stop(self.grace_seconds)

    def finish(self, reason: str, grace_seconds: float) -> None:
        """The run reached its planned end (``--duration``, ``--window-trajectories``):
        admission stops and tool delays end as for a signal, but the run is not
        interrupted, and requests in flight get ``grace_seconds`` to finish."""
        if self.stopped:
            return
        self.finished_by = reason
        self.finished_at = time.perf_counter()
        self._stop(grace_seconds)

    def _stop(self, grace_seconds: float) -> None:
        self.stopped = True
        self.stop_event.set()
        for sleeper in self._sleepers:
            if not sleeper.done():
                sleeper.set_result(False)
        self._grace_timer = self._loop.call_later(grace_seconds, self.cancel_now)

    def cancel_now(self) -> None:
        if self._grace_timer is not None:
            self._grace_timer.cancel()
        self.cancel_event.set()

    async def sleep(self, seconds: float) -> bool:
        """Sleep unless stopped; True when the whole sleep happened."""
        if self.stopped:
            return False
        if seconds <= 0:
            return True
        waiter = self._loop.create_future()
        timer = self._loop.call_later(seconds, _wake, waiter)
        self._sleepers.add(waiter)
        try:
            return await waiter
        finally:
            timer.cancel()
            self._sleepers.discard(waiter)

    @property
    def exit_status(self) -> int:
        """130/143 after a signal; 0 after a planned end."""
        if self.signal_name is None:
            return 0
        return EXIT_STATUS.get(self.signal_name, 130)

    def install(self) -> None:
        """Route SIGINT and SIGTERM to ``request`` (Unix event loops)."""
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.getsignal(sig)
            self._loop.add_signal_handler(sig, self.request, sig.name)

    def uninstall(self) -> None:
        """Put back the handlers found at ``install`` (the event loop would leave the
        defaults: a worker process, which ignores signals outside its run, would then die
        of a late SIGTERM or raise KeyboardInterrupt at a late SIGINT)."""
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._loop.remove_signal_handler(sig)
            previous = self._previous.pop(sig, None)
            if previous is not None:
                signal.signal(sig, previous)


def _wake(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_result(True)
