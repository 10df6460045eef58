"""The simulator's command line: its options, declared once for ``batchbench sim`` and for
checking ``--sim-args`` when a ``--sim`` run's options are checked, before its child starts."""

from __future__ import annotations

import argparse
import difflib
import shlex
from typing import Any

from batchbench.errors import UsageError
from batchbench.options.parser import CommandParser
from batchbench.options.values import (
    finite_above_zero,
    finite_at_least_zero,
    int_at_least,
    rate,
    share,
    status_codes,
)
from batchbench.text.chat_templates import TEMPLATE_CHOICES
from batchbench.text.tokenizer import DEFAULT_BUILTIN

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
    # the client checks --sim-args with this parser and otherwise imports nothing of the
    # simulator's modules (a test holds it to that)
    from batchbench.sim.serving import ServingModel  # lazy: only when this parser is built

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


def check_sim_command(command: list[str]) -> None:
    """The child's arguments (``sim_command``'s, after ``python -m batchbench sim``) parsed
    as the simulator will parse them, before it starts: a mistake in --sim-args is one
    usage error naming the simulator option, not the simulator's whole usage text."""
    words = command[4:]
    if "-h" in words or "--help" in words:
        raise UsageError(
            "--sim-args: --help is not a simulator option here; `batchbench sim --help` lists them"
        )
    parser = build_parser()
    try:
        _args, unknown = parser.parse_known_args(words)
    except UsageError as exc:  # a bad value, a missing one, an option given twice
        raise UsageError(f"--sim-args: {exc}") from None
    if unknown:
        raise UsageError(f"--sim-args: {_unknown(parser.long_options(), unknown)}")


def sim_model_name(command: list[str]) -> str:
    """The model id the simulator child of ``command`` will list (its --model, else the
    default), so that a caller that starts it need not ask the server."""
    args, _unknown_words = build_parser().parse_known_args(command[4:])
    return str(args.model_name)


def _unknown(known: list[str], words: list[str]) -> str:
    """What the simulator would refuse: its unknown options, each with the nearest known one."""
    options = [word.split("=", 1)[0] for word in words if word.startswith("-")]
    if not options:
        return (
            f"unexpected simulator argument {shlex.join(words)} (the simulator takes only "
            "options, each starting with --)"
        )
    named = []
    for option in options:
        close = difflib.get_close_matches(option, known, n=1, cutoff=0.75)
        named.append(f"{option} (did you mean {close[0]}?)" if close else option)
    plural = "s" if len(named) > 1 else ""
    return f"unknown simulator option{plural} {', '.join(named)}"
