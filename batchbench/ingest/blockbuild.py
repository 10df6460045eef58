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
    tails_merged: int = 0  # trailing units sent as the request's own new content
    resized_seeds: int = 0  # a seed met again with another size or role: given its own name
    grown: int = 0  # requests written as growth of their predecessor, with its live reply
    folded: int = 0  # growth whose reply and new content are one plain assistant block
    not_grown: int = 0  # requests too short to hold their predecessor's prompt


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
            return self._segments(record.segments, uid, 0)
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
        for one message. The reply is ``live`` within a trajectory (a plain assistant
        block when a branch starts), and only when at least ``min_new_tokens`` follow it:
        the new messages' template framing must fit in the new content for the prompt to
        come out exact. Otherwise reply and new content become one plain assistant block
        (``folded``), which still repeats the predecessor's prompt byte for byte."""
        room = record.input_tokens - sum(block.tokens for block in previous)
        if room < self.min_new_tokens:
            self.counts.not_grown += 1
            return None
        blocks = list(previous) if live else [_branch_copy(block, uid) for block in previous]
        new = room - before.output_tokens
        if new >= self.min_new_tokens:
            self.counts.grown += 1
            reply = f"r{before_uid}" if live else f"r{before_uid}@{uid}"
            blocks.append(Block(reply, before.output_tokens, "assistant", live))
            blocks.extend(self._new_content(record, new, uid))
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

    def _segments(self, segments: Sequence[Segment], uid: int, first: int) -> list[Block]:
        blocks = []
        for k, segment in enumerate(segments, first):
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
        sizes = [min(stop * size, record.input_tokens) - start * size for start, stop in spans]
        rest = record.input_tokens - min(usable * size, record.input_tokens)
        # The prompt ends in a block of its own (the run's prompt correction resizes only
        # such a block to absorb the template's framing), of at least min_new_tokens:
        # trailing units join the new content until it is that large.
        own = len(spans)
        while own and rest < self.min_new_tokens:
            own -= 1
            rest += sizes[own]
            self.counts.tails_merged += 1
        blocks = []
        for (start, _stop), tokens in zip(spans[:own], sizes[:own], strict=True):
            role = self.id_roles.get(chain[start], "user")
            blocks.append(Block(self.seeds.name(f"h{chain[start]}", tokens, role), tokens, role))
        self.counts.units += own + (own < len(spans))
        self.counts.hash_references += usable
        if rest > 0:
            blocks.append(Block(f"n{uid}", rest, "user"))
        return blocks


def _branch_copy(block: Block, uid: int) -> Block:
    """A block of the parent's prompt as a branch starting at record ``uid`` repeats it.
    Hash units keep their seeds (the prefix the trace says they share). A trajectory's
    own content (new messages, replies) gets a seed of the branch: the parent's
    trajectory may resize that block to absorb its template's framing, which a block
    another trajectory also sends could not be, and a live reply's text exists only
    there."""
    if block.seed.startswith("h") or block.seed.startswith("s:"):
        return block
    return Block(f"{block.seed}@{uid}", block.tokens, block.role)


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
