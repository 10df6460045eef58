"""The files a run writes once it finished: the summary CSV and JSON, a shard's raw data,
the HTML report and the resolved options (the events files were written as it ran)."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from batchbench.config import RunConfig
from batchbench.errors import BatchbenchError
from batchbench.results.console import csv_row, write_csv, write_json
from batchbench.results.documents import ShardSection
from batchbench.results.windowreport import window_csv
from batchbench.stages.console import RunOutput
from batchbench.stages.finish import RunResult
from batchbench.stages.target import SIM_METRICS


class OutputError(BatchbenchError):
    """A requested output file could not be written; ``result`` still holds the run."""

    def __init__(self, message: str, result: RunResult) -> None:
        super().__init__(message)
        self.result = result


def config_file_path(config: RunConfig) -> str | None:
    """Where the resolved options go: beside the results JSON, else beside the CSV; only
    beside a regular file (not a pipe or a device)."""
    results = config.results_json or config.results_csv
    if results is None or not os.path.isfile(results):
        return None
    path = Path(results)
    return str(path.with_name(path.stem + ".config.toml"))


def write_outputs(result: RunResult, out: RunOutput | None = None) -> RunResult:
    """Write the summary files the config names; every one is attempted, and a failure
    raises OutputError carrying the result (with what was written). The resolved options
    file is a convenience: failing to write it is a warning."""
    config = result.config
    written: list[tuple[str, str]] = []
    if config.agent_events_jsonl:
        written.append(("agent lifecycle events", config.agent_events_jsonl))
    if config.request_events_jsonl and not config.dry_run:
        written.append(("request events", config.request_events_jsonl))
    if config.server_metrics_jsonl and not config.dry_run:
        written.append(("server metrics", config.server_metrics_jsonl))
    errors: list[str] = []
    if config.results_csv:
        try:
            extra = window_csv(result.window, config.percentiles)
            write_csv(config.results_csv, csv_row(result.summary), extra)
            written.append(("agent benchmark summary", config.results_csv))
        except BatchbenchError as exc:
            errors.append(str(exc))
    document = None
    if config.results_json or config.report_html:
        model = result.document()
        if config.results_json and result.shard_data is not None and config.shard is not None:
            try:
                shard = _write_shard_data(result, config.results_json)
                model = replace(model, shard=shard)
                written.append(("shard raw data", shard.data_path))
            except BatchbenchError as exc:
                errors.append(str(exc))
        document = model.to_json()
    if config.results_json:
        assert document is not None  # made for results_json
        try:
            write_json(config.results_json, document)
            written.append(("agent benchmark JSON summary", config.results_json))
        except BatchbenchError as exc:
            errors.append(str(exc))
    if config.report_html and document is not None:
        try:
            from batchbench.report import write_report  # lazy: the HTML report's modules

            name = os.path.basename(config.results_json) if config.results_json else "this run"
            write_report([dict(document, _report_source=name)], config.report_html)
            written.append(("HTML report", config.report_html))
        except BatchbenchError as exc:
            errors.append(str(exc))
    options_path = config_file_path(config) if not errors else None
    if options_path is not None:
        resolved = replace(_as_given(config), seed=result.setup.root_seed)
        text = resolved.to_toml(salt_used=result.setup.content_salt)
        try:
            Path(options_path).write_text(text, encoding="utf-8")
            written.append(("resolved options", options_path))
        except (OSError, ValueError) as exc:
            if out is not None:
                out.warning(
                    f"warning: the resolved options were not written to {options_path}: {exc}"
                )
    result = replace(result, written=tuple(written))
    if errors:
        raise OutputError("; ".join(errors), result)
    return result


def _write_shard_data(result: RunResult, results_json: str) -> ShardSection:
    """Save a shard's raw data beside its results JSON; the JSON's ``shard`` section."""
    data = result.shard_data
    assert data is not None  # only a shard's result is written with its data
    from batchbench.scale.partial import data_path, save  # lazy: shard runs only (start-up)

    path = data_path(results_json)
    save(data, path)
    config = result.config
    index, count = data.shard
    return ShardSection(
        index=index,
        count=count,
        data=os.path.basename(path),
        data_path=path,
        wall_origin=data.meta["wall_origin"],
        agent_events=os.path.basename(config.agent_events_jsonl)
        if config.agent_events_jsonl
        else None,
        request_events=os.path.basename(config.request_events_jsonl)
        if config.request_events_jsonl and not config.dry_run
        else None,
    )


def _as_given(config: RunConfig) -> RunConfig:
    """The options a user would pass again: with --sim, no host (the simulator's URL is
    new every run)."""
    if config.sim:
        metrics = tuple(  # the simulator's URL is new every run
            SIM_METRICS if config.host and url.startswith(config.host) else url
            for url in config.server_metrics
        )
        return replace(config, host=None, server_metrics=metrics)
    return config
