"""The dry-run agent loop: materialize every text of a trajectory, send nothing."""

from __future__ import annotations

import asyncio
from concurrent.futures import Executor

from batchbench.drive.blocks import TrajectoryBlocks, prepare_blocks
from batchbench.plan.workload import Workload
from batchbench.results.lifecycle import Outcome
from batchbench.text.blocks import BlockTexts
from batchbench.text.content import ContentFactory

# Texts up to this many tokens are generated without the pool: a few microseconds of
# synthesis against tens for the round trip through a worker thread.
INLINE_TOKENS = 2048


class DryRunLoop:
    """Generates each trajectory's texts off the event loop; unconstructable content fails the run.

    Completion is instant, and agents that complete at the same instant finish in admission
    order, so slot inheritance (and so every dry-run line) is the same on every run.
    """

    # Agents running at once (``run_closed_loop``): enough to keep the generation pool
    # busy; the rest of a large initial wave waits its turn instead of holding a task.
    start_window = 1024

    def __init__(self, factory: ContentFactory, workload: Workload, pool: Executor) -> None:
        self.factory = factory
        self.workload = workload
        self.pool = pool
        self._last_finish: asyncio.Future | None = None
        self._blocks = BlockTexts(factory.synth) if workload.blocks is not None else None

    async def prepare(self, agent: int):
        """Generate the first request's text; only a block trajectory keeps what it made
        (its block cache), since nothing is sent: a million texts need not be held. A
        short text is made on the loop's thread: handing it to the pool costs more."""
        loop = asyncio.get_running_loop()
        if self.workload.has_blocks(agent):
            return await loop.run_in_executor(self.pool, self._first_blocks, agent)
        first = self.workload.request_offsets[agent]
        if self.workload.input_content_tokens[first] <= INLINE_TOKENS:
            self.factory.initial_prompt(agent)
        else:
            await loop.run_in_executor(self.pool, self.factory.initial_prompt, agent)
        return None

    def _first_blocks(self, agent: int) -> TrajectoryBlocks:
        """The first request's blocks, live ones generated from their seeds (a dry run has
        no replies, and counts no fallback)."""
        assert self.workload.blocks is not None  # a block trajectory's plan has them
        state = TrajectoryBlocks(self.workload.blocks)
        self._fill(state, self.workload.turns(agent)[0])
        return state

    def _fill(self, state: TrajectoryBlocks, request: int) -> None:
        assert self._blocks is not None  # made when the workload has blocks
        prepare_blocks(state, request, self._blocks, 0, 0, None, resolve_live=False)

    def _materialize_rest(self, agent: int, state: TrajectoryBlocks | None = None) -> int:
        """Every environment text but the last turn's (never sent) and every reset prompt,
        or every block of a block trajectory; bytes (or blocks) made."""
        produced = 0
        turns = self.workload.turns(agent)
        if state is not None:
            for request in turns[1:]:
                if self.workload.reset_before[request]:
                    state.reset()
                self._fill(state, request)
                produced += len(state.cache)  # blocks held after this request
            return produced
        reset = self.workload.reset_before
        for turn, request in enumerate(turns):
            if turn > 0 and reset[request]:
                produced += len(self.factory.reset_prompt(agent, turn))
            if turn < len(turns) - 1:
                produced += len(self.factory.environment(agent, turn))
        return produced

    async def run(self, agent: int, slot: int, prepared) -> Outcome:
        loop = asyncio.get_running_loop()
        previous, finished = self._last_finish, loop.create_future()
        self._last_finish = finished
        state = prepared if isinstance(prepared, TrajectoryBlocks) else None
        try:
            if len(self.workload.turns(agent)) > 1:  # one request: nothing more to make
                await loop.run_in_executor(self.pool, self._materialize_rest, agent, state)
            if previous is not None:
                await previous
        finally:
            finished.set_result(None)
        return Outcome.COMPLETED
