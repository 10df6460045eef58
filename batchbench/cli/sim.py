"""``batchbench sim``: parse the options, load the tokenizer, serve until stopped."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from collections.abc import Sequence

from batchbench.cli.listening import listen_until_signal
from batchbench.errors import BatchbenchError, UsageError
from batchbench.lifeline import die_with_parent, on_eof
from batchbench.options.simulator import build_parser
from batchbench.sim.faults import Fault, FaultPlan
from batchbench.sim.overheads import measure_overheads
from batchbench.sim.server import SimConfig, SimServer
from batchbench.sim.serving import ServingModel
from batchbench.text.tokenizer import load_tokenizer


def config_from_args(args: argparse.Namespace) -> SimConfig:
    rates = {
        Fault.ERROR: args.fault_error_rate,
        Fault.RATE_LIMIT: args.fault_429_rate,
        Fault.DROP: args.fault_drop_rate,
        Fault.TRUNCATE: args.fault_truncate_rate,
        Fault.MALFORMED: args.fault_malformed_rate,
        Fault.MISSING_USAGE: args.fault_missing_usage_rate,
    }
    try:
        plan = FaultPlan(
            seed=args.fault_seed,
            rates={kind: rate for kind, rate in rates.items() if rate},
            error_statuses=args.fault_error_statuses,
            retry_after_seconds=args.fault_retry_after_s,
            spike_rate=args.fault_spike_rate,
            spike_ms=args.fault_spike_ms,
        )
    except ValueError as exc:
        raise BatchbenchError(str(exc)) from None
    serving = ServingModel(
        kv_cache_tokens=args.kv_cache_tokens,
        block_tokens=args.block_size,
        prefill_tokens_per_s=args.prefill_tokens_per_s,
        decode_step_ms=args.decode_step_ms,
        decode_step_ms_per_seq=args.decode_step_ms_per_seq,
        decode_step_ms_per_ktoken=args.decode_step_ms_per_ktoken,
        max_batch=args.max_batch,
        max_num_batched_tokens=args.max_num_batched_tokens,
        speed=args.speed,
    )
    return SimConfig(
        host=args.host,
        port=args.port,
        model_name=args.model_name,
        dp_ranks=args.dp_ranks,
        chat_template=args.chat_template,
        reply_text=args.reply_text,
        reasoning_share=args.reasoning_share,
        reasoning_field=args.reasoning_field,
        default_max_tokens=args.default_max_tokens,
        max_model_len=args.max_model_len,
        stream_chunk_tokens=args.stream_chunk_tokens,
        close_after_stream=args.close_after_stream,
        serving=serving,
        faults=plan,
    )


async def serve(server: SimServer, host: str, port: int) -> None:
    """Serve until SIGINT/SIGTERM; prints the listening line once the socket is bound."""
    runner = server.runner()
    await runner.setup()
    try:
        await listen_until_signal(runner, host, port, "sim")
    finally:
        await runner.cleanup()


def tie_to_parent(parent_pid: int) -> None:
    """End with the process that started this simulator: SIGTERM (a graceful stop once
    serving, the default action before) when it dies or when standard input ends."""
    die_with_parent(signal.SIGTERM, parent_pid)
    on_eof(sys.stdin.fileno(), lambda: os.kill(os.getpid(), signal.SIGTERM))


def _warn(text: str) -> None:
    print(text, file=sys.stderr)


def run(argv: Sequence[str], prog: str = "batchbench sim") -> int:
    parser = build_parser(prog)
    try:
        args = parser.parse_args(list(argv))
    except UsageError as exc:  # in argparse's own form, which its users know
        parser.exit_with_usage(str(exc))
    if args.parent_pid is not None:
        tie_to_parent(args.parent_pid)
    try:
        loaded = load_tokenizer(args.tokenizer_model, args.tokenizer_download or None)
        config = config_from_args(args)
        if args.show_overheads:
            initial, turn = measure_overheads(loaded, config.chat_template)
            print(f"replay initial overhead: {initial} tokens")
            print(f"replay turn overhead: {turn} tokens")
            print(
                f"flags: --replay-initial-overhead-tokens {initial} "
                f"--replay-turn-overhead-tokens {turn}"
            )
            return 0
        # Embedded (--sim), the client names a template problem itself.
        warn = None if args.parent_pid is not None else _warn
        server = SimServer(config, loaded, warn)
    except BatchbenchError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    try:
        import uvloop

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(serve(server, config.host, config.port))
    except BatchbenchError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0
