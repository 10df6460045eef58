"""``batchbench import FORMAT INPUT... -o manifest.jsonl``: a public trace to a manifest."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from batchbench.cli.exits import exit_status, parsed_or_status
from batchbench.cli.workload import add_describe_html, check_describe_html, show_workload
from batchbench.ingest.describe import describe
from batchbench.ingest.importer import (
    FORMATS,
    MIN_PROMPT_TOKENS,
    ImportOptions,
    ImportStats,
    import_trace,
)
from batchbench.options.parser import CommandParser
from batchbench.options.values import number
from batchbench.results.progress import progress_wanted

DESCRIPTION = """\
Turn a public LLM trace into a schema v2 trajectory manifest that `batchbench run
--agent-plans-jsonl` replays, keeping the trace's sessions, prefix sharing, growth and
timing (docs/import.md has a section per format).

formats:
  mooncake     Mooncake-style JSONL: timestamp (ms), input/output_length, hash_ids
               (--block-size, default 512); sessions rebuilt from hash-prefix chains
  bailian      Alibaba Bailian (ServeGen): chat_id / parent_chat_id chains
  weka         WEKA Claude Code sessions: one JSON file per trajectory, sub-agents apart
  tracelab     TraceLab round_trace.jsonl (Claude Code and Codex rounds)
  azure        Azure LLM inference CSV: arrivals only (one-request trajectories)
  burstgpt     BurstGPT CSV: arrivals, or sessions with Session ID
  ragpulse     RAGPulse 0_trace.jsonl with its side tables beside it
  claude-code  Claude Code session logs (~/.claude/projects/*/*.jsonl)

Inputs may be gzip- or zstd-compressed. Requests of a trajectory that extends its
predecessor replay the previous reply as a live assistant block plus the new content;
requests that share hash ids send byte-identical blocks. Every line is validated before
the file is written; an empty or invalid import writes nothing.

Exit status: 0 on success, 1 on bad input or an empty or invalid import, 2 on misuse."""


def build_parser(prog: str) -> CommandParser:
    parser = CommandParser(
        prog=prog, description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = parser.add_argument
    add("format", choices=tuple(FORMATS), metavar="FORMAT", help="the trace's format (above)")
    add("inputs", nargs="+", metavar="INPUT", help="trace files, read in order")
    add("-o", "--output", required=True, metavar="PATH", help="the manifest to write")
    add_describe_html(parser)
    window = parser.add_argument_group("window and filters")
    window.add_argument(
        "--start",
        metavar="TIME",
        help="keep requests from TIME: seconds on the trace's clock, or an RFC 3339 time "
        "for traces with wall-clock times; offsets are measured from it",
    )
    window.add_argument("--end", metavar="TIME", help="keep requests before TIME (as --start)")
    window.add_argument(
        "--first-seconds",
        type=number,
        metavar="S",
        help="keep the first S seconds after the earliest kept request",
    )
    window.add_argument("--model", metavar="NAME", help="keep only requests of this model")
    window.add_argument(
        "--sample",
        type=number,
        metavar="F",
        help="keep this fraction of the trajectories, chosen by a hash of seed and id "
        "(as export-plans; default: all)",
    )
    window.add_argument("--seed", type=int, default=0, help="the sampling seed (default: 0)")
    window.add_argument(
        "--stratify-by-session-length",
        action="store_true",
        help="sample within each power-of-two bucket of request count",
    )
    sessions = parser.add_argument_group("sessions and blocks")
    sessions.add_argument(
        "--block-size",
        type=int,
        metavar="TOKENS",
        help="tokens per hash id for Mooncake-style files from other sources (default: the "
        "format's own, 512 for mooncake)",
    )
    sessions.add_argument(
        "--link-window-hours",
        type=number,
        default=24.0,
        metavar="H",
        help="largest gap between a request and the parent it continues (default: 24)",
    )
    sessions.add_argument(
        "--shared-prefix-followers",
        type=int,
        default=16,
        metavar="N",
        help="a hash id followed by at least N different ids belongs to the prefix every "
        "session shares (a system prompt) and cannot link two requests (default: 16)",
    )
    sessions.add_argument(
        "--min-new-tokens",
        type=int,
        default=32,
        metavar="N",
        help="replay the previous reply as a live block only when at least N new prompt "
        "tokens follow it: the new messages' chat-template framing must fit in them for "
        "the prompt to come out exact; otherwise reply and new content are one plain "
        "assistant block (default: 32)",
    )
    sessions.add_argument(
        "--min-prompt-tokens",
        type=int,
        default=MIN_PROMPT_TOKENS,
        metavar="N",
        help="raise a prompt under N tokens to N (counted and printed): a chat template's "
        "framing of one message alone costs 7-10 tokens, so a smaller prompt cannot be "
        f"replayed exactly; 0 keeps every prompt as recorded (default: {MIN_PROMPT_TOKENS})",
    )
    sessions.add_argument(
        "--split-idle-ms",
        type=number,
        metavar="MS",
        help="start a new trajectory (keeping the context) after an idle gap longer than MS",
    )
    time = parser.add_argument_group("time")
    time.add_argument(
        "--latency-model",
        default="none",
        metavar="MODEL",
        help="when the trace records no end time: how long a request took on the recorded "
        "server, subtracted from the arrival gap: none, fixed:MS or linear:TTFT_MS,TPOT_MS "
        "(default: none)",
    )
    time.add_argument(
        "--max-delay-ms",
        type=number,
        metavar="MS",
        help="cap every delay between requests at MS (capped delays are counted)",
    )
    time.add_argument(
        "--time-scale",
        type=number,
        default=1.0,
        metavar="X",
        help="divide every written offset and delay by X (default: 1)",
    )
    return parser


def run(argv: Sequence[str], prog: str = "batchbench import") -> int:
    args = parsed_or_status(build_parser(prog), argv)
    if isinstance(args, int):
        return args
    options = ImportOptions(
        format=args.format,
        inputs=tuple(args.inputs),
        output=args.output,
        start=args.start,
        end=args.end,
        first_seconds=args.first_seconds,
        model=args.model,
        block_size=args.block_size,
        link_window_hours=args.link_window_hours,
        shared_prefix_followers=args.shared_prefix_followers,
        min_new_tokens=args.min_new_tokens,
        min_prompt_tokens=args.min_prompt_tokens,
        latency_model=args.latency_model,
        max_delay_ms=args.max_delay_ms,
        split_idle_ms=args.split_idle_ms,
        sample=args.sample,
        seed=args.seed,
        stratify_by_session_length=args.stratify_by_session_length,
        time_scale=args.time_scale,
    )

    def command() -> int:
        check_describe_html(args.describe_html, args.output)
        bar = _RowBar() if progress_wanted() else None
        try:
            stats, plans = import_trace(options, bar.tick if bar is not None else None)
        finally:
            if bar is not None:
                bar.close()
        print(summary(options, stats))
        show_workload(describe(plans), args.output, args.describe_html, sys.stdout)
        return 0

    return exit_status(command)


class _RowBar:
    """Rows read so far, on a terminal: a long trace shows it is moving."""

    def __init__(self) -> None:
        from tqdm import tqdm  # lazy: only on a terminal

        self._bar: Any = tqdm(unit=" rows", file=sys.stderr, desc="reading", unit_scale=True)

    def tick(self, rows: int) -> None:
        self._bar.update(rows - self._bar.n)

    def close(self) -> None:
        self._bar.close()


def _n(value: int) -> str:
    return f"{value:,}"


def summary(options: ImportOptions, stats: ImportStats) -> str:
    """What the import did, a line per subject."""
    dropped = ", ".join(f"{_n(n)} {reason}" for reason, n in sorted(stats.dropped.items()))
    sampled = (
        f" ({_n(stats.trajectories)} built, sampled {options.sample:g})"
        if stats.written != stats.trajectories
        else ""
    )
    share = stats.shared_prompt_tokens / stats.prompt_tokens if stats.prompt_tokens else 0.0
    raised = (
        f", plus the {_n(stats.raised_tokens)} tokens of raised prompts"
        if stats.raised_tokens
        else ""
    )
    if (stats.prompt_tokens - stats.raised_tokens, stats.output_tokens) != (
        stats.kept_prompt_tokens,
        stats.kept_output_tokens,
    ):
        totals = (
            f"the sample of rows kept ({_n(stats.kept_prompt_tokens)} / "
            f"{_n(stats.kept_output_tokens)} before sampling)"
        )
    elif stats.dropped:
        totals = (
            f"equal to the rows kept{raised}; the dropped rows held "
            f"{_n(stats.input_prompt_tokens - stats.kept_prompt_tokens)} prompt and "
            f"{_n(stats.input_output_tokens - stats.kept_output_tokens)} output tokens"
        )
    else:
        totals = f"equal to the input's{raised}"
    lineage = ", ".join(f"{name} {_n(n)}" for name, n in stats.lineage.items() if n)
    blocks = stats.blocks
    lines = [
        f"wrote {_n(stats.written)} trajectories ({_n(stats.requests)} requests) to "
        f"{options.output}{sampled}",
        f"  rows read       {_n(stats.rows)}; dropped: {dropped or 'none'}",
        f"  trajectories    {_n(stats.written)}, {_n(stats.multi_request)} of more than one "
        f"request",
        f"  lineage         roots {_n(stats.roots)}, links {_n(stats.links)}, branches "
        f"{_n(stats.branches)}, idle splits {_n(stats.splits)}, resets {_n(stats.resets)}"
        + (f" ({lineage})" if lineage else ""),
        f"  blocks          {_n(blocks.grown)} requests grown from their predecessor with its "
        f"live reply, {_n(blocks.folded)} with reply and new content as one block"
        + (
            f"; hash ids {_n(blocks.hash_references)} collapsed into {_n(blocks.units)} blocks"
            if blocks.hash_references
            else ""
        )
        + (
            f"; {_n(blocks.resized_seeds)} seeds renamed for a second size"
            if blocks.resized_seeds
            else ""
        ),
        f"  tokens          prompt {_n(stats.prompt_tokens)} ({share:.1%} in blocks other "
        f"trajectories share), output {_n(stats.output_tokens)}; {totals}",
    ]
    if stats.raised_prompts:
        lines.append(
            f"  small prompts   {_n(stats.raised_prompts)} kept prompts under "
            f"{options.min_prompt_tokens} tokens raised to {options.min_prompt_tokens} "
            f"(+{_n(stats.raised_tokens)} tokens): a chat template's framing alone would "
            "exceed them (--min-prompt-tokens 0 keeps them)"
            + (" (counted before sampling)" if stats.written != stats.trajectories else "")
        )
    if options.max_delay_ms is not None:
        lines.append(f"  delays          {_n(stats.capped_delays)} capped at --max-delay-ms")
    else:
        lines.append(f"  delays          uncapped (latency model {options.latency_model})")
    return "\n".join(lines)
