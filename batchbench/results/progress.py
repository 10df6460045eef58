"""The progress bar of a live run: on stderr, only when stderr is a terminal."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Sized
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from batchbench.results.metrics import RunTotals

REFRESH_SECONDS = 0.5


class ProgressSource(Protocol):
    """What the bar reads: a live run's ``Recorder``, or the workers' sum of theirs."""

    @property
    def totals(self) -> RunTotals: ...

    @property
    def agents(self) -> Sized: ...  # the active agents


def progress_wanted() -> bool:
    """A bar only where someone watches: stderr is a terminal."""
    return sys.stderr.isatty()


class Progress:
    """Requests settled of those planned (a long trajectory moves the bar at every
    request, not only when it ends), with trajectories done, active agents, throughput in
    requests and output tokens, and failures."""

    def __init__(self, trajectories: int, requests: int, recorder: ProgressSource) -> None:
        from tqdm import tqdm

        self._recorder = recorder
        self._trajectories = trajectories
        self._finished = 0
        self._bar = tqdm(
            total=requests, unit="req", file=sys.stderr, dynamic_ncols=True, desc="requests"
        )
        self._started = time.perf_counter()

    def trajectory_finished(self) -> None:
        self._finished += 1

    def trajectories_finished(self, count: int) -> None:
        """Set the count (worker processes report theirs to the parent)."""
        self._finished = count

    async def refresh(self) -> None:
        """Redraw twice a second (never per request)."""
        while True:
            await asyncio.sleep(REFRESH_SECONDS)
            self.draw()

    def draw(self) -> None:
        recorder = self._recorder
        totals = recorder.totals
        settled = totals.total_requests + totals.cancelled_requests
        elapsed = time.perf_counter() - self._started
        bar = self._bar
        assert bar.total is not None  # set to the planned requests
        bar.n = min(settled, bar.total)
        bar.set_postfix(
            traj=f"{self._finished}/{self._trajectories}",
            active=len(recorder.agents),
            out_tok_s=f"{totals.total_output_tokens / elapsed:.0f}" if elapsed > 0 else "0",
            failed=totals.failed_requests,
            refresh=True,
        )

    def close(self) -> None:
        self.draw()
        self._bar.close()
