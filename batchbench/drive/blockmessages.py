"""A block request's messages and tools (schema v2), built block by block.

Tool definitions become the body's ``tools``; a tool call hangs on the preceding assistant
message (or on a new one with ``content: null``) and its id waits in a FIFO until a
``tool`` block answers it. A message that takes a call is copied, never changed, so built
messages can be kept and reused. The build also notes where each message ends, which call
ids are still unanswered after it and how many tokens its stand-ins leave out: what a
trajectory's next request needs to reuse the messages it shares with this one
(``Kept``).

A request shares its first blocks with the trajectory's last one (the same seeds and
roles, filled with the same content, up to the first block that differs); the messages
made of those blocks are the same, but for the last of them when the new request hangs
a tool call on it. So a request's messages can be built, and counted, from there on.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import compress, count, islice
from operator import is_not, ne

import numpy as np
import orjson

from batchbench.plan.manifest import BLOCK_ROLES
from batchbench.plan.workload import BlockPlan
from batchbench.text.blocks import (
    ROLE_ASSISTANT,
    ROLE_TOOL,
    ROLE_TOOL_CALL,
    ROLE_TOOL_DEFINITION,
    BlockText,
    call_id,
    tool_call,
    tool_entry,
)


class AssemblyError(Exception):
    """A block has no prepared content when its request is assembled (a bug upstream)."""


@dataclass(slots=True)
class LiveFill:
    """A live block filled by the previous reply: the normalized reply message itself."""

    message: dict
    tokens: int  # the reply as the next prompt renders it (0 when not counted)


Filled = BlockText | LiveFill
# A block's text as it goes into a rendering, and the tokens its stand-in leaves out.
Shorten = Callable[[int, BlockText], tuple[str, int]]


@dataclass(frozen=True, slots=True)
class Rows:
    """One request's blocks as Python lists: each is read several times a request, where
    numpy scalars would cost more than the work done with them."""

    request: int
    first: int  # the plan row of the first block: block ``i`` is row ``first + i``
    seed: list[int]
    role: list[int]
    live: list[bool]
    tokens: list[int]
    tool_definitions: list[int]  # the positions of the tool definitions

    @classmethod
    def of(cls, plan: BlockPlan, request: int) -> Rows:
        rows = plan.of(request)
        start, stop = rows.start, rows.stop
        roles = plan.role[start:stop]
        return cls(
            request,
            start,
            plan.seed[start:stop].tolist(),
            roles.tolist(),
            plan.live[start:stop].tolist(),
            plan.tokens[start:stop].tolist(),
            np.flatnonzero(roles == ROLE_TOOL_DEFINITION).tolist(),
        )


@dataclass(slots=True)
class Built:
    """Messages and tools built from a request's blocks, from ``start`` on."""

    messages: list[dict] = field(default_factory=list)
    tools: list[dict] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)  # after each message's last block
    hidden: list[int] = field(default_factory=list)  # tokens each message's stand-ins leave out
    pending: list[tuple[str, ...]] = field(default_factory=list)  # unanswered after each
    tools_hidden: int = 0


def _text_of(filled: Filled) -> str:
    """A block's text; a seed first filled by a live reply and reused in another role (a
    redefined seed) gives the reply's content."""
    if isinstance(filled, LiveFill):
        content = filled.message.get("content")
        return content if isinstance(content, str) else ""
    return filled.text


def build(
    seeds: Sequence[str],
    rows: Rows,
    filled: Sequence[Filled | None],
    start: int = 0,
    pending: Sequence[str] = (),
    shorten: Shorten | None = None,
) -> Built:
    """The messages and tools of blocks ``start`` on (``filled``: each block's content),
    the call ids in ``pending`` still to answer. ``shorten`` gives generated texts as
    their stand-ins (to count the request, never to send it); a live reply is kept."""
    built = Built()
    messages, ends, hidden, after = built.messages, built.ends, built.hidden, built.pending
    queue = deque(pending)
    roles = rows.role
    for position in range(start, len(roles)):
        seed_index, role, content = rows.seed[position], roles[position], filled[position]
        seed = seeds[seed_index]
        if content is None:
            raise AssemblyError(
                f"{BLOCK_ROLES[role]} block with seed {orjson.dumps(seed).decode()} has no "
                "prepared content"
            )
        if shorten is None or isinstance(content, LiveFill):
            text, left_out = _text_of(content), 0
        else:
            text, left_out = shorten(seed_index, content)
        if role == ROLE_TOOL_DEFINITION:
            built.tools.append(tool_entry(seed, text))
            built.tools_hidden += left_out
            continue
        if role == ROLE_TOOL_CALL:
            call = tool_call(seed, text)
            queue.append(call["id"])
            last = messages[-1] if messages else None
            if last is not None and last.get("role") == "assistant":
                messages[-1] = {**last, "tool_calls": [*last.get("tool_calls", ()), call]}
                ends[-1] = position + 1
                hidden[-1] += left_out
                after[-1] = tuple(queue)
                continue
            message = {"role": "assistant", "content": None, "tool_calls": [call]}
        elif role == ROLE_TOOL:
            answered = queue.popleft() if queue else call_id(seed)
            message = {"role": "tool", "tool_call_id": answered, "content": text}
        elif isinstance(content, LiveFill) and role == ROLE_ASSISTANT:
            message = dict(content.message)
        else:
            message = {"role": BLOCK_ROLES[role], "content": text}
        messages.append(message)
        ends.append(position + 1)
        hidden.append(left_out)
        after.append(tuple(queue))
    return built


@dataclass
class Kept:
    """Where the messages of a trajectory's last request built (for one use: counting it
    or sending it) came from, so the next request rebuilds only those that changed."""

    seeds: list[int] = field(default_factory=list)  # the request's blocks
    roles: list[int] = field(default_factory=list)
    filled: list[Filled | None] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)  # after each message's last block
    pending: list[tuple[str, ...]] = field(default_factory=list)  # unanswered after each
    takes_calls: list[bool] = field(default_factory=list)  # assistant messages
    tools: list[Filled | None] | None = None  # the tool definitions' contents

    def clear(self) -> None:
        """Forget the last request (a reset: its blocks are filled anew)."""
        self.seeds, self.roles, self.filled = [], [], []
        self.ends, self.pending, self.takes_calls = [], [], []
        self.tools = None

    def shared(self, rows: Rows, filled: list[Filled | None]) -> int:
        """How many of the last request's messages this one has too: made of blocks
        both have alike, and not taking a tool call this request adds; none when the
        tools changed (they render apart, before every message)."""
        if _tools(rows, filled) != self.tools:
            return 0
        common = min(len(self.seeds), len(rows.seed))
        common = min(
            _first(map(ne, rows.seed, self.seeds), common),
            _first(map(ne, rows.role, self.roles), common),
            _first(map(is_not, filled, self.filled), common),
        )
        kept = bisect_right(self.ends, common)
        if kept and self.takes_calls[kept - 1] and _takes_a_call(rows.role, self.ends[kept - 1]):
            kept -= 1
        return kept

    def resume(self, kept: int) -> tuple[int, tuple[str, ...]]:
        """Where building goes on after ``kept`` shared messages: the block, and the call
        ids still unanswered there."""
        if not kept:
            return 0, ()
        return self.ends[kept - 1], self.pending[kept - 1]

    def keep(self, rows: Rows, filled: list[Filled | None], kept: int, built: Built) -> None:
        """Remember this request: its first ``kept`` messages as they were, then those
        just built."""
        self.seeds, self.roles, self.filled = rows.seed, rows.role, filled
        del self.ends[kept:], self.pending[kept:], self.takes_calls[kept:]
        self.ends += built.ends
        self.pending += built.pending
        self.takes_calls += [message.get("role") == "assistant" for message in built.messages]
        self.tools = _tools(rows, filled)


def _tools(rows: Rows, filled: list[Filled | None]) -> list[Filled | None]:
    """The contents of the request's tool definitions, in order."""
    return [filled[position] for position in rows.tool_definitions]


def _first(differences: Iterable[bool], otherwise: int) -> int:
    """The position of the first true difference, else ``otherwise``."""
    return next(compress(count(), differences), otherwise)


def _takes_a_call(roles: list[int], position: int) -> bool:
    """True when the first block from ``position`` on that is not a tool definition is a
    tool call (it hangs on the message before ``position`` when that is an assistant's)."""
    for role in islice(roles, position, None):
        if role != ROLE_TOOL_DEFINITION:
            return role == ROLE_TOOL_CALL
    return False


@dataclass
class SentMessages:
    """One trajectory's last request's messages as sent, each as JSON: the next request
    reuses those it shares with it and builds and serializes the rest."""

    kept: Kept = field(default_factory=Kept)
    messages: list[bytes] = field(default_factory=list)
    tools: bytes = b""  # the ``tools`` array, empty without tools

    def clear(self) -> None:
        """Forget the last request (a reset: its blocks are filled anew)."""
        self.kept.clear()
        self.messages, self.tools = [], b""

    def head(
        self, model: str, seeds: Sequence[str], rows: Rows, filled: list[Filled | None]
    ) -> tuple[bytes, int]:
        """``{"model":…,"messages":[…],"tools":[…]`` (no closing brace, compact JSON as
        ``orjson.dumps`` writes the whole object) and the message count."""
        kept = self.kept.shared(rows, filled)
        start, pending = self.kept.resume(kept)
        built = build(seeds, rows, filled, start, pending)
        del self.messages[kept:]
        self.messages += map(orjson.dumps, built.messages)
        if start == 0:
            self.tools = orjson.dumps(built.tools) if built.tools else b""
        self.kept.keep(rows, filled, kept, built)
        head = b'{"model":' + orjson.dumps(model) + b',"messages":[' + b",".join(self.messages)
        return head + (b"]" if not self.tools else b'],"tools":' + self.tools), len(self.messages)
