"""Command line of ``batchbench-agent`` (COMPAT §2): parsing and parse-time checks only."""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence

from batchbench import __version__
from batchbench.errors import UsageError
from batchbench.plan.sampling import FamilyFlags, resolve_latency_spec, resolve_size_spec
from batchbench.plan.workload import SampledShape

DEFAULT_MODEL = "Qwen/Qwen3-VL-235B-A22B-Instruct-FP8"


class AgentArgumentParser(argparse.ArgumentParser):
    """argparse that raises UsageError instead of printing usage and exiting."""

    def error(self, message: str):  # type: ignore[override]
        raise UsageError(message)


def _uint(text: str) -> int:
    try:
        value = int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f'"{text}" is not a valid non-negative integer') from None
    if value < 0:
        raise argparse.ArgumentTypeError(f'"{text}" is not a valid non-negative integer')
    return value


def _u64(text: str) -> int:
    value = _uint(text)
    if value >= 1 << 64:
        raise argparse.ArgumentTypeError(f'"{text}" does not fit in 64 bits')
    return value


def _positive_uint(text: str) -> int:
    try:
        value = int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f'"{text}" is not a valid positive integer') from None
    if value == 0:
        raise argparse.ArgumentTypeError("value must be greater than zero")
    if value < 0:
        raise argparse.ArgumentTypeError(f'"{text}" is not a valid positive integer')
    return value


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f'"{text}" is not a valid number') from None


def _non_negative_float(text: str) -> float:
    value = _float(text)
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError("value must be a non-negative finite number")
    return value


def _positive_finite(text: str) -> float:
    value = _float(text)
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError("value must be a positive finite number")
    return value


def _admission(text: str) -> str:
    if text not in ("closed-loop", "open-loop"):
        raise argparse.ArgumentTypeError(
            f'invalid value "{text}" (expected closed-loop or open-loop)'
        )
    return text


# (family label, destination prefix, fixed flags, log-normal flag prefixes)
SIZE_FAMILIES = (
    (
        "input",
        "input",
        ("--input-tokens", "--initial-prompt-tokens"),
        ("--input-lognorm", "--initial-prompt-lognorm"),
    ),
    (
        "output",
        "output",
        ("--output-tokens", "--model-response-tokens"),
        ("--output-lognorm", "--model-response-lognorm"),
    ),
    (
        "environment",
        "environment",
        ("--environment-tokens", "--environment-response-tokens"),
        ("--environment-lognorm", "--environment-response-lognorm"),
    ),
    (
        "tool-invocations",
        "tool_invocations",
        ("--tool-invocations",),
        ("--tool-invocations-lognorm",),
    ),
)
SIZE_DEFAULTS = {"input": 128, "output": 64, "environment": 64, "tool-invocations": 4}
LATENCY_DESTS = (
    "tool_call_latency_ms",
    "tool_call_latency_lognorm_mu",
    "tool_call_latency_lognorm_median_ms",
    "tool_call_latency_lognorm_sigma",
    "tool_call_latency_lognorm_max_ms",
)


def shape_dests() -> list[str]:
    """Destinations of the 25 synthetic workload-shape flags (§2.3, §2.4)."""
    dests = []
    for _label, dest, _fixed, _lognorm in SIZE_FAMILIES:
        dests += [f"{dest}_fixed", f"{dest}_mu", f"{dest}_median", f"{dest}_sigma", f"{dest}_max"]
    return dests + list(LATENCY_DESTS)


def add_target_flags(target) -> None:
    """--model, --tokenizer-model, --host, --endpoint, --api-key, --api-key-env (COMPAT §2.2);
    shared by ``batchbench-agent`` and ``batchbench calibrate``."""
    target.add_argument(
        "--model", default=DEFAULT_MODEL, help="model name sent in each body (default: %(default)s)"
    )
    target.add_argument(
        "--tokenizer-model",
        help="tokenizer for synthetic text: a tokenizer.json file, a directory containing one, "
        "a built-in name (deepseek-v3; see `batchbench tokenizers`) or a hub id "
        "(default: the --model value)",
    )
    target.add_argument(
        "--host", default="https://api.openai.com", help="base URL (default: %(default)s)"
    )
    target.add_argument(
        "--endpoint",
        default="/v1/chat/completions",
        help="path appended to --host, or a full URL that replaces it (default: %(default)s)",
    )
    target.add_argument(
        "--api-key", help="API key (takes precedence over --api-key-env); never printed"
    )
    target.add_argument(
        "--api-key-env",
        default="OPENAI_API_KEY",
        help="environment variable holding the API key (default: %(default)s)",
    )


def add_chat_template_flag(group) -> None:
    group.add_argument(
        "--chat-template",
        metavar="TEMPLATE",
        help="the chat template the server renders with, used to count the model's replies "
        "as the next prompt will render them: chatml, gemma, llama3 (the simulator's "
        "built-ins), `tokenizer` (the chat_template.jinja or tokenizer_config.json beside the "
        "tokenizer file), or a .jinja file (default: the template beside the tokenizer when "
        "there is one; with --sim, the simulator's: a built-in name or tokenizer given here "
        "is passed on to it)",
    )


def add_fidelity_flags(group) -> None:
    """Flags of the closed-loop prompt correction (see ``batchbench.run.sizing``)."""
    group.add_argument(
        "--calibrate",
        action="store_true",
        help="before the run, measure the server's initial and per-turn framing overhead "
        "with probe requests (as `batchbench calibrate` does) and use them; explicit "
        "--replay-*-overhead-tokens flags still win",
    )
    group.add_argument(
        "--no-prompt-correction",
        dest="prompt_correction",
        action="store_false",
        help="send the plan's sizes unchanged: no reply accounting and no correction from "
        "usage.prompt_tokens (for comparison; the fidelity lines still measure the drift)",
    )
    group.add_argument(
        "--prompt-oracle",
        choices=("none", "server"),
        default="none",
        help="server: before sending each request, ask the server to count it through its "
        "own chat template (vLLM POST /tokenize with messages, or llama.cpp "
        "/apply-template + /tokenize) and resize its new content to the exact target "
        "(default: %(default)s)",
    )
    group.add_argument(
        "--content-salt",
        metavar="S",
        help="salt of every trajectory's private text: equal manifest, seed, salt and "
        "tokenizer give byte-identical requests, and a new salt changes the text but no "
        "token count, so a warm server cannot serve this run from an earlier run's cache "
        "(default: random, shown in the banner)",
    )
    add_chat_template_flag(group)


def build_parser(prog: str = "batchbench-agent") -> AgentArgumentParser:
    """Every flag of COMPAT §2; defaults are None where "not given" must stay visible."""
    parser = AgentArgumentParser(
        prog=prog,
        allow_abbrev=False,
        description=(
            "Replay agent trajectories (or sampled agents) against an OpenAI-compatible "
            "/v1/chat/completions server. Every prompt and tool result is synthetic text that "
            "re-encodes to exactly the planned token count."
        ),
        epilog=(
            "Replay does not reproduce the original text, the model's real replies or "
            "content-dependent effects; compare the live usage.prompt_tokens with the plan "
            "before accepting a capacity result."
        ),
    )
    add = parser.add_argument
    add_target_flags(parser.add_argument_group("target and model"))
    add_fidelity_flags(parser.add_argument_group("prompt fidelity (batchbench additions)"))

    shape = parser.add_argument_group("sampled workload shape (without --agent-plans-jsonl)")
    for label, dest, fixed_flags, lognorm_prefixes in SIZE_FAMILIES:
        default = SIZE_DEFAULTS[label]
        unit = "invocations" if label == "tool-invocations" else "tokens"
        shape.add_argument(
            *fixed_flags,
            dest=f"{dest}_fixed",
            type=_uint,
            metavar="N",
            help=f"fixed {label} size in {unit} (default: fixed {default})",
        )
        for suffix, kind, typ, what in (
            ("mu", "mu", _float, "mu of ln(size)"),
            ("median", "median", _float, "median size (mu = ln(median))"),
            ("sigma", "sigma", _float, "sigma of ln(size); required for log-normal"),
            ("max", "max", _uint, "cap on each sample"),
        ):
            shape.add_argument(
                *[f"{prefix}-{suffix}" for prefix in lognorm_prefixes],
                dest=f"{dest}_{kind}",
                type=typ,
                metavar="X",
                help=f"log-normal {label}: {what}",
            )
    shape.add_argument(
        "--tool-call-latency-ms",
        "--tool-latency-ms",
        dest="tool_call_latency_ms",
        type=_uint,
        metavar="MS",
        help="fixed sleep after each successful response, ms (default: 0 = disabled)",
    )
    shape.add_argument(
        "--tool-call-latency-lognorm-mu",
        type=_float,
        metavar="X",
        help="log-normal latency: mu of ln(ms)",
    )
    shape.add_argument(
        "--tool-call-latency-lognorm-median-ms",
        "--tool-call-latency-lognorm-median",
        dest="tool_call_latency_lognorm_median_ms",
        type=_float,
        metavar="MS",
        help="log-normal latency: median in ms",
    )
    shape.add_argument(
        "--tool-call-latency-lognorm-sigma",
        type=_float,
        metavar="X",
        help="log-normal latency: sigma (required)",
    )
    shape.add_argument(
        "--tool-call-latency-lognorm-max-ms",
        "--tool-call-latency-lognorm-max",
        dest="tool_call_latency_lognorm_max_ms",
        type=_uint,
        metavar="MS",
        help="log-normal latency: cap in ms",
    )

    replay = parser.add_argument_group("agents, replay and admission")
    replay.add_argument(
        "--agents", type=_uint, help="number of sampled agents (default: 1; not with a manifest)"
    )
    replay.add_argument(
        "--agent-plans-jsonl", metavar="PATH", help="trajectory manifest (JSONL) to replay"
    )
    replay.add_argument(
        "--replay-initial-overhead-tokens",
        type=_uint,
        metavar="N",
        help="prompt tokens taken by template/framing on a first or reset request (default: 0)",
    )
    replay.add_argument(
        "--replay-turn-overhead-tokens",
        type=_uint,
        metavar="N",
        help="extra framing tokens per appended turn; they accumulate (default: 0)",
    )
    replay.add_argument(
        "--max-active-agents",
        type=_positive_uint,
        metavar="N",
        help="concurrent agents; closed loop refills freed slots in FIFO order (default: all)",
    )
    replay.add_argument(
        "--admission",
        type=_admission,
        metavar="{closed-loop,open-loop}",
        help="admission mode for a manifest (default: closed-loop)",
    )
    replay.add_argument(
        "--time-scale",
        type=_positive_finite,
        metavar="F",
        help="divide every start_after_ms and delay_after_ms by F (default: 1)",
    )

    routing = parser.add_argument_group("routing and identity")
    routing.add_argument("--user-prefix", help="user tag <prefix>-<agent_id> instead of a UUIDv4")
    routing.add_argument(
        "--disable-user-tagging", action="store_true", help="send no user field and no routing key"
    )
    routing.add_argument(
        "--dp-rank-perfect-routing",
        action="store_true",
        help="send X-SMG-Target-Worker = routing slot %% ranks",
    )
    routing.add_argument(
        "--dp-rank-perfect-routing-num", type=_positive_uint, metavar="N", help="number of DP ranks"
    )

    http = parser.add_argument_group("HTTP behaviour and outputs")
    http.add_argument(
        "--request-timeout-secs",
        type=_uint,
        default=60,
        metavar="S",
        help="timeout of one whole attempt (default: %(default)s)",
    )
    http.add_argument(
        "--max-retries",
        type=_uint,
        default=2,
        metavar="N",
        help="retries after the first attempt (default: %(default)s)",
    )
    http.add_argument(
        "--retry-delay-ms",
        type=_uint,
        default=250,
        metavar="MS",
        help="base of the exponential backoff; 0 = no delay (default: %(default)s)",
    )
    http.add_argument("--sglang", action="store_true", help="send max_new_tokens/min_new_tokens")
    http.add_argument(
        "--ignore-eos", action="store_true", help='add "ignore_eos": true to every body'
    )
    http.add_argument(
        "--verbose",
        "-v",
        action="store_true",
        help="print truncated request/response JSON per attempt",
    )
    http.add_argument(
        "--dry-run",
        action="store_true",
        help="build plans, generate all text, run admission; send nothing",
    )
    http.add_argument("--seed", type=_u64, help="root seed for sampling and text (default: random)")
    http.add_argument("--results-csv", metavar="PATH", help="write a one-row CSV summary")
    http.add_argument(
        "--agent-events-jsonl", metavar="PATH", help="write one lifecycle record per trajectory"
    )
    live = parser.add_argument_group("live runs (batchbench additions)")
    live.add_argument(
        "--stream",
        action="store_true",
        help="stream every reply (SSE with stream_options.include_usage) and report TTFT, "
        "inter-token latency and time per output token",
    )
    live.add_argument(
        "--request-events-jsonl",
        metavar="PATH",
        help="write one JSON line per request (tokens, latency, TTFT, attempts, status)",
    )
    live.add_argument(
        "--results-json",
        metavar="PATH",
        help="write the whole summary (metrics, configuration, manifest SHA-256) as JSON",
    )
    live.add_argument(
        "--grace-seconds",
        type=_non_negative_float,
        default=5.0,
        metavar="S",
        help="after Ctrl+C or SIGTERM, how long requests in flight may finish before they "
        "are cancelled (default: %(default)s)",
    )
    live.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bar (it is only ever drawn when stderr is a terminal)",
    )
    sim = parser.add_argument_group("embedded simulator (batchbench additions)")
    sim.add_argument(
        "--sim",
        action="store_true",
        help="start `batchbench sim` on a free loopback port, run against it, then stop it; "
        "--host is ignored, and the tokenizer defaults to deepseek-v3",
    )
    sim.add_argument(
        "--sim-dp-ranks",
        type=_positive_uint,
        metavar="N",
        help="data-parallel ranks of the simulator (default: its own default, 1)",
    )
    sim.add_argument(
        "--sim-args",
        metavar="ARGS",
        help='more `batchbench sim` options as one string, e.g. "--speed 0 --fault-seed 3"',
    )
    add("--version", action="version", version=version_text())
    return parser


def version_text() -> str:
    from batchbench._impl import active_implementation

    return f"batchbench {__version__} ({active_implementation()})"


def check_companions(args: argparse.Namespace) -> None:
    """Parse-time companion rules of COMPAT §2.8."""
    if args.agent_plans_jsonl is None:
        for dest, flag in (
            ("replay_initial_overhead_tokens", "--replay-initial-overhead-tokens"),
            ("replay_turn_overhead_tokens", "--replay-turn-overhead-tokens"),
            ("admission", "--admission"),
            ("time_scale", "--time-scale"),
        ):
            if getattr(args, dest) is not None:
                raise UsageError(f"{flag} requires --agent-plans-jsonl")
    if args.dp_rank_perfect_routing and args.dp_rank_perfect_routing_num is None:
        raise UsageError("--dp-rank-perfect-routing requires --dp-rank-perfect-routing-num")
    if args.dp_rank_perfect_routing_num is not None and not args.dp_rank_perfect_routing:
        raise UsageError("--dp-rank-perfect-routing-num requires --dp-rank-perfect-routing")
    for dest, flag in (("sim_dp_ranks", "--sim-dp-ranks"), ("sim_args", "--sim-args")):
        if getattr(args, dest) is not None and not args.sim:
            raise UsageError(f"{flag} requires --sim")
    if args.sim and args.endpoint.startswith(("http://", "https://")):
        raise UsageError(
            "--sim cannot be combined with a full-URL --endpoint; give a path such as "
            "/v1/chat/completions"
        )
    if args.sim and args.dry_run:
        raise UsageError("--sim cannot be combined with --dry-run; a dry-run sends nothing")
    if args.prompt_oracle == "server" and not args.prompt_correction:
        raise UsageError("--prompt-oracle server cannot be combined with --no-prompt-correction")
    if args.prompt_oracle == "server" and args.dry_run:
        raise UsageError("--prompt-oracle server cannot be combined with --dry-run")
    if args.sim and args.chat_template is not None:
        if args.chat_template not in ("chatml", "gemma", "llama3", "tokenizer"):
            raise UsageError(
                "with --sim, --chat-template must be chatml, gemma, llama3 or tokenizer "
                "(the simulator's templates)"
            )
        if "--chat-template" in (args.sim_args or ""):
            raise UsageError("give --chat-template once: as a flag or inside --sim-args, not both")
    if args.calibrate and args.dry_run:
        raise UsageError("--calibrate cannot be combined with --dry-run; a dry-run sends nothing")


def parse_agent_args(
    argv: Sequence[str], prog: str = "batchbench-agent"
) -> argparse.Namespace | None:
    """Parse and run the parse-time checks; raises UsageError (exit 2).

    Returns None after ``--help`` or ``--version`` printed their text (D9: status 0).
    """
    parser = build_parser(prog)
    try:
        args = parser.parse_args(list(argv))
    except SystemExit as exc:
        if exc.code in (0, None):
            return None
        raise
    check_companions(args)
    return args


def shape_flags_given(args: argparse.Namespace) -> bool:
    """True when any of the 25 synthetic shape flags (aliases included) was given."""
    return any(getattr(args, dest) is not None for dest in shape_dests())


def resolve_shape(args) -> SampledShape:
    """Resolve the four size families and the latency spec (COMPAT §2.3, §2.4)."""
    specs = {}
    for label, dest, _fixed, _lognorm in SIZE_FAMILIES:
        flags = FamilyFlags(
            fixed=getattr(args, f"{dest}_fixed"),
            mu=getattr(args, f"{dest}_mu"),
            median=getattr(args, f"{dest}_median"),
            sigma=getattr(args, f"{dest}_sigma"),
            cap=getattr(args, f"{dest}_max"),
        )
        specs[label] = resolve_size_spec(label, flags, SIZE_DEFAULTS[label])
    latency = resolve_latency_spec(
        FamilyFlags(
            fixed=args.tool_call_latency_ms,
            mu=args.tool_call_latency_lognorm_mu,
            median=args.tool_call_latency_lognorm_median_ms,
            sigma=args.tool_call_latency_lognorm_sigma,
            cap=args.tool_call_latency_lognorm_max_ms,
        )
    )
    return SampledShape(
        input=specs["input"],
        output=specs["output"],
        environment=specs["environment"],
        tool_invocations=specs["tool-invocations"],
        latency=latency,
    )
