"""Block requests (schema v2): each request rebuilt from its blocks, in block order.

Nothing is carried from one request to the next but the trajectory's seed cache (a seed
sent once is resent byte for byte, a live reply included), the last reply, which the
next uncached live block takes, and what counting the last request learned. The messages
are built by ``batchbench.drive.blockmessages``.

Prompt correction: a real server frames messages, tools and calls in its own chat template,
so a request made of the planned blocks rarely costs exactly its ``prompt_tokens``. The
difference is absorbed by one block: the last one of the request that is new in this
trajectory, plain (a message, not JSON), not live and not shared with another trajectory,
so shared prefixes stay byte-identical. The framing the request will cost is estimated from
what the server reported for earlier requests of the same shape (``BlockFraming``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

from batchbench.drive.blockmessages import (
    Filled,
    LiveFill,
    Rows,
    SentMessages,
    Shorten,
    build,
)
from batchbench.drive.messagecount import MessageCounts, Shortener
from batchbench.plan.workload import BlockPlan
from batchbench.text.blocks import JSON_ROLES, ROLE_ASSISTANT, BlockText, BlockTexts
from batchbench.text.promptcount import SegmentCounter
from batchbench.text.standins import RenderingCounter, StandIns, counted, stand_in


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
    counts: MessageCounts = field(default_factory=MessageCounts)  # the last request counted
    sent_messages: SentMessages = field(default_factory=SentMessages)  # the last one sent
    # The blocks of the request last asked about.
    _rows: Rows | None = field(default=None, init=False, repr=False)

    def reset(self) -> None:
        """A compaction: forget every seed and the last reply."""
        self.cache.clear()
        self.stand_in_of.clear()
        self.counts.clear()
        self.sent_messages.clear()
        self.reply = None
        self.reply_tokens = 0
        self.previous = None

    def rows(self, request: int) -> Rows:
        """The request's blocks as lists (kept while the trajectory is at this request)."""
        rows = self._rows
        if rows is None or rows.request != request:
            rows = self._rows = Rows.of(self.plan, request)
        return rows

    def filled(self, request: int) -> list[Filled | None]:
        """Each block's content (None: not made yet)."""
        return list(map(self.cache.get, self.rows(request).seed))

    def keep_reply(self, message: dict, tokens: int) -> None:
        self.reply = message
        self.reply_tokens = tokens

    def fill_live(self, request: int, texts: BlockTexts, resolve: bool = True) -> None:
        """Give each uncached live block the kept reply (once); the others fall back to text
        generated from their seed. ``resolve=False`` (dry-run) generates them all, uncounted."""
        plan = self.plan
        rows = self.rows(request)
        cache = self.cache
        for seed, live, tokens in zip(rows.seed, rows.live, rows.tokens, strict=True):
            if not live or seed in cache:
                continue
            if resolve and self.reply is not None:
                cache[seed] = LiveFill(self.reply, self.reply_tokens)
                self.reply = None
                continue
            cache[seed] = texts.make(
                plan.seeds[seed], tokens, ROLE_ASSISTANT, bool(plan.shared[seed])
            )
            if resolve:
                self.fallbacks += 1

    def missing(self, request: int) -> list[int]:
        """Rows of the request whose seed has no content yet (first occurrence of each)."""
        rows = self.rows(request)
        cache = self.cache
        seen = set()
        missing = []
        for position, seed in enumerate(rows.seed):
            if seed in cache or seed in seen:
                continue
            seen.add(seed)
            missing.append(rows.first + position)
        return missing

    def absorbing_row(self, request: int, missing: list[int]) -> int | None:
        """The block that takes the prompt correction: the last new, plain, unshared,
        not-live block of the request that occurs once in it."""
        plan = self.plan
        rows = self.rows(request)
        seeds = Counter(rows.seed)
        for row in reversed(missing):
            position = row - rows.first
            seed = rows.seed[position]
            if plan.shared[seed] or rows.live[position] or rows.role[position] in JSON_ROLES:
                continue
            if seeds[seed] == 1:
                return row
        return None

    def content_tokens(self, request: int) -> int:
        """The request's content as it will be sent: cached block counts, live replies as
        rendered."""
        return sum(filled.tokens for filled in self.filled(request) if filled is not None)

    def shape(self, request: int) -> tuple[int, ...]:
        """The request's structure (roles, live ones marked): requests of one shape are
        framed alike by a chat template."""
        rows = self.rows(request)
        return tuple(
            role + (8 if live else 0) for role, live in zip(rows.role, rows.live, strict=True)
        )


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
        # A template that renders each message on its own: requests are counted by the
        # messages they add (batchbench.drive.messagecount).
        self.per_message = isinstance(counter, SegmentCounter) and counter.per_message()
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
        if self.per_message:
            shortener = _shortener(state) if self.stand_ins else None
            return state.counts.count(
                cast(SegmentCounter, counter),
                state.plan.seeds,
                state.rows(request),
                state.filled(request),
                shortener,
            )
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
    planned = sum(state.rows(request).tokens) + overhead
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
    """``{"model":…,"messages":[…],"tools":[…]`` (no closing brace) and the message count;
    the messages shared with the last request sent are not built again."""
    return state.sent_messages.head(
        model, state.plan.seeds, state.rows(request), state.filled(request)
    )


def build_messages(
    state: TrajectoryBlocks, request: int, stand_ins: StandIns | None = None
) -> tuple[list[dict], list[dict]]:
    """The request's messages and tools, in block order. With ``stand_ins`` (to count the
    request, never to send it) every generated text is shortened to its stand-in."""
    shorten = None if stand_ins is None else _shortener(state)(stand_ins)
    built = build(state.plan.seeds, state.rows(request), state.filled(request), shorten=shorten)
    return built.messages, built.tools


def _shortener(state: TrajectoryBlocks) -> Shortener:
    """Generated texts shortened to their stand-ins through a rendering's ``StandIns``
    (each text's stand-in found once, kept by seed)."""
    stand_in_of = state.stand_in_of

    def shortener(stand_ins: StandIns) -> Shorten:
        use = stand_ins.use

        def shorten(seed_index: int, filled: BlockText) -> tuple[str, int]:
            known = stand_in_of.get(seed_index)
            if known is None or known[0] is not filled:
                known = (filled, *stand_in(filled.text))
                stand_in_of[seed_index] = known
            return use(filled.text, known[1], known[2], known[3])

        return shorten

    return shortener
