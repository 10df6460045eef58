"""``batchbench merge``: the shards of one run (``--shard I/N``) as one run's outputs."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

import orjson

from batchbench.cli.exits import parsed_or_status
from batchbench.errors import BatchbenchError
from batchbench.options.parser import CommandParser

DESCRIPTION = """\
Merge the results of a run split with --shard I/N (on one machine or many) into the
outputs one run over the whole manifest writes, and print its console summary.

Each RESULTS is a shard's --results-json; its raw data (<name>.shard.npz) and, when the
shard wrote them, its --agent-events-jsonl and --request-events-jsonl files are read from
the same directory. Every shard must be there, once, and from the same run (same
manifest, options and shard count). Times move to the clock of the shard that started
first (shards started with --start-at differ by milliseconds); counters add up; every
percentile is computed over the union of all shards' samples, so merged percentiles are
exact.

Writes into DIR: results.json, results.csv, agent-events.jsonl and request-events.jsonl
(when every shard wrote them), and --report-html when asked.

Exit status: the merged run's (0, 3 when more requests failed than --max-failure-rate
allows, 130/143 when a shard was interrupted), 1 when a file cannot be read or the
shards do not belong together, 2 on misuse."""


def build_parser(prog: str) -> CommandParser:
    parser = CommandParser(
        prog=prog,
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "results", nargs="+", metavar="SHARD_RESULTS", help="every shard's results JSON"
    )
    parser.add_argument(
        "--output-dir",
        metavar="DIR",
        help="the directory the merged outputs go into (created when missing); required",
    )
    # the spelling of earlier releases: -o names a file everywhere else (report, import,
    # export-plans), so it is no longer shown here, but scripts that merge with -o DIR work
    parser.add_argument("-o", dest="output_dir", metavar="DIR", help=argparse.SUPPRESS)
    parser.add_argument("--report-html", metavar="PATH", help="also write the HTML report")
    return parser


def _load(path: str):
    """A shard's results JSON and raw data; the events files it wrote beside it."""
    from batchbench.scale.partial import load  # lazy: numpy, after parsing (--help)

    try:
        with open(path, "rb") as handle:
            document = orjson.loads(handle.read())
    except OSError as exc:
        raise BatchbenchError(f"{path}: {exc.strerror or exc}") from None
    except orjson.JSONDecodeError as exc:
        raise BatchbenchError(f"{path}: not JSON ({exc})") from None
    shard = document.get("shard") if isinstance(document, dict) else None
    if not isinstance(shard, dict) or not isinstance(shard.get("data"), str):
        raise BatchbenchError(
            f"{path}: not a shard's results (no shard section: was it run with --shard?)"
        )
    folder = os.path.dirname(path)

    def beside(name) -> str | None:
        if not isinstance(name, str) or os.path.basename(name) != name:
            return None
        candidate = os.path.join(folder, name)
        return candidate if os.path.isfile(candidate) else None

    data = load(os.path.join(folder, os.path.basename(shard["data"])))
    return data, beside(shard.get("agent_events")), beside(shard.get("request_events"))


def run(argv: Sequence[str], prog: str = "batchbench merge") -> int:
    args = parsed_or_status(build_parser(prog), argv)
    if isinstance(args, int):
        return args
    if args.output_dir is None:
        print(
            f"Error: {prog} needs --output-dir DIR (the directory the merged outputs go into)",
            file=sys.stderr,
        )
        return 2
    # lazy: the merge's modules load once the arguments parsed (--help answers at once)
    from batchbench.cli.agent import ConsoleOutput, render
    from batchbench.scale.combine import finish_merged
    from batchbench.scale.merge import check_shards, merge

    try:
        loaded = [_load(path) for path in args.results]
        by_data = {id(data): (agents, requests) for data, agents, requests in loaded}
        shards = check_shards([data for data, _, _ in loaded], list(args.results))
        events = [by_data[id(data)] for data in shards]
        merged = merge(shards)
        os.makedirs(args.output_dir, exist_ok=True)
        target = args.output_dir
        live = not merged.config.dry_run
        request_events = [requests for _, requests in events]
        outputs = {
            "results_json": os.path.join(target, "results.json"),
            "results_csv": os.path.join(target, "results.csv"),
            "agent_events_jsonl": os.path.join(target, "agent-events.jsonl")
            if all(agents for agents, _ in events)
            else None,
            "request_events_jsonl": os.path.join(target, "request-events.jsonl")
            if live and all(request_events)
            else None,
            "report_html": args.report_html,
        }
        if args.report_html:
            from batchbench.report import require_plotly  # lazy: only with --report-html

            require_plotly()
        result = finish_merged(merged, outputs, request_events, ConsoleOutput())
    except BatchbenchError as exc:
        sys.stdout.flush()
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    from batchbench.results.console import banner_lines  # lazy: as the merge above

    ConsoleOutput().lines(banner_lines(result.config, result.setup))
    print(
        f"Merged {len(shards)} shards of {merged.setup.agents} trajectories "
        f"(clock starts {max(merged.offsets) * 1000.0:.1f} ms apart at most)"
    )
    render(result)
    return result.exit_status
