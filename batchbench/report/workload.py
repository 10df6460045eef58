"""``--describe-html``: a workload description (``batchbench.ingest.describe``) as one
self-contained HTML page, in the report's page shell (plotly.js inlined, offline).

The tables hold the figures the importer prints, spelled the same way; the charts show
the distributions behind them: prompt and output tokens per request, requests per
trajectory, delays, arrivals over time and the perfect prefix cache's hit rate.
"""

from __future__ import annotations

import html
import os
from collections.abc import Callable
from typing import Any

from batchbench.errors import BatchbenchError
from batchbench.ingest.describe import (
    PERCENTILE_COLUMNS,
    PERCENTILE_ROWS,
    Percentiles,
    WorkloadDescription,
    count,
    seconds,
    share,
)
from batchbench.report.page import Page, importing_plotly

# (field, label, value) of the figures table, in order.
FIGURES: tuple[tuple[str, str, Callable[[WorkloadDescription], str]], ...] = (
    ("trajectories", "trajectories", lambda d: count(d.trajectories)),
    ("multi_request_trajectories", "with more than one request",
     lambda d: count(d.multi_request_trajectories)),
    ("requests", "requests", lambda d: count(d.requests)),
    ("block_requests", "requests with blocks", lambda d: count(d.block_requests)),
    ("prompt_tokens", "prompt tokens", lambda d: count(d.prompt_tokens)),
    ("output_tokens", "output tokens", lambda d: count(d.output_tokens)),
    ("block_tokens", "prompt tokens in blocks", lambda d: count(d.block_tokens)),
    ("shared_share", "in blocks shared by 2+ trajectories", lambda d: share(d.shared_share)),
    ("live_share", "in live blocks", lambda d: share(d.live_share)),
    ("cache_hit_rate", "perfect prefix cache hit rate", lambda d: share(d.cache_hit_rate)),
    ("cache_hit_tokens", "prompt tokens hit", lambda d: count(d.cache_hit_tokens)),
    ("cache_counted_tokens", "prompt tokens counted", lambda d: count(d.cache_counted_tokens)),
    ("first_arrival", "first arrival", lambda d: seconds(d.first_arrival_ms)),
    ("last_arrival", "last arrival", lambda d: seconds(d.last_arrival_ms)),
)  # fmt: skip


def render_workload_html(desc: WorkloadDescription, title: str) -> str:
    """The page as a string; BatchbenchError when plotly is not installed."""
    with importing_plotly():
        from batchbench.report import workload_charts  # lazy: it imports plotly (an extra)
    page = Page(workload_charts)
    page.parts.append(f"<h1>{html.escape(title)}</h1>")
    page.section("figures", "Workload")
    page.table(
        "bb-workload",
        ["figure", "value"],
        [[("figure", html.escape(label)), (field, value(desc))] for field, label, value in FIGURES],
    )
    page.table(
        "bb-workload-percentiles",
        ["per", *PERCENTILE_COLUMNS],
        [_percentile_row(label, getattr(desc, name)) for label, name in PERCENTILE_ROWS],
        caption="Nearest-rank percentiles",
    )
    page.section("distributions", "Distributions")
    charts: list[tuple[Any, str]] = [
        (
            workload_charts.histogram_chart(
                "bb-workload-isl", "Prompt tokens per request (ISL)", "prompt tokens",
                "requests", desc.prompt_histogram, 0,
            ),
            "No requests.",
        ),
        (
            workload_charts.histogram_chart(
                "bb-workload-osl", "Output tokens per request (OSL)", "output tokens",
                "requests", desc.output_histogram, 1,
            ),
            "No requests.",
        ),
        (
            workload_charts.histogram_chart(
                "bb-workload-turns", "Requests per trajectory", "requests",
                "trajectories", desc.turns_histogram, 4,
            ),
            "No trajectories.",
        ),
        (
            workload_charts.delay_chart(desc.delay_histogram, desc.zero_delays),
            f"All {count(desc.zero_delays)} delays are 0 ms."
            if desc.zero_delays
            else "No delays: no request is followed by another in its trajectory.",
        ),
    ]  # fmt: skip
    for chart, missing in charts:
        _chart_or_note(page, chart, missing)
    page.section("time", "Over time")
    _chart_or_note(page, workload_charts.arrivals_chart(desc.timeline), "No requests.")
    _chart_or_note(page, workload_charts.cache_chart(desc.timeline), "No prompt tokens.")
    return page.render(title)


def _percentile_row(label: str, figures: Percentiles) -> list[tuple[str, str]]:
    cells = [(column, count(getattr(figures, column))) for column in PERCENTILE_COLUMNS]
    return [("per", html.escape(label)), *cells]


def _chart_or_note(page: Page, chart: Any, missing: str) -> None:
    if chart is None:
        page.note(missing)
    else:
        page.chart(chart)


def write_workload_html(
    desc: WorkloadDescription, path: str | os.PathLike[str], title: str
) -> None:
    """Write the page to ``path``; BatchbenchError naming it when it cannot be written."""
    data = render_workload_html(desc, title).encode()
    try:
        with open(path, "wb") as handle:
            handle.write(data)
    except OSError as exc:
        raise BatchbenchError(f"cannot write {path}: {exc.strerror or exc}") from None
