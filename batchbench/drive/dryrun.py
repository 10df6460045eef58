"""The dry-run agent loop: materialize every text of a trajectory, send nothing."""

from __future__ import annotations

import asyncio
from concurrent.futures import Executor

from batchbench.plan.workload import Workload
from batchbench.results.lifecycle import Outcome
from batchbench.text.content import ContentFactory


class DryRunLoop:
    """Generates each trajectory's texts off the event loop; unconstructable content fails the run.

    Completion is instant, and agents that complete at the same instant finish in admission
    order, so slot inheritance (and so every dry-run line) is the same on every run.
    """

    def __init__(self, factory: ContentFactory, workload: Workload, pool: Executor) -> None:
        self.factory = factory
        self.workload = workload
        self.pool = pool
        self._last_finish: asyncio.Future | None = None

    async def prepare(self, agent: int) -> str:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.pool, self.factory.initial_prompt, agent)

    def _materialize_rest(self, agent: int) -> int:
        """Every environment text but the last turn's (never sent) and every reset prompt;
        bytes made."""
        produced = 0
        turns = self.workload.turns(agent)
        reset = self.workload.reset_before
        for turn, request in enumerate(turns):
            if turn > 0 and reset[request]:
                produced += len(self.factory.reset_prompt(agent, turn))
            if turn < len(turns) - 1:
                produced += len(self.factory.environment(agent, turn))
        return produced

    async def run(self, agent: int, slot: int, prepared: str) -> Outcome:
        loop = asyncio.get_running_loop()
        previous, finished = self._last_finish, loop.create_future()
        self._last_finish = finished
        try:
            await loop.run_in_executor(self.pool, self._materialize_rest, agent)
            if previous is not None:
                await previous
        finally:
            finished.set_result(None)
        return Outcome.COMPLETED
