"""``batchbench-agent``: parse the command line into a RunConfig, run it, render the result.

Exit statuses: 0 done (no request failed beyond --max-failure-rate), 3 done but more
requests failed than that allows, 1 runtime error, 2 usage error, 130 after SIGINT, 143
after SIGTERM.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterable, Sequence
from types import FrameType
from typing import NoReturn

from batchbench.api import OutputError, RunResult, run
from batchbench.cli.agent_args import config_from_argv
from batchbench.cli.exits import exit_status
from batchbench.drive.shutdown import signal_stopped_a_run
from batchbench.results.console import (
    dry_run_lines,
    live_lines,
    server_rank_lines,
    summary_lines,
    verdict_lines,
)
from batchbench.results.windowreport import server_metrics_lines, window_lines
from batchbench.secrets import redact


class ConsoleOutput:
    """Lines to standard output (in large writes), warnings to standard error."""

    def lines(self, lines: Iterable[str]) -> None:
        write_lines(lines)
        sys.stdout.flush()

    def warning(self, text: str) -> None:
        sys.stdout.flush()
        print(redact(text), file=sys.stderr)


def write_lines(lines: Iterable[str]) -> None:
    out = sys.stdout
    chunk: list[str] = []
    for line in lines:
        chunk.append(line)
        if len(chunk) >= 4096:
            out.write("\n".join(chunk) + "\n")
            chunk.clear()
    if chunk:
        out.write("\n".join(chunk) + "\n")


def render(result: RunResult) -> None:
    """The console report of a finished run: dry-run lines, summary, live figures, files."""
    if result.dry_run and result.workload is not None:
        write_lines(dry_run_lines(result.workload, result.engine))
    elif result.dry_run:  # merged shards or workers: the lines they made
        write_lines(result.merged_dry_run_lines)
    write_lines(
        summary_lines(result.summary, result.failures, result.interrupted_by, result.config.verbose)
    )
    if result.live is not None:
        write_lines(live_lines(result.live))
        sections = result.sections or {}
        if sections.get("ranks_source") == "server":
            metrics = sections.get("server_metrics") or {}
            write_lines(server_rank_lines(sections["ranks"], metrics.get("window")))
    if result.window is not None:
        config = result.config
        write_lines(
            window_lines(result.window, config.percentiles, config.warmup, result.finished_by)
        )
        write_lines(server_metrics_lines((result.sections or {}).get("server_metrics")))
    for what, path in result.written:
        print(f"Wrote {what} to {path}")
    write_lines(verdict_lines(result.summary))
    sys.stdout.flush()


def main(argv: Sequence[str] | None = None, prog: str = "batchbench-agent") -> int:
    """Run the benchmark; raises BatchbenchError (UsageError for argument errors).

    Returns 0, or 130/143 after an interruption.
    """
    config = config_from_argv(sys.argv[1:] if argv is None else argv, prog=prog)
    if config is None:  # --help or --version was printed
        return 0
    try:
        result = run(config, output=ConsoleOutput())
    except OutputError as exc:
        render(exc.result)
        lost_worker_lines(exc.result)
        raise
    render(result)
    lost_worker_lines(result)
    return result.exit_status


def lost_worker_lines(result: RunResult) -> None:
    """One ``Error:`` line per worker that died: the outputs are written, but incomplete."""
    sys.stdout.flush()
    for line in result.lost_workers:
        print(f"Error: {line}", file=sys.stderr)


def run_console(argv: Sequence[str] | None, prog: str) -> int:
    """Errors as one line on stderr: 1 at run time, 2 for usage, 130 for Ctrl+C."""
    return exit_status(lambda: main(argv, prog=prog))


def _late_signal(signum: int, _frame: FrameType | None) -> None:
    if signal_stopped_a_run():
        return  # the outputs are written and the summary is on its way: part of that stop
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    signal.signal(signum, signal.SIG_DFL)  # SIGTERM before any stop: end as before
    os.kill(os.getpid(), signum)


def hold_late_signals() -> None:
    """For a console run: a Ctrl+C or SIGTERM that arrives after the run it stopped gave
    its signal handlers back (a double Ctrl+C as the run ends, while the summary prints or
    the interpreter exits) is part of that interruption, not a reason to die of the signal
    half-way through the summary. Before any run was stopped, SIGINT still interrupts and
    SIGTERM still ends the process."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _late_signal)


def exit_process(status: int) -> NoReturn:
    """End the process with ``status``. After a run a signal stopped, SIGINT and SIGTERM are
    ignored from here on: while it shuts down the interpreter gives each signal that has a
    Python handler its default action back, and a second Ctrl+C landing in that last
    instant would kill the process after its summary, turning exit 130 into death by the
    signal. (Ignoring is process-wide and kept through shutdown; blocking would be per
    thread, and a native library's thread would still take the signal.)"""
    if signal_stopped_a_run():
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, signal.SIG_IGN)
    sys.exit(status)


def console_main() -> None:
    hold_late_signals()
    try:
        status = run_console(None, "batchbench-agent")
    except KeyboardInterrupt:  # in the last instants (an error line being printed)
        status = 130
    exit_process(status)
