"""Take a finished shard's state apart into ``ShardData`` (``merge`` puts shards together).

The configuration travels as plain fields (objectives as their command-line text, never
the API key), so a merge on another machine rebuilds the run's configuration without the
manifest, the tokenizer or the server.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from batchbench.config import RunConfig
from batchbench.results.lifecycle import EngineResult
from batchbench.results.recording import DriftFigures, FidelityFigures
from batchbench.results.slo import goodput_text, slo_text
from batchbench.scale.partial import PER_SHARD_FIELDS, ShardData, capture


def config_fields(config: RunConfig) -> dict[str, Any]:
    """Every configuration field as JSON-ready data (the API key left out)."""
    fields: dict[str, Any] = {}
    for spec in dataclasses.fields(config):
        value = getattr(config, spec.name)
        if spec.name == "api_key":
            continue
        if spec.name == "slo":
            value = slo_text(value)
        elif spec.name == "goodput":
            value = goodput_text(value)
        elif isinstance(value, tuple):
            value = [list(item) if isinstance(item, tuple) else item for item in value]
        fields[spec.name] = value
    return fields


def config_from_fields(fields: dict[str, Any]) -> RunConfig:
    """The configuration ``config_fields`` described (not checked: the manifest and the
    server may not exist where shards are merged)."""
    known = {spec.name for spec in dataclasses.fields(RunConfig)}
    values = {name: value for name, value in fields.items() if name in known}
    if "shape_options" in values:
        values["shape_options"] = tuple(tuple(pair) for pair in values["shape_options"])
    if "percentiles" in values:
        values["percentiles"] = tuple(float(p) for p in values["percentiles"])
    return RunConfig(**values)


def run_identity(fields: dict[str, Any]) -> dict[str, Any]:
    """The fields every shard of one run shares."""
    return {name: value for name, value in fields.items() if name not in PER_SHARD_FIELDS}


def _drift(figures: DriftFigures) -> dict[str, Any]:
    return {
        "requests": figures.requests,
        "exact": figures.exact,
        "abs_sum": figures.abs_sum,
        "max_abs": figures.max_abs,
        "histogram": [[drift, count] for drift, count in figures.histogram.items()],
    }


def fidelity_document(fidelity: FidelityFigures) -> dict[str, Any]:
    return {
        "prompt": _drift(fidelity.prompt),
        "output": _drift(fidelity.output),
        "prompt_by_turn": [[turn, _drift(f)] for turn, f in fidelity.prompt_by_turn.items()],
        "corrected_requests": fidelity.corrected_requests,
        "limited_requests": fidelity.limited_requests,
        "oracle_queries": fidelity.oracle_queries,
        "explainable_cached_tokens": fidelity.explainable_cached_tokens,
        "inexact_tool_blocks": fidelity.inexact_tool_blocks,
    }


def engine_document(engine: EngineResult) -> dict[str, Any]:
    return {
        "records": [
            [
                r.agent_id,
                r.routing_slot,
                r.scheduled_at,
                r.admitted_at,
                r.finished_at,
                r.loop_seconds,
                r.completed,
                r.interrupted,
                r.finish_sequence,
            ]
            for r in engine.records
        ],
        "total_duration": engine.total_duration,
        "max_active_agents": engine.max_active_agents,
        "last_agent_admitted_at": engine.last_agent_admitted_at,
        "late_admissions": engine.late_admissions,
        "max_admission_lag": engine.max_admission_lag,
    }


def totals_document(totals: Any) -> dict[str, Any]:
    scalars = {
        spec.name: getattr(totals, spec.name)
        for spec in dataclasses.fields(totals)
        if isinstance(getattr(totals, spec.name), int | float)
    }
    errors = totals.errors
    return {
        "scalars": scalars,
        "errors": {
            "counts": errors.counts,
            "statuses": [[status, count] for status, count in errors.statuses.items()],
            "examples": errors.examples,
        },
        "failures": [list(failure) for failure in totals.failures],
    }


def snapshot(
    config: RunConfig,
    setup: Any,
    shard: tuple[int, int],
    planned: tuple[int, int],
    engine: EngineResult,
    live: Any | None,
    lifecycle: Sequence[dict[str, Any]],
    wall_origin: float,
) -> ShardData:
    """A finished shard as ``ShardData``. ``planned``: (trajectories, requests) it owned."""
    meta: dict[str, Any] = {
        "shard": list(shard),
        "planned": list(planned),
        "config": config_fields(config),
        "setup": dataclasses.asdict(setup),
        "wall_origin": wall_origin,
        "engine": engine_document(engine),
        "lifecycle": list(lifecycle),
        "live": None,
    }
    recorder = None
    if live is not None:
        recorder = live.recorder
        meta["live"] = {
            "totals": totals_document(recorder.totals),
            "server_cached_tokens": recorder.server_cached_tokens,
            "ranks": [dataclasses.asdict(rank) for rank in recorder.ranks],
            "started_agents": sorted(recorder.started_agents),
            "peak_in_flight": recorder.peak_in_flight,
            "cpu_seconds": recorder.cpu_seconds,
            "wall_seconds": recorder.wall_seconds,
            "series_interval": recorder.series.interval,
            "fidelity": fidelity_document(recorder.fidelity),
            "framing": live.framing.learned() if config.prompt_correction else None,
            "interrupted_by": live.interrupted_by,
            "exit_status": live.exit_status,
            "finished_by": live.finished_by,
            "window_end": live.window_end,
            "server_metrics": live.server_metrics,
        }
    return capture(meta, recorder)
