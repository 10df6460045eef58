"""Which earlier request each request continues, and the trajectories that follow.

A trace names a request's predecessor in one of three ways: an explicit session key (the
previous request of the session), a parent key (Bailian's ``parent_chat_id``), or nothing
but its hashed blocks (Mooncake), where the parent is rebuilt from hash-prefix chains:
the latest earlier request whose full blocks are a strict prefix of this request's blocks
and reach past the globally shared prefix. Ids that many different ids follow (a system
prompt every request starts with) form that shared prefix; without this rule a trace
whose requests all begin with the same block would collapse into a few giant sessions.

Trajectories follow from the parents, in arrival order: a request whose parent is the
last request of its trajectory and has no other child yet continues that trajectory (a
link); a second child of the same parent, or a child of a request that is no longer its
trajectory's last, starts a new trajectory built on the parent's context (a branch); so
does a request that comes after a longer idle gap than ``split_idle_s`` (a split).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from batchbench.ingest.record import Record
from batchbench.ingest.timing import gap_seconds

NO_PARENT = -1
MANY = -2  # an id followed (or preceded) by more than one distinct id, or by the sequence's end


@dataclass
class LineageCounts:
    session_links: int = 0  # parents from an explicit session key
    key_links: int = 0  # parents named by a parent key
    hash_links: int = 0  # parents rebuilt from hash-prefix chains
    missing_parents: int = 0  # a parent key naming no earlier request in reach
    shared_prefix_ids: int = 0  # hash ids taken as the globally shared prefix


@dataclass
class Trajectory:
    """Record indexes in order; ``context`` is the record whose prompt and reply the first
    request continues from another trajectory (a branch or split), else NO_PARENT."""

    requests: list[int]
    context: int = NO_PARENT
    kind: str = "root"  # root, branch or split


@dataclass
class Lineage:
    parents: list[int]
    trajectories: list[Trajectory]
    counts: LineageCounts = field(default_factory=LineageCounts)
    links: int = 0
    branches: int = 0
    splits: int = 0


def qualified_ids(record: Record, source_index: int) -> tuple[str, ...]:
    """The record's hash ids as strings that mean the same content wherever they are
    equal: ids of a file-scoped trace are qualified with their file."""
    assert record.hash_ids is not None
    if record.hash_scope == "file":
        return tuple(f"{source_index}.{value}" for value in record.hash_ids)
    return tuple(str(value) for value in record.hash_ids)


def full_block_count(record: Record, n_ids: int) -> int:
    """How many of the record's leading hash ids cover whole blocks."""
    if record.block_size <= 0:
        return 0
    return min(n_ids, record.input_tokens // record.block_size)


def shared_prefix_ids(chains: Sequence[tuple[str, ...] | None], min_followers: int) -> set[str]:
    """Ids that at least ``min_followers`` distinct ids follow, and in each chain the ids
    before them: the prefix every conversation shares (a system prompt). A wide id deep in
    a chain (a document many conversations paste) makes its whole chain prefix shared for
    that chain, which only keeps such requests from linking through it."""
    followers: dict[str, set[str]] = {}
    for chain in chains:
        if not chain:
            continue
        for position in range(len(chain) - 1):
            seen = followers.setdefault(chain[position], set())
            if len(seen) < min_followers:
                seen.add(chain[position + 1])
    wide = {key for key, seen in followers.items() if len(seen) >= min_followers}
    shared: set[str] = set()
    for chain in chains:
        if not chain:
            continue
        for position, value in enumerate(chain):
            if value in wide:
                shared.update(chain[: position + 1])
    return shared


def linkable_chains(
    records: Sequence[Record], chains: Sequence[tuple[str, ...] | None]
) -> list[tuple[str, ...] | None]:
    """The chains of records whose trace names no session and no parent key: only their
    hashes can link them. (A record with a key of its own comes from a trace that names
    parents by key: without a parent it is a first turn, whatever its ids share.)"""
    return [
        chain
        if chain is not None
        and record.session is None
        and record.parent is None
        and record.key is None
        else None
        for record, chain in zip(records, chains, strict=True)
    ]


def _leading_shared(chain: tuple[str, ...], shared: set[str]) -> int:
    n = 0
    while n < len(chain) and chain[n] in shared:
        n += 1
    return n


def assign_parents(
    records: Sequence[Record],
    chains: Sequence[tuple[str, ...] | None],
    sources: Sequence[int],
    link_window_s: float,
    shared: set[str],
    min_new_tokens: int,
) -> tuple[list[int], LineageCounts]:
    """Each record's parent index (records in arrival order), or NO_PARENT; ``shared``
    are the ids of the globally shared prefix (``shared_prefix_ids`` of the chains that
    only their hashes can link)."""
    counts = LineageCounts()
    parents = [NO_PARENT] * len(records)
    last_of_session: dict[str, int] = {}
    by_key: dict[str, int] = {}
    hashed = linkable_chains(records, chains)
    counts.shared_prefix_ids = len(shared)
    latest_full: dict[str, int] = {}  # last full id -> latest record whose full blocks end there
    for index, record in enumerate(records):
        if record.session is not None:
            previous = last_of_session.get(record.session, NO_PARENT)
            if previous != NO_PARENT:
                parents[index] = previous
                counts.session_links += 1
            last_of_session[record.session] = index
        elif record.parent is not None:
            candidate = by_key.get(f"{sources[index]}.{record.parent}", NO_PARENT)
            if (
                candidate != NO_PARENT
                and record.time_s - records[candidate].time_s <= link_window_s
            ):
                parents[index] = candidate
                counts.key_links += 1
            else:
                counts.missing_parents += 1
        chain = hashed[index]
        if chain is not None:
            parent = _hash_parent(
                records, hashed, latest_full, index, shared, link_window_s, min_new_tokens
            )
            if parent != NO_PARENT:
                parents[index] = parent
                counts.hash_links += 1
            full = full_block_count(record, len(chain))
            if full:
                latest_full[chain[full - 1]] = index
        if record.key is not None:  # keys name requests within their own file
            by_key[f"{sources[index]}.{record.key}"] = index
    return parents, counts


def _hash_parent(
    records: Sequence[Record],
    chains: Sequence[tuple[str, ...] | None],
    latest_full: dict[str, int],
    index: int,
    shared: set[str],
    link_window_s: float,
    min_new_tokens: int,
) -> int:
    """The latest earlier record whose full blocks are a strict prefix of this chain and
    longer than its shared prefix, at most the link window earlier, and whose prompt this
    one holds with room for a message (at least ``min_new_tokens`` more): a request of
    the same size or shorter is a retry or an edit, not the next turn."""
    chain = chains[index]
    assert chain is not None
    floor = _leading_shared(chain, shared)
    best = NO_PARENT
    time_s = records[index].time_s
    for length in range(len(chain) - 1, floor, -1):
        candidate = latest_full.get(chain[length - 1], NO_PARENT)
        if candidate <= best or time_s - records[candidate].time_s > link_window_s:
            continue
        if records[index].input_tokens < records[candidate].input_tokens + min_new_tokens:
            continue
        other = chains[candidate]
        assert other is not None
        full = full_block_count(records[candidate], len(other))
        if full == length and other[:length] == chain[:length]:
            best = candidate
    return best


def build_trajectories(
    records: Sequence[Record],
    parents: list[int],
    counts: LineageCounts,
    split_idle_s: float | None,
    ends: Sequence[float],
) -> Lineage:
    """Trajectories from the parents, in arrival order (see the module's docstring);
    ``ends`` are the records' end times (recorded or estimated) for the idle split."""
    lineage = Lineage(parents, [], counts)
    trajectory_of: list[int] = [NO_PARENT] * len(records)
    has_child = [False] * len(records)
    for index, parent in enumerate(parents):
        if parent == NO_PARENT:
            trajectory_of[index] = len(lineage.trajectories)
            lineage.trajectories.append(Trajectory([index]))
            continue
        owner = lineage.trajectories[trajectory_of[parent]]
        idle = gap_seconds(records[parent], records[index], ends[parent])
        if split_idle_s is not None and idle > split_idle_s:
            kind = "split"
            lineage.splits += 1
        elif owner.requests[-1] == parent and not has_child[parent]:
            kind = "link"
            lineage.links += 1
        else:
            kind = "branch"
            lineage.branches += 1
        has_child[parent] = True
        if kind == "link":
            owner.requests.append(index)
            trajectory_of[index] = trajectory_of[parent]
        else:
            trajectory_of[index] = len(lineage.trajectories)
            lineage.trajectories.append(Trajectory([index], context=parent, kind=kind))
    return lineage
