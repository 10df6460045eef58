"""``batchbench report``: one self-contained HTML report from results and capacity JSON."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from batchbench.cli.exits import parsed_or_status
from batchbench.errors import BatchbenchError
from batchbench.options.parser import CommandParser

DESCRIPTION = """\
Write one self-contained HTML file (it opens offline: plotly.js is inlined, nothing is
fetched) from results JSON documents (--results-json of batchbench-agent) and capacity
documents (capacity.json of `batchbench capacity`; the step results it names are read
from its directory).

The report holds: a header table per document (timestamp, version, verdicts) and the
headline figures of each run's measured window (requests, req/s, output tok/s, TTFT, ITL
and E2E p50/p99, goodput, trajectory goodput, cache hit rate, client verdict) with the SLO
outcomes and their confidence intervals; latency CDFs (TTFT, ITL, E2E; runs overlaid, SLO
limits drawn); throughput, active agents and requests in flight over time; per-DP-rank
bars; prompt and output token-fidelity histograms; server metrics over time and their
summary; for a capacity search, the capacity curve (latency objectives and goodput against
active agents, SLO lines, the answer marked, steps coloured by verdict) and the steps
table; the configuration and manifest identity.

Needs plotly (pip install 'batchbench[report]').

A step file a capacity document names is read only from that document's own directory
(a plain file name); a step file that is missing, unreadable or named otherwise is a note in
the page, and the curve is still drawn from the capacity document.

Exit status: 0 when the report was written, 1 when a file cannot be read, is not a
batchbench document, or has a field the report reads holding the wrong kind of value (one
line names the file and the field), 2 on misuse."""


def build_parser(prog: str) -> CommandParser:
    parser = CommandParser(
        prog=prog,
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "results",
        nargs="+",
        metavar="RESULTS",
        help="results JSON files (runs are overlaid: one legend entry and table row each) "
        "and capacity.json files",
    )
    parser.add_argument(
        "-o",
        "--output",
        required=True,
        metavar="PATH",
        help="the HTML file to write (replaced if it exists)",
    )
    parser.add_argument(
        "--title",
        help="the page title (default: 'batchbench report', with the file name for one file)",
    )
    return parser


def run(argv: Sequence[str], prog: str = "batchbench report") -> int:
    """0 when the report was written, 1 on bad input, 2 on misuse."""
    args = parsed_or_status(build_parser(prog), argv)
    if isinstance(args, int):
        return args
    from batchbench.report import load_documents, write_report  # lazy: parsed first (--help)

    try:
        documents = load_documents(args.results)
        write_report(documents, args.output, args.title)
    except BatchbenchError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    size = os.path.getsize(args.output) / 1e6
    print(f"Wrote HTML report to {args.output} ({size:.1f} MB)")
    return 0
