"""The report page: headline tables, chart divs and the script that draws them, assembled
into one self-contained HTML file (plotly.js inlined once, no network)."""

from __future__ import annotations

import contextlib
import functools
import html
import importlib.util
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import orjson

from batchbench.errors import BatchbenchError
from batchbench.report.format import get, text
from batchbench.report.load import json_problem, kind_of, labels, validate
from batchbench.report.views import DocumentView, StepView
from batchbench.results.documents import OutcomeView, WindowView
from batchbench.results.formatting import MISSING, finite, number, percent, ratio_percent
from batchbench.results.slo import SPEED_METRICS

PLOTLY_MISSING = "the HTML report needs plotly: pip install 'batchbench[report]'"


def require_plotly() -> None:
    """Raise BatchbenchError(PLOTLY_MISSING) when plotly is not installed. Cheap (plotly is
    looked up, not imported), so a run asked for ``--report-html`` can say so before it
    starts instead of after it has measured."""
    try:
        found = importlib.util.find_spec("plotly") is not None
    except ValueError:  # imported already, by a loader that left no spec: it is there
        found = True
    if not found:
        raise BatchbenchError(PLOTLY_MISSING)


@contextlib.contextmanager
def importing_plotly() -> Iterator[None]:
    """Around the import of a module that imports plotly: one clear line when plotly (or
    one of its own dependencies) cannot be imported."""
    require_plotly()
    try:
        yield
    except ImportError as exc:
        package = (exc.name or "").split(".")[0]
        if package == "plotly":
            raise BatchbenchError(PLOTLY_MISSING) from None
        if package and package != "batchbench":
            raise BatchbenchError(f"{PLOTLY_MISSING} (importing it failed: {exc})") from None
        raise


def _plotly() -> Any:
    """The chart builders (which import plotly)."""
    with importing_plotly():
        from batchbench.report import charts  # lazy: charts import plotly (an extra)
    return charts


def write_report(
    documents: list[dict[str, Any]], path: str | os.PathLike[str], title: str | None = None
) -> None:
    """Write the HTML report of ``documents`` (from ``load_documents``, or results documents
    built in memory) to ``path``."""
    page = render_html(documents, title)
    data = page.encode()
    try:
        with open(path, "wb") as handle:
            handle.write(data)
    except OSError as exc:
        raise BatchbenchError(f"cannot write {path}: {exc.strerror or exc}") from None


def render_html(documents: list[dict[str, Any]], title: str | None = None) -> str:
    """The report page as a string.

    Documents built in memory are checked like files are (see load.validate) after a JSON
    round trip (tuples become lists, NaN becomes null), so the page reads what a results
    JSON file of the same run would hold; a malformed one is a BatchbenchError naming it."""
    charts = _plotly()
    if not documents:
        raise BatchbenchError("no documents to report on")
    names = labels(documents)
    documents = [_plain(d, n) for d, n in zip(documents, names, strict=True)]
    for document, name in zip(documents, names, strict=True):
        validate(document, name)
    if title is None:
        title = "batchbench report" + (f": {names[0]}" if len(documents) == 1 else "")
    page = Page(charts)
    runs = [(n, d) for n, d in zip(names, documents, strict=True) if kind_of(d) == "run"]
    capacities = [(n, d) for n, d in zip(names, documents, strict=True) if kind_of(d) == "capacity"]
    page.header(title, names, documents)
    if runs:
        page.runs_summary(runs)
        page.workload(runs)
        page.latency(runs)
        page.over_time(runs)
        page.ranks(runs)
        page.fidelity(runs)
        page.server_metrics(runs)
    for index, (name, capacity) in enumerate(capacities):
        page.capacity(name, capacity, "" if index == 0 else f"-{index + 1}")
    page.configuration(names, documents)
    return page.render(title)


def _plain(document: Any, name: str) -> dict[str, Any]:
    """The document as JSON would give it back."""
    try:
        data = orjson.dumps(document, option=orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY)
    except orjson.JSONEncodeError as exc:
        raise BatchbenchError(f"{name}: cannot be shown: {json_problem(exc)}") from None
    plain = orjson.loads(data)
    if not isinstance(plain, dict):
        raise BatchbenchError(
            f"{name} is not a batchbench results or capacity document (a "
            f"{type(document).__name__}, not an object)"
        )
    return plain


class Page:
    """Sections in order, and the charts their divs name."""

    def __init__(self, charts: Any) -> None:
        self.charts_module = charts
        self.parts: list[str] = []
        self.charts: list[Any] = []
        self.toc: list[tuple[str, str]] = []

    # -- building blocks --------------------------------------------------------------------

    def section(self, anchor: str, heading: str) -> None:
        self.toc.append((anchor, heading))
        self.parts.append(f'<h2 id="{anchor}">{html.escape(heading)}</h2>')

    def note(self, message: str) -> None:
        self.parts.append(f'<p class="bb-note">{html.escape(message)}</p>')

    def chart(self, chart: Any) -> None:
        self.charts.append(chart)
        self.parts.append(
            f'<div id="{chart.id}" class="bb-chart" style="height:{chart.height}px"></div>'
        )

    def table(
        self,
        table_id: str,
        headers: Sequence[str],
        rows: Sequence[Sequence[tuple[str, str]]],
        caption: str | None = None,
        classes: str = "",
    ) -> None:
        """A table; each cell is (field name for ``data-field``, escaped HTML text)."""
        out = [f'<table id="{table_id}" class="bb-table{f" {classes}" if classes else ""}">']
        if caption:
            out.append(f"<caption>{html.escape(caption)}</caption>")
        out.append("<thead><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in headers))
        out.append("</tr></thead><tbody>")
        for row in rows:
            cells = "".join(
                f'<td data-field="{html.escape(field)}"{_verdict_class(value)}>{value}</td>'
                for field, value in row
            )
            out.append(f"<tr>{cells}</tr>")
        out.append("</tbody></table>")
        self.parts.append("".join(out))

    # -- sections ---------------------------------------------------------------------------

    def header(self, title: str, names: list[str], documents: list[dict[str, Any]]) -> None:
        self.parts.append(f"<h1>{html.escape(title)}</h1>")
        rows = []
        views = [DocumentView.read(document) for document in documents]
        for name, document, view in zip(names, documents, views, strict=True):
            verdict: Any = view.summary_verdict
            if kind_of(document) == "capacity":
                concluded = view.answer_concluded
                verdict = None if concluded is None else ("concluded" if concluded else "open")
            rows.append(
                [
                    ("file", text(name)),
                    ("kind", text(kind_of(document))),
                    ("timestamp", text(view.timestamp)),
                    ("batchbench_version", text(view.batchbench_version)),
                    ("verdict", text(verdict)),
                    ("slo_verdict", text(view.window.slo_verdict)),
                ]
            )
        self.table(
            "bb-documents",
            ["file", "kind", "run timestamp", "batchbench", "verdict", "SLO verdict"],
            rows,
        )
        sentences = []
        for name, view in zip(names, views, strict=True):
            prefix = f"{name}: " if len(documents) > 1 else ""
            answer = view.answer_text
            if answer is not None:
                sentences.append(f'<li class="bb-answer">{html.escape(prefix + answer)}</li>')
            window = view.window
            for side, verdict, reason in (
                ("client", window.client_verdict, window.client_reason),
                ("server", window.server_verdict, window.server_reason),
            ):
                if reason:
                    judged = f" ({verdict})" if verdict is not None else ""
                    line = f"{prefix}{side.capitalize()}{judged}: {reason}"
                    sentences.append(f"<li>{html.escape(line)}</li>")
            if view.interrupted:
                by = view.interrupted_by
                line = f"{prefix}interrupted{f' by {by}' if by else ''}: the figures cover what ran"
                sentences.append(f'<li class="bb-note">{html.escape(line)}</li>')
            if view.dry_run:
                line = f"{prefix}a dry run: no requests were sent, so there are no live figures"
                sentences.append(f'<li class="bb-note">{html.escape(line)}</li>')
            for note in view.notes:
                sentences.append(f'<li class="bb-note">{html.escape(prefix + str(note))}</li>')
        if sentences:
            self.parts.append('<ul class="bb-verdicts">' + "".join(sentences) + "</ul>")

    def runs_summary(self, runs: list[tuple[str, dict[str, Any]]]) -> None:
        self.section("summary", "Headline figures")
        rows, fallback = [], []
        views = _views(runs)
        for name, view in views:
            if not view.has_window:
                fallback.append(name)
            rows.append([("file", text(name))] + [(c[0], c[2](headline_value(view, c[0])))
                                                   for c in HEADLINE])  # fmt: skip
        self.table("bb-headline", ["file"] + [c[1] for c in HEADLINE], rows)
        if fallback:
            self.note(
                f"{', '.join(fallback)}: no measured window in the document (a dry run or an "
                "older batchbench); figures are the whole run's summary."
            )
        slo_rows = []
        for name, view in views:
            for objective in view.window.slo:
                slo_rows.append([("file", text(name)), *slo_cells(objective)])
        if slo_rows:
            self.table(
                "bb-slo",
                ["file", "objective", "limit", "value (95% interval)", "required",
                 "attainment (95% interval)", "within / samples", "verdict"],
                slo_rows,
                caption="SLO outcomes, each with its confidence interval",
            )  # fmt: skip

    def workload(self, runs: list[tuple[str, dict[str, Any]]]) -> None:
        self.section("workload", "Workload")
        self.table(
            "bb-workload",
            [c[1] for c in WORKLOAD_COLUMNS],
            [workload_cells(name, document) for name, document in runs],
            caption="Trajectories, requests and tokens per successful request",
        )

    def latency(self, runs: list[tuple[str, dict[str, Any]]]) -> None:
        self.section("latency", "Latency distributions")
        documents = [d for _, d in runs]
        for metric, key, title in self.charts_module.CDF_METRICS:
            series = [(n, get(d, "distributions", key)) for n, d in runs]
            limits = self.charts_module.slo_limits(documents, metric)
            counts = self.charts_module.CDF_COUNTS[metric]
            chart = self.charts_module.cdf_chart(f"bb-cdf-{metric}", title, series, limits, counts)
            if chart is None:
                hint = (
                    " (TTFT and ITL need streamed replies: not --no-stream)"
                    if metric != "e2e"
                    else ""
                )
                self.note(f"{title}: no distribution in the documents{hint}.")
            else:
                self.chart(chart)
        rows = [[("file", text(n)), *speed_cells(v.window)] for n, v in _views(runs)
                if v.window.output_speed]  # fmt: skip
        if rows:
            self.table(
                "bb-output-speed",
                ["file", "agents", "per-agent p50 (tok/s)", "per-agent p10 (tok/s)",
                 "requests", "per-request p50 (tok/s)", "per-request p10 (tok/s)"],
                rows,
                caption="Output speed in the measured window: output tokens over generation "
                "time (first to last content chunk); per agent, summed over its requests",
            )  # fmt: skip

    def over_time(self, runs: list[tuple[str, dict[str, Any]]]) -> None:
        self.section("over-time", "Throughput and concurrency over time")
        series = [(n, v.timeseries) for n, v in _views(runs) if v.timeseries is not None]
        throughput = self.charts_module.throughput_chart(series)
        concurrency = self.charts_module.concurrency_chart(series)
        if throughput is None and concurrency is None:
            self.note("No time series in the documents.")
        for chart in (throughput, concurrency):
            if chart is not None:
                self.chart(chart)

    def ranks(self, runs: list[tuple[str, dict[str, Any]]]) -> None:
        self.section("ranks", "Data-parallel ranks")
        views = _views(runs)
        series = [(n, v.ranks) for n, v in views if v.ranks is not None]
        chart = self.charts_module.ranks_chart(series)
        if chart is None:
            self.note(
                "No per-rank figures: the client did not route to ranks and no server "
                "metrics with rank labels were scraped."
            )
            return
        for name, view in views:
            source = RANK_SOURCES.get(view.ranks_source, "source not recorded")
            if view.ranks:
                self.note(f"{name}: per-rank figures from {source}.")
        self.chart(chart)

    def fidelity(self, runs: list[tuple[str, dict[str, Any]]]) -> None:
        self.section("fidelity", "Token fidelity")
        views = [(n, v) for n, v in _views(runs) if v.fidelity is not None]
        chart = self.charts_module.fidelity_chart([(n, v.fidelity) for n, v in views])
        if chart is None:
            self.note("No fidelity figures in the documents (a dry run, or no usage reported).")
            return
        self.chart(chart)
        rows = []
        for name, view in views:
            for side in ("prompt", "output"):
                figures = view.drift(side)
                if figures is None:
                    continue
                rows.append(
                    [
                        ("file", text(name)),
                        ("side", side),
                        ("requests", number(figures.requests)),
                        ("exact", number(figures.exact)),
                        ("exact_percent", percent(figures.exact_percent)),
                        ("mean_abs_drift", number(figures.mean_abs_drift)),
                        ("max_abs_drift", number(figures.max_abs_drift)),
                    ]
                )
        self.table(
            "bb-fidelity-table",
            ["file", "tokens", "requests", "exact", "exact", "mean |drift|", "max |drift|"],
            rows,
        )

    def server_metrics(self, runs: list[tuple[str, dict[str, Any]]]) -> None:
        self.section("server-metrics", "Server metrics")
        present = [(n, v.server_metrics) for n, v in _views(runs)
                   if v.server_metrics is not None]  # fmt: skip
        if not present:
            self.note("No server metrics in the documents (scrape them with --server-metrics URL).")
            return
        for name, metrics in present:
            self.note(
                f"{name}: {metrics.url or MISSING} ({metrics.dialect or 'unknown'}), "
                f"{number(metrics.scrapes)} scrapes every "
                f"{number(metrics.interval_seconds)} s, "
                f"{number(metrics.failed_scrapes)} failed."
            )
        series = [  # several endpoints: each one's own series, named by its URL
            (f"{n} {e.url}" if m.endpoints else n, e.series)
            for n, m in present
            for e in (m.endpoints or (m,))
            if e.series is not None
        ]
        chart = self.charts_module.server_metrics_chart(series)
        if chart is None:
            self.note("The server metrics hold no time series.")
        else:
            self.chart(chart)
        rows = []
        for name, metrics in present:
            concepts = metrics.concepts
            if concepts is None:
                continue
            for concept, by_rank in concepts.items():
                if not isinstance(by_rank, dict):
                    continue
                for rank, value in by_rank.items():
                    rows.append([("file", text(name)), ("concept", text(concept)),
                                 ("rank", text(rank)), *concept_cells(value, concept)])  # fmt: skip
        if rows:
            self.table(
                "bb-server-concepts",
                ["file", "concept", "rank", "value", "mean", "min", "p50", "p90", "p99", "max"],
                rows,
                caption="Summarized over the measured window",
            )

    def capacity(self, name: str, capacity: dict[str, Any], suffix: str) -> None:
        self.section(f"capacity{suffix}", f"Capacity search: {name}")
        view = DocumentView.read(capacity)  # its answer is said once, under the page's title
        slo = view.slo
        if slo:
            self.note("SLO: " + ", ".join(str(s) for s in slo))
        chart = self.charts_module.capacity_chart(f"bb-capacity-curve{suffix}", capacity)
        if chart is None:
            self.note("No steps in the capacity document.")
        else:
            self.chart(chart)
            against = self.charts_module.throughput_latency_chart(
                f"bb-capacity-tput-latency{suffix}", capacity
            )
            if against is not None:
                self.chart(against)
        steps_documents = view.step_documents
        series, metric = capacity_cdf_series(view, steps_documents)
        if series:
            names = {m: t for m, _, t in self.charts_module.CDF_METRICS}
            key = {m: k for m, k, _ in self.charts_module.CDF_METRICS}[metric]
            limits = self.charts_module.slo_limits(
                [d for d in steps_documents.values() if d], metric
            )
            chart = self.charts_module.cdf_chart(
                f"bb-capacity-cdf{suffix}",
                f"{names[metric]} by step",
                [(label, get(d, "distributions", key)) for label, d in series],
                limits,
                self.charts_module.CDF_COUNTS[metric],
            )
            if chart is not None:
                self.chart(chart)
        rows = []
        for index, step in enumerate(view.steps, start=1):
            rows.append(step_cells(index, step))
        self.table("bb-capacity-steps" + suffix, [c[1] for c in STEP_COLUMNS], rows,
                   caption="Steps in the order they ran", classes="bb-steps")  # fmt: skip
        loaded = [(step.results_json, steps_documents.get(step.results_json))
                  for step in view.steps if step.results_json is not None]  # fmt: skip
        workload = [(n, d) for n, d in dict(loaded).items() if isinstance(d, dict)]
        if workload:
            self.table(
                "bb-capacity-workload" + suffix,
                [c[1] for c in WORKLOAD_COLUMNS],
                [workload_cells(n, d) for n, d in workload],
                caption="Workload of each step (tokens per successful request)",
            )

    def configuration(self, names: list[str], documents: list[dict[str, Any]]) -> None:
        self.section("configuration", "Configuration and manifest")
        rows = []
        views = [DocumentView.read(document) for document in documents]
        for name, view in zip(names, views, strict=True):
            manifest = view.manifest
            rows.append(
                [
                    ("file", text(name)),
                    ("path", text(manifest.path)),
                    ("sha256", text(manifest.sha256)),
                    ("schema_version", text(manifest.schema_version)),
                ]
            )
        self.table("bb-manifest", ["file", "manifest path", "SHA-256", "schema"], rows)
        for index, (name, view) in enumerate(zip(names, views, strict=True)):
            configuration = view.configuration
            if configuration is None:
                self.note(f"{name}: no configuration in the document.")
                continue
            suffix = "" if index == 0 else f"-{index + 1}"
            self.parts.append(f"<details{' open' if index == 0 else ''}><summary>"
                              f"{html.escape(name)}</summary>")  # fmt: skip
            self.table(
                "bb-configuration" + suffix,
                ["option", "value"],
                [[("option", text(k)), ("value", text(v))] for k, v in configuration.items()],
            )
            self.parts.append("</details>")

    # -- output -----------------------------------------------------------------------------

    def render(self, title: str) -> str:
        template, plotlyjs = _plotly_assets()
        specs = {
            "template": template,
            "charts": [{"id": c.id, "figure": c.figure} for c in self.charts],
        }
        nav = " · ".join(f'<a href="#{a}">{html.escape(h)}</a>' for a, h in self.toc)
        return "".join(
            [
                '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">',
                '<meta name="viewport" content="width=device-width, initial-scale=1">',
                f"<title>{html.escape(title)}</title><style>{STYLE}</style>",
                f"<script>{ERROR_COLLECTOR}</script>",
                f'</head><body><nav class="bb-nav">{nav}</nav>',
                "\n".join(self.parts),
                # After the content, so the tables show while plotly.js loads.
                f'<script type="application/json" id="bb-figures">{_script_json(specs)}</script>',
                "<script>",
                plotlyjs,  # not in an f-string: 4.8 MB copied once, by the join
                "</script>",
                f"<script>{DRAW}</script></body></html>\n",
            ]
        )


@functools.cache
def _plotly_assets() -> tuple[dict[str, Any], str]:
    """The page template and plotly.js (4.8 MB read from plotly's package), read once per
    process: they are the same for every page and most of a small page's cost."""
    from plotly.io import templates
    from plotly.offline import get_plotlyjs

    return templates["plotly_white"].to_plotly_json(), get_plotlyjs()


def _script_json(value: Any) -> str:
    """JSON safe inside a script element: ``<``, ``>`` and ``&`` as \\u escapes."""
    data = orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY).decode()
    return data.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _verdict_class(value: str) -> str:
    if value in ("pass", "fail", "unresolved", "client-bound", "ok", "server-bound"):
        return f' class="bb-verdict-{value}"'
    return ""


# -- table contents -----------------------------------------------------------------------


def _views(runs: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, DocumentView]]:
    return [(name, DocumentView.read(document)) for name, document in runs]


# (field, header, formatter); values come from headline_value.
HEADLINE: tuple[tuple[str, str, Callable[[Any], str]], ...] = (
    ("requests", "requests", number),
    ("failed_requests", "failed", number),
    ("duration_seconds", "window (s)", number),
    ("requests_per_second", "req/s", number),
    ("output_tokens_per_second", "output tok/s", number),
    ("ttft_p50_ms", "TTFT p50 (ms)", number),
    ("ttft_p99_ms", "TTFT p99 (ms)", number),
    ("itl_p50_ms", "ITL p50 (ms)", number),
    ("itl_p99_ms", "ITL p99 (ms)", number),
    ("e2e_p50_ms", "E2E p50 (ms)", number),
    ("e2e_p99_ms", "E2E p99 (ms)", number),
    ("good_requests_per_second", "good req/s", number),
    ("goodput_ratio", "goodput", ratio_percent),
    ("good_trajectories_per_minute", "good trajectories/min", number),
    ("cache_hit_percent", "cache hit", percent),
    ("client_verdict", "client", lambda v: text(v)),
    ("slo_verdict", "SLO", lambda v: text(v)),
)

# Where each headline figure is in a measured window.
_FROM_WINDOW: dict[str, Callable[[WindowView], Any]] = {
    "requests": lambda w: w.requests,
    "failed_requests": lambda w: w.failed_requests,
    "duration_seconds": lambda w: w.duration_seconds,
    "requests_per_second": lambda w: w.requests_per_second,
    "output_tokens_per_second": lambda w: w.output_tokens_per_second,
    "ttft_p50_ms": lambda w: w.percentile("ttft_ms", "p50"),
    "ttft_p99_ms": lambda w: w.percentile("ttft_ms", "p99"),
    "itl_p50_ms": lambda w: w.percentile("itl_ms", "p50"),
    "itl_p99_ms": lambda w: w.percentile("itl_ms", "p99"),
    "e2e_p50_ms": lambda w: w.percentile("e2e_ms", "p50"),
    "e2e_p99_ms": lambda w: w.percentile("e2e_ms", "p99"),
    "good_requests_per_second": lambda w: w.good_requests_per_second,
    "goodput_ratio": lambda w: w.goodput_ratio,
    "good_trajectories_per_minute": lambda w: w.good_trajectories_per_minute,
    "cache_hit_percent": lambda w: w.cache_hit_percent,
    "client_verdict": lambda w: w.client_verdict,
    "slo_verdict": lambda w: w.slo_verdict,
}

# The whole-run summary's names, for documents without a measured window.
_METRICS_NAMES = {
    "requests": "total_requests",
    "failed_requests": "failed_requests",
    "duration_seconds": "total_duration_seconds",
    "requests_per_second": "requests_per_second",
    "output_tokens_per_second": "output_tokens_per_second",
    "ttft_p50_ms": "ttft_p50_ms",
    "ttft_p99_ms": "ttft_p99_ms",
    "itl_p50_ms": "inter_token_latency_p50_ms",
    "itl_p99_ms": "inter_token_latency_p99_ms",
    "e2e_p50_ms": "latency_p50_ms",
    "e2e_p99_ms": "latency_p99_ms",
}


def headline_value(document: DocumentView, field: str) -> Any:
    """A headline figure: from the measured window, else from the whole-run summary."""
    if document.has_window:
        return _FROM_WINDOW[field](document.window)
    metrics = document.metrics
    if field == "cache_hit_percent":
        cached = finite(get(metrics, "server_cached_input_tokens"))
        total = finite(get(metrics, "total_input_tokens"))
        return None if cached is None or not total else cached / total * 100.0
    name = _METRICS_NAMES.get(field)
    return get(metrics, name) if name else None


def slo_cells(objective: OutcomeView) -> list[tuple[str, str]]:
    """One SLO outcome: its limit, value and attainment, each with its interval."""
    if objective.metric == "goodput":
        limit = f"≥ {ratio_percent(objective.quantile)} good"
        value = MISSING
    elif objective.metric in SPEED_METRICS:
        limit = f"≥ {number(objective.limit_tokens_per_second)} tok/s"
        value = _interval(
            objective.value_tokens_per_second,
            objective.value_low_tokens_per_second,
            objective.value_high_tokens_per_second,
        )
    else:
        limit = f"≤ {number(objective.limit_ms)} ms"
        value = _interval(objective.value_ms, objective.value_low_ms, objective.value_high_ms)
    attainment = _interval(
        objective.attainment, objective.attainment_low, objective.attainment_high, ratio_percent
    )
    within = f"{number(objective.within)} / {number(objective.samples)}"
    return [
        ("objective", text(objective.objective)),
        ("limit", html.escape(limit)),
        ("value", html.escape(value)),
        ("required", ratio_percent(objective.required)),
        ("attainment", html.escape(attainment)),
        ("within", within),
        ("verdict", text(objective.verdict)),
    ]


def speed_cells(window: WindowView) -> list[tuple[str, str]]:
    """A window's output speed, tokens/s: per agent and per request, count, p50 and p10."""
    cells: list[tuple[str, str]] = []
    for side, count_name in (("agents", "agents"), ("requests", "requests")):
        stats = window.output_speed.get(side) or {}
        percentiles = stats.get("percentiles")
        percentiles = percentiles if isinstance(percentiles, dict) else {}
        cells += [
            (count_name, number(stats.get("count"))),
            (f"{side}_p50", number(percentiles.get("p50"))),
            (f"{side}_p10", number(percentiles.get("p10"))),
        ]
    return cells


def _interval(value: Any, low: Any, high: Any, fmt: Callable[[Any], str] = number) -> str:
    if finite(value) is None:
        return MISSING
    if finite(low) is None and finite(high) is None:
        return fmt(value)
    if finite(high) is None:  # too few samples to bound the upper side
        return f"{fmt(value)} (≥ {fmt(low)})"
    if finite(low) is None:
        return f"{fmt(value)} (≤ {fmt(high)})"
    return f"{fmt(value)} ({fmt(low)} – {fmt(high)})"


def count(value: Any) -> str:
    """A count: whole numbers without decimals (``5,120``), a mean of counts with one."""
    number_ = finite(value)
    if number_ is None:
        return MISSING
    return f"{number_:,.0f}" if number_.is_integer() else f"{number_:,.1f}"


def milliseconds(seconds: Any) -> str:
    number_ = finite(seconds)
    return MISSING if number_ is None else f"{number(number_ * 1000.0)} ms"


# How each server-metrics concept's values are spelled: shares as percentages, times in
# ms, counts as integers; a concept not named here as a plain number.
CONCEPT_FORMATS: dict[str, Callable[[Any], str]] = {
    "kv_cache_usage": ratio_percent,  # a fraction of the pool
    "prefix_cache_hit_percent": percent,
    "prefix_cache_hit_tokens": count,
    "prefix_cache_queried_tokens": count,
    "ttft_seconds": milliseconds,
    "running_requests": count,
    "waiting_requests": count,
    "requests": count,
    "prompt_tokens": count,
    "generation_tokens": count,
    "policy_branches": count,
}


def concept_cells(value: Any, concept: str = "") -> list[tuple[str, str]]:
    """A server-metrics concept for one rank: a single value, or summary statistics, each
    in the concept's unit (CONCEPT_FORMATS)."""
    fmt = CONCEPT_FORMATS.get(concept, number)
    stats = ("mean", "min", "p50", "p90", "p99", "max")
    if isinstance(value, dict):
        return [("value", MISSING)] + [(s, fmt(value.get(s))) for s in stats]
    return [("value", fmt(value))] + [(s, MISSING) for s in stats]


def _token_figure(window: Any, side: str, stat: str) -> Any:
    return finite(get(window, "request_tokens", side, stat))


def _mean_tokens(document: dict[str, Any], side: str) -> float | None:
    """Tokens per successful request from the window's totals, else the whole run's (a
    document written before the window had per-request figures)."""
    for total, requests in (
        (get(document, "window", f"{side}_tokens"),
         get(document, "window", "successful_requests")),
        (get(document, "metrics", f"total_{side}_tokens"),
         get(document, "metrics", "successful_requests")),
    ):  # fmt: skip
        total, requests = finite(total), finite(requests)
        if total is not None and requests:
            return total / requests
    return None


# (field, header) of the workload tables; cells from workload_cells.
WORKLOAD_COLUMNS = (
    ("file", "file"),
    ("trajectories", "trajectories"),
    ("requests", "requests"),
    ("input_mean", "input tokens mean"),
    ("input_p50", "input p50"),
    ("input_p90", "input p90"),
    ("output_mean", "output tokens mean"),
    ("output_p50", "output p50"),
    ("output_p90", "output p90"),
)


def workload_cells(name: str, document: dict[str, Any]) -> list[tuple[str, str]]:
    """One run's workload: its trajectories (agents), the window's requests, and input and
    output tokens per successful request (mean, p50, p90)."""
    window = get(document, "window")
    requests = finite(get(window, "requests"))
    if requests is None:
        requests = finite(get(document, "metrics", "total_requests"))
    cells = [
        ("file", text(name)),
        ("trajectories", count(get(document, "metrics", "agents"))),
        ("requests", count(requests)),
    ]
    for side in ("input", "output"):
        mean = _token_figure(window, side, "mean")
        if mean is None and get(window, "request_tokens") is None:
            mean = _mean_tokens(document, side)
        cells.append((f"{side}_mean", number(mean)))
        cells += [(f"{side}_{s}", count(_token_figure(window, side, s))) for s in ("p50", "p90")]
    return cells


# (field, header, value of a step) for the capacity steps table.
STEP_COLUMNS: tuple[tuple[str, str, Callable[[StepView], str]], ...] = (
    ("agents", "agents", lambda s: number(s.agents)),
    ("phase", "phase", lambda s: text(s.phase)),
    ("verdict", "verdict", lambda s: text(s.verdict)),
    ("extensions", "extensions", lambda s: number(s.extensions)),
    ("requests", "requests", lambda s: number(s.window.requests)),
    ("requests_per_second", "req/s", lambda s: number(s.window.requests_per_second)),
    ("output_tokens_per_second", "output tok/s",
     lambda s: number(s.window.output_tokens_per_second)),
    ("ttft_p50_ms", "TTFT p50 (ms)", lambda s: number(s.window.percentile("ttft_ms", "p50"))),
    ("ttft_p99_ms", "TTFT p99 (ms)", lambda s: number(s.window.percentile("ttft_ms", "p99"))),
    ("itl_p99_ms", "ITL p99 (ms)", lambda s: number(s.window.percentile("itl_ms", "p99"))),
    ("e2e_p95_ms", "E2E p95 (ms)", lambda s: number(s.window.percentile("e2e_ms", "p95"))),
    ("goodput_ratio", "goodput", lambda s: ratio_percent(s.window.goodput_ratio)),
    ("good_trajectories_per_minute", "good trajectories/min",
     lambda s: number(s.window.good_trajectories_per_minute)),
    ("cache_hit_percent", "cache hit", lambda s: percent(s.window.cache_hit_percent)),
    ("client_verdict", "client", lambda s: text(s.window.client_verdict)),
    ("results_json", "results", lambda s: text(s.results_json)),
    ("note", "note", lambda s: text(s.note) if s.note else ""),
)  # fmt: skip


def step_cells(index: int, step: StepView) -> list[tuple[str, str]]:
    del index  # rows are in run order; the table needs no number column
    return [(field, value(step)) for field, _, value in STEP_COLUMNS]


def capacity_cdf_series(
    capacity: DocumentView, steps: dict[str, dict[str, Any] | None]
) -> tuple[list[tuple[str, dict[str, Any]]], str]:
    """(label, step document) per loaded step in agent order, and the metric to draw: the
    first latency objective's metric, else TTFT when streamed, else E2E."""
    metric = None
    for objective in capacity.slo or []:
        head = str(objective).split("_", 1)[0].split("=", 1)[0]
        if head in ("ttft", "itl", "e2e"):
            metric = head
            break
    ordered = sorted(capacity.steps, key=lambda s: finite(s.agents) or 0.0)
    series: list[tuple[str, dict[str, Any]]] = []
    seen = set()
    for step in ordered:
        name = step.results_json
        document = steps.get(name) if name is not None else None
        if document is None or name in seen:
            continue
        seen.add(name)
        agents = step.agents
        series.append((f"{number(agents)} agent{'' if agents == 1 else 's'}", document))
    if metric is None:
        has_ttft = any(get(d, "distributions", "ttft_ms") for _, d in series)
        metric = "ttft" if has_ttft else "e2e"
    return series, metric


RANK_SOURCES: dict[str | None, str] = {
    "client": "client routing (the rank each request was sent to)",
    "server": "the server's metrics (per-rank labels)",
}

STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0 auto;
max-width:1280px;padding:0 24px 48px;color:#222}
h1{font-size:1.6em;margin:16px 0 8px}h2{font-size:1.25em;margin-top:32px;
border-bottom:1px solid #ddd;padding-bottom:4px}
.bb-nav{position:sticky;top:0;background:#fff;padding:8px 0;border-bottom:1px solid #eee;
font-size:.9em;z-index:10}.bb-nav a{color:#1f5fa0;text-decoration:none}
.bb-table{border-collapse:collapse;margin:8px 0 16px;font-size:.85em;display:block;
overflow-x:auto}.bb-table caption{text-align:left;font-weight:600;padding:4px 0}
.bb-table th,.bb-table td{border:1px solid #ddd;padding:3px 8px;text-align:right;
white-space:nowrap}.bb-table th{background:#f5f5f5;white-space:normal}
.bb-table td[data-field=file]{text-align:left}
.bb-table td[data-field=option],.bb-table td[data-field=value],.bb-table td[data-field=path]
{text-align:left;white-space:normal;word-break:break-all}
.bb-table td[data-field=note]{text-align:left;white-space:normal;min-width:16em}
.bb-steps{font-size:.8em}.bb-steps th,.bb-steps td{padding:3px 5px}
.bb-steps td[data-field=note]{min-width:10em}
.bb-steps td[data-field=results_json]{white-space:normal;word-break:break-all}
.bb-verdict-pass,.bb-verdict-ok{color:#1a7f37;font-weight:600}
.bb-verdict-fail,.bb-verdict-client-bound,.bb-verdict-server-bound{color:#c62828;
font-weight:600}.bb-verdict-unresolved{color:#b86e00;font-weight:600}
.bb-note{color:#555;font-size:.9em}.bb-answer{font-weight:600;font-size:1.05em}
.bb-chart{width:100%;margin:8px 0 24px}details summary{cursor:pointer;margin:8px 0}
"""

# Before plotly.js: every script error and rejected promise is kept for tests and readers.
ERROR_COLLECTOR = (
    "window.__bbErrors=[];window.__bbReady=false;"
    "window.addEventListener('error',function(e){window.__bbErrors.push(String(e.message||e))});"
    "window.addEventListener('unhandledrejection',function(e){"
    "window.__bbErrors.push('unhandled rejection: '+String(e.reason))});"
)

# Draw every chart; when all have drawn, record the time (ms since navigation started).
DRAW = """
(function(){
  window.__bbDrawStartMs=performance.now();
  var specs=JSON.parse(document.getElementById('bb-figures').textContent);
  var config={responsive:true,displaylogo:false};
  var jobs=specs.charts.map(function(c){
    var layout=c.figure.layout;layout.template=specs.template;
    return Plotly.newPlot(document.getElementById(c.id),c.figure.data,layout,config);
  });
  Promise.all(jobs).then(function(){
    window.__bbReadyMs=performance.now();window.__bbReady=true;
    document.body.setAttribute('data-bb-ready','true');
  },function(err){window.__bbErrors.push('chart failed: '+String(err));});
})();
"""
