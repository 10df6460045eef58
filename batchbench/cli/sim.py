"""``batchbench sim``: parse the options, load the tokenizer, serve until stopped."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any

from batchbench.cli.listening import listen_until_signal
from batchbench.errors import BatchbenchError, UsageError
from batchbench.lifeline import die_with_parent, on_eof
from batchbench.options.parser import CommandParser
from batchbench.options.values import (
    finite_above_zero,
    finite_at_least_zero,
    int_at_least,
    rate,
    share,
    status_codes,
)
from batchbench.sim.faults import Fault, FaultPlan
from batchbench.sim.overheads import measure_overheads
from batchbench.sim.server import SimConfig, SimServer
from batchbench.sim.serving import ServingModel
from batchbench.text.chat_templates import TEMPLATE_CHOICES
from batchbench.text.tokenizer import DEFAULT_BUILTIN, load_tokenizer

DESCRIPTION = """\
An OpenAI-compatible serving simulator with data-parallel ranks, per-rank prefix caches,
continuous batching and deterministic fault injection. It counts prompt tokens exactly
(the prompt rendered with a chat template and the given tokenizer) and replies with
completion_tokens tokens of model-like text (or, with --reply-text exact, text of exactly
that many tokens), so a benchmark can check its token shapes end to end without a GPU.
Once it listens it prints one line, "batchbench sim listening on http://HOST:PORT", and
serves until SIGINT or SIGTERM."""

EPILOG = """\
routing (first that applies): x-smg-target-worker: <rank>; x-data-parallel-rank: <rank>;
a consistent hash of x-smg-routing-key; else the least-loaded rank (fewest requests in
flight, ties round-robin).

step time per rank = prefill tokens in the step / --prefill-tokens-per-s + (--decode-step-ms
+ --decode-step-ms-per-seq x running sequences + --decode-step-ms-per-ktoken x context
thousands of tokens in the batch) / 1000, all divided by --speed. A step processes at most
--max-num-batched-tokens (one per decoding sequence, the rest chunked prefill)."""


def build_parser(prog: str = "batchbench sim") -> CommandParser:
    parser = CommandParser(
        prog=prog,
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_server_flags(parser.add_argument_group("server"))
    add_serving_flags(parser.add_argument_group("serving model (per rank)"))
    add_fault_flags(parser.add_argument_group("fault injection (rates are per request, in [0, 1])"))
    return parser


def add_server_flags(server: Any) -> None:
    """Where it listens, what it serves and how it renders and replies."""
    server.add_argument("--host", default="127.0.0.1", help="address to bind (default %(default)s)")
    server.add_argument(
        "--port",
        type=int_at_least(0, 65535),
        default=8000,
        help="TCP port; 0 picks a free one (default %(default)s)",
    )
    server.add_argument(
        "--tokenizer-model",
        default=DEFAULT_BUILTIN,
        help="tokenizer.json path, a directory holding one, a hub id or a built-in name "
        "(default %(default)s)",
    )
    server.add_argument(
        "--parent-pid",
        type=int_at_least(1),
        default=None,
        help="end when process PID ends: at the end of standard input (a pipe that PID "
        "holds) and, on Linux, at PID's death even by kill -9 (batchbench-agent --sim "
        "passes its own)",
    )
    server.add_argument(
        "--tokenizer-download",
        action="store_true",
        help="allow --tokenizer-model to name a Hugging Face hub id and download it",
    )
    server.add_argument(
        "--chat-template",
        choices=TEMPLATE_CHOICES,
        default="chatml",
        help="prompt template: chatml (content as sent, tool calls without ids), gemma "
        "(Gemma-3 style: content trimmed, tool calls not rendered, tool results as user "
        "turns), llama3 (Llama-3 style: content trimmed, tool calls and tool results "
        "rendered with their call ids), qwen3 (Qwen3 style: content trimmed, reasoning in "
        "<think> blocks, tool calls as <tool_call> JSON after a newline an empty text goes "
        "without, tool results as user turns) - all four counted per message, fast on long "
        "histories - or tokenizer: the model's own template (chat_template.jinja or "
        "tokenizer_config.json beside the tokenizer file) via jinja2, whole prompt each "
        "request, tool-call arguments parsed into objects as vLLM does (default %(default)s)",
    )
    server.add_argument(
        "--reply-text",
        choices=("model", "exact"),
        default="model",
        help="model: replies are random token ids decoded as a model's would be, so like a "
        "real model's they need not re-encode to completion_tokens (some start with "
        "whitespace or end with a newline); exact: synthetic text that re-encodes to exactly "
        "completion_tokens, trim-stable (default %(default)s)",
    )
    server.add_argument(
        "--reasoning-share",
        type=share,
        default=0.0,
        metavar="FRACTION",
        help="share of replies that think first, as a reasoning model behind a reasoning "
        "parser does: part of the reply's completion tokens come as reasoning_content "
        "(streamed as reasoning_content deltas before the content), and one in four of "
        "those replies is all reasoning with empty content; which replies think is seeded "
        "by the request (default %(default)s)",
    )
    server.add_argument(
        "--reasoning-field",
        choices=("reasoning_content", "reasoning"),
        default="reasoning_content",
        help="the field reasoning comes in: reasoning_content (SGLang, llama.cpp, vLLM before "
        "0.17) or reasoning (vLLM since 0.17) (default %(default)s)",
    )
    server.add_argument(
        "--model",
        "--model-name",
        dest="model_name",
        default="batchbench-sim",
        help="model id listed by /v1/models, as --model names it in batchbench-agent "
        "(requests may name any model; --model-name is the older spelling) "
        "(default %(default)s)",
    )
    server.add_argument(
        "--default-max-tokens",
        type=int_at_least(1),
        default=256,
        help="reply cap in tokens when a request sets none (default %(default)s)",
    )
    server.add_argument(
        "--max-model-len",
        type=int_at_least(1),
        default=262_144,
        help="context length in tokens: a request whose prompt plus max_tokens exceeds it "
        "gets a 400, as vLLM answers (default %(default)s)",
    )
    server.add_argument(
        "--stream-chunk-tokens",
        type=int_at_least(1),
        default=1,
        help="tokens per streamed content chunk (default %(default)s)",
    )
    server.add_argument(
        "--close-after-stream",
        action="store_true",
        help="close the connection after every streamed response, although HTTP/1.1 keeps "
        "it alive, as llama.cpp's server does: a client that sends its next request on it "
        "at once finds it closed",
    )
    server.add_argument(
        "--show-overheads",
        action="store_true",
        help="print the template's replay overheads in tokens (the values to pass to "
        "--replay-initial-overhead-tokens and --replay-turn-overhead-tokens) and exit",
    )


def add_serving_flags(model: Any) -> None:
    """The per-rank serving model (defaults: ``ServingModel``'s)."""
    defaults = ServingModel()
    model.add_argument(
        "--dp-ranks", type=int_at_least(1), default=1, help="data-parallel ranks (default 1)"
    )
    model.add_argument(
        "--kv-cache-tokens",
        type=int_at_least(0),
        default=defaults.kv_cache_tokens,
        help="KV pool per rank in tokens, shared by running sequences (which claim their "
        "uncached prompt plus output; admission waits when full) and the prefix cache "
        "(the rest); 0 disables caching and the limit (default %(default)s)",
    )
    model.add_argument(
        "--block-size",
        type=int_at_least(1),
        default=defaults.block_tokens,
        help="KV block size in tokens; cache hits count whole blocks (default %(default)s)",
    )
    model.add_argument(
        "--prefill-tokens-per-s",
        type=finite_above_zero,
        default=defaults.prefill_tokens_per_s,
        help="prefill throughput in uncached tokens per second (default %(default)g)",
    )
    model.add_argument(
        "--decode-step-ms",
        type=finite_at_least_zero,
        default=defaults.decode_step_ms,
        help="fixed time of one decode step in ms (default %(default)g)",
    )
    model.add_argument(
        "--decode-step-ms-per-seq",
        type=finite_at_least_zero,
        default=defaults.decode_step_ms_per_seq,
        help="extra decode-step time per running sequence in ms (default %(default)g)",
    )
    model.add_argument(
        "--decode-step-ms-per-ktoken",
        type=finite_at_least_zero,
        default=defaults.decode_step_ms_per_ktoken,
        help="extra decode-step time per 1000 tokens of context in the batch, in ms "
        "(attention reads the KV) (default %(default)g)",
    )
    model.add_argument(
        "--max-batch",
        type=int_at_least(1),
        default=defaults.max_batch,
        help="running sequences per rank; more wait in a FIFO queue (default %(default)s)",
    )
    model.add_argument(
        "--max-num-batched-tokens",
        type=int_at_least(1),
        default=defaults.max_num_batched_tokens,
        help="tokens one step may process (one per decoding sequence, the rest prefill, "
        "chunked across steps) (default %(default)s)",
    )
    model.add_argument(
        "--speed",
        type=finite_at_least_zero,
        default=defaults.speed,
        help="divides every modelled time; 0 disables modelled time: requests are answered "
        "as soon as they are counted, so batching, prefill and decode settings and the "
        "queue are unused (a zero-latency backend for client benchmarks) (default %(default)g)",
    )


def add_fault_flags(faults: Any) -> None:
    """Deterministic fault injection."""
    faults.add_argument(
        "--fault-seed", type=int_at_least(0), default=0, help="seed of the fault draws"
    )
    faults.add_argument(
        "--fault-error-rate", type=rate, default=0.0, help="answer with an error status"
    )
    faults.add_argument(
        "--fault-error-statuses",
        type=status_codes,
        default=(500, 503),
        help="statuses for --fault-error-rate, comma-separated (default 500,503)",
    )
    faults.add_argument(
        "--fault-429-rate", type=rate, default=0.0, help="answer 429 with Retry-After"
    )
    faults.add_argument(
        "--fault-retry-after-s",
        type=int_at_least(0),
        default=1,
        help="Retry-After seconds on simulated 429s (default %(default)s)",
    )
    faults.add_argument(
        "--fault-drop-rate", type=rate, default=0.0, help="cut the connection mid-response"
    )
    faults.add_argument(
        "--fault-truncate-rate",
        type=rate,
        default=0.0,
        help="end a stream halfway without usage or [DONE] (non-streamed: no effect)",
    )
    faults.add_argument(
        "--fault-malformed-rate",
        type=rate,
        default=0.0,
        help="send a body (or one stream chunk) that is not JSON",
    )
    faults.add_argument(
        "--fault-missing-usage-rate", type=rate, default=0.0, help="omit usage from the reply"
    )
    faults.add_argument(
        "--fault-spike-rate", type=rate, default=0.0, help="delay a request by --fault-spike-ms"
    )
    faults.add_argument(
        "--fault-spike-ms",
        type=finite_at_least_zero,
        default=1000.0,
        help="latency spike in ms, real time whatever --speed (default %(default)g)",
    )


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
