"""The request-log exporter (COMPAT §7): rows in, a validated schema v2 manifest out."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, fields

from batchbench.errors import InputError
from batchbench.ingest.describe import WorkloadDescription, describe
from batchbench.ingest.plans import Plan, PlanBuilder
from batchbench.ingest.rows import Row, read_rows
from batchbench.ingest.sampling import check_fraction, sample_plans
from batchbench.ingest.sessions import reconstruct
from batchbench.ingest.window import Window
from batchbench.ingest.write import encode, write_manifest


@dataclass(frozen=True)
class ExportOptions:
    rows_jsonl: str
    start: str
    end: str
    output: str
    principal_id: str | None = None
    model: str | None = None
    link_window_hours: float = 24.0
    sample: float | None = None
    seed: int = 0
    stratify_by_session_length: bool = False
    time_scale: float = 1.0


@dataclass
class ExportStats:
    """The counters of the stats line, in its order (COMPAT §7.3)."""

    rows: int = 0  # non-blank input lines
    usable: int = 0  # rows read (window plus look-back, filters) that passed the hygiene
    dropped_no_prompt_tokens: int = 0
    dropped_no_completion_tokens: int = 0
    dropped_malformed_blocks: int = 0
    in_window: int = 0  # usable rows in [start, end)
    trajectories: int = 0  # reconstructed, before sampling
    sampled: int = 0  # kept by sampling (written)
    normalized_block_tokens: int = 0
    prewindow_sessions: int = 0

    def line(self) -> str:
        return ", ".join(f"{f.name}={getattr(self, f.name)}" for f in fields(self))


def usable(row: Row, stats: ExportStats) -> bool:
    """Row hygiene (COMPAT §7.4): malformed block arrays, then prompt tokens (Σ block
    tokens stand in for a missing count), then completion tokens. Fills in the prompt."""
    n = len(row.chain)
    if (row.block_roles and len(row.block_roles) != n) or (
        row.block_tokens and len(row.block_tokens) != n
    ):
        stats.dropped_malformed_blocks += 1
        return False
    if row.prompt_tokens is None or row.prompt_tokens <= 0:
        total = sum(row.block_tokens)
        if total <= 0:
            stats.dropped_no_prompt_tokens += 1
            return False
        row.prompt_tokens = total
    if row.completion_tokens is None or row.completion_tokens <= 0:
        stats.dropped_no_completion_tokens += 1
        return False
    return True


def check_options(options: ExportOptions) -> Window:
    window = Window.parse(options.start, options.end, options.link_window_hours)
    if not (math.isfinite(options.time_scale) and options.time_scale > 0):
        raise InputError("time scale must be a positive finite number")
    check_fraction(options.sample)
    return window


def selected_rows(
    rows: Iterable[Row], options: ExportOptions, window: Window, stats: ExportStats
) -> Iterable[Row]:
    for row in rows:
        stats.rows += 1
        if not window.reads(row.ts_us):
            continue
        if options.principal_id is not None and row.principal_id != options.principal_id:
            continue
        if options.model is not None and row.model != options.model:
            continue
        if usable(row, stats):
            stats.usable += 1
            stats.in_window += window.holds(row.ts_us)
            yield row


def build_plans(
    rows: Iterable[Row], options: ExportOptions, window: Window, stats: ExportStats
) -> list[Plan]:
    """The sampled plans sorted by (start_after_ms, trajectory_id)."""
    sessions = reconstruct(selected_rows(rows, options, window, stats), window)
    builder = PlanBuilder(window, options.time_scale)
    plans = [builder.build(session) for session in sessions]
    stats.trajectories = len(plans)
    stats.normalized_block_tokens = builder.counters.normalized_block_tokens
    stats.prewindow_sessions = builder.counters.prewindow_sessions
    kept = sample_plans(plans, options.sample, options.seed, options.stratify_by_session_length)
    stats.sampled = len(kept)
    return kept


def export(options: ExportOptions) -> tuple[ExportStats, WorkloadDescription]:
    """Read, rebuild, sample, validate and write; InputError (nothing written) when the
    options or a row are bad, nothing is left to export, or a line would be invalid. The
    counters, and the description of the workload written."""
    window = check_options(options)
    stats = ExportStats()
    plans = build_plans(read_rows(options.rows_jsonl), options, window, stats)
    if not plans:
        raise InputError(f"no trajectories to export ({stats.line()})")
    write_manifest(options.output, [encode(plan) for plan in plans])
    return stats, describe(plans)
