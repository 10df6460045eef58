"""Watch the worker processes of ``--workers`` without ever blocking on one of them.

One reader thread per worker turns its pipe into messages on a queue, so the main thread
only waits on the queue (a short timeout) and always gets back to its signals, its
deadlines and the processes' exit codes: a worker that dies is noticed at once, and a
stuck one (stopped, or wedged in its delivery) cannot hold the parent.

Signals: the first SIGINT/SIGTERM is passed on to every worker (its graceful stop); a
worker still running its requests ``grace + STOP_MARGIN_SECONDS`` later is killed. The
second is passed on too (the workers cancel what is in flight) and shortens that to
``SECOND_SIGNAL_SECONDS``; a third kills what is left at once. A worker that has finished
its run and is handing its results over gets ``DELIVERY_SECONDS`` for that (until a third
signal). A worker still loading gets
the signals once its graceful stop is installed (so even a double Ctrl+C while loading
ends with a summary); a third signal before the clocks started abandons the run
(``KeyboardInterrupt``).
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from batchbench.config import RunConfig
from batchbench.drive.shutdown import note_signal_stop
from batchbench.errors import BatchbenchError, UsageError
from batchbench.scale.loss import death_cause
from batchbench.scale.salvage import WorkerStart

POLL_SECONDS = 0.1
PROGRESS_SECONDS = 0.5
START_MARGIN_SECONDS = 0.05  # the go message reaches every worker well within this
STOP_MARGIN_SECONDS = 3.0  # after the grace period: for a worker to wrap up and say so
SECOND_SIGNAL_SECONDS = 2.0  # after a second signal, for workers cancelling in flight
DELIVERY_SECONDS = 120.0  # for a worker that finished its run to hand over its data
EXIT_SECONDS = 2.0  # for a process whose pipe closed to report its exit code


@dataclass
class WorkerState:
    """What the parent knows of one worker."""

    index: int
    process: Any
    conn: Connection
    ready: bool = False
    start: WorkerStart | None = None
    counts: tuple[int, ...] | None = None
    peak_active: int = 0
    stopping: float | None = None  # monotonic time it said its run had ended
    result: Any = None  # its ShardData
    error: str | None = None  # what it reported before dying
    closed: float | None = None  # monotonic time its pipe closed
    cause: str | None = None  # set once it is known dead: how it ended
    exitcode: int | None = None
    died_at: float | None = None  # Unix time it was found dead
    deadline: float | None = None  # monotonic: killed if still running its requests then
    deadline_reason: str = ""
    exited: float | None = None  # monotonic time its exit code was first seen

    @property
    def settled(self) -> bool:
        return self.result is not None or self.cause is not None


def _reader(state: WorkerState, inbox: queue.Queue) -> None:
    """Forward every message of one worker, then ``None`` when its pipe closes."""
    try:
        while True:
            inbox.put((state.index, state.conn.recv()))
    except (EOFError, OSError):
        pass
    except Exception as exc:  # a message that cannot be read ends the pipe
        inbox.put((state.index, ("error", "runtime", f"unreadable message: {exc!r}")))
    inbox.put((state.index, None))


class Supervisor:
    """Start the workers together, draw progress, pass signals on, notice deaths."""

    def __init__(self, config: RunConfig, states: list[WorkerState], out: Any) -> None:
        self.config = config
        self.states = states
        self.out = out
        self.inbox: queue.Queue = queue.Queue()
        self.signals: list[int] = []  # appended by the handler, handled by the loop
        self.handled = 0
        self.started = False
        self.start_time: float | None = None  # Unix time the workers' clocks started
        self.warnings: set[str] = set()
        self.writing = False  # after the workers: signals only count

    # -- signals ------------------------------------------------------------------------
    def on_signal(self, signum: int, _frame: Any) -> None:
        """The process's SIGINT/SIGTERM handler: note it (the loop acts on it). A dry run
        has no graceful stop: it ends at once, as one process does; while the outputs are
        written, a third signal abandons them."""
        self.signals.append(signum)
        note_signal_stop()
        if self.config.dry_run and not self.writing:
            raise KeyboardInterrupt
        if self.writing and len(self.signals) >= 3:
            raise KeyboardInterrupt

    @property
    def signal_name(self) -> str | None:
        return signal.Signals(self.signals[0]).name if self.signals else None

    def _handle_signals(self) -> None:
        while self.handled < len(self.signals):
            signum = self.signals[self.handled]
            self.handled += 1
            if not self.started and self.handled >= 3:
                raise KeyboardInterrupt  # still loading, and asked three times: abandon
            for state in self.states:
                if state.ready:
                    self._send(state, signum)
                    self._set_deadline(state, self.handled)

    def _set_deadline(self, state: WorkerState, signals: int) -> None:
        """A worker that got its ``signals``-th signal now must stop running by then."""
        now = time.monotonic()
        if signals == 1:
            when = now + self.config.grace_seconds + STOP_MARGIN_SECONDS
            reason = "did not stop within the grace period"
        elif signals == 2:
            when, reason = now + SECOND_SIGNAL_SECONDS, "did not stop after a second signal"
        else:
            when, reason = now, "was still running at a third signal"
        if state.deadline is None or when < state.deadline:
            state.deadline, state.deadline_reason = when, reason

    @staticmethod
    def _send(state: WorkerState, signum: int) -> None:
        """Pass a signal on to a worker still running its requests (one that has finished
        its run has nothing left to stop)."""
        if state.settled or state.stopping is not None or state.process.pid is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(state.process.pid, signum)

    # -- the loop -----------------------------------------------------------------------
    def run(self, progress: Any = None) -> list[WorkerState]:
        """Until every worker has handed over its results or is known dead."""
        for state in self.states:
            threading.Thread(
                target=_reader, args=(state, self.inbox), name="batchbench-worker-pipe",
                daemon=True,
            ).start()  # fmt: skip
        next_draw = time.monotonic()
        while not all(state.settled for state in self.states):
            self._receive()
            self._handle_signals()
            self._check_processes()
            self._enforce_deadlines()
            self._maybe_start()
            if progress is not None and time.monotonic() >= next_draw:
                progress(self.states)
                next_draw = time.monotonic() + PROGRESS_SECONDS
        return self.states

    def _receive(self) -> None:
        try:
            item = self.inbox.get(timeout=POLL_SECONDS)
        except queue.Empty:
            return
        while True:
            self._message(*item)
            try:
                item = self.inbox.get_nowait()
            except queue.Empty:
                return

    def _message(self, k: int, message: tuple | None) -> None:
        state = self.states[k]
        if message is None:
            state.closed = time.monotonic()
            return
        kind = message[0]
        if kind == "lines" and k == 0:
            self.out.lines(message[1])
        elif kind == "warning" and message[1] not in self.warnings:
            self.warnings.add(message[1])
            self.out.warning(message[1])
        elif kind == "planned":
            state.start = WorkerStart(tuple(message[1]), message[2])
        elif kind == "ready":
            state.ready = True
            for count, signum in enumerate(self.signals[: self.handled], start=1):
                self._send(state, signum)  # what came while it got ready: from now on
                self._set_deadline(state, count)
        elif kind == "progress":
            state.counts = message[1]
            state.peak_active = max(state.peak_active, int(message[1][3]))
        elif kind == "stopping":
            state.stopping = time.monotonic()
        elif kind == "done":
            state.result = message[1]
        elif kind == "error":
            if not self.started:  # it failed while loading: so would the others
                if message[1] == "usage":
                    raise UsageError(message[2])
                raise BatchbenchError(f"worker {k}: {message[2]}")
            state.error = message[2]

    def _check_processes(self) -> None:
        now = time.monotonic()
        for state in self.states:
            if state.settled:
                continue
            exitcode = state.process.exitcode
            if state.closed is None and exitcode is None:
                continue
            if state.closed is not None and exitcode is None:
                if now - state.closed < EXIT_SECONDS:
                    continue  # its exit code is on its way
                state.process.kill()  # closed its pipe but lingers: it is no worker any more
                state.process.join(EXIT_SECONDS)
            elif state.closed is None:
                # Exited: its last messages (its results: maybe large) are still being read
                # from the pipe, whose end of file follows them.
                state.exited = state.exited or now
                if now - state.exited < DELIVERY_SECONDS:
                    continue
            self._dead(state, state.process.exitcode)

    def _dead(self, state: WorkerState, exitcode: int | None, cause: str | None = None) -> None:
        state.exitcode = exitcode
        if cause is None:
            cause = f"failed: {state.error}" if state.error else death_cause(exitcode)
        state.cause = cause
        state.died_at = time.time()
        if not self.started or state.start is None:
            raise BatchbenchError(
                f"worker {state.index} (of {len(self.states)}) {cause} before the run started"
            )
        running = [s for s in self.states if not s.settled]
        tail = "; the other workers run on" if running and not self.signals else ""
        self.out.warning(f"warning: worker {state.index} (of {len(self.states)}, pid "
                         f"{state.process.pid}) {cause}{tail}")  # fmt: skip

    def _enforce_deadlines(self) -> None:
        now = time.monotonic()
        for state in self.states:
            if state.settled or not state.ready:
                continue
            overdue = state.deadline is not None and now >= state.deadline
            if state.stopping is not None and self.handled < 3:  # handing its results over
                overdue = now >= state.stopping + DELIVERY_SECONDS
            if not overdue:
                continue
            state.process.kill()
            state.process.join(EXIT_SECONDS)
            reason = state.deadline_reason or "did not hand over its results"
            self._dead(state, state.process.exitcode, f"{reason} (killed with SIGKILL)")

    def _maybe_start(self) -> None:
        if self.started or not all(state.ready for state in self.states):
            return
        start = time.time() + START_MARGIN_SECONDS
        config = self.config
        if config.start_at is not None:
            if config.start_at < time.time():
                self.out.warning(
                    f"warning: --start-at was {time.time() - config.start_at:.1f} s ago; "
                    "starting now"
                )
            start = max(start, config.start_at)
        for state in self.states:
            with contextlib.suppress(OSError):
                state.conn.send(("go", start))
        self.started = True
        self.start_time = start
