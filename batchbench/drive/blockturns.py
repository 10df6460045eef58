"""Requests of a block trajectory (schema v2 with blocks).

Each request is rebuilt from its blocks (``batchbench.drive.blocks``); the reply of a
successful request is kept for the next live block; a reset clears the trajectory's seed
cache. The agent loop (``batchbench.drive.driver``) sends, retries and records these
requests exactly as it does a growing conversation's.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import numpy as np

from batchbench.drive.blockmessages import AssemblyError
from batchbench.drive.blocks import (
    BlockFraming,
    BlockSizing,
    TrajectoryBlocks,
    assemble,
    prepare_blocks,
    resize_absorbing,
    tokenize_body,
)
from batchbench.drive.context import INLINE_COUNT_CHARACTERS, AgentRun
from batchbench.drive.oracle import ORACLE_ROUNDS
from batchbench.drive.wire import Reply, normalized_assistant, reasoning_of, without_reasoning
from batchbench.errors import BatchbenchError
from batchbench.text.blocks import JSON_ROLES, BlockTexts
from batchbench.text.framing import trimmed
from batchbench.text.promptcount import SegmentCounter
from batchbench.text.standincheck import stand_ins_add_up

# Blocks up to this many tokens are made on the loop (fast method; tool blocks when sized
# around stand-ins, else their several encodes go to the worker pool, as longer texts do).
INLINE_BLOCK_TOKENS = 4096


def _short_reply(state: TrajectoryBlocks) -> bool:
    """True when the reply the next live block takes (if any: its content and reasoning)
    is short to encode."""
    reply = state.reply
    if reply is None:
        return True
    size = sum(len(value) for value in reply.values() if isinstance(value, str))
    return size <= INLINE_COUNT_CHARACTERS


@dataclass(slots=True)
class BlockPrepared:
    """A block trajectory's state with its first request's blocks filled."""

    state: TrajectoryBlocks
    sizing: BlockSizing


class BlockRun:
    """What the block trajectories of a run share: their texts and the shared seeds sent."""

    __slots__ = ("run", "sent_shared", "shared_seeds", "stand_ins", "texts")

    def __init__(self, run: AgentRun) -> None:
        self.run = run
        self.texts = BlockTexts(run.factory.synth)
        plan = run.workload.blocks
        assert plan is not None  # a run of block trajectories
        # Seeds more than one trajectory uses (a set: looked up for every block sent).
        self.shared_seeds = frozenset(np.flatnonzero(plan.shared).tolist())
        self.sent_shared: set[int] = set()  # shared seeds some trajectory has sent
        self.stand_ins: bool | None = None  # texts counted through stand-ins; None: not known

    def _stand_ins(self) -> bool:
        """Whether block texts can be counted through stand-ins in the server's template,
        checked once (a few encodes of a sample request)."""
        if self.stand_ins is None:
            counter = self.run.fidelity.prompt_counter
            self.stand_ins = isinstance(counter, SegmentCounter) and stand_ins_add_up(
                counter, self.texts.synth
            )
        return self.stand_ins

    def _inline(self, state: TrajectoryBlocks, request: int) -> bool:
        """True when every block still to make, and the request's count in the chat
        template, are cheap enough for the loop: counted through stand-ins, only the kept
        reply is new text to encode, and tool blocks are sized around stand-ins too."""
        fidelity = self.run.fidelity
        if not self.run.inline:
            return False
        if fidelity.correct and fidelity.prompt_counter:
            framing = state.framing
            if framing is None or not framing.stand_ins or not _short_reply(state):
                return False
        rows = state.rows(request)
        wrapped_cheap = self.texts.stand_ins
        for row in state.missing(request):
            position = row - rows.first
            if rows.tokens[position] > INLINE_BLOCK_TOKENS:
                return False
            if rows.role[position] in JSON_ROLES and not wrapped_cheap:
                return False
        return True

    async def fill(self, state: TrajectoryBlocks, request: int) -> BlockSizing:
        """Make the blocks ``request`` still lacks, sized against its target."""
        workload = self.run.workload
        overheads = workload.overhead_tokens
        assert overheads is not None  # a workload with blocks has them
        arguments = (
            state,
            request,
            self.texts,
            int(workload.target_prompt_tokens[request]),
            int(overheads[request]),
            state.framing,
        )
        if self._inline(state, request):
            sizing = prepare_blocks(*arguments)
        else:
            loop = asyncio.get_running_loop()
            sizing = await loop.run_in_executor(self.run.pool, prepare_blocks, *arguments)
        if self.run.fidelity.oracle is not None and self.run.fidelity.correct:
            await self._oracle_blocks(state, request, sizing)
        return sizing

    async def _oracle_blocks(
        self, state: TrajectoryBlocks, request: int, sizing: BlockSizing
    ) -> None:
        """With ``--prompt-oracle server``: let the server count the built request and move
        the absorbing block until the count is the target (at most three counts)."""
        oracle = self.run.fidelity.oracle
        assert oracle is not None  # called with an oracle
        started = time.perf_counter()
        model = self.run.settings.body.model
        for _ in range(ORACLE_ROUNDS):
            counted = await oracle.count(tokenize_body(state, request, model))
            if counted == sizing.target or not resize_absorbing(state, sizing, self.texts, counted):
                break
        sizing.oracle_seconds = time.perf_counter() - started
        self.run.recorder.oracle_counted(sizing.oracle_seconds, oracle.queries)

    async def prepare(self, agent: int) -> BlockPrepared:
        """The trajectory's state with its first request's blocks made."""
        fidelity = self.run.fidelity
        framing = None
        if fidelity.correct:
            stand_ins = fidelity.prompt_counter is not None and self._stand_ins()
            framing = BlockFraming(fidelity.prompt_counter, stand_ins)
        workload = self.run.workload
        assert workload.blocks is not None  # a block trajectory's workload has them
        state = TrajectoryBlocks(workload.blocks, framing=framing)
        sizing = await self.fill(state, workload.turns(agent)[0])
        return BlockPrepared(state, sizing)

    def drain_counts(self, state: TrajectoryBlocks) -> None:
        """Hand the trajectory's live-block fallbacks and inexact tool blocks to the run."""
        recorder = self.run.recorder
        if state.fallbacks:
            recorder.live_blocks_fell_back(state.fallbacks)
            state.fallbacks = 0
        if state.inexact:
            recorder.tool_blocks_inexact(state.inexact)
            state.inexact = 0

    def shared_sent_tokens(self, state: TrajectoryBlocks, request: int) -> int:
        """Tokens perfect caching could serve to a fresh block request: its blocks that
        other trajectories sent before (shared seeds), or that this trajectory sent before
        a reset (plain blocks, whose text is their seed's)."""
        rows = state.rows(request)
        sent = self.sent_shared  # holds shared seeds only
        own = state.sent
        return sum(
            tokens
            for seed, live, tokens in zip(rows.seed, rows.live, rows.tokens, strict=True)
            if seed in sent or (seed in own and not live)
        )


class BlockRequests:
    """The ``RequestBuilder`` of a block trajectory: one per trajectory."""

    __slots__ = ("_blocks", "_explain", "_overhead", "_state", "_turns", "sizing")

    def __init__(self, blocks: BlockRun, agent: int, prepared: BlockPrepared) -> None:
        self._blocks = blocks
        self._turns = blocks.run.workload.turns(agent)
        self._state = prepared.state
        self.sizing = prepared.sizing
        self._explain = 0  # shared tokens the current request's cache could hold
        self._overhead = 0  # the current request's manifest overhead
        blocks.drain_counts(self._state)

    @property
    def oracle_seconds(self) -> float | None:
        return self.sizing.oracle_seconds

    def body(self, turn: int, request: int, fields: bytes) -> bytes:
        """The request assembled from its blocks, then ``fields``."""
        state = self._state
        run = self._blocks.run
        try:
            head, _ = assemble(state, request, run.settings.body.model)
        except AssemblyError as exc:
            raise BatchbenchError(str(exc)) from None
        overheads = run.workload.overhead_tokens
        assert overheads is not None  # a workload with blocks has them
        self._overhead = int(overheads[request])
        fresh = turn == 0 or bool(run.workload.reset_before[request])
        # What requests that went out earlier sent: a server prefills in arrival order, so
        # they may be cached by the time this one is (served or still decoding).
        self._explain = self._blocks.shared_sent_tokens(state, request) if fresh else 0
        self._mark_sent(request)
        return head + b"," + fields

    def _mark_sent(self, request: int) -> None:
        state = self._state
        rows = state.rows(request)
        shared = self._blocks.shared_seeds
        self._blocks.sent_shared.update(seed for seed in rows.seed if seed in shared)
        state.sent.update(seed for seed, live in zip(rows.seed, rows.live, strict=True) if not live)

    def served(self, turn: int, request: int, reply: Reply) -> int:
        """Teach the framing what the server counted beyond the blocks."""
        state = self._state
        overhead = self._overhead
        residual = reply.prompt_tokens - state.content_tokens(request)
        framing = state.framing
        if framing is not None:
            if self.sizing.rendered is not None:
                framing.observe_rendered(residual - self.sizing.rendered)
            else:
                framing.observe(state.shape(request), residual, overhead)
        state.previous = (residual, overhead)
        # Perfect caching can hold the blocks sent before and the template's framing around
        # them: bounded by all of this request's framing as the server counted it (the
        # manifest's overhead may undercount it), never below the manifest's figure.
        return self._explain + max(residual, overhead, 0)

    def replied(self, turn: int, request: int, reply: Reply) -> int | None:
        """Keep the reply for the next live block; its rendered size when correcting and
        it is used.

        With the chat template known, a request is sized from its whole rendering, in which
        the reply's own count cancels out (``prepare_blocks`` and ``served`` take the
        content's tokens from the rendering and add them back): the reply is then counted
        only for ``--request-events-jsonl``, which reports it."""
        fidelity = self._blocks.run.fidelity
        message = reply.message if fidelity.keep_reasoning else without_reasoning(reply.message)
        content = message.get("content")
        reasoning = reasoning_of(message)
        rendered = None
        if fidelity.correct:
            assert fidelity.replies is not None  # what correct means
            content, reasoning = trimmed(content), trimmed(reasoning)
            framing = self._state.framing
            rendered_whole = framing is not None and framing.counter is not None
            if not rendered_whole or self._blocks.run.recorder.request_events is not None:
                rendered = fidelity.replies.count(content, reasoning)
        self._state.keep_reply(normalized_assistant(message, content, reasoning), rendered or 0)
        return rendered

    async def build(self, turn: int) -> None:
        """The next request's blocks (after a reset, from an empty seed cache)."""
        blocks = self._blocks
        state = self._state
        following = self._turns[turn + 1]
        if blocks.run.workload.reset_before[following]:
            state.reset()
        self.sizing = await blocks.fill(state, following)
        blocks.drain_counts(state)
