"""The open-loop alarm: wakes trajectories at their scheduled times, never early.

Split from the engine because it is about timers, not admission: the event loop's own
timers are too coarse for sub-millisecond admission accuracy (see ``Alarm``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import heapq
import math
import os
import sys
import time
from collections.abc import Callable
from typing import Any, Protocol


class Clock(Protocol):
    """The benchmark clock: seconds since it started, and its origin (perf_counter)."""

    origin: float

    def now(self) -> float: ...


# How long before a due time the open-loop alarm stops sleeping and yields to the loop until
# the time has come (seconds): about how late its timer wakes. A kernel timer wakes a
# sleeping client some 50-100 microseconds after its time; the loop's own timer is up to
# about a millisecond off (either way with uvloop, late with asyncio's loop).
KERNEL_WAKE_EARLY = 0.0001
WAKE_EARLY = 0.0015


class Alarm:
    """Wakes each waiter at its due time on the benchmark clock: never before it, and as soon
    after it as the event loop allows, earliest first (ties in schedule order).

    The event loop's own timers are too coarse for that: uvloop counts them in whole
    milliseconds from a loop time cached at the start of each loop turn, so a sleep ends up
    to about a millisecond early or late, and asyncio's loop rounds its poll timeout up and
    wakes up to 1.5 ms late. So the alarm sleeps until shortly before the earliest due time,
    then yields to the loop, one turn at a time (the loop keeps serving I/O in between),
    until the time has come. On Linux it sleeps on a kernel timer (``_KernelTimer``, on the
    monotonic clock the benchmark clock reads), which ends the loop's poll about a tenth of
    a millisecond after its time, so that last stretch is short (``KERNEL_WAKE_EARLY``) and
    the client stays idle between arrivals; on the loop's timer it is ``WAKE_EARLY``. One
    timer serves every waiting trajectory, and only the alarm yields, however many wait."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._loop = asyncio.get_running_loop()
        self._heap: list[tuple[float, int, asyncio.Future]] = []
        self._pending: asyncio.Handle | None = None  # the next tick on the loop, if any
        self._kernel = _KernelTimer.open()
        if self._kernel is not None:
            try:
                self._loop.add_reader(self._kernel.fd, self._expired)
            except (NotImplementedError, OSError):  # a loop that cannot watch the descriptor
                self._kernel.close()
                self._kernel = None
        self._early = KERNEL_WAKE_EARLY if self._kernel is not None else WAKE_EARLY

    def at(self, due: float, position: int) -> asyncio.Future:
        """A future that resolves at ``due`` seconds on the clock (``position`` breaks ties).
        Cancelling it (as cancelling the task that awaits it does) withdraws the wait."""
        waiter = self._loop.create_future()
        heapq.heappush(self._heap, (due, position, waiter))
        if self._heap[0][2] is waiter:  # the earliest now: the alarm must be back sooner
            self._plan(due)
        return waiter

    def _plan(self, due: float) -> None:
        """Be back shortly before ``due``: on the timer while it is further away, else at
        the next loop turn."""
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None
        remaining = due - self._clock.now()
        if remaining <= self._early:
            self._pending = self._loop.call_soon(self._tick)
        elif self._kernel is not None:
            self._kernel.arm(self._clock.origin + due - self._early)
        else:
            self._pending = self._loop.call_later(remaining - self._early, self._tick)

    def _tick(self) -> None:
        """Resolve every waiter whose time has come (dropping withdrawn ones), then plan
        for the next."""
        self._pending = None
        heap, now = self._heap, self._clock.now
        while heap and (heap[0][2].done() or heap[0][0] <= now()):
            waiter = heapq.heappop(heap)[2]
            if not waiter.done():
                waiter.set_result(None)
        if heap:
            self._plan(heap[0][0])

    def _expired(self) -> None:
        """The kernel timer went off (or an earlier arming of it did: harmless)."""
        assert self._kernel is not None  # the reader that calls this goes with the timer
        self._kernel.clear()
        if self._pending is not None:  # a tick already planned: this one replaces it
            self._pending.cancel()
        self._tick()

    def close(self) -> None:
        """Withdraw every wait and release the timer."""
        for _due, _position, waiter in self._heap:
            waiter.cancel()
        self._heap.clear()
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None
        if self._kernel is not None:
            self._loop.remove_reader(self._kernel.fd)
            self._kernel.close()
            self._kernel = None


class _KernelTimer:
    """A Linux timerfd on CLOCK_MONOTONIC (what ``time.perf_counter`` reads there): readable
    once the clock reaches the time it was armed for, to the microsecond. ``open()`` is None
    where there is none (other systems, or no way to reach it)."""

    def __init__(self, fd: int, set_ns: Callable[[int, int], None]) -> None:
        self.fd = fd
        self._set_ns = set_ns

    @classmethod
    def open(cls) -> _KernelTimer | None:
        if not sys.platform.startswith("linux") or not _perf_counter_is_monotonic():
            return None
        flags = os.O_NONBLOCK | os.O_CLOEXEC  # TFD_NONBLOCK and TFD_CLOEXEC are these
        try:
            if hasattr(os, "timerfd_create"):  # Python 3.13+
                return cls(os.timerfd_create(time.CLOCK_MONOTONIC, flags=flags), _os_set_ns)
            libc = _libc_timerfd()
            if libc is None:
                return None
            fd = libc.timerfd_create(time.CLOCK_MONOTONIC, flags)
        except OSError:
            return None
        return cls(fd, _ctypes_set_ns(libc)) if fd >= 0 else None

    def arm(self, at: float) -> None:
        """Go off when the monotonic clock reaches ``at`` seconds (at once if it has)."""
        self._set_ns(self.fd, max(math.ceil(at * 1e9), 1))  # 0 would disarm it

    def clear(self) -> None:
        with contextlib.suppress(BlockingIOError, InterruptedError):
            os.read(self.fd, 8)  # the expiry count; reading it clears readiness

    def close(self) -> None:
        os.close(self.fd)


_TFD_TIMER_ABSTIME = 1


def _os_set_ns(fd: int, ns: int) -> None:
    # Python 3.13+ (mypy checks for 3.11); used only where os.timerfd_create exists.
    os.timerfd_settime_ns(fd, flags=_TFD_TIMER_ABSTIME, initial=ns)  # type: ignore[attr-defined]


@functools.cache
def _libc_timerfd() -> Any:
    """The C library, with timerfd_create and timerfd_settime typed; None without them."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    if not hasattr(libc, "timerfd_create") or not hasattr(libc, "timerfd_settime"):
        return None
    libc.timerfd_create.argtypes = [ctypes.c_int, ctypes.c_int]
    libc.timerfd_settime.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
    return libc


def _ctypes_set_ns(libc: Any) -> Callable[[int, int], None]:
    """timerfd_settime with an absolute expiry in nanoseconds, through one preallocated
    ``struct itimerspec`` (a zero interval, then the expiry: two timespecs)."""
    import ctypes

    spec = (ctypes.c_long * 4)()
    address = ctypes.addressof(spec)
    settime = libc.timerfd_settime

    def set_ns(fd: int, ns: int) -> None:
        spec[2], spec[3] = divmod(ns, 1_000_000_000)
        if settime(fd, _TFD_TIMER_ABSTIME, address, None):
            error = ctypes.get_errno()
            raise OSError(error, os.strerror(error))

    return set_ns


@functools.cache
def _perf_counter_is_monotonic() -> bool:
    return time.get_clock_info("perf_counter").implementation == "clock_gettime(CLOCK_MONOTONIC)"
