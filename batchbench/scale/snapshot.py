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
from batchbench.results.slo import goodput_text, slo_text
from batchbench.scale.partial import PER_SHARD_FIELDS, ShardData, capture
from batchbench.scale.sharddoc import EngineDocument, LiveShard, ShardDocument, TotalsDocument


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


def snapshot(
    config: RunConfig,
    setup: Any,
    shard: tuple[int, int],
    planned: tuple[int, int],
    engine: EngineResult,
    live: Any | None,
    lifecycle: Sequence[dict[str, Any]],
    wall_origin: float,
    processes: int | None = None,
    dry_run_lines: Sequence[str] | None = None,
) -> ShardData:
    """A finished shard as ``ShardData``. ``planned``: (trajectories, requests) it owned;
    ``processes``: the worker processes that ran it; ``dry_run_lines``: a dry run's."""
    recorder = live.recorder if live is not None else None
    document = ShardDocument(
        shard=shard,
        planned=planned,
        config=config_fields(config),
        setup=setup,
        wall_origin=wall_origin,
        engine=EngineDocument.of(engine),
        lifecycle=tuple(lifecycle),
        live=None if live is None else _live(config, live),
        processes=processes,
        dry_run_lines=None if dry_run_lines is None else tuple(dry_run_lines),
    )
    data = capture(document.to_meta(), recorder)
    data.meta.update(document.trailing_meta())
    return data


def _live(config: RunConfig, live: Any) -> LiveShard:
    """What a live shard's recorder counted and how its run ended (``live``: an
    ``api.LiveRun``)."""
    recorder = live.recorder
    return LiveShard(
        totals=TotalsDocument.of(recorder.totals),
        server_cached_tokens=recorder.server_cached_tokens,
        ranks=tuple(recorder.ranks),
        started_agents=tuple(sorted(recorder.started_agents)),
        peak_in_flight=recorder.peak_in_flight,
        cpu_seconds=recorder.cpu_seconds,
        wall_seconds=recorder.wall_seconds,
        series_interval=recorder.series.interval,
        fidelity=recorder.fidelity,
        framing=live.framing.learned() if config.prompt_correction else None,
        interrupted_by=live.interrupted_by,
        exit_status=live.exit_status,
        finished_by=live.finished_by,
        window_end=live.window_end,
        server_metrics=live.server_metrics,
    )
