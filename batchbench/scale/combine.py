"""Write merged shards as one run: summary, CSV, JSON, lifecycle and request events.

Used by ``batchbench merge`` (shards from several machines) and by ``--workers`` (worker
processes on one machine); both end with outputs identical in form to a single run's.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Iterator, Sequence
from typing import Any

import orjson

from batchbench.errors import BatchbenchError
from batchbench.results.events import JsonlFile
from batchbench.scale.merge import MergedRun
from batchbench.scale.snapshot import snapshot
from batchbench.stages.finish import finish_run
from batchbench.stages.outputs import write_outputs

OUTPUT_FIELDS = (
    "results_csv",
    "results_json",
    "agent_events_jsonl",
    "request_events_jsonl",
    "server_metrics_jsonl",
    "report_html",
)


def _events(path: str, offset: float) -> Iterator[tuple[float, bytes]]:
    """One shard's request events on the merged clock, keyed by when each request ended."""
    try:
        handle = open(path, "rb")  # noqa: SIM115 - closed by the with below, errors first
    except OSError as exc:
        raise BatchbenchError(f"{path}: {exc.strerror or exc}") from None
    with handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                event = orjson.loads(line)
            except orjson.JSONDecodeError:
                raise BatchbenchError(f"{path}:{number}: not a JSON line") from None
            start = event.get("start_offset_seconds")
            if isinstance(start, int | float):
                event["start_offset_seconds"] = start + offset
                start = start + offset
            else:
                start = 0.0
            latency = event.get("latency_seconds")
            end = start + (latency if isinstance(latency, int | float) else 0.0)
            yield end, orjson.dumps(event, option=orjson.OPT_APPEND_NEWLINE)


def merge_request_events(sources: Sequence[tuple[str, float]], target: str) -> int:
    """Every shard's request events in one file, in the order the requests ended (each
    shard's file is already in that order, so this is a streaming k-way merge)."""
    written = 0
    out = JsonlFile(target)
    try:
        streams = [_events(path, offset) for path, offset in sources]
        batch = bytearray()
        for _end, line in heapq.merge(*streams, key=lambda item: item[0]):
            batch += line
            written += 1
            if len(batch) >= 1 << 20:
                out.write_lines(batch)
                batch.clear()
        out.write_lines(batch)
    finally:
        out.close()
    return written


def write_lifecycle(records: Sequence[dict[str, Any]], target: str) -> None:
    out = JsonlFile(target)
    try:
        for record in records:
            out.write_batched(record)
        out.flush()
    finally:
        out.close()


def finish_merged(
    merged: MergedRun,
    outputs: dict[str, str | None],
    request_events: Sequence[str | None],
    out: Any = None,
    sections: dict[str, Any] | None = None,
):
    """The merged run's result, with every output ``outputs`` names written (events files
    first: the summary then lists them). ``request_events``: each shard's events file;
    ``sections``: more results JSON sections (a lost worker's account)."""
    # Any: mypy checks ** against every field of RunConfig; these are its str | None paths.
    paths: dict[str, Any] = {name: outputs.get(name) for name in OUTPUT_FIELDS}
    config = dataclasses.replace(merged.config, **paths)
    if config.agent_events_jsonl:
        write_lifecycle(merged.lifecycle, config.agent_events_jsonl)
    if config.request_events_jsonl:
        sources = [
            (path, offset)
            for path, offset in zip(request_events, merged.offsets, strict=True)
            if path is not None
        ]
        merge_request_events(sources, config.request_events_jsonl)
    result = finish_run(
        config,
        merged.setup,
        merged.planned,
        None,  # each shard already counted its never-started trajectories' requests
        None,
        merged.engine,
        merged.live,
        merged.lifecycle,
    )
    if merged.dry_run_lines:
        result = dataclasses.replace(result, merged_dry_run_lines=merged.dry_run_lines)
    if sections:
        result = dataclasses.replace(result, sections={**(result.sections or {}), **sections})
    shard = config.shard_spec()
    if shard is not None:  # workers of one shard: the shard's raw data, for the next merge
        data = snapshot(
            config,
            merged.setup,
            (shard.index, shard.count),
            merged.planned,
            merged.engine,
            merged.live,
            merged.lifecycle,
            merged.wall_origin,
            processes=len(merged.shards),
            dry_run_lines=merged.dry_run_lines or None,
        )
        result = dataclasses.replace(result, shard_data=data)
    return write_outputs(result, out)
