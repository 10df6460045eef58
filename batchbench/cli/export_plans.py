"""``batchbench export-plans`` (also ``batchbench-export-plans`` and ``python -m
batchbench.export_plans``): request-log rows to a schema v2 manifest (COMPAT §7)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from batchbench.cli.exits import parsed_or_status
from batchbench.cli.workload import add_describe_html, check_describe_html, show_workload
from batchbench.errors import BatchbenchError
from batchbench.ingest.export_plans import ExportOptions, export
from batchbench.options.parser import CommandParser
from batchbench.options.values import number

DESCRIPTION = """\
Rebuild agent sessions from logged chat requests and write them as a schema v2 trajectory
manifest that `batchbench run --agent-plans-jsonl` replays (docs/import.md).

Each input line is one request: ts, principal_id, correlation_id, model, chain (cumulative
per-block hashes), block_roles, block_tokens, prompt_tokens, completion_tokens, stream,
max_tokens, duration_ms. A request's parent is the latest earlier request of the same
principal, within the link window, whose chain is a strict prefix of its own; each
in-window request without an in-window parent starts a trajectory. Every line is
validated before the file is written; an empty or invalid export writes nothing.

On success stderr gets `wrote <n> trajectories to <path> (<stats>)`, then the workload's
description: trajectories, requests, tokens, the shares of block tokens shared between
trajectories and in live blocks, the hit rate of a perfect prefix cache serving the
requests in arrival order, and percentiles of prompt and output tokens, requests per
trajectory and delays (--describe-html draws it). Exit status: 0 on success, 1 on bad
input, an empty or invalid export, or a page that cannot be written (`error: <message>`),
2 on misuse."""


def build_parser(prog: str) -> CommandParser:
    parser = CommandParser(
        prog=prog, description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = parser.add_argument
    add("--rows-jsonl", required=True, metavar="PATH", help="input rows, one JSON object a line")
    add(
        "--start",
        required=True,
        metavar="TIME",
        help="window start, RFC 3339 (a Z suffix or a space for T accepted; no offset = UTC)",
    )
    add("--end", required=True, metavar="TIME", help="window end (exclusive), as --start")
    add("--principal-id", metavar="ID", help="keep only the rows of this principal")
    add("--model", metavar="NAME", help="keep only the rows of this model")
    add(
        "--link-window-hours",
        type=float,
        default=24.0,
        metavar="H",
        help="largest parent-to-child gap; rows this long before --start are read as "
        "possible parents only (default: 24)",
    )
    add(
        "--sample",
        type=number,
        metavar="F",
        help="keep this fraction of the trajectories, chosen by a hash of seed and id "
        "(default: all)",
    )
    add("--seed", type=int, default=0, help="the sampling seed (default: 0)")
    add(
        "--stratify-by-session-length",
        action="store_true",
        help="sample within each power-of-two bucket of request count, keeping at least "
        "one trajectory of every bucket",
    )
    add(
        "--time-scale",
        type=float,
        default=1.0,
        metavar="X",
        help="divide every written start offset and delay by X (default: 1)",
    )
    add("-o", "--output", required=True, metavar="PATH", help="the manifest to write")
    add_describe_html(parser)
    return parser


def run(argv: Sequence[str], prog: str = "batchbench export-plans") -> int:
    args = parsed_or_status(build_parser(prog), argv)
    if isinstance(args, int):
        return args
    options = ExportOptions(
        rows_jsonl=args.rows_jsonl,
        start=args.start,
        end=args.end,
        output=args.output,
        principal_id=args.principal_id,
        model=args.model,
        link_window_hours=args.link_window_hours,
        sample=args.sample,
        seed=args.seed,
        stratify_by_session_length=args.stratify_by_session_length,
        time_scale=args.time_scale,
    )
    try:
        check_describe_html(args.describe_html, args.output)
        stats, workload = export(options)
        print(
            f"wrote {stats.sampled} trajectories to {args.output} ({stats.line()})",
            file=sys.stderr,
        )
        show_workload(workload, args.output, args.describe_html)
    except BatchbenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    return 0


def console_main() -> None:
    sys.exit(run(sys.argv[1:], "batchbench-export-plans"))
