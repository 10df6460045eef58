"""Put shards back together: one run's engine result, recorder and lifecycle, exactly.

Every shard's times are on its own clock; they move to the earliest shard's clock by the
difference of their start times (wall clock, so shards on different machines merge; with
``--start-at`` they differ by milliseconds). Counters add up, raw samples are joined (so
every percentile of the merged run is the percentile of the union), records and rows are
re-sorted by the time they finished, and the time series is re-sampled on one grid.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import numpy as np

from batchbench.config import RunConfig
from batchbench.errors import BatchbenchError
from batchbench.results.documents import add_fidelity
from batchbench.results.failures import ErrorTally
from batchbench.results.lifecycle import EngineResult, TrajectoryRecord
from batchbench.results.recording import ClientHealth, Recorder
from batchbench.results.samples import TimeSeries
from batchbench.results.summary import RunSetup
from batchbench.scale.partial import SAMPLE_COLUMNS, SERIES_COLUMNS, STREAM_COLUMNS, ShardData
from batchbench.scale.sharddoc import EngineDocument, LiveShard, ShardDocument, ShardIdentity
from batchbench.scale.snapshot import config_from_fields, run_identity
from batchbench.stages.liverun import LiveRun

T = TypeVar("T")
LIFECYCLE_TIMES = ("scheduled_at_seconds", "admitted_at_seconds", "finished_at_seconds")


class LearnedFraming:
    """The framing a shard learned, standing in for the live ``Framing``."""

    def __init__(self, learned: dict | None) -> None:
        self._learned = learned

    def learned(self) -> dict | None:
        return self._learned


class MergedRecorder(Recorder):
    """A recorder rebuilt from shards: its health spans every client process."""

    processes: int = 1

    def health(self) -> ClientHealth:
        health = super().health()
        health.processes = self.processes
        return health


@dataclass
class MergedRun:
    """What ``api.finish_run`` needs, from every shard together."""

    config: RunConfig
    setup: RunSetup
    engine: EngineResult
    live: Any | None  # an api.LiveRun
    lifecycle: tuple[dict[str, Any], ...]
    planned: tuple[int, int]  # trajectories, requests
    offsets: tuple[float, ...]  # each shard's clock start after the earliest, seconds
    shards: tuple[ShardData, ...]
    wall_origin: float = 0.0  # Unix time of the earliest shard's clock start
    dry_run_lines: tuple[str, ...] = ()  # dry runs: every shard's lines, by agent id


def check_shards(
    shards: list[ShardData], names: list[str], expected: list[int] | None = None
) -> list[ShardData]:
    """The shards of one run, in index order; one-line errors otherwise. ``expected``: the
    indexes that must be there (default: all of 0..count-1)."""
    if not shards:
        raise BatchbenchError("no shard results to merge")
    documents = [
        _read(name, data, ShardIdentity.from_meta) for name, data in zip(names, shards, strict=True)
    ]
    counts = {document.shard[1] for document in documents}
    if len(counts) != 1:
        listed = ", ".join(
            f"{name}: {document.shard[1]}" for name, document in zip(names, documents, strict=True)
        )
        raise BatchbenchError(f"the results come from runs split differently ({listed} shards)")
    count = counts.pop()
    by_index: dict[int, str] = {}
    for name, document in zip(names, documents, strict=True):
        index = document.shard[0]
        if index in by_index:
            raise BatchbenchError(f"{name} and {by_index[index]} are both shard {index}/{count}")
        by_index[index] = name
    wanted = range(count) if expected is None else expected
    missing = [str(i) for i in wanted if i not in by_index]
    if missing:
        raise BatchbenchError(
            f"shard {', '.join(missing)} of {count} missing: merge needs every shard's results"
        )
    first, first_identity = documents[0], run_identity(documents[0].config)
    for name, document in zip(names[1:], documents[1:], strict=True):
        other = run_identity(document.config)
        differing = sorted(
            k for k in first_identity.keys() | other.keys() if first_identity.get(k) != other.get(k)
        )
        if differing:
            raise BatchbenchError(
                f"{name} is from a different run than {names[0]}: options differ "
                f"({', '.join(differing)})"
            )
        if document.manifest_sha256 != first.manifest_sha256:
            raise BatchbenchError(f"{name} replayed another manifest than {names[0]}")
        if document.live != first.live:
            raise BatchbenchError(f"{name} and {names[0]}: one is a dry run, the other not")
    return sorted(shards, key=lambda data: data.shard[0])


def _read(name: str, data: ShardData, reader: Callable[[dict[str, Any]], T]) -> T:
    """A shard's meta read as a typed record; a one-line error when fields are missing or
    of the wrong kind."""
    try:
        return reader(data.meta)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise BatchbenchError(f"{name}: damaged shard data (meta: {exc!r})") from None


def merge(shards: list[ShardData]) -> MergedRun:
    """Shards (checked, in index order) as one run."""
    documents = [_read(f"shard {data.shard[0]}", data, ShardDocument.from_meta) for data in shards]
    origins = [document.wall_origin for document in documents]
    base = min(origins)
    offsets = tuple(origin - base for origin in origins)
    lives = [document.live for document in documents if document.live is not None]
    if not lives:  # a dry run has no common clock: every shard starts at 0
        offsets = tuple(0.0 for _ in origins)
    fields = dict(documents[0].config, shard=None, workers=1, start_at=None)
    config = config_from_fields(fields)
    setup = documents[0].setup
    engine = _engine(shards, offsets)
    lifecycle = _lifecycle(documents, offsets)
    planned = (
        sum(document.planned[0] for document in documents),
        sum(document.planned[1] for document in documents),
    )
    live = None
    if lives:
        recorder = _recorder(shards, documents, lives, offsets, config)
        window_ends = [
            offset + document.live.window_end
            for document, offset in zip(documents, offsets, strict=True)
            if document.live is not None and document.live.window_end is not None
        ]
        live = LiveRun(
            engine=engine,
            recorder=recorder,
            interrupted_by=next((d.interrupted_by for d in lives if d.interrupted_by), None),
            exit_status=max(d.exit_status for d in lives),
            framing=LearnedFraming(_framing(lives)),
            finished_by=next((d.finished_by for d in lives if d.finished_by), None),
            window_end=max(window_ends) if window_ends else None,
            server_metrics=next((d.server_metrics for d in lives if d.server_metrics), None),
        )
    lines = [line for document in documents for line in document.dry_run_lines or ()]
    lines.sort(key=_line_agent)  # stable: each agent's lines stay in invocation order
    return MergedRun(
        config, setup, engine, live, lifecycle, planned, offsets, tuple(shards), base,
        tuple(lines),
    )  # fmt: skip


def _line_agent(line: str) -> int:
    """The agent id of a ``[DRY-RUN] agent=N ...`` line."""
    return int(line.split(" ", 2)[1].removeprefix("agent="))


def _framing(lives: list[LiveShard]) -> dict | None:
    """What the shards learned of the framing: their observations added up, and each
    estimate the most frequent observation (the first shard's estimate among equals)."""
    learned = [live.framing for live in lives if live.framing]
    if not learned:
        return None
    merged = dict(learned[0])
    for kind, estimate in (
        ("initial", "initial_overhead_tokens"),
        ("turn", "turn_overhead_tokens"),
    ):
        counts: dict[str, int] = {}
        for document in learned:
            for value, count in document[f"{kind}_observations"].items():
                counts[value] = counts.get(value, 0) + int(count)
        merged[f"{kind}_observations"] = dict(sorted(counts.items(), key=lambda kv: int(kv[0])))
        if counts:
            current = str(merged[estimate])
            best = max(counts, key=lambda value: (counts[value], value == current))
            merged[estimate] = int(best)
    return merged


def _engine(shards: list[ShardData], offsets: tuple[float, ...]) -> EngineResult:
    records: list[TrajectoryRecord] = []
    result = EngineResult()
    for data, offset in zip(shards, offsets, strict=True):
        engine = EngineDocument.from_json(data.meta["engine"])
        records += [
            replace(
                record,
                scheduled_at=record.scheduled_at + offset,
                admitted_at=record.admitted_at + offset,
                finished_at=record.finished_at + offset,
            )
            for record in engine.records
        ]
        result.total_duration = max(result.total_duration, offset + engine.total_duration)
        result.max_active_agents += engine.max_active_agents
        if engine.records:
            result.last_agent_admitted_at = max(
                result.last_agent_admitted_at, offset + engine.last_agent_admitted_at
            )
        result.late_admissions += engine.late_admissions
        result.max_admission_lag = max(result.max_admission_lag, engine.max_admission_lag)
    records.sort(key=lambda r: (r.finished_at, r.agent_id))
    for sequence, record in enumerate(records):
        record.finish_sequence = sequence
    result.records = records
    return result


def _lifecycle(documents: list[ShardDocument], offsets: tuple[float, ...]) -> tuple[dict, ...]:
    merged: list[dict[str, Any]] = []
    for document, offset in zip(documents, offsets, strict=True):
        for event in document.lifecycle:
            event = dict(event)
            for key in LIFECYCLE_TIMES:
                if isinstance(event.get(key), int | float):
                    event[key] = event[key] + offset
            merged.append(event)
    merged.sort(key=lambda e: (e.get("finished_at_seconds") or 0.0, e["agent_id"]))
    return tuple(merged)


def _recorder(
    shards: list[ShardData],
    documents: list[ShardDocument],
    lives: list[LiveShard],
    offsets: tuple[float, ...],
    config: RunConfig,
) -> Recorder:
    recorder = MergedRecorder(dp_ranks=config.dp_ranks, goodput=config.goodput_thresholds)
    recorder.processes = sum(document.process_count for document in documents)
    totals = recorder.totals
    errors = ErrorTally()
    server_cached: int | None = None
    for live, offset in zip(lives, offsets, strict=True):
        counted = live.totals
        for name, value in counted.scalars.items():
            setattr(totals, name, getattr(totals, name) + value)
        tally = counted.errors
        for kind, count in tally.counts.items():
            errors.counts[kind] = errors.counts.get(kind, 0) + count
            errors.examples.setdefault(kind, tally.examples[kind])
        for status, count in tally.statuses.items():
            errors.statuses[status] = errors.statuses.get(status, 0) + count
        totals.failures.extend(counted.failures)
        if live.server_cached_tokens is not None:
            server_cached = (server_cached or 0) + live.server_cached_tokens
        for rank, figures in zip(recorder.ranks, live.ranks, strict=False):
            if figures.down_reason:  # seen down on the shard's clock: onto the run's
                figures = replace(figures, down_at_seconds=figures.down_at_seconds + offset)
            rank.add(figures)
        recorder.started_agents.update(live.started_agents)
        recorder.cpu_seconds += live.cpu_seconds
    errors.counts = dict(sorted(errors.counts.items()))
    totals.errors = errors
    recorder.server_cached_tokens = server_cached
    recorder.fidelity = add_fidelity(
        [
            replace(live.fidelity, oracle_seconds=data.array("oracle_seconds").tolist())
            for data, live in zip(shards, lives, strict=True)
        ]
    )
    recorder.wall_seconds = max(
        offset + live.wall_seconds for live, offset in zip(lives, offsets, strict=True)
    )
    recorder.origin = 0.0
    _join_samples(recorder, shards, offsets)
    recorder.series = _series(shards, offsets)
    recorder.peak_in_flight = _peak_in_flight(recorder)
    if not recorder.samples.start_s:
        recorder.peak_in_flight = sum(live.peak_in_flight for live in lives)
    return recorder


def _join_samples(recorder: Recorder, shards: list[ShardData], offsets: tuple[float, ...]) -> None:
    """Raw samples of every shard, request rows in the order they ended."""
    stream = recorder.stream
    for name in STREAM_COLUMNS:
        stream_values = np.concatenate([d.array(f"stream.{name}") for d in shards])
        setattr(stream, name, array("d", stream_values.astype(np.float64).tobytes()))
    latencies = np.concatenate([d.array("latencies_ms") for d in shards]).astype(np.float64)
    recorder.latencies_ms = array("d", latencies.tobytes())
    recorder.totals.request_latencies_ms = recorder.latencies_ms
    lag = np.concatenate([d.array("lag_ms") for d in shards]).astype(np.float64)
    recorder.lag_ms = array("d", lag.tobytes())
    columns: dict[str, list[np.ndarray]] = {name: [] for name in SAMPLE_COLUMNS}
    gap_base = 0
    for data, offset in zip(shards, offsets, strict=True):
        for name in SAMPLE_COLUMNS:
            column = data.array(f"samples.{name}")
            if name == "start_s":
                column = column + offset
            elif name == "gap_first":
                column = column + gap_base
            columns[name].append(column)
        gap_base += len(data.array("stream.itl_ms"))
    joined = {name: np.concatenate(parts) for name, parts in columns.items()}
    ends = joined["start_s"] + joined["latency_ms"] / 1000.0
    order = np.argsort(ends, kind="stable")
    samples = recorder.samples
    for name in SAMPLE_COLUMNS:
        target = getattr(samples, name)
        values = joined[name][order]
        if isinstance(target, bytearray):
            setattr(samples, name, bytearray(values.astype(np.uint8).tobytes()))
        else:
            values = values.astype(np.dtype(target.typecode))
            setattr(samples, name, array(target.typecode, values.tobytes()))


def _series(shards: list[ShardData], offsets: tuple[float, ...]):
    """Every shard's series re-sampled on one grid (every interval from the earliest start,
    and the end) and summed. Shards sample slightly after each grid time, so cumulative
    counts are interpolated linearly between their points (from 0 at the shard's start,
    their last value after its end), and gauges (agents, requests in flight) are read at
    the shard's point nearest the grid time, 0 when none lies within half an interval."""
    interval = float(shards[0].meta["live"]["series_interval"])
    series = TimeSeries(interval=interval)
    parts = []
    for data, offset in zip(shards, offsets, strict=True):
        t = data.array("series.t").astype(np.float64) + offset
        if len(t):
            values = {name: data.array(f"series.{name}") for name in SERIES_COLUMNS[1:]}
            parts.append((t, offset, values))
    if not parts:
        return series
    end = max(float(t[-1]) for t, _, _ in parts)
    grid = [interval * k for k in range(1, int(end / interval + 1e-9) + 1)]
    if not grid or grid[-1] < end - 1e-9:
        grid.append(end)
    at = np.asarray(grid)
    agents = np.zeros(len(at), dtype=np.int64)
    in_flight = np.zeros(len(at), dtype=np.int64)
    settled = np.zeros(len(at), dtype=np.float64)
    output = np.zeros(len(at), dtype=np.float64)
    for t, offset, values in parts:
        times = np.concatenate([[offset], t])
        for name, total in (("settled", settled), ("output_tokens", output)):
            counts = np.concatenate([[0.0], values[name].astype(np.float64)])
            total += np.interp(at, times, counts)
        nearest = np.clip(np.searchsorted(t, at), 1, len(t) - 1) if len(t) > 1 else None
        if nearest is None:
            index = np.zeros(len(at), dtype=np.int64)
        else:
            before = nearest - 1
            index = np.where(np.abs(t[before] - at) <= np.abs(t[nearest] - at), before, nearest)
        close = np.abs(t[index] - at) <= interval / 2 + 1e-9
        agents += np.where(close, values["active_agents"][index], 0).astype(np.int64)
        in_flight += np.where(close, values["in_flight"][index], 0).astype(np.int64)
    for k, now in enumerate(grid):
        series.add(
            now,
            int(agents[k]),
            int(in_flight[k]),
            round(float(settled[k])),
            round(float(output[k])),
        )
    return series


def _peak_in_flight(recorder: Recorder) -> int:
    """The most requests in flight at once across every shard, from their send times and
    latencies (retries inside a request are not seen separately)."""
    samples = recorder.samples
    if not samples.start_s:
        return 0
    starts = np.frombuffer(samples.start_s, dtype=np.float64)
    ends = starts + np.frombuffer(samples.latency_ms, dtype=np.float64) / 1000.0
    times = np.concatenate([starts, ends])
    steps = np.concatenate([np.ones(len(starts), np.int64), -np.ones(len(ends), np.int64)])
    order = np.lexsort((steps, times))  # at the same instant an end comes before a start
    return int(np.cumsum(steps[order]).max())
