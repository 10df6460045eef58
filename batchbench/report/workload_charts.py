"""The figures of a workload description (``batchbench.ingest.describe``), drawn from its
compact histograms and timeline: nothing here grows with the number of requests."""

from __future__ import annotations

from itertools import pairwise

import plotly.graph_objects as go

from batchbench.ingest.describe import Timeline
from batchbench.ingest.distribution import Histogram
from batchbench.report.charts import Chart, color, finish, log_ms_axis, note_left_out


def _range(low: float, high: float) -> str:
    """The integers of a bin [low, high) as text: ``7`` or ``100–199``."""
    return f"{low:,.0f}" if high - low == 1 else f"{low:,.0f}–{high - 1:,.0f}"


def histogram_chart(
    chart_id: str, title: str, axis: str, counted: str, histogram: Histogram, index: int
) -> Chart | None:
    """Bars of an integer histogram: one per bin, as wide as the bin."""
    if not histogram.counts:
        return None
    edges = histogram.edges
    span = edges[-1] - edges[0]
    pad = span / len(histogram.counts) if len(histogram.counts) < 5 else 0  # not one wall
    fig = go.Figure(
        go.Bar(
            x=[(low + high) / 2 for low, high in pairwise(edges)],
            y=list(histogram.counts),
            width=[high - low for low, high in pairwise(edges)],
            customdata=[_range(low, high) for low, high in pairwise(edges)],
            marker={"color": color(index), "line": {"width": 0}},
            name=counted,
            hovertemplate="%{customdata}: %{y} " + counted + "<extra></extra>",
        )
    )
    return finish(
        fig,
        chart_id,
        340,
        title={"text": title},
        xaxis={"title": {"text": axis}, "range": [edges[0] - pad, edges[-1] + pad]},
        yaxis={"title": {"text": counted}},
        bargap=0,
        showlegend=False,
    )


def delay_chart(histogram: Histogram, zeros: int) -> Chart | None:
    """The positive delays as a step outline on a log axis (bars have no width there);
    the delays of 0 ms are said in a note, since a log axis has no 0."""
    if not histogram.counts:
        return None
    counts = list(histogram.counts)
    fig = go.Figure(
        go.Scatter(
            x=list(histogram.edges),
            y=[*counts, counts[-1]],
            mode="lines",
            line={"shape": "hv", "color": color(2), "width": 2},
            fill="tozeroy",
            name="requests",
            hovertemplate="from %{x:.4~g} ms: %{y} requests<extra></extra>",
        )
    )
    if zeros:
        note_left_out(fig, f"{zeros:,} delays of 0 ms are not drawn (log scale)")
    return finish(
        fig,
        "bb-workload-delay",
        340,
        title={"text": "Delay after a request (delay_after_ms)"},
        xaxis=log_ms_axis(histogram.edges),
        yaxis={"title": {"text": "requests"}},
        showlegend=False,
    )


def _starts(timeline: Timeline) -> list[float]:
    return [i * timeline.bin_ms / 1000 for i in range(len(timeline.requests))]


def arrivals_chart(timeline: Timeline) -> Chart | None:
    """Requests per second, averaged over each bin of the timeline."""
    if not timeline.requests:
        return None
    width = timeline.bin_ms / 1000
    fig = go.Figure(
        go.Bar(
            x=[start + width / 2 for start in _starts(timeline)],
            y=[n / width for n in timeline.requests],
            width=[width] * len(timeline.requests),
            customdata=list(timeline.requests),
            marker={"color": color(0), "line": {"width": 0}},
            name="requests/s",
            hovertemplate="%{x:.4~g} s: %{y:.4~g} requests/s (%{customdata} requests)"
            "<extra></extra>",
        )
    )
    return finish(
        fig,
        "bb-workload-arrivals",
        340,
        title={"text": f"Arrivals over time ({width:g} s bins)"},
        xaxis={"title": {"text": "seconds after the start"}},
        yaxis={"title": {"text": "requests per second"}},
        bargap=0,
        showlegend=False,
    )


def cache_chart(timeline: Timeline) -> Chart | None:
    """The perfect prefix cache's cumulative hit rate at the end of each bin."""
    if not any(rate is not None for rate in timeline.cache_hit_rate):
        return None
    width = timeline.bin_ms / 1000
    fig = go.Figure(
        go.Scatter(
            x=[start + width for start in _starts(timeline)],
            y=list(timeline.cache_hit_rate),
            mode="lines",
            line={"color": color(3), "width": 2},
            name="cumulative hit rate",
            hovertemplate="by %{x:.4~g} s: %{y:.1%} of prompt tokens hit<extra></extra>",
        )
    )
    return finish(
        fig,
        "bb-workload-cache",
        340,
        title={"text": "Perfect prefix cache: cumulative hit rate"},
        xaxis={"title": {"text": "seconds after the start"}},
        yaxis={"title": {"text": "prompt tokens hit"}, "tickformat": ".0%", "range": [0, 1.02]},
        showlegend=False,
    )
