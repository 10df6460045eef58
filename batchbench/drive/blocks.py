"""Block requests (schema v2): each request rebuilt from its blocks, in block order.

Nothing is carried from one request to the next but the trajectory's seed cache (a seed
sent once is resent byte for byte, a live reply included) and the last reply, which the
next uncached live block takes. Tool definitions become the body's ``tools``; a tool call
hangs on the preceding assistant message (or on a new one with ``content: null``) and its
id waits in a FIFO until a ``tool`` block answers it.

Prompt correction: a real server frames messages, tools and calls in its own chat template,
so a request made of the planned blocks rarely costs exactly its ``prompt_tokens``. The
difference is absorbed by one block: the last one of the request that is new in this
trajectory, plain (a message, not JSON), not live and not shared with another trajectory,
so shared prefixes stay byte-identical. The framing the request will cost is estimated from
what the server reported for earlier requests of the same shape (``BlockFraming``).
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

import orjson

from batchbench.plan.manifest import BLOCK_ROLES
from batchbench.plan.workload import BlockPlan
from batchbench.text.blocks import (
    JSON_ROLES,
    ROLE_ASSISTANT,
    ROLE_TOOL,
    ROLE_TOOL_CALL,
    ROLE_TOOL_DEFINITION,
    BlockText,
    BlockTexts,
    call_id,
    tool_call,
    tool_entry,
)
from batchbench.text.standins import RenderingCounter, StandIns, counted, stand_in

_DUMPS = orjson.dumps


class AssemblyError(Exception):
    """A block has no prepared content when its request is assembled (a bug upstream)."""


@dataclass(slots=True)
class LiveFill:
    """A live block filled by the previous reply: the normalized reply message itself."""

    message: dict
    tokens: int  # the reply as the next prompt renders it (0 when not counted)


Filled = BlockText | LiveFill


@dataclass(slots=True)
class BlockSizing:
    """How one block request was sized against its target."""

    target: int
    planned: int  # the blocks' tokens as written plus the request's overhead
    correction: int = 0  # tokens added to (negative: removed from) the absorbing block
    note: str | None = None  # why the target could not be reached, when it could not
    rendered: int | None = None  # the framing counted in the known chat template
    absorbing: int | None = None  # the block row that took the correction
    oracle_seconds: float | None = None  # time spent on server counts (--prompt-oracle)


@dataclass
class TrajectoryBlocks:
    """One trajectory's block state: seed cache, kept reply, fallbacks so far."""

    plan: BlockPlan
    cache: dict[int, Filled] = field(default_factory=dict)
    reply: dict | None = None  # the last successful reply, normalized, not used yet
    reply_tokens: int = 0
    fallbacks: int = 0
    inexact: int = 0  # JSON blocks whose wrapper could not reach their size
    previous: tuple[int, int] | None = None  # (residual, manifest overhead) of the last request
    framing: BlockFraming | None = None  # None: blocks sent as written (no correction)
    # Seeds of plain blocks this trajectory sent, kept across resets: their text depends on
    # the seed alone, so a server may still hold them when a reset sends them again.
    sent: set[int] = field(default_factory=set)
    # The stand-in of each cached text (stand_in's result), by seed: texts are counted in
    # every later request of the trajectory, shortened alike each time.
    stand_in_of: dict[int, tuple[BlockText, str, str, int]] = field(default_factory=dict)

    def reset(self) -> None:
        """A compaction: forget every seed and the last reply."""
        self.cache.clear()
        self.stand_in_of.clear()
        self.reply = None
        self.reply_tokens = 0
        self.previous = None

    def keep_reply(self, message: dict, tokens: int) -> None:
        self.reply = message
        self.reply_tokens = tokens

    def fill_live(self, request: int, texts: BlockTexts, resolve: bool = True) -> None:
        """Give each uncached live block the kept reply (once); the others fall back to text
        generated from their seed. ``resolve=False`` (dry-run) generates them all, uncounted."""
        plan = self.plan
        for row in plan.of(request):
            if not plan.live[row]:
                continue
            seed = int(plan.seed[row])
            if seed in self.cache:
                continue
            if resolve and self.reply is not None:
                self.cache[seed] = LiveFill(self.reply, self.reply_tokens)
                self.reply = None
                continue
            self.cache[seed] = texts.make(
                plan.seeds[seed], int(plan.tokens[row]), ROLE_ASSISTANT, bool(plan.shared[seed])
            )
            if resolve:
                self.fallbacks += 1

    def missing(self, request: int) -> list[int]:
        """Rows of the request whose seed has no content yet (first occurrence of each)."""
        plan = self.plan
        seen = set()
        rows = []
        for row in plan.of(request):
            seed = int(plan.seed[row])
            if seed in self.cache or seed in seen:
                continue
            seen.add(seed)
            rows.append(row)
        return rows

    def absorbing_row(self, request: int, missing: list[int]) -> int | None:
        """The block that takes the prompt correction: the last new, plain, unshared,
        not-live block of the request that occurs once in it."""
        plan = self.plan
        seeds = Counter(int(plan.seed[row]) for row in plan.of(request))
        for row in reversed(missing):
            seed = int(plan.seed[row])
            if plan.shared[seed] or plan.live[row] or int(plan.role[row]) in JSON_ROLES:
                continue
            if seeds[seed] == 1:
                return row
        return None

    def content_tokens(self, request: int) -> int:
        """The request's content as it will be sent: cached block counts, live replies as
        rendered."""
        plan = self.plan
        total = 0
        for row in plan.of(request):
            filled = self.cache.get(int(plan.seed[row]))
            if filled is not None:
                total += filled.tokens
        return total

    def shape(self, request: int) -> tuple[int, ...]:
        """The request's structure (roles, live ones marked): requests of one shape are
        framed alike by a chat template."""
        plan = self.plan
        return tuple(int(plan.role[row]) + (8 if plan.live[row] else 0) for row in plan.of(request))


class BlockFraming:
    """What the server's template adds around a block request's content, learned within one
    trajectory (from its own earlier requests only, so a request's bytes never depend on
    when other trajectories' replies arrived).

    When the client knows the server's chat template (``counter``), every request is
    rendered in it and counted (templates drop or reshape tools and calls, so no per-shape
    constant fits), and the most frequent difference between the server's count and that
    rendering (a BOS the template text lacks, say) is added. Otherwise the estimate is the
    most frequent framing seen for requests of its shape; else the last request of the
    trajectory's framing, moved by the difference in the manifest's overheads; else the
    manifest's overhead moved by the most frequent error of that overhead so far. Integer
    counts only, so equal runs estimate alike.
    """

    def __init__(
        self, counter: Callable[[list, list], int] | None = None, stand_ins: bool = False
    ) -> None:
        self.counter = counter
        # True: the counter renders texts through stand-ins (batchbench.text.standins),
        # which BlockRun found to add up for its tokenizer and template.
        self.stand_ins = stand_ins
        self._by_shape: dict[tuple[int, ...], Counter[int]] = {}
        self._estimate: dict[tuple[int, ...], int] = {}
        self._errors: Counter[int] = Counter()
        self._error = 0
        self._biases: Counter[int] = Counter()
        self.bias = 0  # server count minus the rendered count, most frequent

    def rendered(self, state: TrajectoryBlocks, request: int) -> int:
        """The request's tokens in the known chat template (``counter`` set)."""
        counter = self.counter
        assert counter is not None  # called when the template is known
        if not self.stand_ins:
            return counter(*build_messages(state, request))

        def build(stand_ins: StandIns | None) -> tuple[list[dict], list[dict]]:
            return build_messages(state, request, stand_ins)

        return counted(cast(RenderingCounter, counter), build, True)  # see stand_ins

    def observe_rendered(self, difference: int) -> None:
        """The server counted ``difference`` tokens more than the rendering predicted."""
        self._biases[difference] += 1
        if self._biases[difference] > self._biases[self.bias]:
            self.bias = difference

    def estimate(self, shape: tuple[int, ...], overhead: int, previous: tuple[int, int] | None):
        known = self._estimate.get(shape)
        if known is not None:
            return known
        if previous is not None:
            residual, previous_overhead = previous
            return residual - previous_overhead + overhead
        return overhead + self._error

    def observe(self, shape: tuple[int, ...], residual: int, overhead: int) -> None:
        counts = self._by_shape.setdefault(shape, Counter())
        counts[residual] += 1
        current = self._estimate.get(shape)
        if current is None or counts[residual] > counts[current]:
            self._estimate[shape] = residual
        error = residual - overhead
        self._errors[error] += 1
        if self._errors[error] > self._errors[self._error]:
            self._error = error


def prepare_blocks(
    state: TrajectoryBlocks,
    request: int,
    texts: BlockTexts,
    target: int,
    overhead: int,
    framing: BlockFraming | None,
    resolve_live: bool = True,
) -> BlockSizing:
    """Fill every block of ``request`` (live ones first), sizing the absorbing block so the
    request should cost ``target`` tokens; ``framing`` None sends the blocks as written."""
    plan = state.plan
    state.fill_live(request, texts, resolve_live)
    missing = state.missing(request)
    planned = sum(int(plan.tokens[row]) for row in plan.of(request)) + overhead
    sizing = BlockSizing(target, planned)
    for row in missing:
        seed = int(plan.seed[row])
        made = texts.make(
            plan.seeds[seed], int(plan.tokens[row]), int(plan.role[row]), bool(plan.shared[seed])
        )
        if not made.exact:
            state.inexact += 1
        state.cache[seed] = made
    if framing is None:
        return sizing
    content = state.content_tokens(request)  # every block at its planned size
    if framing.counter is not None:
        sizing.rendered = framing.rendered(state, request) - content
        predicted = content + sizing.rendered + framing.bias
    else:
        predicted = content + framing.estimate(state.shape(request), overhead, state.previous)
    absorbing = state.absorbing_row(request, missing)
    if absorbing is None:
        if predicted != target:
            sizing.note = (
                f"no block can absorb a correction of {target - predicted} tokens (every new "
                "block is shared, live or a tool block)"
            )
        return sizing
    sizing.absorbing = absorbing
    planned_size = int(plan.tokens[absorbing])
    predicted -= planned_size  # the other blocks and the framing
    wanted = target - predicted
    size = max(wanted, 0)
    if wanted < 0:
        sizing.note = (
            f"the other blocks and the framing already cost {predicted} tokens of the "
            f"{target}-token target; the absorbing block was sent empty"
        )
    sizing.correction = size - planned_size
    if size != planned_size:
        seed = int(plan.seed[absorbing])
        state.cache[seed] = texts.make(plan.seeds[seed], size, int(plan.role[absorbing]))
    return sizing


def resize_absorbing(
    state: TrajectoryBlocks, sizing: BlockSizing, texts: BlockTexts, counted: int
) -> bool:
    """Move the absorbing block by what a server count of the built request says (the
    prompt oracle); False when it cannot move (no absorbing block, or already empty)."""
    row = sizing.absorbing
    if row is None:
        return False
    plan = state.plan
    seed = int(plan.seed[row])
    current = state.cache[seed].tokens
    wanted = current + sizing.target - counted
    size = max(wanted, 0)
    if size == current:
        return False
    state.cache[seed] = texts.make(plan.seeds[seed], size, int(plan.role[row]))
    sizing.correction += size - current
    sizing.note = (
        None
        if wanted >= 0
        else (
            f"the server counts {counted} tokens with the absorbing block at {current}; the "
            f"{sizing.target}-token target needs {wanted}; sent it empty"
        )
    )
    return True


def tokenize_body(state: TrajectoryBlocks, request: int, model: str) -> bytes:
    """The body that asks a server to count this request through its chat template."""
    head, _ = assemble(state, request, model)
    return head + b',"add_generation_prompt":true}'


def assemble(state: TrajectoryBlocks, request: int, model: str) -> tuple[bytes, int]:
    """``{"model":…,"messages":[…],"tools":[…]`` (no closing brace) and the message count."""
    messages, tools = build_messages(state, request)
    head: dict = {"model": model, "messages": messages}
    if tools:
        head["tools"] = tools
    return _DUMPS(head)[:-1], len(messages)


def build_messages(
    state: TrajectoryBlocks, request: int, stand_ins: StandIns | None = None
) -> tuple[list[dict], list[dict]]:
    """The request's messages and tools, in block order. Attaching tool calls never changes
    a cached message: live replies are copied. With ``stand_ins`` (to count the request,
    never to send it) every generated text is shortened to its stand-in."""
    plan = state.plan
    messages: list[dict] = []
    tools: list[dict] = []
    pending: deque[str] = deque()
    for row in plan.of(request):
        seed_index = int(plan.seed[row])
        seed = plan.seeds[seed_index]
        role = int(plan.role[row])
        filled = state.cache.get(seed_index)
        if filled is None:
            raise AssemblyError(
                f"{BLOCK_ROLES[role]} block with seed {_DUMPS(seed).decode()} has no prepared "
                "content"
            )
        text = (
            _text_of(filled)
            if stand_ins is None
            else _shortened(state, seed_index, filled, stand_ins)
        )
        if role == ROLE_TOOL_DEFINITION:
            tools.append(tool_entry(seed, text))
        elif role == ROLE_TOOL_CALL:
            call = tool_call(seed, text)
            last = messages[-1] if messages else None
            if last is not None and last.get("role") == "assistant":
                last["tool_calls"] = [*last.get("tool_calls", ()), call]
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
            pending.append(call["id"])
        elif role == ROLE_TOOL:
            answered = pending.popleft() if pending else call_id(seed)
            messages.append({"role": "tool", "tool_call_id": answered, "content": text})
        elif isinstance(filled, LiveFill) and role == ROLE_ASSISTANT:
            messages.append(dict(filled.message))
        else:
            messages.append({"role": BLOCK_ROLES[role], "content": text})
    return messages, tools


def _text_of(filled: Filled) -> str:
    """A block's text; a seed first filled by a live reply and reused in another role (a
    redefined seed) gives the reply's content."""
    if isinstance(filled, LiveFill):
        content = filled.message.get("content")
        return content if isinstance(content, str) else ""
    return filled.text


def _shortened(
    state: TrajectoryBlocks, seed_index: int, filled: Filled, stand_ins: StandIns
) -> str:
    """A generated text shortened to its stand-in (a live reply's text kept)."""
    if isinstance(filled, LiveFill):
        return _text_of(filled)
    known = state.stand_in_of.get(seed_index)
    if known is None or known[0] is not filled:
        known = (filled, *stand_in(filled.text))
        state.stand_in_of[seed_index] = known
    return stand_ins.use(filled.text, *known[1:])
