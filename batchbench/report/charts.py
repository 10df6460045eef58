"""The report's figures, built with plotly's figure objects (which check every property
name) and handed to the page as plain ``{"data", "layout"}`` dicts.

Each builder returns a Chart, or None when no document has the data (the page then writes a
one-line note instead). Strings from documents go into figures HTML-escaped: plotly renders
a small HTML subset in names and titles."""

from __future__ import annotations

import html
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from batchbench.report.format import get
from batchbench.report.views import StepView, read_steps
from batchbench.results.documents import OutcomeView, WindowView
from batchbench.results.formatting import finite, number, rank_order, ratio_percent

# Trace colours by document (or rank), and step colours by verdict.
PALETTE = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
)  # fmt: skip
VERDICT_COLORS = {
    "pass": "#2ca02c",
    "fail": "#d62728",
    "unresolved": "#ff9f1c",
    "client-bound": "#9467bd",
}
UNKNOWN_COLOR = "#7f7f7f"
SLO_COLOR = "#d62728"

# Latency metrics with a distribution: (metric name in SLO objectives, document key, title).
CDF_METRICS = (
    ("ttft", "ttft_ms", "Time to first token"),
    ("itl", "itl_ms", "Inter-token latency"),
    ("e2e", "e2e_ms", "End-to-end request latency"),
)
# What one sample of each distribution is (a CDF's y axis counts these).
CDF_COUNTS = {"ttft": "requests", "itl": "inter-token gaps", "e2e": "requests"}


@dataclass(frozen=True)
class Chart:
    """One figure of the page: its div id (stable; tests and links use it) and its figure."""

    id: str
    figure: dict[str, Any]
    height: int


def color(index: int) -> str:
    return PALETTE[index % len(PALETTE)]


# Lines of the capacity curve avoid the verdict colours its markers use.
CURVE_PALETTE = ("#1f77b4", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f")


def curve_color(index: int) -> str:
    return CURVE_PALETTE[index % len(CURVE_PALETTE)]


def compact(values: Any) -> list[float | None]:
    """Numbers rounded to six significant digits (smaller page, same picture); others None."""
    if not isinstance(values, list):
        return []
    out: list[float | None] = []
    for value in values:
        number_ = finite(value)
        out.append(None if number_ is None else float(f"{number_:.6g}"))
    return out


def finish(fig: go.Figure, chart_id: str, height: int, **layout: Any) -> Chart:
    fig.update_layout(
        height=height,
        margin={"l": 60, "r": 20, "t": 50, "b": 50},
        legend={"orientation": "h", "yanchor": "top", "y": -0.15, "x": 0},
        hovermode="closest",
        **layout,
    )
    figure = fig.to_plotly_json()
    figure["layout"].pop("template", None)  # the page sets one shared template
    return Chart(chart_id, {"data": figure["data"], "layout": figure["layout"]}, height)


def tick_label(value: float) -> str:
    """A tick's plain number: ``0.5``, ``2``, ``2,000``."""
    return f"{value:,.12g}"


def log_ticks(values: Any) -> dict[str, Any]:
    """A log axis's readable ticks for ``values`` (the positive ones): 1, 2 and 5 times
    each power of ten (only the powers of ten beyond four decades), as plain numbers, and
    a range from the tick at or below the smallest value to the one at or above the
    largest (so every axis shows two ticks at least). Empty when no value is positive."""
    numbers = [v for v in (finite(x) for x in values) if v is not None and v > 0]
    if not numbers:
        return {}
    low, high = min(numbers), max(numbers)
    first, last = math.floor(math.log10(low)), math.ceil(math.log10(high))
    steps = (1,) if last - first > 4 else (1, 2, 5)
    candidates = [float(f"{m * 10.0**e:.12g}") for e in range(first, last + 1) for m in steps]
    bottom = max([c for c in candidates if c <= low * (1 + 1e-9)], default=candidates[0])
    top = min([c for c in candidates if c >= high * (1 - 1e-9)], default=candidates[-1])
    if top <= bottom:  # one value on a tick: the ticks either side of it
        index = candidates.index(bottom)
        bottom = candidates[max(index - 1, 0)]
        top = candidates[min(index + 1, len(candidates) - 1)]
    ticks = [c for c in candidates if bottom <= c <= top]
    return {
        "type": "log",
        "tickmode": "array",
        "tickvals": ticks,
        "ticktext": [tick_label(t) for t in ticks],
        "range": [math.log10(bottom), math.log10(top)],
    }


def log_ms_axis(values: Any = ()) -> dict[str, Any]:
    """A log axis of milliseconds (latencies and delays span several orders), with the
    readable ticks of ``values`` (the drawn ones, limits included)."""
    return {"type": "log", "title": {"text": "milliseconds (log scale)"}, **log_ticks(values)}


def note_left_out(fig: go.Figure, text: str) -> None:
    """A small note above the plot's top left saying what is not drawn (a log axis has no
    0, so the zeros are counted here instead)."""
    fig.add_annotation(
        text=text,
        xref="paper",
        yref="paper",
        x=0,
        y=1,
        xanchor="left",
        yanchor="bottom",
        showarrow=False,
        font={"size": 11, "color": "#666"},
    )


def _name(label: str) -> str:
    return html.escape(label)


def slo_limits(documents: list[dict[str, Any]], metric: str) -> list[tuple[str, float, float]]:
    """Distinct (objective, limit ms, quantile) of ``metric`` over the documents' SLOs."""
    limits: list[tuple[str, float, float]] = []
    for document in documents:
        for objective in WindowView.read(get(document, "window")).slo:
            if objective.metric != metric:
                continue
            limit, quantile = finite(objective.limit_ms), finite(objective.quantile)
            name = objective.objective
            if limit is None or limit <= 0 or quantile is None or name is None:
                continue
            entry = (name, limit, quantile)
            if entry not in limits:
                limits.append(entry)
    return limits


def cdf_chart(
    chart_id: str,
    title: str,
    series: list[tuple[str, Any]],
    limits: list[tuple[str, float, float]],
    counts: str = "requests",
) -> Chart | None:
    """Cumulative fraction of ``counts`` (what each sample is: requests, or the gaps
    between streamed chunks for ITL) against latency (log x), one line per series, with
    each SLO as a dashed vertical line at its limit and a marker at its required fraction:
    the objective holds where the curve passes at or above the marker."""
    if not any(compact(get(distribution, "values")) for _, distribution in series):
        return None  # before building a figure (the slow part of a small page)
    fig = go.Figure()
    drawn = zeros = 0
    drawn_x: list[float] = []
    for index, (label, distribution) in enumerate(series):
        values = compact(get(distribution, "values"))
        fractions = compact(get(distribution, "fractions"))
        points = [
            (x, y)
            for x, y in zip(values, fractions, strict=False)
            if x is not None and y is not None and x > 0
        ]
        zeros += sum(1 for x in values if x is not None and x <= 0)
        if not points:
            continue
        drawn += 1
        drawn_x += [p[0] for p in points]
        fig.add_trace(
            go.Scatter(
                x=[p[0] for p in points],
                y=[p[1] for p in points],
                mode="lines",
                line={"shape": "hv", "color": color(index), "width": 2},
                name=_name(label),
                hovertemplate="%{x:.4~g} ms: %{y:.1%} of " + counts,
            )
        )
    if not drawn:
        return None
    for name, limit, quantile in limits:
        text = f"SLO {name} ≤ {number(limit)} ms"
        fig.add_trace(
            go.Scatter(
                x=[limit, limit],
                y=[0, 1],
                mode="lines",
                line={"color": SLO_COLOR, "dash": "dash", "width": 1.5},
                name=_name(text),
                legendgroup=_name(name),
                hoverinfo="skip",
            )
        )
        fig.add_trace(
            go.Scatter(
                x=[limit],
                y=[quantile],
                mode="markers",
                marker={"color": SLO_COLOR, "symbol": "x", "size": 10},
                legendgroup=_name(name),
                showlegend=False,
                name=_name(text),
                hovertemplate=_name(f"{text}: at least {ratio_percent(quantile)} within"),
            )
        )
    if zeros:  # a log axis has no 0: say what is left out (the fractions stay cumulative)
        note_left_out(fig, f"{zeros} points at 0 ms are not drawn (log scale)")
    return finish(
        fig,
        chart_id,
        380,
        title={"text": _name(title)},
        xaxis=log_ms_axis(drawn_x + [limit for _, limit, _ in limits]),
        yaxis={"title": {"text": f"fraction of {counts}"}, "range": [0, 1.02]},
    )


# Throughput bins: wide enough to hold about this many requests each, and at least this
# share of the run (at most 60 bins), but never so wide that a run has fewer than
# MIN_BINS of them.
REQUESTS_PER_BIN = 20
MAX_BINS = 60
MIN_BINS = 10


@dataclass(frozen=True)
class Bins:
    """A run's throughput regrouped into wider bins: bin ends, rates and the bin width."""

    t: list[float | None]
    requests_per_second: list[float | None]
    output_tokens_per_second: list[float | None]
    width: float | None  # seconds; None when the document does not say its interval


def bin_factor(interval: float, duration: float, requests: float) -> int:
    """How many of the recorded bins (``interval`` s each) make one drawn bin: the width
    that holds ~REQUESTS_PER_BIN requests, at least 1/MAX_BINS of the run, capped so the
    run keeps MIN_BINS bins, in whole recorded bins (1 at least)."""
    if interval <= 0 or duration <= 0:
        return 1
    width = duration / MAX_BINS
    if requests > 0:
        width = max(width, min(REQUESTS_PER_BIN * duration / requests, duration / MIN_BINS))
    return max(1, math.ceil(width / interval - 1e-9))


def throughput_bins(timeseries: dict[str, Any]) -> Bins:
    """The document's time series regrouped by ``bin_factor`` (each drawn bin's rate is
    its recorded bins' counts over their span, so a short last bin weighs what it holds)."""
    t = compact(get(timeseries, "t"))
    rps = compact(get(timeseries, "requests_per_second"))
    tps = compact(get(timeseries, "output_tokens_per_second"))
    interval = finite(get(timeseries, "interval_seconds"))
    ends = [x for x in t if x is not None]
    if interval is None or not ends or len(ends) != len(t):
        return Bins(t, rps, tps, interval)
    spans = [end - start for start, end in zip([0.0, *ends], ends, strict=False)]
    requests = math.fsum(r * s for r, s in zip(rps, spans, strict=False) if r is not None)
    k = bin_factor(interval, ends[-1], requests)
    if k == 1:
        return Bins(t, rps, tps, interval)

    def grouped(rates: list[float | None]) -> list[float | None]:
        out: list[float | None] = []
        for start in range(0, len(ends), k):
            group = rates[start : start + k]
            widths = spans[start : start + k]
            span = math.fsum(widths)
            known = [r for r in group if r is not None]
            if len(known) < len(group) or span <= 0:
                out.append(None)
            else:
                total = math.fsum(r * w for r, w in zip(known, widths, strict=False))
                out.append(float(f"{total / span:.6g}"))
        return out

    return Bins(
        [ends[min(start + k, len(ends)) - 1] for start in range(0, len(ends), k)],
        grouped(rps) if len(rps) == len(ends) else [],
        grouped(tps) if len(tps) == len(ends) else [],
        float(f"{interval * k:.6g}"),
    )


def seconds_label(value: float) -> str:
    return f"{value:.6g} s"


def throughput_chart(series: list[tuple[str, dict[str, Any]]]) -> Chart | None:
    """Requests/s and output tokens/s over time, one colour per document, in bins chosen
    from each run's length and request count (``throughput_bins``); the title says the
    bin width."""
    if not series:  # no subplots to build (they are the slow part of a page)
        return None
    fig = make_subplots(
        rows=2,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.12,
        subplot_titles=("Requests per second", "Output tokens per second"),
    )
    drawn = False
    widths: list[tuple[str, float | None]] = []
    for index, (label, timeseries) in enumerate(series):
        bins = throughput_bins(timeseries)
        t = bins.t
        shown = False
        for row, values in ((1, bins.requests_per_second), (2, bins.output_tokens_per_second)):
            if not t or not values:
                continue
            drawn = shown = True
            fig.add_trace(
                go.Scatter(
                    x=t,
                    y=values,
                    mode="lines",
                    line={"color": color(index)},
                    name=_name(label),
                    legendgroup=_name(label),
                    showlegend=row == 1,
                    hovertemplate="%{x:.1f} s: %{y:.4~g}",
                ),
                row=row,
                col=1,
            )
        if shown:
            widths.append((label, bins.width))
    if not drawn:
        return None
    fig.update_xaxes(title_text="seconds since the run started", row=2, col=1)
    distinct = {w for _, w in widths}
    if len(distinct) == 1:
        (width,) = distinct
        bins_text = f"{seconds_label(width)} bins" if width is not None else "bins of unknown width"
    else:
        bins_text = "bins: " + ", ".join(
            f"{label} {seconds_label(w) if w is not None else 'unknown'}" for label, w in widths
        )
    title = _name(f"Throughput over time ({bins_text})")
    return finish(fig, "bb-throughput", 520, title={"text": title})


def concurrency_chart(series: list[tuple[str, dict[str, Any]]]) -> Chart | None:
    """Active agents (solid) and requests in flight (dashed) over time."""
    if not series:
        return None
    fig = go.Figure()
    for index, (label, timeseries) in enumerate(series):
        t = compact(get(timeseries, "t"))
        for key, text, dash in (
            ("active_agents", "active agents", "solid"),
            ("in_flight", "requests in flight", "dash"),
        ):
            values = compact(get(timeseries, key))
            if not t or not values:
                continue
            prefix = f"{label}: " if len(series) > 1 else ""
            fig.add_trace(
                go.Scatter(
                    x=t,
                    y=values,
                    mode="lines",
                    line={"color": color(index), "dash": dash, "shape": "hv"},
                    name=_name(prefix + text),
                    hovertemplate="%{x:.1f} s: %{y}",
                )
            )
    if not fig.data:
        return None
    return finish(
        fig,
        "bb-concurrency",
        360,
        title={"text": "Active agents and requests in flight"},
        xaxis={"title": {"text": "seconds since the run started"}},
        yaxis={"title": {"text": "count"}, "rangemode": "tozero"},
    )


def ranks_chart(series: list[tuple[str, list[dict[str, Any]]]]) -> Chart | None:
    """Per-DP-rank bars: requests, input tokens, TTFT p50 and p99, cached tokens."""
    if not series:  # no subplots to build (they are the slow part of a page)
        return None
    fig = make_subplots(
        rows=2,
        cols=2,
        vertical_spacing=0.18,
        subplot_titles=("Requests", "Input tokens", "TTFT p50 / p99 (ms)", "Cached input tokens"),
    )
    drawn = False
    for index, (label, ranks) in enumerate(series):
        rows = [r for r in ranks if isinstance(r, dict) and isinstance(r.get("rank"), int)]
        if not rows:
            continue
        drawn = True
        # a server-reported row is named as its metrics name it ("<url> <rank>" when several
        # pages were scraped); the client's rows by their index
        x = [
            f"rank {r['label']}"
            if str(r.get("label", "x")).isdigit()
            else str(r["label"])
            if r.get("label")
            else f"rank {r['rank']}"
            for r in rows
        ]
        panels = (
            (1, 1, "requests", "", 1.0),
            (1, 2, "input_tokens", "", 1.0),
            (2, 1, "ttft_p50_ms", " p50", 1.0),
            (2, 1, "ttft_p99_ms", " p99", 0.55),
            (2, 2, "cached_tokens", "", 1.0),
        )
        for row, col, key, suffix, opacity in panels:
            fig.add_trace(
                go.Bar(
                    x=x,
                    y=[finite(r.get(key)) for r in rows],
                    name=_name(label + suffix),
                    legendgroup=_name(label),
                    showlegend=(row, col) == (1, 1),
                    marker={"color": color(index), "opacity": opacity},
                    hovertemplate="%{x}: %{y:,.4~g}",
                ),
                row=row,
                col=col,
            )
    if not drawn:
        return None
    return finish(fig, "bb-ranks", 560, title={"text": "Per data-parallel rank"}, barmode="group")


def fidelity_chart(series: list[tuple[str, dict[str, Any]]]) -> Chart | None:
    """Requests by token drift (served minus planned), prompt and output side by side."""
    if not series:  # no subplots to build (they are the slow part of a page)
        return None
    fig = make_subplots(
        rows=1, cols=2, subplot_titles=("Prompt tokens: drift", "Output tokens: drift")
    )
    for index, (label, fidelity) in enumerate(series):
        for col, side in ((1, "prompt"), (2, "output")):
            histogram = get(fidelity, side, "histogram")
            if not isinstance(histogram, dict) or not histogram:
                continue
            pairs = []
            for key, count in histogram.items():
                try:
                    pairs.append((int(key), finite(count)))
                except ValueError:
                    continue
            pairs.sort()
            fig.add_trace(
                go.Bar(
                    x=[p[0] for p in pairs],
                    y=[p[1] for p in pairs],
                    name=_name(label),
                    legendgroup=_name(label),
                    showlegend=col == 1,
                    marker={"color": color(index)},
                    hovertemplate="drift %{x} tokens: %{y} requests",
                ),
                row=1,
                col=col,
            )
    if not fig.data:
        return None
    fig.update_xaxes(title_text="served − planned tokens")
    fig.update_yaxes(title_text="requests", col=1)
    return finish(
        fig, "bb-fidelity", 380, title={"text": "Token fidelity"}, barmode="group", bargap=0.2
    )


SERVER_SERIES = (
    ("kv_cache_usage", "KV-cache usage (fraction of the pool)"),
    ("running_requests", "Running requests"),
    ("waiting_requests", "Waiting requests"),
)


def server_metrics_chart(series: list[tuple[str, dict[str, Any]]]) -> Chart | None:
    """KV-cache usage, running and waiting requests over time, one line per rank."""
    if not series:  # no subplots to build (they are the slow part of a page)
        return None
    fig = make_subplots(
        rows=3,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.08,
        subplot_titles=tuple(title for _, title in SERVER_SERIES),
    )
    seen: dict[str, int] = {}
    for doc_index, (label, metrics_series) in enumerate(series):
        t = compact(get(metrics_series, "t"))
        if not t:
            continue
        for row, (concept, _) in enumerate(SERVER_SERIES, start=1):
            by_rank = get(metrics_series, concept)
            if not isinstance(by_rank, dict):
                continue
            for rank, values in sorted(by_rank.items(), key=lambda item: rank_order(item[0])):
                name = f"rank {rank}" if rank != "all" else "all ranks"
                if len(series) > 1:
                    name = f"{label}: {name}"
                index = seen.setdefault(name, len(seen))
                fig.add_trace(
                    go.Scatter(
                        x=t,
                        y=compact(values),
                        mode="lines",
                        line={"color": color(index), "dash": "solid" if doc_index == 0 else "dot"},
                        name=_name(name),
                        legendgroup=_name(name),
                        showlegend=name not in {d.name for d in fig.data},
                        hovertemplate="%{x:.1f} s: %{y:.4~g}",
                    ),
                    row=row,
                    col=1,
                )
    if not fig.data:
        return None
    fig.update_xaxes(title_text="seconds since the run started", row=3, col=1)
    return finish(fig, "bb-server-metrics", 640, title={"text": "Server metrics over time"})


def _steps_by_agents(capacity: dict[str, Any]) -> list[StepView]:
    steps = [s for s in read_steps(get(capacity, "steps")) if finite(s.agents) is not None]
    return sorted(steps, key=lambda s: s.agents or 0)


def _latency_objectives(capacity: dict[str, Any], steps: list[StepView]) -> list[str]:
    """The step SLO objectives with a latency limit, in first-seen order."""
    names: list[str] = []
    for step in steps:
        for objective in step.window.slo:
            name = objective.objective
            limit = finite(objective.limit_ms)
            if name is not None and limit is not None and name not in names:
                names.append(name)
    return names


def _objective(step: StepView, name: str) -> OutcomeView | None:
    return next((o for o in step.window.slo if o.objective == name), None)


def _figure(objective: OutcomeView | None, read: Callable[[OutcomeView], Any]) -> float | None:
    """A figure of a step's objective, None when the step has no such objective."""
    return None if objective is None else finite(read(objective))


def capacity_chart(chart_id: str, capacity: dict[str, Any]) -> Chart | None:
    """The capacity curve: each latency objective's value (with its confidence interval)
    against active agents with its limit as a horizontal line; throughput and good
    throughput below (and the goodput ratio when the SLO has a goodput objective); each
    step's marker coloured by its verdict; the answer and the breaking point marked."""
    steps = _steps_by_agents(capacity)
    if not steps:
        return None
    goodput_objective = next(
        (
            o
            for o in steps[-1].window.slo
            if o.metric == "goodput" and finite(o.quantile) is not None
        ),
        None,
    )
    has_ratio = any(finite(s.window.goodput_ratio) is not None for s in steps)
    rows = 3 if has_ratio else 2
    titles = ["Latency objectives (ms)", "Requests per second"]
    if has_ratio:
        titles.append("Goodput ratio")
    fig = make_subplots(
        rows=rows, cols=1, shared_xaxes=True, vertical_spacing=0.08, subplot_titles=titles
    )
    agents = [s.agents for s in steps if s.agents is not None]  # all: steps_by_agents kept those
    verdicts = [s.verdict if s.verdict is not None else "?" for s in steps]
    colors = [VERDICT_COLORS.get(v, UNKNOWN_COLOR) for v in verdicts]
    hover = [html.escape(f"{a} agents: {v}") for a, v in zip(agents, verdicts, strict=True)]
    marker = {"color": colors, "size": 10, "line": {"color": "#333", "width": 1}}
    names = _latency_objectives(capacity, steps)
    answer = get(capacity, "answer", "agents")
    answer = answer if finite(answer) is not None else None
    # A search that did not conclude still names the highest cap that held so far.
    concluded = get(capacity, "answer", "concluded") is not False
    answer_label = "capacity" if concluded else "held so far (not concluded)"
    latency_rows: list[tuple[str, list[float | None], dict[str, Any] | None]] = []
    limits: list[float | None] = []  # per latency objective
    drawn_ms: list[float | None] = []  # the interval bars' ends (the values come below)
    span = (
        [agents[0], agents[-1]] if agents[0] != agents[-1] else [agents[0] - 0.5, agents[0] + 0.5]
    )
    for name in names:
        objectives = [_objective(s, name) for s in steps]
        values = [_figure(o, lambda o: o.value_ms) for o in objectives]
        high = [_figure(o, lambda o: o.value_high_ms) for o in objectives]
        low = [_figure(o, lambda o: o.value_low_ms) for o in objectives]
        error = None
        if any(h is not None for h in high) or any(lo is not None for lo in low):
            error = {
                "type": "data",
                "symmetric": False,
                "array": [_gap(h, v) for h, v in zip(high, values, strict=True)],
                "arrayminus": [_gap(v, lo) for v, lo in zip(values, low, strict=True)],
                "thickness": 1,
            }
        latency_rows.append((name, values, error))
        drawn_ms += high + low
        limits.append(next((finite(o.limit_ms) for o in objectives if o is not None), None))
    if not latency_rows:  # no latency objective: show TTFT (or E2E) p99 of each step
        for key, name in (("ttft_ms", "TTFT p99"), ("e2e_ms", "E2E p99")):
            values = [finite(s.window.percentile(key, "p99")) for s in steps]
            if any(v is not None for v in values):
                latency_rows.append((name, values, None))
                break
    for index, (name, values, error) in enumerate(latency_rows):
        fig.add_trace(
            go.Scatter(
                x=agents,
                y=values,
                error_y=error,
                mode="lines+markers",
                line={"color": curve_color(index)},
                marker=marker,
                name=_name(name),
                text=hover,
                hovertemplate="%{text}<br>%{y:.4~g} ms",
            ),
            row=1,
            col=1,
        )
        limit = limits[index] if index < len(limits) else None
        if limit is not None:
            text = f"{name} ≤ {number(limit)} ms"
            fig.add_trace(_limit_line(span, limit, text, curve_color(index)), row=1, col=1)
        if answer is not None and answer in agents:
            value = values[agents.index(answer)]
            if value is not None:
                fig.add_trace(
                    go.Scatter(
                        x=[answer],
                        y=[value],
                        mode="markers",
                        marker={"symbol": "star", "size": 18, "color": "#ffd400",
                                "line": {"color": "#333", "width": 1}},
                        name=_name(f"{answer_label}: {number(answer)} agents"),
                        showlegend=index == 0,
                        legendgroup="answer",
                        hovertemplate=_name(f"{answer_label}: {number(answer)} agents") + "<br>"
                        "%{y:.4~g} ms<extra></extra>",
                    ),
                    row=1,
                    col=1,
                )  # fmt: skip
    for key, name, offset in (
        ("requests_per_second", "requests/s", 0),
        ("good_requests_per_second", "good requests/s", 1),
    ):
        values = [
            finite(
                s.window.requests_per_second
                if key == "requests_per_second"
                else s.window.good_requests_per_second
            )
            for s in steps
        ]
        if not any(v is not None for v in values):
            continue
        fig.add_trace(
            go.Scatter(
                x=agents,
                y=values,
                mode="lines+markers",
                line={"color": curve_color(len(latency_rows) + offset)},
                marker=marker,
                name=name,
                text=hover,
                hovertemplate="%{text}<br>%{y:.4~g} " + name,
            ),
            row=2,
            col=1,
        )
    if has_ratio:
        ratios = [finite(s.window.goodput_ratio) for s in steps]
        fig.add_trace(
            go.Scatter(
                x=agents,
                y=ratios,
                mode="lines+markers",
                line={"color": curve_color(len(latency_rows) + 2)},
                marker=marker,
                name="goodput ratio",
                text=hover,
                hovertemplate="%{text}<br>%{y:.1%} good",
            ),
            row=3,
            col=1,
        )
        if goodput_objective is not None:
            required = finite(goodput_objective.quantile) or 0.0  # finite: it was chosen so
            fig.add_trace(
                _limit_line(span, required, f"goodput ≥ {ratio_percent(required)}", SLO_COLOR),
                row=3,
                col=1,
            )
        fig.update_yaxes(tickformat=".0%", range=[0, 1.05], row=3, col=1)
    for verdict, verdict_color in VERDICT_COLORS.items():  # legend entries for the colours
        fig.add_trace(
            go.Scatter(
                x=[None],
                y=[None],
                mode="markers",
                marker={"color": verdict_color, "size": 10},
                name=f"step {verdict}",
                legendgroup="verdicts",
            ),
            row=1,
            col=1,
        )
    breaking = get(capacity, "answer", "breaking_agents")
    breaking = breaking if finite(breaking) is not None else None
    for value, text, dash in ((answer, answer_label, "solid"), (breaking, "breaks", "dot")):
        if value is None:
            continue
        line = {"color": "#444", "dash": dash, "width": 1}
        fig.add_shape(
            type="line", x0=value, x1=value, xref="x", y0=0, y1=1, yref="paper", line=line
        )
        fig.add_annotation(
            x=value,
            xref="x",
            y=1,
            yref="paper",
            text=_name(f"{text}: {number(value)}"),
            showarrow=False,
            xanchor="left",
            yanchor="top",
        )
    drawn_ms += [v for _, values, _ in latency_rows for v in values]
    # objectives from ms (ITL) to s (E2E): a log axis with readable ticks
    fig.update_yaxes(**{"type": "log", **log_ticks(drawn_ms + limits)}, row=1, col=1)
    fig.update_xaxes(tickmode="array", tickvals=agents)  # ticks at the steps only
    fig.update_xaxes(title_text="active agents", row=rows, col=1)
    return finish(fig, chart_id, 260 + 220 * rows, title={"text": "Capacity curve"})


def throughput_latency_chart(chart_id: str, capacity: dict[str, Any]) -> Chart | None:
    """Each step's throughput (x, requests/s) against the latency percentile each SLO
    objective judges (y, log ms): one point per step, labelled by its agent count and
    coloured by its verdict, one line per objective with its limit dashed (TTFT or E2E p99
    when the SLO has no latency objective)."""
    steps = [s for s in _steps_by_agents(capacity)
             if finite(s.window.requests_per_second) is not None]  # fmt: skip
    if not steps:
        return None
    x = [finite(s.window.requests_per_second) for s in steps]
    labels = [f"{number(s.agents)} agent{'' if s.agents == 1 else 's'}" for s in steps]
    verdicts = [s.verdict if s.verdict is not None else "?" for s in steps]
    marker = {"color": [VERDICT_COLORS.get(v, UNKNOWN_COLOR) for v in verdicts], "size": 10,
              "line": {"color": "#333", "width": 1}}  # fmt: skip
    hover = [html.escape(f"{a}: {v}") for a, v in zip(labels, verdicts, strict=True)]
    rows: list[tuple[str, list[float | None], float | None]] = []
    for name in _latency_objectives(capacity, steps):
        objectives = [_objective(s, name) for s in steps]
        values = [_figure(o, lambda o: o.value_ms) for o in objectives]
        limit = next((finite(o.limit_ms) for o in objectives if o is not None), None)
        rows.append((name, values, limit))
    if not rows:
        for key, name in (("ttft_ms", "TTFT p99"), ("e2e_ms", "E2E p99")):
            values = [finite(s.window.percentile(key, "p99")) for s in steps]
            if any(v is not None for v in values):
                rows.append((name, values, None))
                break
    if not rows:
        return None
    fig = go.Figure()
    known = [v for v in x if v is not None]
    span = [min(known), max(known)]
    for index, (name, values, limit) in enumerate(rows):
        fig.add_trace(
            go.Scatter(
                x=x,
                y=values,
                mode="lines+markers+text",
                line={"color": curve_color(index)},
                marker=marker,
                text=[_name(label) for label in labels],
                textposition="top center",
                customdata=hover,
                name=_name(name),
                hovertemplate="%{customdata}<br>%{x:.4~g} requests/s<br>%{y:.4~g} ms"
                "<extra></extra>",
            )
        )
        if limit is not None:
            text = f"{name} ≤ {number(limit)} ms"
            fig.add_trace(_limit_line(span, limit, text, curve_color(index)))
    drawn = [v for _, values, _ in rows for v in values] + [lim for *_, lim in rows]
    return finish(
        fig,
        chart_id,
        420,
        title={"text": "Throughput against latency, one point per step"},
        xaxis={"title": {"text": "requests per second"}},
        yaxis={**log_ms_axis(drawn), "title": {"text": "milliseconds (log scale)"}},
    )


def _limit_line(span: list[float], limit: float, text: str, line_color: str) -> go.Scatter:
    """An SLO limit as a dashed horizontal line in the objective's colour, named in the
    legend (a trace, not a shape: it works on log axes and says which objective it is)."""
    return go.Scatter(
        x=span,
        y=[limit, limit],
        mode="lines",
        line={"color": line_color, "dash": "dash", "width": 1.5},
        name=_name("SLO " + text),
        hovertemplate=_name("SLO " + text) + "<extra></extra>",
    )


def _gap(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or math.isnan(a - b):
        return None
    return max(a - b, 0.0)
