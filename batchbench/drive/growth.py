"""Requests of a growing conversation (schema v1 and sampled workloads).

Per turn the body is the conversation's serialized prefix plus that turn's tail, built once
and resent unchanged on retries. The next request appends the reply and a tool result sized
so the server sees the planned prompt (``batchbench.drive.sizing``), or starts over with a
fresh user message after a reset. Texts for the next turn are generated while the request
is in flight.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial

from batchbench.drive.context import AgentRun
from batchbench.drive.sizing import Sizing, TrajectorySizer
from batchbench.drive.wire import (
    Conversation,
    Reply,
    assistant_with_tool_call,
    reasoning_of,
    tool_call_id,
    tool_message,
    without_reasoning,
)
from batchbench.text.framing import trimmed


@dataclass(slots=True)
class Prepared:
    """A trajectory's first request: its user message and how it was sized."""

    text: str
    sizing: Sizing
    oracle_seconds: float | None = None


async def prepare_growth(run: AgentRun, agent: int) -> Prepared:
    """The first request's user message, sized (and counted by the server with an oracle)."""
    factory = run.factory
    sizer = TrajectorySizer(run.workload, agent, run.fidelity.framing, run.fidelity.correct)
    sizing = sizer.fresh(0)
    if run.cheap(sizing.tokens):
        text = factory.initial_prompt(agent, sizing.tokens)
    else:
        loop = asyncio.get_running_loop()
        text = await loop.run_in_executor(run.pool, factory.initial_prompt, agent, sizing.tokens)
    if run.fidelity.oracle is None:
        return Prepared(text, sizing)
    text, sizing, seconds = await run.oracle_sized(
        sizer,
        sizing,
        fresh_body(run.settings.body.model),
        partial(factory.initial_prompt, agent),
        text,
    )
    return Prepared(text, sizing, seconds)


class GrowthRequests:
    """The ``RequestBuilder`` of a growing conversation: one per trajectory."""

    __slots__ = (
        "_agent",
        "_appends",
        "_conversation",
        "_counting",
        "_env_pending",
        "_env_planned",
        "_following_reset",
        "_message",
        "_next_planned",
        "_previous",
        "_reply_parts",
        "_reset_pending",
        "_run",
        "_served",
        "_sizer",
        "_turns",
        "oracle_seconds",
        "sizing",
    )

    def __init__(self, run: AgentRun, agent: int, prepared: Prepared) -> None:
        self._run = run
        self._agent = agent
        self._turns = run.workload.turns(agent)
        fidelity = run.fidelity
        self._sizer = TrajectorySizer(run.workload, agent, fidelity.framing, fidelity.correct)
        self._conversation = Conversation(run.settings.body.model)
        self._conversation.reset(prepared.text)
        self.sizing = prepared.sizing
        self.oracle_seconds = prepared.oracle_seconds
        # (served, rendered reply, tool tokens) of the request before; None: a fresh one.
        self._previous: tuple[int, int, int] | None = None
        # What the current request leaves for the next one (set by body and replied).
        self._following_reset = False
        self._appends = False
        self._env_planned = 0
        self._env_pending: asyncio.Future | None = None
        self._next_planned = 0
        self._reset_pending: asyncio.Future | None = None
        self._served = 0
        self._message: dict = {}
        self._reply_parts: tuple = (None, None)
        self._counting: int | asyncio.Future | None = None

    def body(self, turn: int, request: int, fields: bytes) -> bytes:
        """The conversation so far and ``fields``; starts making the next turn's text."""
        run = self._run
        workload = run.workload
        turns = self._turns
        last = len(turns) - 1
        following_reset = self._following_reset = turn < last and bool(
            workload.reset_before[turns[turn + 1]]
        )
        appends = self._appends = turn < last and not following_reset
        factory = run.factory
        self._env_planned = int(workload.environment_tokens[request])
        self._env_pending = (
            run.text_later(factory.environment, self._agent, turn, self._env_planned)
            if appends
            else None
        )
        self._reset_pending = None
        self._next_planned = 0
        if following_reset:
            self._next_planned = int(workload.input_content_tokens[turns[turn + 1]])
            self._reset_pending = run.text_later(
                factory.reset_prompt, self._agent, turn + 1, self._next_planned
            )
        return self._conversation.body(b"]," + fields)

    def served(self, turn: int, request: int, reply: Reply) -> int:
        """Teach the framing estimate what the server counted around the content."""
        framing = self._run.fidelity.framing
        served = self._served = reply.prompt_tokens
        if self._run.fidelity.correct:
            previous = self._previous
            if previous is None:
                framing.observe_initial(served - self.sizing.tokens)
            else:
                framing.observe_turn(
                    served - previous[0] - previous[1] - previous[2], previous[2] > 0
                )
        return framing.initial

    def replied(self, turn: int, request: int, reply: Reply) -> int | asyncio.Future | None:
        fidelity = self._run.fidelity
        message = reply.message if fidelity.keep_reasoning else without_reasoning(reply.message)
        content = message.get("content")
        reasoning = reasoning_of(message)
        counting = None
        if self._appends and fidelity.correct:
            content, reasoning = trimmed(content), trimmed(reasoning)
            counting = self._run.rendered(content, reasoning)
        self._message = message
        self._reply_parts = (content, reasoning)
        self._counting = counting
        return counting

    def build(self, turn: int) -> Awaitable[None]:
        """The next request: its tool result appended, or a fresh prompt after a reset."""
        return self._build_reset(turn) if self._following_reset else self._build_appended(turn)

    async def _build_reset(self, turn: int) -> None:
        # A reply before a reset is not counted (nothing renders it).
        run, agent, sizer = self._run, self._agent, self._sizer
        factory = run.factory
        sizing = sizer.fresh(turn + 1)
        text = await run.text(
            self._reset_pending, self._next_planned, factory.reset_prompt, agent, turn + 1,
            sizing.tokens,
        )  # fmt: skip
        seconds = None
        if run.fidelity.oracle is not None:
            text, sizing, seconds = await run.oracle_sized(
                sizer, sizing, fresh_body(run.settings.body.model),
                partial(factory.reset_prompt, agent, turn + 1), text,
            )  # fmt: skip
        self._conversation.reset(text)
        self.sizing, self.oracle_seconds, self._previous = sizing, seconds, None

    async def _build_appended(self, turn: int) -> None:
        counting = self._counting
        counted = await counting if isinstance(counting, asyncio.Future) else counting
        run, agent, sizer = self._run, self._agent, self._sizer
        factory = run.factory
        conversation = self._conversation
        sizing = sizer.appended(turn, self._served, counted)
        call = tool_call_id(agent, turn + 1)
        env_text = await run.text(
            self._env_pending, self._env_planned, factory.environment, agent, turn, sizing.tokens
        )
        content, reasoning = self._reply_parts
        assistant = (
            assistant_with_tool_call(self._message, call, content, reasoning)
            if run.fidelity.correct
            else assistant_with_tool_call(self._message, call)
        )
        seconds = None
        if run.fidelity.oracle is not None:

            def build(candidate: str) -> bytes:
                return conversation.tokenize_body(assistant, tool_message(call, candidate))

            env_text, sizing, seconds = await run.oracle_sized(
                sizer, sizing, build, partial(factory.environment, agent, turn), env_text
            )
        conversation.append(assistant, tool_message(call, env_text))
        self.sizing, self.oracle_seconds = sizing, seconds
        self._previous = (self._served, counted or 0, sizing.tokens)


def fresh_body(model: str) -> Callable[[str], bytes]:
    """Builds the tokenize body of a conversation that is one user message."""
    conversation = Conversation(model)

    def build(text: str) -> bytes:
        conversation.reset(text)
        return conversation.tokenize_body()

    return build
