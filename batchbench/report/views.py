"""The report's typed views of the documents it draws: a results JSON or a capacity
document (``DocumentView``), a capacity step (``StepView``) and a run's server metrics
(``ServerMetricsView``), built on the read models of ``batchbench.results.documents``.

Every field is optional, as in those models: a document of an earlier version (or a dry
run) may lack it, and the page prints the missing-value spelling. The types are the ones
``batchbench.report.schema`` checked when the document was loaded; a value of another type
reads as None. The series the charts draw (time series, ranks, fidelity, distributions)
stay the mappings the document holds: the chart builders read them as arrays.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from batchbench.report.load import NOTES_KEY, STEPS_KEY
from batchbench.results.documents import DriftView, WindowView
from batchbench.results.documents import json_number as _number
from batchbench.results.documents import json_text as _text


def _mapping(value: Any) -> dict[str, Any] | None:
    return value if isinstance(value, dict) else None


def _list(value: Any) -> list[Any] | None:
    return value if isinstance(value, list) else None


@dataclass(frozen=True, slots=True)
class StepView:
    """One entry of a capacity document's ``steps``."""

    agents: int | float | None
    phase: str | None
    verdict: str | None
    extensions: int | float | None
    results_json: str | None
    note: str | None
    window: WindowView
    raw: dict[str, Any]  # the entry as written, for the charts that draw a step

    @classmethod
    def read(cls, entry: dict[str, Any]) -> StepView:
        return cls(
            agents=_number(entry.get("agents")),
            phase=_text(entry.get("phase")),
            verdict=_text(entry.get("verdict")),
            extensions=_number(entry.get("extensions")),
            results_json=_text(entry.get("results_json")),
            note=_text(entry.get("note")),
            window=WindowView.read(entry.get("window")),
            raw=entry,
        )


def read_steps(entries: Any) -> tuple[StepView, ...]:
    """The step entries that are objects, in written order."""
    return tuple(StepView.read(s) for s in (_list(entries) or []) if isinstance(s, dict))


@dataclass(frozen=True, slots=True)
class ServerMetricsView:
    """A run's ``server_metrics`` section: where and how often the server was scraped, its
    series (for the chart) and its per-rank concepts (for the table)."""

    url: str | None
    dialect: str | None
    scrapes: int | float | None
    interval_seconds: int | float | None
    failed_scrapes: int | float | None
    series: dict[str, Any] | None
    concepts: dict[str, Any] | None
    endpoints: tuple[ServerMetricsView, ...]  # several --server-metrics: each URL's own

    @classmethod
    def read(cls, section: Any) -> ServerMetricsView | None:
        """None when the run has no server metrics."""
        metrics = _mapping(section)
        if metrics is None:
            return None
        return cls(
            url=_text(metrics.get("url")),
            dialect=_text(metrics.get("dialect")),
            scrapes=_number(metrics.get("scrapes")),
            interval_seconds=_number(metrics.get("interval_seconds")),
            failed_scrapes=_number(metrics.get("failed_scrapes")),
            series=_mapping(metrics.get("series")),
            concepts=_mapping(metrics.get("concepts")),
            endpoints=tuple(
                view
                for view in map(cls.read, _list(metrics.get("endpoints")) or [])
                if view is not None
            ),
        )


@dataclass(frozen=True, slots=True)
class ManifestView:
    path: str | None
    sha256: str | None
    schema_version: Any  # not checked by the schema: shown as written


@dataclass(frozen=True, slots=True)
class DocumentView:
    """A loaded results JSON or capacity document as the page reads it (the loader's
    notes and a capacity document's step documents included)."""

    timestamp: str | None
    batchbench_version: str | None
    interrupted: bool
    interrupted_by: str | None
    dry_run: bool
    notes: tuple[Any, ...]  # what the loader noted about the file
    manifest: ManifestView
    configuration: dict[str, Any] | None
    # a run
    summary_verdict: str | None
    metrics: dict[str, Any] | None  # the whole-run summary, by the CSV's column names
    has_window: bool
    window: WindowView
    timeseries: dict[str, Any] | None
    ranks: list[Any] | None
    ranks_source: str | None
    fidelity: dict[str, Any] | None
    server_metrics: ServerMetricsView | None
    # a capacity document
    slo: list[Any] | None
    steps: tuple[StepView, ...]
    step_documents: dict[str, dict[str, Any] | None]  # by results_json, as the loader read them
    answer_text: str | None
    answer_concluded: Any

    @classmethod
    def read(cls, document: dict[str, Any]) -> DocumentView:
        manifest = _mapping(document.get("manifest")) or {}
        answer = _mapping(document.get("answer")) or {}
        concluded = answer.get("concluded")
        return cls(
            timestamp=_text(document.get("timestamp")),
            batchbench_version=_text(document.get("batchbench_version")),
            interrupted=bool(document.get("interrupted")),
            interrupted_by=_text(document.get("interrupted_by")),
            dry_run=bool(document.get("dry_run")),
            notes=tuple(document.get(NOTES_KEY) or ()),
            manifest=ManifestView(
                path=_text(manifest.get("path")),
                sha256=_text(manifest.get("sha256")),
                schema_version=manifest.get("schema_version"),
            ),
            configuration=_mapping(document.get("configuration")),
            summary_verdict=_text((_mapping(document.get("metrics")) or {}).get("verdict")),
            metrics=_mapping(document.get("metrics")),
            has_window=isinstance(document.get("window"), dict),
            window=WindowView.read(document.get("window")),
            timeseries=_mapping(document.get("timeseries")),
            ranks=_list(document.get("ranks")),
            ranks_source=_text(document.get("ranks_source")),
            fidelity=_mapping(document.get("fidelity")),
            server_metrics=ServerMetricsView.read(document.get("server_metrics")),
            slo=_list(document.get("slo")),
            steps=read_steps(document.get("steps")),
            step_documents=document.get(STEPS_KEY) or {},
            answer_text=_text(answer.get("text")),
            answer_concluded=concluded,
        )

    def drift(self, side: str) -> DriftView | None:
        """One side (``prompt`` or ``output``) of the fidelity section, None when absent."""
        return DriftView.read((self.fidelity or {}).get(side))
