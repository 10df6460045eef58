"""A worker that died during a ``--workers`` run: who, how, and what it cost."""

from __future__ import annotations

import signal
from dataclasses import dataclass
from typing import Any


def death_cause(exitcode: int | None) -> str:
    """How a process ended, from its exit code: ``was killed by SIGKILL``."""
    if exitcode is None:
        return "vanished"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"was killed by {name}"
    return f"exited with status {exitcode}"


@dataclass(frozen=True)
class LostWorker:
    """One worker that ended without handing over its results."""

    index: int  # 0-based, as in "worker k owns routing slots k, k+N, ..."
    workers: int
    pid: int | None
    cause: str  # "was killed by SIGKILL", "exited with status 1", "failed: ..."
    exitcode: int | None
    planned_requests: int = 0
    recorded_requests: int = 0
    lost_requests: int = 0
    events_file: bool = False  # its request events were being written

    @property
    def who(self) -> str:
        pid = f", pid {self.pid}" if self.pid is not None else ""
        return f"worker {self.index} (of {self.workers}{pid})"

    def text(self) -> str:
        """The one line that says what happened and what it cost."""
        line = (
            f"{self.who} {self.cause}: {self.recorded_requests} of its "
            f"{self.planned_requests} planned requests recorded, {self.lost_requests} lost"
        )
        if self.lost_requests and not self.events_file:
            line += " (--request-events-jsonl keeps a lost worker's finished requests)"
        return line

    def as_dict(self) -> dict[str, Any]:
        signum = -self.exitcode if self.exitcode is not None and self.exitcode < 0 else None
        return {
            "worker": self.index,
            "workers": self.workers,
            "pid": self.pid,
            "cause": self.cause,
            "signal": _signal_name(signum),
            "exit_status": self.exitcode if signum is None else None,
            "planned_requests": self.planned_requests,
            "recorded_requests": self.recorded_requests,
            "lost_requests": self.lost_requests,
        }


def _signal_name(signum: int | None) -> str | None:
    if signum is None:
        return None
    try:
        return signal.Signals(signum).name
    except ValueError:
        return str(signum)
