"""The workload description a command that writes a manifest prints after writing it
(``batchbench export-plans``, ``batchbench import``), and its ``--describe-html`` page."""

from __future__ import annotations

import argparse
import os
import sys
from typing import TextIO

from batchbench.errors import InputError, UsageError
from batchbench.ingest.describe import WorkloadDescription, format_description

DESCRIBE_HTML_HELP = (
    "also write the workload description (figures, distributions, arrivals and the perfect "
    "prefix cache over time) as a self-contained HTML page; needs plotly "
    "(pip install 'batchbench[report]')"
)


def add_describe_html(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--describe-html", metavar="PATH", help=DESCRIBE_HTML_HELP)


def check_describe_html(path: str | None, manifest: str) -> None:
    """Before any work: BatchbenchError when the page is asked for and plotly is missing,
    when it would overwrite the manifest, or when its folder cannot take it (so a bad
    page path never leaves a manifest behind a failed command)."""
    if path is None:
        return
    from batchbench.report import require_plotly  # lazy: only with --describe-html

    require_plotly()
    if os.path.realpath(path) == os.path.realpath(manifest):
        raise UsageError(f"--describe-html {path} would overwrite the manifest; name another file")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
        raise InputError(f"cannot write {path}: its folder {folder} is missing or not writable")


def show_workload(
    desc: WorkloadDescription, manifest: str, html_path: str | None, out: TextIO | None = None
) -> None:
    """The description on ``out`` (stderr by default; after the command's own lines), then
    the page if asked; BatchbenchError when the page cannot be written."""
    out = out or sys.stderr
    print(format_description(desc), file=out)
    if html_path is not None:
        from batchbench.report.workload import write_workload_html  # lazy: plotly

        title = f"batchbench workload: {os.path.basename(manifest)}"
        write_workload_html(desc, html_path, title)
        print(f"wrote the workload description to {html_path}", file=out)
