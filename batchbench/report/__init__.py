"""The HTML report: ``batchbench report RESULTS... -o report.html`` and ``--report-html``.

One self-contained file from results documents (``--results-json``) and capacity documents
(``capacity.json``): latency CDFs, throughput and concurrency over time, per-DP-rank bars,
fidelity histograms, server metrics, the capacity curve, and configuration tables.

Why plotly: the reader wants to hover a CDF to read "what fraction of requests finished
within 800 ms", zoom into a spike of the time series and toggle runs in a legend, offline.
plotly gives interactive charts from plain JSON figure specs with one inlined JavaScript
bundle (about 4.8 MB, no CDN, so the file opens anywhere and stays under 10 MB); static SVG
from matplotlib would be smaller but loses hover values, and hand-written SVG would need its
own axes, log scales and legends. plotly is an optional extra (``batchbench[report]``):
only the report imports it, and without it the report fails with one line saying so.
"""

from __future__ import annotations

from batchbench.report.load import load_documents
from batchbench.report.page import PLOTLY_MISSING, render_html, require_plotly, write_report

__all__ = ["PLOTLY_MISSING", "load_documents", "render_html", "require_plotly", "write_report"]
