"""``batchbench import``: a public trace in, a validated schema v2 manifest out.

A format module parses rows into ``Record`` values; everything after is here and shared:
the window and filters, parents and trajectories (lineage), blocks (units, growth),
delays, sampling (as export-plans), validation and the atomic write, and the counters
printed at the end.
"""

from __future__ import annotations

import importlib
import math
import os
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

from batchbench.errors import InputError
from batchbench.ingest.blockbuild import Block, BlockBuilder, BlockCounts, id_roles
from batchbench.ingest.lineage import (
    NO_PARENT,
    Lineage,
    Trajectory,
    assign_parents,
    build_trajectories,
    full_block_count,
    linkable_chains,
    qualified_ids,
    shared_prefix_ids,
)
from batchbench.ingest.record import FormatOptions, Record
from batchbench.ingest.sampling import check_fraction, sample_plans
from batchbench.ingest.timing import LatencyModel, TraceWindow, end_time, gap_seconds
from batchbench.ingest.units import Units
from batchbench.ingest.write import encode, write_manifest

Plan = dict[str, Any]

# The formats, in the order --help lists them: name -> module under batchbench.ingest.formats.
FORMATS = {
    "mooncake": "mooncake",
    "bailian": "bailian",
    "weka": "weka",
    "tracelab": "tracelab",
    "azure": "azure",
    "burstgpt": "burstgpt",
    "ragpulse": "ragpulse",
    "claude-code": "claude_code",
}


def format_reader(name: str) -> Callable[[str, FormatOptions], Iterator[Record]]:
    if name not in FORMATS:
        raise InputError(f"unknown format {name!r}; expected one of {', '.join(FORMATS)}")
    module = importlib.import_module(f"batchbench.ingest.formats.{FORMATS[name]}")
    reader: Callable[[str, FormatOptions], Iterator[Record]] = module.read
    return reader


# The smallest prompt a chat request replays exactly in common templates: one user
# message's framing with the generation prompt costs 7 to 10 tokens (ChatML, Qwen, Gemma,
# Llama 3), and the message needs a few tokens of its own.
MIN_PROMPT_TOKENS = 16


@dataclass(frozen=True)
class ImportOptions:
    format: str
    inputs: tuple[str, ...]
    output: str
    start: str | None = None
    end: str | None = None
    first_seconds: float | None = None
    model: str | None = None
    block_size: int | None = None
    link_window_hours: float = 24.0
    shared_prefix_followers: int = 16
    min_new_tokens: int = 32
    min_prompt_tokens: int = MIN_PROMPT_TOKENS
    latency_model: str = "none"
    max_delay_ms: float | None = None
    split_idle_ms: float | None = None
    sample: float | None = None
    seed: int = 0
    stratify_by_session_length: bool = False
    time_scale: float = 1.0


@dataclass
class ImportStats:
    """What an import did, for its closing lines and for tests."""

    rows: int = 0
    dropped: Counter[str] = field(default_factory=Counter)
    input_prompt_tokens: int = 0  # over every row read
    input_output_tokens: int = 0
    kept_prompt_tokens: int = 0  # over the rows kept (window, filters), before sampling
    kept_output_tokens: int = 0
    requests: int = 0  # written (after sampling)
    trajectories: int = 0  # built, before sampling
    written: int = 0  # trajectories written
    multi_request: int = 0  # written trajectories of more than one request
    roots: int = 0  # trajectories that continue nothing earlier
    links: int = 0
    branches: int = 0
    splits: int = 0
    resets: int = 0  # requests that follow a predecessor they do not extend (reset_before)
    capped_delays: int = 0
    raised_prompts: int = 0  # kept rows whose prompt was raised to --min-prompt-tokens
    raised_tokens: int = 0  # the tokens that added
    prompt_tokens: int = 0  # written
    output_tokens: int = 0
    shared_prompt_tokens: int = 0  # written prompt tokens in blocks other trajectories also use
    lineage: dict[str, int] = field(default_factory=dict)
    blocks: BlockCounts = field(default_factory=BlockCounts)


def check_options(options: ImportOptions) -> tuple[TraceWindow, LatencyModel]:
    format_reader(options.format)
    if not options.inputs:
        raise InputError("no input files")
    names: dict[str, str] = {}
    for path in options.inputs:
        other = names.setdefault(os.path.basename(path), path)
        if other != path:
            raise InputError(
                f"two inputs are named {os.path.basename(path)} ({other}, {path}): provenance "
                "names a file by its name; give each input once, under its own name"
            )
    window = TraceWindow.parse(options.start, options.end, options.first_seconds)
    model = LatencyModel.parse(options.latency_model)
    if not (math.isfinite(options.time_scale) and options.time_scale > 0):
        raise InputError("time scale must be a positive finite number")
    if not math.isfinite(options.link_window_hours) or options.link_window_hours < 0:
        raise InputError("--link-window-hours must be non-negative")
    for flag, value in (
        ("--max-delay-ms", options.max_delay_ms),
        ("--split-idle-ms", options.split_idle_ms),
    ):
        if value is not None and not (math.isfinite(value) and value >= 0):
            raise InputError(f"{flag} must be a non-negative number of milliseconds")
    if options.block_size is not None and options.block_size <= 0:
        raise InputError("--block-size must be a positive number of tokens")
    if options.min_new_tokens < 0:
        raise InputError("--min-new-tokens must not be negative")
    if options.min_prompt_tokens < 0:
        raise InputError("--min-prompt-tokens must not be negative")
    if options.shared_prefix_followers < 2:
        raise InputError("--shared-prefix-followers must be at least 2")
    check_fraction(options.sample)
    return window, model


@dataclass
class _Kept:
    records: list[Record]
    sources: list[int]  # the input file index of each record


RowCounter = Callable[[int], None]


def read_records(
    options: ImportOptions, window: TraceWindow, stats: ImportStats, tick: RowCounter | None
) -> _Kept:
    """Every input's records that pass the window and filters, in arrival order; ``tick``
    hears the rows read so far every 65,536 rows (a progress bar)."""
    reader = format_reader(options.format)
    format_options = FormatOptions(block_size=options.block_size)
    kept: list[tuple[float, int, int, Record]] = []
    order = 0
    for source, path in enumerate(options.inputs):
        for record in reader(path, format_options):
            stats.rows += 1
            if tick is not None and not stats.rows & 0xFFFF:
                tick(stats.rows)
            stats.input_prompt_tokens += record.input_tokens
            stats.input_output_tokens += record.output_tokens
            _check_sizes(record)
            reason = _drop_reason(record, options, window)
            if reason is not None:
                stats.dropped[reason] += 1
                continue
            kept.append((record.time_s, source, order, record))
            stats.kept_prompt_tokens += record.input_tokens
            stats.kept_output_tokens += record.output_tokens
            order += 1
    if window.first_seconds is not None and kept:
        until = min(item[0] for item in kept) + window.first_seconds
        inside = [item for item in kept if item[0] < until]
        stats.dropped["outside the window"] += len(kept) - len(inside)
        for _time, _source, _order, late in kept:
            if late.time_s >= until:
                stats.kept_prompt_tokens -= late.input_tokens
                stats.kept_output_tokens -= late.output_tokens
        kept = inside
    kept.sort(key=lambda item: item[:3])
    records = [_raised(item[3], options.min_prompt_tokens, stats) for item in kept]
    return _Kept(records, [item[1] for item in kept])


def _raised(record: Record, floor: int, stats: ImportStats) -> Record:
    """The record, its prompt raised to ``floor`` tokens of its own content when smaller:
    a chat template's framing alone would exceed it, and it could not be replayed
    exactly. The kept rows' totals stay the input's; the raise is counted apart."""
    if record.input_tokens >= floor:
        return record
    stats.raised_prompts += 1
    stats.raised_tokens += floor - record.input_tokens
    return replace(record, input_tokens=floor, segments=None, new_segments=None)


LARGEST = 2**53  # counts and milliseconds a manifest holds exactly (JSON numbers in most readers)


def _check_sizes(record: Record) -> None:
    for name, value in (
        ("input tokens", record.input_tokens),
        ("output tokens", record.output_tokens),
    ):
        if value > LARGEST:
            raise InputError(f"{record.source}:{record.row}: {name} {value} exceed 2^53")
    if not math.isfinite(record.time_s) or abs(record.time_s) > LARGEST / 1000:
        raise InputError(
            f"{record.source}:{record.row}: its time {record.time_s!r} is out of range"
        )


def _drop_reason(record: Record, options: ImportOptions, window: TraceWindow) -> str | None:
    if not window.admits(record.time_s):
        return "outside the window"
    if options.model is not None and record.model != options.model:
        return "another model"
    if record.input_tokens <= 0:
        return "no input tokens"
    if record.output_tokens <= 0:
        return "no output tokens"
    return None


class PlanWriter:
    """Plans of the trajectories, numbering ids per base name."""

    def __init__(
        self,
        options: ImportOptions,
        kept: _Kept,
        chains: list[tuple[str, ...] | None],
        builder: BlockBuilder,
        ends: list[float],
        origin_s: float,
        stats: ImportStats,
    ) -> None:
        self.options = options
        self.records = kept.records
        self.sources = kept.sources
        self.chains = chains
        self.builder = builder
        self.ends = ends
        self.origin_s = origin_s
        self.stats = stats
        self.prompts: dict[int, list[Block]] = {}
        self._names: Counter[str] = Counter()
        self._taken: set[str] = set()

    def offset_ms(self, time_s: float) -> int:
        return _milliseconds(max(time_s - self.origin_s, 0.0) * 1000 / self.options.time_scale)

    def plan(self, trajectory: Trajectory) -> Plan:
        requests = []
        indexes = trajectory.requests
        for position, index in enumerate(indexes):
            record = self.records[index]
            blocks, reset = self._blocks(trajectory, position)
            self.prompts[index] = blocks
            request: dict[str, Any] = {
                "prompt_tokens": record.input_tokens,
                "output_tokens": record.output_tokens,
            }
            if position + 1 < len(indexes):
                request["delay_after_ms"] = self._delay_ms(index, indexes[position + 1])
            if reset:
                request["reset_before"] = True
            if record.stream is not None:
                request["stream"] = record.stream
            request["recorded_start_after_ms"] = self.offset_ms(record.time_s)
            request["blocks"] = [block.as_json() for block in blocks]
            requests.append(request)
        first = self.records[indexes[0]]
        return {
            "schema_version": 2,
            "trajectory_id": self._trajectory_id(first, indexes[0]),
            "start_after_ms": self.offset_ms(first.time_s),
            "requests": requests,
            "metadata": self._provenance(indexes, trajectory),
        }

    def _blocks(self, trajectory: Trajectory, position: int) -> tuple[list[Block], bool]:
        index = trajectory.requests[position]
        record = self.records[index]
        before = trajectory.requests[position - 1] if position else trajectory.context
        if before != NO_PARENT and continues(self.records, self.chains, before, index):
            grown = self.builder.grown(
                self.prompts[before], self.records[before], before, record, index, live=position > 0
            )
            if grown is not None:
                return grown, False
        blocks = self.builder.content(record, self.chains[index], index)
        # A prompt of whole segments restates its context: it does not drop a predecessor.
        reset = position > 0 and not _whole_segments(record)
        self.stats.resets += reset
        return blocks, reset

    def _delay_ms(self, index: int, following: int) -> int:
        gap = gap_seconds(self.records[index], self.records[following], self.ends[index])
        delay = gap * 1000 / self.options.time_scale
        cap = self.options.max_delay_ms
        if cap is not None and delay > cap:
            self.stats.capped_delays += 1
            delay = cap
        return _milliseconds(delay)

    def _trajectory_id(self, first: Record, index: int) -> str:
        source = os.path.basename(self.options.inputs[self.sources[index]])
        base = first.session if first.session is not None else f"{source}:{first.row}"
        while True:  # a key may itself look numbered ("x#1"): take the next free name
            n = self._names[base]
            self._names[base] = n + 1
            name = base if n == 0 else f"{base}#{n}"
            if name not in self._taken:
                self._taken.add(name)
                return name

    def _provenance(self, indexes: Sequence[int], trajectory: Trajectory) -> dict[str, Any]:
        files = [os.path.basename(self.options.inputs[self.sources[i]]) for i in indexes]
        source: dict[str, Any] = {"format": self.options.format}
        if len(set(files)) == 1:
            source["file"] = files[0]
        else:
            source["files"] = files
        source["rows"] = [self.records[i].row for i in indexes]
        origins = [self.records[i].origin for i in indexes]
        if any(origin is not None for origin in origins):
            source["origins"] = origins
        if trajectory.context != NO_PARENT:
            context = self.records[trajectory.context]
            source[trajectory.kind + "_of_row"] = context.row
            if len(self.options.inputs) > 1:
                context_file = self.options.inputs[self.sources[trajectory.context]]
                source[trajectory.kind + "_of_file"] = os.path.basename(context_file)
        return {"source": source}


def _milliseconds(value: float) -> int:
    if not value <= LARGEST:  # a tiny --time-scale, say
        raise InputError(
            f"an offset or delay of {value:.4g} ms is out of range (at most 2^53 ms); "
            "check --time-scale"
        )
    return round(value)


def continues(
    records: Sequence[Record], chains: Sequence[tuple[str, ...] | None], before: int, index: int
) -> bool:
    """Whether record ``index`` may be written as growth of record ``before``: it is not a
    prompt of whole segments, and its hash ids extend the full blocks of ``before`` when
    both are hashed (otherwise only the sizes tell, and growth decides)."""
    if _whole_segments(records[index]):
        return False
    chain, previous = chains[index], chains[before]
    if chain is None or previous is None:
        return True
    full = full_block_count(records[before], len(previous))
    return full <= len(chain) and chain[:full] == previous[:full]


def built_from_content(
    lineage: Lineage,
    records: Sequence[Record],
    chains: Sequence[tuple[str, ...] | None],
    min_new_tokens: int,
) -> list[int]:
    """The records whose blocks come from their own content, not from growth: the
    trajectories' first requests without context, and requests that cannot grow their
    predecessor (a prompt always sums to its record's input tokens, so the room is
    known before any block is built)."""
    chosen = []
    for trajectory in lineage.trajectories:
        for position, index in enumerate(trajectory.requests):
            before = trajectory.requests[position - 1] if position else trajectory.context
            if (
                before == NO_PARENT
                or not continues(records, chains, before, index)
                or records[index].input_tokens - records[before].input_tokens < min_new_tokens
            ):
                chosen.append(index)
    return chosen


def _whole_segments(record: Record) -> bool:
    return record.segments is not None and record.hash_ids is None


def build_plans(
    options: ImportOptions, stats: ImportStats, tick: RowCounter | None = None
) -> list[Plan]:
    """Read, rebuild and sample: the plans sorted by (start_after_ms, trajectory_id)."""
    window, model = check_options(options)
    kept = read_records(options, window, stats, tick)
    records = kept.records
    chains = [
        qualified_ids(record, source) if record.hash_ids and record.block_size > 0 else None
        for record, source in zip(records, kept.sources, strict=True)
    ]
    ends = [end_time(record, model) for record in records]
    linkable = linkable_chains(records, chains)
    shared = (
        shared_prefix_ids(linkable, options.shared_prefix_followers) if any(linkable) else set()
    )
    parents, counts = assign_parents(
        records,
        chains,
        kept.sources,
        options.link_window_hours * 3600,
        shared,
        options.min_new_tokens,
    )
    split = options.split_idle_ms / 1000 if options.split_idle_ms is not None else None
    lineage = build_trajectories(records, parents, counts, split, ends)
    # Units over the prompts written from their ids, and over the first requests of
    # branches and splits: those repeat their parent's blocks, so the ids they share with
    # it must end a unit there (or the parent's tail would take them in).
    content = built_from_content(lineage, records, chains, options.min_new_tokens)
    content += [t.requests[0] for t in lineage.trajectories if t.context != NO_PARENT]
    builder = _block_builder(
        [records[i] for i in content],
        [chains[i] for i in content],
        shared,
        stats.blocks,
        options.min_new_tokens,
    )
    origin = (
        window.start_s if window.start_s is not None else (records[0].time_s if records else 0.0)
    )
    writer = PlanWriter(options, kept, chains, builder, ends, origin, stats)
    plans = []
    counted: dict[int, Counter[str]] = {}  # id(plan) -> what building it counted
    for trajectory in lineage.trajectories:
        before = _tally(stats)
        plan = writer.plan(trajectory)
        moved = _tally(stats)
        moved.subtract(before)
        moved[trajectory.kind] += 1  # root, branch or split
        moved["links"] += len(trajectory.requests) - 1
        plans.append(plan)
        counted[id(plan)] = moved
    _count_lineage(stats, lineage)
    kept_plans = sample_plans(
        plans, options.sample, options.seed, options.stratify_by_session_length
    )
    if len(kept_plans) != len(plans):  # the counters say what was written
        _untally(stats, sum((counted[id(plan)] for plan in kept_plans), Counter()))
    _count_written(stats, kept_plans)
    return kept_plans


_TALLIED = ("resets", "capped_delays")
_BLOCK_COUNTS = tuple(f.name for f in fields(BlockCounts))


def _tally(stats: ImportStats) -> Counter[str]:
    """The counters building a plan moves, as they stand."""
    counts = Counter({name: getattr(stats, name) for name in _TALLIED})
    counts.update({f"blocks.{name}": getattr(stats.blocks, name) for name in _BLOCK_COUNTS})
    return counts


def _untally(stats: ImportStats, counts: Counter[str]) -> None:
    """Set the counters to those of the sampled plans alone."""
    for name in _TALLIED:
        setattr(stats, name, counts[name])
    for name in _BLOCK_COUNTS:
        setattr(stats.blocks, name, counts[f"blocks.{name}"])
    stats.roots, stats.branches, stats.splits = counts["root"], counts["branch"], counts["split"]
    stats.links = counts["links"]


def _block_builder(
    records: Sequence[Record],
    chains: Sequence[tuple[str, ...] | None],
    shared: set[str],
    counts: BlockCounts,
    min_new_tokens: int,
) -> BlockBuilder:
    if not any(chains):
        return BlockBuilder(None, {}, counts, min_new_tokens)
    roles: dict[str, str] = {}
    for record, chain in zip(records, chains, strict=True):
        if chain:
            id_roles(record, chain, shared, roles)
    usable = [
        chain[: -(-record.input_tokens // record.block_size)]
        for record, chain in zip(records, chains, strict=True)
        if chain
    ]
    return BlockBuilder(Units(usable, roles), roles, counts, min_new_tokens)


def _count_lineage(stats: ImportStats, lineage: Lineage) -> None:
    stats.trajectories = len(lineage.trajectories)
    stats.roots = sum(trajectory.kind == "root" for trajectory in lineage.trajectories)
    stats.links = lineage.links
    stats.branches = lineage.branches
    stats.splits = lineage.splits
    stats.lineage = {
        "session links": lineage.counts.session_links,
        "parent-key links": lineage.counts.key_links,
        "hash-prefix links": lineage.counts.hash_links,
        "parents not found": lineage.counts.missing_parents,
        "shared-prefix ids": lineage.counts.shared_prefix_ids,
    }


def _count_written(stats: ImportStats, plans: Sequence[Plan]) -> None:
    users: dict[str, set[str]] = {}
    for plan in plans:
        for request in plan["requests"]:
            for block in request["blocks"]:
                users.setdefault(block["seed"], set()).add(plan["trajectory_id"])
    stats.written = len(plans)
    for plan in plans:
        stats.multi_request += len(plan["requests"]) > 1
        for request in plan["requests"]:
            stats.requests += 1
            stats.prompt_tokens += request["prompt_tokens"]
            stats.output_tokens += request["output_tokens"]
            stats.shared_prompt_tokens += sum(
                block["tokens"] for block in request["blocks"] if len(users[block["seed"]]) > 1
            )


def import_trace(
    options: ImportOptions, tick: RowCounter | None = None
) -> tuple[ImportStats, list[Plan]]:
    """Import, validate and write; InputError (nothing written) when an option or a row is
    bad, nothing is left, or a line would be invalid."""
    stats = ImportStats()
    plans = build_plans(options, stats, tick)
    if not plans:
        raise InputError(f"no trajectories to write from {stats.rows} rows")
    write_manifest(options.output, [encode(plan) for plan in plans])
    return stats, plans
