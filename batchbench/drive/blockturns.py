"""The HTTP agent loop of block trajectories (schema v2 with blocks).

Mixed into ``HttpAgentLoop``: it shares that loop's sending, retries, recording and request
events, and differs in how a request is made. Each request is rebuilt from its blocks
(``batchbench.drive.blocks``); the reply of a successful request is kept for the next live
block; a reset clears the trajectory's seed cache.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from batchbench.drive.blocks import (
    AssemblyError,
    BlockFraming,
    BlockSizing,
    TrajectoryBlocks,
    assemble,
    prepare_blocks,
    resize_absorbing,
    tokenize_body,
)
from batchbench.drive.oracle import ORACLE_ROUNDS
from batchbench.drive.shutdown import abandon
from batchbench.drive.wire import (
    body_fields,
    normalized_assistant,
    reasoning_of,
    without_reasoning,
)
from batchbench.errors import BatchbenchError
from batchbench.results.lifecycle import Outcome
from batchbench.text.blocks import JSON_ROLES, BlockTexts
from batchbench.text.framing import trimmed

if TYPE_CHECKING:
    from concurrent.futures import Executor

    from batchbench.drive.driver import DriverSettings, Fidelity
    from batchbench.drive.shutdown import Shutdown
    from batchbench.plan.workload import Workload
    from batchbench.results.recording import Recorder
    from batchbench.text.content import ContentFactory

# Blocks up to this many tokens are made on the loop (plain text, fast method); tool blocks
# (several encodes) and longer texts go to the worker pool.
INLINE_BLOCK_TOKENS = 4096


@dataclass(slots=True)
class BlockPrepared:
    """A block trajectory's state with its first request's blocks filled."""

    state: TrajectoryBlocks
    sizing: BlockSizing


class BlockTurns:
    """Block-trajectory methods of ``HttpAgentLoop`` (which provides the attributes used)."""

    block_texts: BlockTexts | None

    if TYPE_CHECKING:  # what HttpAgentLoop provides
        settings: DriverSettings
        workload: Workload
        factory: ContentFactory
        pool: Executor
        recorder: Recorder
        shutdown: Shutdown
        fidelity: Fidelity
        _inline: bool

        def _identity(self, agent: int, slot: int) -> Any: ...

        async def _exchange(
            self, body, headers, streamed, tag_error, figures, rank, agent, ident, invocation, event
        ) -> Any: ...

        def _request_event(
            self, agent, ident, invocation, slot, rank, request, reply, started, elapsed,
            attempts, status, errors, sizing, rendered, oracle_seconds,
        ) -> None: ...  # fmt: skip

    def _setup_blocks(self) -> None:
        workload = self.workload
        self.block_texts = BlockTexts(self.factory.synth) if workload.blocks is not None else None
        self._sent_shared: set[int] = set()

    def _block_inline(self, state: TrajectoryBlocks, request: int) -> bool:
        """True when every block still to make is cheap enough to make on the loop."""
        if not self._inline or (self.fidelity.correct and self.fidelity.prompt_counter):
            return False  # rendering the request in the chat template is not cheap
        plan = state.plan
        for row in state.missing(request):
            if int(plan.role[row]) in JSON_ROLES or int(plan.tokens[row]) > INLINE_BLOCK_TOKENS:
                return False
        return True

    async def _fill_blocks(self, state: TrajectoryBlocks, request: int) -> BlockSizing:
        workload = self.workload
        texts, overheads = self.block_texts, workload.overhead_tokens
        assert texts is not None and overheads is not None  # a workload with blocks has them
        arguments = (
            state,
            request,
            texts,
            int(workload.target_prompt_tokens[request]),
            int(overheads[request]),
            state.framing,
        )
        if self._block_inline(state, request):
            sizing = prepare_blocks(*arguments)
        else:
            loop = asyncio.get_running_loop()
            sizing = await loop.run_in_executor(self.pool, prepare_blocks, *arguments)
        if self.fidelity.oracle is not None and self.fidelity.correct:
            await self._oracle_blocks(state, request, sizing)
        return sizing

    async def _oracle_blocks(
        self, state: TrajectoryBlocks, request: int, sizing: BlockSizing
    ) -> None:
        """With ``--prompt-oracle server``: let the server count the built request and move
        the absorbing block until the count is the target (at most three counts)."""
        oracle, texts = self.fidelity.oracle, self.block_texts
        assert oracle is not None and texts is not None  # called with an oracle, on blocks
        started = time.perf_counter()
        model = self.settings.body.model
        for _ in range(ORACLE_ROUNDS):
            counted = await oracle.count(tokenize_body(state, request, model))
            if counted == sizing.target or not resize_absorbing(state, sizing, texts, counted):
                break
        sizing.oracle_seconds = time.perf_counter() - started
        self.recorder.oracle_counted(sizing.oracle_seconds, oracle.queries)

    async def _prepare_block_agent(self, agent: int) -> BlockPrepared:
        fidelity = self.fidelity
        framing = BlockFraming(fidelity.prompt_counter) if fidelity.correct else None
        assert self.workload.blocks is not None  # a block trajectory's workload has them
        state = TrajectoryBlocks(self.workload.blocks, framing=framing)
        sizing = await self._fill_blocks(state, self.workload.turns(agent)[0])
        return BlockPrepared(state, sizing)

    def _drain_counts(self, state: TrajectoryBlocks) -> None:
        """Hand the trajectory's live-block fallbacks and inexact tool blocks to the run."""
        if state.fallbacks:
            self.recorder.live_blocks_fell_back(state.fallbacks)
            state.fallbacks = 0
        if state.inexact:
            self.recorder.tool_blocks_inexact(state.inexact)
            state.inexact = 0

    def _shared_sent_tokens(self, state: TrajectoryBlocks, request: int) -> int:
        """Tokens perfect caching could serve to a fresh block request: its blocks that
        other trajectories sent before (shared seeds)."""
        plan = state.plan
        total = 0
        for row in plan.of(request):
            seed = int(plan.seed[row])
            if plan.shared[seed] and seed in self._sent_shared:
                total += int(plan.tokens[row])
        return total

    async def _block_turns(
        self, agent: int, slot: int, prepared: BlockPrepared, figures
    ) -> Outcome:
        """One block trajectory; a request being built is never left running when the
        loop ends (a shutdown, a failure or a cancellation)."""
        building: list[asyncio.Future | None] = [None]
        try:
            return await self._block_loop(agent, slot, prepared, figures, building)
        finally:
            await abandon(building[0])

    async def _block_loop(
        self, agent: int, slot: int, prepared: BlockPrepared, figures, pending: list
    ) -> Outcome:
        settings = self.settings
        workload = self.workload
        recorder = self.recorder
        shutdown = self.shutdown
        fidelity = self.fidelity
        correct = fidelity.correct
        ident = workload.trajectory_ids[agent]
        turns = workload.turns(agent)
        last = len(turns) - 1
        reset = workload.reset_before
        output = workload.output_tokens
        latency_ms = workload.tool_call_latency_ms
        stream_column = workload.request_stream
        cap_column = workload.request_max_tokens
        overheads = workload.overhead_tokens
        assert overheads is not None  # a workload with blocks has them
        framing = prepared.state.framing
        rank, tag, tag_error, headers = self._identity(agent, slot)
        state = prepared.state
        sizing = prepared.sizing
        self._drain_counts(state)
        building: asyncio.Future | None = None  # the next request's blocks, being made

        for turn, request in enumerate(turns):
            if shutdown.stopped:
                return Outcome.INTERRUPTED
            invocation = turn + 1
            fresh = turn == 0 or bool(reset[request])
            if building is not None:
                sizing = await building
                building = pending[0] = None
                self._drain_counts(state)
            try:
                head, _ = assemble(state, request, settings.body.model)
            except AssemblyError as exc:
                raise BatchbenchError(str(exc)) from None
            planned_output = int(output[request])
            cap = int(cap_column[request]) if cap_column is not None else 0
            stream = int(stream_column[request]) if stream_column is not None else -1
            body = (
                head
                + b","
                + body_fields(
                    settings.body,
                    planned_output,
                    tag,
                    cap if cap > 0 else None,
                    None if stream < 0 else bool(stream),
                )
            )
            if sizing.correction or sizing.note is not None:
                recorder.request_sized(bool(sizing.correction), sizing.note is not None)
            overhead = int(overheads[request])
            explain = self._shared_sent_tokens(state, request) if fresh else 0

            streamed = settings.body.stream if stream < 0 else bool(stream)

            def event(
                reply, started, elapsed, attempts, status, errors, rendered=None,
                request=request, invocation=invocation, sizing=sizing,
            ):  # fmt: skip
                self._request_event(
                    agent, ident, invocation, slot, rank, request, reply, started, elapsed,
                    attempts, status, errors, sizing, rendered, sizing.oracle_seconds,
                )  # fmt: skip

            reply, attempts, started, elapsed, errors, ended = await self._exchange(
                body, headers, streamed, tag_error, figures, rank, agent, ident, invocation, event
            )
            if ended is not None:
                return ended
            plan = state.plan
            for row in plan.of(request):
                seed = int(plan.seed[row])
                if plan.shared[seed]:
                    self._sent_shared.add(seed)
            served = reply.prompt_tokens
            completion = reply.completion_tokens
            recorder.request_succeeded(
                figures, rank, served, completion, reply.cached_tokens, elapsed, reply.ttft,
                reply.gaps, reply.tpot, attempts, errors, started,
            )  # fmt: skip
            recorder.request_fidelity(
                figures, turn, sizing.target, served, completion, planned_output, fresh,
                explain + max(overhead, 0), attempts,
            )  # fmt: skip
            recorder.request_done(figures, served, completion)
            residual = served - state.content_tokens(request)
            if framing is not None:
                if sizing.rendered is not None:
                    framing.observe_rendered(residual - sizing.rendered)
                else:
                    framing.observe(state.shape(request), residual, overhead)
            state.previous = (residual, overhead)

            message = reply.message if fidelity.keep_reasoning else without_reasoning(reply.message)
            content = message.get("content")
            reasoning = reasoning_of(message)
            rendered = None
            if correct:
                assert fidelity.replies is not None  # what correct means
                content, reasoning = trimmed(content), trimmed(reasoning)
                rendered = fidelity.replies.count(content, reasoning)
            state.keep_reply(normalized_assistant(message, content, reasoning), rendered or 0)
            event(reply, started, elapsed, attempts, "ok", errors, rendered)
            if turn == last or shutdown.stopped:
                building = None
            else:  # the next request is made while the tool delay runs
                following = turns[turn + 1]
                if reset[following]:
                    state.reset()
                    recorder.conversation_reset(figures)
                building = pending[0] = asyncio.ensure_future(self._fill_blocks(state, following))
            delay = float(latency_ms[request]) / 1000.0
            if delay > 0:
                began = time.perf_counter()
                whole = await shutdown.sleep(delay)
                recorder.tool_slept(time.perf_counter() - began if not whole else delay)
                if not whole:
                    return Outcome.INTERRUPTED
            if turn == last:
                break
        return Outcome.COMPLETED
