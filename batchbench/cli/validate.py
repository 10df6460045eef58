"""``batchbench validate``: check trajectory manifests line by line and summarize them."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np
import orjson

from batchbench.cli.exits import parsed_or_status
from batchbench.errors import ManifestError
from batchbench.options.parser import CommandParser
from batchbench.plan.manifest import Manifest, read_manifest_file, validate_manifest

DESCRIPTION = """\
Check trajectory manifests (the JSONL files of --agent-plans-jsonl, schema versions 1
and 2) without a server or a tokenizer. A run stops at the first problem; this command
reads each file to the end and reports every invalid line (its first error), one
`Error: invalid trajectory plan at <path>:<line>: <cause>` line each on stderr, followed
by the number of errors.

For a valid file it prints a summary: trajectories, requests, the schema versions
present, prompt and output token totals, blocks (distinct seeds, seeds shared by more
than one trajectory and the tokens of their blocks, live blocks), start offsets, and the
SHA-256 of the raw bytes (the identity a run reports). A block seed that a trajectory
redefines with other tokens or role gives a `warning:` line on stderr.

Exit status: 0 when every file is valid, 1 when any file is invalid or cannot be read,
2 on misuse."""


def build_parser(prog: str) -> CommandParser:
    parser = CommandParser(
        prog=prog,
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("files", nargs="+", metavar="FILE", help="manifest files to check")
    parser.add_argument(
        "--json",
        action="store_true",
        help="print one JSON document (a list with one object per file) to stdout instead",
    )
    return parser


def run(argv: Sequence[str], prog: str = "batchbench validate") -> int:
    """0 when every file is valid, 1 when any is not, 2 on misuse."""
    args = parsed_or_status(build_parser(prog), argv)
    if isinstance(args, int):
        return args
    reports = [check_file(path) for path in args.files]
    if args.json:
        sys.stdout.write(orjson.dumps(reports, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        for report in reports:
            print_report(report)
    return 0 if all(report["valid"] for report in reports) else 1


def check_file(path: str) -> dict[str, Any]:
    """The report of one file: ``readable``, ``valid`` and ``errors``, plus the summary
    and ``warnings`` when valid."""
    try:
        data = read_manifest_file(path)
    except ManifestError as exc:
        return {"path": path, "readable": False, "valid": False, "errors": [str(exc)]}
    manifest, errors = validate_manifest(data, path)
    if manifest is None:
        return {"path": path, "readable": True, "valid": False, "errors": errors}
    return {
        "path": path,
        "readable": True,
        "valid": True,
        "errors": [],
        "warnings": manifest.seed_redefinition_warnings(),
        **summarize(manifest),
    }


def summarize(manifest: Manifest) -> dict[str, Any]:
    """Counts and totals of a valid manifest, computed on its columns."""
    versions = np.bincount(manifest.schema_versions, minlength=3)
    offsets = manifest.start_after_ms
    delayed = int(np.count_nonzero(offsets))
    return {
        "trajectories": len(manifest),
        "requests": manifest.n_requests,
        "schema_versions": {str(v): int(versions[v]) for v in (1, 2) if versions[v]},
        "prompt_tokens": int(manifest.prompt_tokens.sum(dtype=np.uint64)),
        "output_tokens": int(manifest.output_tokens.sum(dtype=np.uint64)),
        **block_statistics(manifest),
        "trajectories_with_start_offset": delayed,
        "last_start_after_ms": int(offsets.max()) if delayed else 0,
        "sha256": manifest.sha256,
    }


def block_statistics(manifest: Manifest) -> dict[str, int]:
    """Blocks, distinct seeds, seeds used by more than one trajectory and their tokens."""
    tokens = manifest.block_tokens
    seeds = manifest.block_seed.astype(np.int64)
    trajectories = len(manifest)
    # The trajectory of every block: requests per trajectory, then blocks per request.
    request_trajectory = np.repeat(
        np.arange(trajectories, dtype=np.int64), np.diff(manifest.request_offsets)
    )
    block_trajectory = np.repeat(request_trajectory, np.diff(manifest.block_offsets))
    pairs = np.unique(seeds * trajectories + block_trajectory)
    users = np.bincount(pairs // max(trajectories, 1), minlength=len(manifest.block_seeds))
    shared = users > 1
    return {
        "blocks": len(tokens),
        "distinct_seeds": len(manifest.block_seeds),
        "shared_seeds": int(np.count_nonzero(shared)),
        "shared_seed_block_tokens": int(tokens[shared[seeds]].sum(dtype=np.uint64)),
        "block_tokens": int(tokens.sum(dtype=np.uint64)),
        "live_blocks": int(np.count_nonzero(manifest.block_live)),
    }


def print_report(report: dict[str, Any]) -> None:
    """Errors and their count on stderr, or warnings on stderr and the summary on stdout."""
    path = report["path"]
    if not report["valid"]:
        for message in report["errors"]:
            print(f"Error: {message}", file=sys.stderr)
        if report["readable"]:  # an unreadable file has its one message
            count = len(report["errors"])
            print(f"{path}: {count} {_plural(count, 'error')}", file=sys.stderr)
        return
    for warning in report["warnings"]:
        print(warning, file=sys.stderr)
    versions = ", ".join(
        f"{version} ({count} {_plural(count, 'trajectory')})"
        for version, count in report["schema_versions"].items()
    )
    delayed = report["trajectories_with_start_offset"]
    start_offsets = str(delayed)
    if delayed:
        start_offsets += f" (the last starts at {report['last_start_after_ms']} ms)"
    lines = [
        f"{path}: valid",
        f"  trajectories: {report['trajectories']}",
        f"  requests: {report['requests']}",
        f"  schema versions: {versions}",
        f"  prompt tokens: {report['prompt_tokens']}",
        f"  output tokens: {report['output_tokens']}",
        f"  blocks: {report['blocks']}",
        f"  distinct seeds: {report['distinct_seeds']}",
        f"  seeds shared by more than one trajectory: {report['shared_seeds']}",
        f"  tokens in shared-seed blocks: {report['shared_seed_block_tokens']} of "
        f"{report['block_tokens']} block tokens",
        f"  live blocks: {report['live_blocks']}",
        f"  trajectories with a start offset: {start_offsets}",
        f"  sha256: {report['sha256']}",
    ]
    print("\n".join(lines))


def _plural(count: int, noun: str) -> str:
    if count == 1:
        return noun
    return noun[:-1] + "ies" if noun.endswith("y") else noun + "s"
