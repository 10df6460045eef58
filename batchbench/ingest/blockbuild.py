"""A request's schema v2 blocks: from the trace's content for a trajectory's first request
(or one that does not continue its predecessor), and by growth otherwise.

Content, the most precise the trace offers: hash ids collapsed into units (equal ids give
equal seeds, so requests that share ids send byte-identical prefixes), role-labelled
segments, or one block of new content. Growth: a request that continues its predecessor
repeats the predecessor's blocks, then its reply (a ``live`` assistant block within a
trajectory, so the server's own reply is sent back as real agents do; a plain one when a
branch starts from another trajectory's request), then the new content. A seed never
changes size or role: a second size gets its own seed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from batchbench.ingest.record import Record, Segment
from batchbench.ingest.units import Units


class Block(NamedTuple):
    seed: str
    tokens: int
    role: str
    live: bool = False

    def as_json(self) -> dict[str, object]:
        block: dict[str, object] = {"seed": self.seed, "role": self.role, "tokens": self.tokens}
        if self.live:
            block["live"] = True
        return block


@dataclass
class BlockCounts:
    units: int = 0  # block references written from hash ids, after collapsing
    hash_references: int = 0  # hash ids those units hold
    dropped_ids: int = 0  # ids past the end of their request's prompt
    tails_merged: int = (
        0  # shared-able blocks (units, keyed segments) joined to a request's own tail
    )
    resized_seeds: int = 0  # a seed met again with another size or role: given its own name
    grown: int = 0  # requests written as growth of their predecessor, with its live reply
    branch_grown: int = 0  # a branch's first request: its parent's shared units, then one own block
    folded: int = 0  # growth whose reply and new content are one plain assistant block
    not_grown: int = 0  # requests too short to hold their predecessor's prompt


# What a chat template adds around one message, at most, in common templates (ChatML,
# Llama 3, Gemma: 4 to 6 tokens), with room to spare.
FRAMING_PER_MESSAGE = 8
# What a template adds once when a request carries tools: the section that lists them,
# with its header and instructions (about 15 tokens in ChatML, about 100 in Qwen-style
# templates), with room to spare.
FRAMING_TOOLS = 128


def framing_reserve(blocks: Sequence[Block]) -> int:
    """Tokens a prompt's own tail keeps for the template's framing of ``blocks``: one
    message's framing per block, and the tool section once when there are tools."""
    tools = any(block.role == "tool_definition" for block in blocks)
    return FRAMING_PER_MESSAGE * len(blocks) + (FRAMING_TOOLS if tools else 0)


class Seeds:
    """Seed names that keep one (tokens, role) each: a base met again with another size or
    role gets a variant name of its own."""

    def __init__(self, counts: BlockCounts) -> None:
        self._first: dict[str, tuple[int, str]] = {}
        self._counts = counts

    def name(self, base: str, tokens: int, role: str) -> str:
        first = self._first.setdefault(base, (tokens, role))
        if first == (tokens, role):
            return base
        variant = f"{base}~{tokens}:{role}"
        if variant not in self._first:
            self._first[variant] = (tokens, role)
            self._counts.resized_seeds += 1
        return variant


class BlockBuilder:
    """Blocks of the records of one import; ``uid`` numbers records for fresh seeds."""

    def __init__(
        self,
        units: Units | None,
        id_roles: dict[str, str],
        counts: BlockCounts,
        min_new_tokens: int,
    ) -> None:
        self.units = units
        self.min_new_tokens = min_new_tokens
        self.id_roles = id_roles
        self.counts = counts
        self.seeds = Seeds(counts)

    def content(self, record: Record, chain: tuple[str, ...] | None, uid: int) -> list[Block]:
        """The blocks of the record's whole prompt from its content alone."""
        if chain:
            return self._hashed(record, chain, uid)
        if record.segments is not None:
            blocks = self._segments(record.segments, uid)
            # Each segment is a message of its own, framed by the template: the tail
            # absorbs that framing for all of them.
            return self._own_tail(blocks, uid, framed=True)
        return [Block(f"n{uid}", record.input_tokens, "user")]

    def grown(
        self,
        previous: Sequence[Block],
        before: Record,
        before_uid: int,
        record: Record,
        uid: int,
        live: bool,
    ) -> list[Block] | None:
        """``previous`` (the prompt of ``before``), its reply, then this record's new
        content; None when the record's prompt cannot hold the previous prompt and room
        for one message. A branch (``live`` false) starts as ``_branch_start`` says.
        Within a trajectory the reply is a ``live`` block, but only when at least
        ``min_new_tokens`` (plus one per 32 reply tokens) follow it: the new messages'
        template framing, and what the reply gains when it is re-encoded, must fit in the
        new content for the prompt to come out exact. Otherwise reply and new content
        become one plain assistant block (``folded``), which still repeats the
        predecessor's prompt byte for byte."""
        room = record.input_tokens - before.input_tokens  # a prompt sums to its input
        if room < self.min_new_tokens:
            self.counts.not_grown += 1
            return None
        if not live:
            return self._branch_start(previous, record, uid)
        blocks = list(previous)
        new = room - before.output_tokens
        # A replayed reply re-encodes to a few more tokens than it was generated with (about
        # one in a hundred on long replies): the new content must absorb that too.
        if new >= self.min_new_tokens + before.output_tokens // 32:
            self.counts.grown += 1
            blocks.append(Block(f"r{before_uid}", before.output_tokens, "assistant", live=True))
            blocks.extend(self._own_tail(self._new_content(record, new, uid), uid))
        else:
            self.counts.folded += 1
            blocks.append(Block(f"r{before_uid}.{uid}", room, "assistant"))
        return blocks

    def _new_content(self, record: Record, tokens: int, uid: int) -> list[Block]:
        parts = []
        left = tokens
        for k, segment in enumerate(record.new_segments or ()):
            size = min(segment.tokens, left)
            if size > 0:
                parts.append(Block(f"n{uid}.{k}", size, segment.role))
                left -= size
        if left > 0:
            parts.append(Block(f"n{uid}", left, "user"))
        return parts

    def _branch_start(self, previous: Sequence[Block], record: Record, uid: int) -> list[Block]:
        """A branch's first request: the blocks its parent's prompt shares with the trace
        (hash units, keyed segments, up to the first other block), then the rest of the
        parent's prompt, its reply and the new content as one block of the branch's own.
        The parent's own blocks cannot be shared (its trajectory resizes them to absorb
        its template's framing, and a live reply's text exists only there), and as one
        block their framing is one message's, which the block absorbs."""
        kept = 0
        while kept < len(previous) and previous[kept].seed.startswith(("h", "s:")):
            kept += 1
        prefix = list(previous[:kept])
        own = record.input_tokens - sum(block.tokens for block in prefix)
        self.counts.branch_grown += 1
        return [*prefix, Block(f"n{uid}", own, "user")]

    def _own_tail(self, blocks: list[Block], uid: int, framed: bool = False) -> list[Block]:
        """The blocks, ending in a block of this request's own of at least min_new_tokens
        (the run's prompt correction resizes only such a block, to absorb the template's
        framing), plus, when ``framed`` (a whole prompt of many messages), the
        ``framing_reserve`` of the blocks before it: trailing blocks join into one
        ``n<uid>`` until it is that large, with their role when they share one, else
        ``user``."""

        if not self.min_new_tokens or not blocks:
            return blocks

        def need(kept: int) -> int:
            return self.min_new_tokens + (framing_reserve(blocks[:kept]) if framed else 0)

        last = blocks[-1]
        if last.seed.startswith(f"n{uid}") and last.tokens >= need(len(blocks) - 1):
            return blocks
        tokens = 0
        roles = set()
        kept = len(blocks)
        while kept:
            kept -= 1
            tokens += blocks[kept].tokens
            roles.add(blocks[kept].role)
            self.counts.tails_merged += not blocks[kept].seed.startswith(f"n{uid}")
            if tokens >= need(kept):
                break
        role = roles.pop() if len(roles) == 1 else "user"
        return [*blocks[:kept], Block(f"n{uid}", tokens, role)]

    def _segments(self, segments: Sequence[Segment], uid: int) -> list[Block]:
        blocks = []
        for k, segment in enumerate(segments):
            if segment.tokens <= 0:
                continue
            if segment.key is None:
                blocks.append(Block(f"n{uid}.{k}", segment.tokens, segment.role))
            else:
                seed = self.seeds.name(f"s:{segment.key}", segment.tokens, segment.role)
                blocks.append(Block(seed, segment.tokens, segment.role))
        return blocks

    def _hashed(self, record: Record, chain: tuple[str, ...], uid: int) -> list[Block]:
        size = record.block_size
        usable = min(len(chain), -(-record.input_tokens // size))
        self.counts.dropped_ids += len(chain) - usable
        chain = chain[:usable]
        if self.units is not None:
            spans = self.units.split(chain)
        else:
            spans = [(k, k + 1) for k in range(len(chain))]
        self.counts.hash_references += usable
        blocks = []
        for start, stop in spans:  # named once kept: a unit joining the tail takes no seed
            tokens = min(stop * size, record.input_tokens) - start * size
            blocks.append(
                Block(f"h{chain[start]}", tokens, self.id_roles.get(chain[start], "user"))
            )
        rest = record.input_tokens - min(usable * size, record.input_tokens)
        if rest > 0:
            blocks.append(Block(f"n{uid}", rest, "user"))
        merged_before = self.counts.tails_merged
        blocks = self._own_tail(blocks, uid, framed=True)
        named = [
            block._replace(seed=self.seeds.name(block.seed, block.tokens, block.role))
            if block.seed.startswith("h")
            else block
            for block in blocks
        ]
        merged = self.counts.tails_merged > merged_before  # the tail holds ids too
        self.counts.units += sum(block.seed.startswith("h") for block in named) + merged
        return named


def id_roles(
    record: Record, chain: tuple[str, ...], shared: set[str], roles: dict[str, str]
) -> None:
    """Give each id of the chain its role, the first time it is met: the prefix role the
    trace gives its block's first token, else ``system`` for the globally shared prefix,
    else ``user``."""
    spans = []
    start = 0
    for role, tokens in record.prefix_roles:
        spans.append((start, start + tokens, role))
        start += tokens
    for position, value in enumerate(chain):
        if value in roles:
            continue
        first_token = position * record.block_size
        labelled = next((r for a, b, r in spans if a <= first_token < b), None)
        roles[value] = labelled or ("system" if value in shared else "user")
