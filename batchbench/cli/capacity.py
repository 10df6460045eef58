"""``batchbench capacity``: the batchbench-agent flags plus the search's bounds; one table row
per step as it finishes, then one answer line.

Exit statuses: 0 the search concluded; 1 it did not (a step stayed unresolved, or the client
was the bottleneck) or a step could not run; 2 a usage error; 130 / 143 interrupted (the
output directory keeps the finished steps; the same command resumes).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from batchbench.capacity.api import (
    DEFAULT_PROBE_SECONDS,
    check_capacity_config,
    run_capacity,
    write_capacity_report,
)
from batchbench.capacity.estimate import ObjectiveEstimate, duration_words
from batchbench.capacity.render import header, step_row
from batchbench.capacity.search import UNRESOLVED, Bounds, Search, StepRecord, sweep_caps
from batchbench.capacity.steps import StepInterrupted, WindowPlan, least_samples
from batchbench.cli.agent_args import build_parser, check_companions, config_from_namespace
from batchbench.cli.exits import exit_status
from batchbench.config import RunConfig
from batchbench.errors import UsageError
from batchbench.options.parser import CommandParser, parse_with_config
from batchbench.options.values import (
    non_negative_float,
    positive_finite,
    positive_uint,
    uint,
    wall_duration,
)

PROG = "batchbench capacity"
DEFAULT_WINDOW_SECONDS = 30.0
# the samples a pNN objective needs in the window to pass at all, for --help
LEAST_SAMPLES = {f"p{q}": least_samples(q / 100.0) for q in (99, 95, 90, 50)}

DESCRIPTION = """\
Find how many concurrent agents a deployment holds while its service-level objectives
(--slo) hold. The same workload runs at increasing --max-active-agents caps, the "steps":
starting at --min-agents, the cap doubles until a step breaks the objectives (or
--max-agents holds), then bisection between the highest cap that held and the lowest that
broke narrows the answer to --resolution agents. Each step leaves its first --warmup
seconds out and judges a measured window of --window seconds (or --window-trajectories
finished trajectories): an objective passes or fails only when its 95% confidence interval
lies on one side of the limit, so to pass, a percentile objective needs at least {p99}
samples in the window for p99 ({p95} for p95, {p90} for p90, {p50} for p50), all within the
limit: size --window from the request rate you expect. A step too short to decide is run
again with a window sized for the samples its undecided objective needs (2 to 8 times
longer, --max-extensions times), and is reported unresolved after that. A step whose
client was the bottleneck is marked client-bound, and the search will not conclude from
it. With sampled agents each step plans enough trajectories to keep its agents busy
through the window (--agents is a floor); --sim starts the simulator once for the whole
search. Every step's results JSON and capacity.json stay in --output-dir; running the same
command again resumes there, also with other bounds, --window, --window-trajectories or
--max-extensions (decided steps are kept; with another window, unresolved ones are
measured again), or with another --slo (the stored steps are re-judged from their results
JSON). Before the first step a short probe (--probe) at --min-agents measures each
objective's sample rate and prints an estimate: the samples a step needs, how long a step
and the search take, and a cheaper alternative when there is one. --max-time bounds the
whole search; --sweep N measures N evenly spaced caps instead of searching.""".format(
    **LEAST_SAMPLES
)

EPILOG = """\
exit statuses: 0 the search concluded; 1 it did not (a step stayed unresolved, or the
client was the bottleneck) or a step could not run; 2 a usage error; 130 / 143 interrupted
by SIGINT / SIGTERM (finished steps kept; run the same command to resume).

example (offline, the embedded simulator: each running sequence adds 40 ms to a decode
step, so ITL p50 <= 260 ms holds up to 6 agents):
  batchbench capacity --sim --sim-args "--decode-step-ms 0 --decode-step-ms-per-seq 40
    --decode-step-ms-per-ktoken 0 --prefill-tokens-per-s 1e9" --stream
    --output-tokens 8 --slo itl_p50=260ms --warmup 1 --window 3 --output-dir capacity-out"""

# batchbench-agent options a search sets itself, per step, or cannot use.
REFUSED = (
    ("--max-active-agents", "max_active_agents", "the search sets it per step; use --min-agents "
     "and --max-agents"),
    ("--concurrency", "concurrency", "the search sets it per step; use --min-agents "
     "and --max-agents"),
    ("--duration", "duration", "each step runs --warmup plus --window seconds"),
    ("--results-json", "results_json", "each step's results JSON is kept in --output-dir"),
    ("--results-csv", "results_csv", "each step's results JSON is kept in --output-dir"),
    ("--agent-events-jsonl", "agent_events_jsonl", "not written by a capacity search"),
    ("--request-events-jsonl", "request_events_jsonl", "not written by a capacity search"),
    ("--server-metrics-jsonl", "server_metrics_jsonl", "each step's results JSON holds its "
     "server metrics"),
    ("--shard", "shard", "a shard needs --results-json, and a search runs its steps itself "
     "(--workers spreads each step over processes)"),
    ("--start-at", "start_at", "it starts the shards of one run together; a search starts "
     "each step when the previous one ends"),
)  # fmt: skip


def build_capacity_parser(prog: str = PROG) -> CommandParser:
    """batchbench-agent's options that apply to a search, after a "capacity search" section
    (with the search's own --warmup and --window-trajectories); the options a search sets
    itself are refused."""
    return build_parser(
        prog,
        command="capacity",
        description=DESCRIPTION,
        epilog=EPILOG,
        own=("capacity search", add_search_flags),
    )


def add_search_flags(group: Any) -> None:
    group.add_argument(
        "--output-dir",
        metavar="DIR",
        help="directory for every step's results JSON (step-0008.json) and capacity.json "
        "(rewritten after every step); required. Running the same search again with it "
        "skips the finished steps",
    )
    group.add_argument(
        "--min-agents",
        type=positive_uint,
        default=1,
        metavar="N",
        help="first step's active-agent cap (default: %(default)s)",
    )
    group.add_argument(
        "--max-agents",
        type=positive_uint,
        default=1024,
        metavar="N",
        help="largest cap tried; when it holds, the answer says so (default: %(default)s)",
    )
    group.add_argument(
        "--resolution",
        type=positive_uint,
        default=1,
        metavar="N",
        help="stop bisecting when the lowest failing and highest passing caps are at most N "
        "agents apart (default: %(default)s)",
    )
    group.add_argument(
        "--warmup",
        type=non_negative_float,
        default=5.0,
        metavar="S",
        help="seconds at the start of each step left out of its figures (default: %(default)g)",
    )
    group.add_argument(
        "--window",
        type=positive_finite,
        metavar="S",
        help=f"each step's measured window in seconds after the warm-up (default: "
        f"{DEFAULT_WINDOW_SECONDS:g}); long enough for the samples the objectives need "
        "(p99: {p99}, p95: {p95}, p90: {p90}, p50: {p50} at least)".format(**LEAST_SAMPLES),
    )
    group.add_argument(
        "--window-trajectories",
        type=positive_uint,
        metavar="N",
        help="instead of --window: measure until N trajectories admitted after the warm-up "
        "have finished",
    )
    group.add_argument(
        "--max-extensions",
        type=uint,
        default=2,
        metavar="K",
        help="an unresolved step runs again, up to K times, with a window sized from its "
        "measured sample rate for the samples its undecided objective needs (at least 2, at "
        "most 8 times longer each time); still unresolved, the search stops there (default: "
        "%(default)s)",
    )
    group.add_argument(
        "--max-time",
        type=wall_duration,
        metavar="DURATION",
        help="bound the whole search (e.g. 30m, 90s, 1h30m): a step or extension that cannot "
        "finish in the time left is not started, a step still running when it runs out is "
        "stopped and not judged, and the answer gives the bracket found so far",
    )
    group.add_argument(
        "--sweep",
        type=positive_uint,
        metavar="N",
        help="instead of searching, measure N caps evenly spaced from --min-agents to "
        "--max-agents (a throughput-latency curve); --slo is optional and judges each step",
    )
    group.add_argument(
        "--probe",
        type=non_negative_float,
        default=DEFAULT_PROBE_SECONDS,
        metavar="S",
        help="seconds of the probe at --min-agents before the first step (at most --window) "
        "that measures each objective's sample rate for the printed estimate; 0: no probe "
        "(default: %(default)g)",
    )
    group.add_argument(
        "--restart",
        action="store_true",
        help="discard an earlier search in --output-dir instead of resuming it",
    )
    for flag, dest, _why in REFUSED:
        group.add_argument(flag, dest=f"refused_{dest}", help=argparse.SUPPRESS)
    group.add_argument("--dry-run", dest="refused_dry_run", action="store_true",
                        help=argparse.SUPPRESS)  # fmt: skip


def parse_capacity_args(argv: Sequence[str]) -> argparse.Namespace | None:
    """Parse (a --config file's values as defaults) and check; None after --help/--version."""
    parser = build_capacity_parser()
    args = parse_with_config(parser, argv)
    if args is None:
        return None
    for flag, dest, why in REFUSED:
        if getattr(args, f"refused_{dest}") is not None:
            raise UsageError(f"{flag} does not apply to a capacity search: {why}")
    if args.refused_dry_run:
        raise UsageError("--dry-run does not apply to a capacity search: it needs a live server")
    if args.output_dir is None:
        raise UsageError(
            "a capacity search needs --output-dir DIR (where every step's results JSON and "
            "capacity.json are kept)"
        )
    if args.window is not None and args.window_trajectories is not None:
        raise UsageError("give --window or --window-trajectories, not both")
    check_companions(args)
    if not args.slo and args.sweep is None:
        raise UsageError(
            "a capacity search needs --slo: the objectives each step must meet, e.g. "
            "--slo ttft_p99=2s or --slo e2e_p95=30s"
        )
    return args


def window_plan(args: argparse.Namespace) -> WindowPlan:
    seconds = None if args.window_trajectories is not None else args.window
    if seconds is None and args.window_trajectories is None:
        seconds = DEFAULT_WINDOW_SECONDS
    return WindowPlan(warmup=args.warmup, seconds=seconds, trajectories=args.window_trajectories)


def bounds_of(args: argparse.Namespace) -> Bounds:
    try:
        return Bounds(args.min_agents, args.max_agents, args.resolution)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def checked_config(args: argparse.Namespace) -> RunConfig:
    """The search's configuration, every option checked before anything is created. A
    --report-html inside an --output-dir that does not exist yet is checked once the
    directory exists: it comes back unset then."""
    output_dir = args.output_dir
    if os.path.exists(output_dir) and not os.path.isdir(output_dir):
        raise UsageError(f"--output-dir {output_dir} is a file; give a directory")
    report = args.report_html
    deferred = (
        report is not None
        and not os.path.isdir(output_dir)
        and os.path.abspath(os.path.dirname(report) or ".") == os.path.abspath(output_dir)
    )
    config = config_from_namespace(
        argparse.Namespace(**{**vars(args), "report_html": None}) if deferred else args
    )
    check_report(report)
    check_capacity_config(config, args.sweep)
    return config


def make_output_dir(path: str) -> None:
    if os.path.exists(path) and not os.path.isdir(path):
        raise UsageError(f"--output-dir {path} is a file; give a directory")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--output-dir {path} cannot be created: {exc.strerror or exc}") from None


def check_report(report_html: str | None) -> None:
    """--report-html needs the report package and plotly; say so before the search."""
    if report_html is None:
        return
    if importlib.util.find_spec("batchbench.report") is None:
        raise UsageError("--report-html: the HTML report is not part of this installation")
    if importlib.util.find_spec("plotly") is None:
        raise UsageError("--report-html needs plotly: pip install 'batchbench[report]'")


def banner(config: RunConfig, bounds: Bounds, window: WindowPlan, args) -> str:
    objectives = " and ".join(o.human for o in config.slo) or "no objectives"
    if window.seconds is not None:
        measured = f"{window.seconds:g} s window"
    else:
        measured = f"window of {window.trajectories} trajectories"
    limit = (
        f"; at most {duration_words(args.max_time)} (--max-time)"
        if args.max_time is not None
        else ""
    )
    if args.sweep is not None:
        caps = ", ".join(str(cap) for cap in sweep_caps(bounds, args.sweep))
        return (
            f"Capacity sweep: {objectives}; caps {caps} active agents; each step "
            f"{window.warmup:g} s warm-up + {measured} (unresolved: extended up to "
            f"{args.max_extensions} times){limit}; output in {args.output_dir}"
        )
    return (
        f"Capacity search: {objectives}; {bounds.min_agents} to {bounds.max_agents} active "
        f"agents, resolution {bounds.resolution}; each step {window.warmup:g} s warm-up + "
        f"{measured} (unresolved: extended up to {args.max_extensions} times){limit}; "
        f"output in {args.output_dir}"
    )


class Ticker:
    """A one-line progress note on stderr while a step runs (only on a terminal)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(
        self, agents: int, extension: int, seconds: float | None, label: str | None = None
    ) -> None:
        self.stop()
        if not self.enabled:
            return
        label = label or f"step at {agents} active agents" + (
            f" (extension {extension})" if extension else ""
        )
        began = time.monotonic()
        self._stop = threading.Event()

        def tick(stop: threading.Event = self._stop) -> None:
            while not stop.is_set():
                elapsed = time.monotonic() - began
                total = f" of ~{seconds:.0f} s" if seconds is not None else ""
                sys.stderr.write(f"\r\x1b[K{label}: {elapsed:.0f} s{total}")
                sys.stderr.flush()
                stop.wait(0.5)

        self._thread = threading.Thread(target=tick, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()


def _say(text: str) -> None:
    print(text, flush=True)


def _warn(text: str) -> None:
    sys.stdout.flush()
    print(text, file=sys.stderr, flush=True)


def _terminated(_signum, _frame) -> None:
    raise StepInterrupted("SIGTERM", 143)


def _catch_sigterm() -> None:
    """SIGTERM between steps ends the search as Ctrl+C does (the simulator child stopped,
    capacity.json written); a step's run handles it itself, and leaves the default behind."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _terminated)


def main(argv: Sequence[str]) -> int:
    args = parse_capacity_args(argv)
    if args is None:
        return 0
    bounds = bounds_of(args)
    window = window_plan(args)
    config = checked_config(args)  # every check first: a usage error leaves no directory
    make_output_dir(args.output_dir)
    if config.report_html is None and args.report_html is not None:
        config = replace(config, report_html=args.report_html)  # inside the new directory
        config.check()
    ticker = Ticker(config.progress and sys.stderr.isatty())
    printed = {"banner": False, "header": False}

    def show_banner() -> None:
        if not printed["banner"]:  # once the output directory was accepted
            _say(banner(config, bounds, window, args))
            printed["banner"] = True

    def started(agents: int, extension: int, seconds: float | None) -> None:
        show_banner()
        _catch_sigterm()
        ticker.start(agents, extension, seconds)

    def listener(record: StepRecord, search: Search, final: bool) -> None:
        _catch_sigterm()
        ticker.stop()
        show_banner()
        if not printed["header"]:
            _say(header())
            printed["header"] = True
        note = None
        if not final and record.verdict == UNRESOLVED:
            longer = window.extend(record)
            note = f"extending the window to {longer.text()}: {longer.reason}"
        _say(step_row(record, note))

    def probing(agents: int, seconds: float) -> None:
        show_banner()
        _catch_sigterm()
        ticker.start(agents, 0, seconds, f"probe at {agents} active agents (for the estimate)")

    def estimated(estimates: Sequence[ObjectiveEstimate], seconds: float) -> None:
        ticker.stop()
        show_banner()
        for item in estimates:
            _say(item.text(seconds))

    previous = signal.getsignal(signal.SIGTERM)
    _catch_sigterm()
    try:
        result = run_capacity(
            config,
            args.output_dir,
            bounds,
            window,
            args.max_extensions,
            restart=args.restart,
            listener=listener,
            started=started,
            warn=_warn,
            workers_available=True,  # the advice may name --workers: a search takes it
            sweep=args.sweep,
            max_time=args.max_time,
            probe_seconds=args.probe,
            estimated=estimated,
            probing=probing,
        )
    finally:
        ticker.stop()
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, previous)
    show_banner()
    _say(result.answer.text)
    steps = len({s.agents for s in result.search.steps})
    plural = "s" if steps != 1 else ""
    _say(f"Wrote capacity document to {result.path} ({steps} step result{plural} beside it)")
    if config.report_html is not None:
        write_capacity_report(result.path, config.report_html)
        _say(f"Wrote HTML report to {config.report_html}")
    return 0 if result.answer.concluded else 1


def run(argv: list[str]) -> int:
    """``batchbench capacity ARGS``: errors as one line on stderr (see the module's exit
    statuses)."""
    return exit_status(lambda: main(argv), resume_note=RESUME_NOTE)


RESUME_NOTE = "the finished steps are kept, run the same command to resume"
