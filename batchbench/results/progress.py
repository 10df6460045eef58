"""The progress bar of a live run: on stderr, only when stderr is a terminal."""

from __future__ import annotations

import asyncio
import sys
import time

from batchbench.results.recording import Recorder

REFRESH_SECONDS = 0.5


def progress_wanted(disabled: bool) -> bool:
    return not disabled and sys.stderr.isatty()


class Progress:
    """Trajectories finished of total, with active agents, req/s and failures."""

    def __init__(self, total: int, recorder: Recorder) -> None:
        from tqdm import tqdm

        self._recorder = recorder
        self._bar = tqdm(
            total=total, unit="traj", file=sys.stderr, dynamic_ncols=True, desc="trajectories"
        )
        self._started = time.perf_counter()

    def trajectory_finished(self) -> None:
        self._bar.update(1)

    async def refresh(self) -> None:
        """Update the postfix twice a second (never per request)."""
        recorder = self._recorder
        while True:
            await asyncio.sleep(REFRESH_SECONDS)
            totals = recorder.totals
            elapsed = time.perf_counter() - self._started
            self._bar.set_postfix(
                active=len(recorder.agents),
                req_s=f"{totals.total_requests / elapsed:.1f}" if elapsed > 0 else "0",
                failed=totals.failed_requests,
                refresh=True,
            )

    def close(self) -> None:
        self._bar.close()
