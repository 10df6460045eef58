"""Command line of ``batchbench-agent``: parsing, the --config file and parse-time checks."""

from __future__ import annotations

import argparse
import math
import re
import textwrap
import tomllib
from collections.abc import Sequence
from datetime import UTC, datetime

from batchbench import __version__
from batchbench._impl import active_implementation
from batchbench.cli.argtypes import (
    CommandParser,
    byte_size,
    failure_rate,
    non_negative_float,
    number,
    positive_finite,
    positive_uint,
    seconds,
    suggestion,
    u64,
    uint,
)
from batchbench.config import RunConfig, api_key_from, check_flag_combinations
from batchbench.config import resolve_shape as shape_from_options
from batchbench.drive.transport import DEFAULT_MAX_RESPONSE_BYTES
from batchbench.errors import UsageError
from batchbench.plan.arrivals import ARRIVAL_PROCESSES
from batchbench.plan.workload import SampledShape
from batchbench.results.slo import DEFAULT_PERCENTILES, parse_goodput, parse_percentiles, parse_slo

AgentArgumentParser = CommandParser  # the name other commands import


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
    """Destinations of the 25 sampled-shape flags: four size families and the tool latency."""
    dests = []
    for _label, dest, _fixed, _lognorm in SIZE_FAMILIES:
        dests += [f"{dest}_fixed", f"{dest}_mu", f"{dest}_median", f"{dest}_sigma", f"{dest}_max"]
    return dests + list(LATENCY_DESTS)


def add_target_flags(target) -> None:
    """--model, --tokenizer-model, --host, --endpoint, --api-key, --api-key-env (the target);
    shared by ``batchbench-agent`` and ``batchbench calibrate``."""
    target.add_argument(
        "--model",
        help="model name sent in each body (default: the model the server lists at "
        "GET /v1/models, when it lists exactly one)",
    )
    target.add_argument(
        "--tokenizer-model",
        help="tokenizer for synthetic text: a tokenizer.json file, a directory containing one, "
        "a built-in name (deepseek-v3; see `batchbench tokenizers`) or a hub id "
        "(default: the --model value)",
    )
    target.add_argument(
        "--tokenizer-download",
        action="store_true",
        help="allow --tokenizer-model to name a Hugging Face hub id and download it "
        "(otherwise only local files and built-in names are used, and nothing is fetched)",
    )
    target.add_argument(
        "--host",
        help="base URL of the OpenAI-compatible server, http:// or https:// (e.g. "
        "http://127.0.0.1:8000; a trailing /v1 as in the OpenAI SDK's base_url is fine); "
        "required unless --sim or --dry-run",
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
        "as the next prompt will render them: chatml, gemma, llama3, qwen3 (the simulator's "
        "built-ins), `tokenizer` (the chat_template.jinja or tokenizer_config.json beside the "
        "tokenizer file), or a .jinja file (default: the template beside the tokenizer when "
        "there is one; with --sim, the simulator's: a built-in name or tokenizer given here "
        "is passed on to it)",
    )


def add_fidelity_flags(group) -> None:
    """Flags of the closed-loop prompt correction (see ``batchbench.drive.sizing``)."""
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
        "--replay-reasoning",
        choices=("keep", "drop"),
        default="keep",
        help="keep: a reply's reasoning (reasoning_content, or reasoning as vLLM 0.17 and "
        "later name it) is sent back with it in the next request under the same name, as "
        "agents that keep their thinking do, and counted as the server's template renders "
        "it (many templates render it only after the last user message, some never); drop: "
        "it is left out of the history, as OpenAI-style clients do (default: %(default)s)",
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


def _paragraphs(*texts: str) -> str:
    """Help text paragraphs wrapped to the terminal's usual width."""
    return "\n\n".join(textwrap.fill(text, 88, break_on_hyphens=False) for text in texts)


def build_parser(prog: str = "batchbench-agent") -> AgentArgumentParser:
    """Every flag; defaults are None where "not given" must stay visible."""
    parser = AgentArgumentParser(
        prog=prog,
        allow_abbrev=False,
        description=_paragraphs(
            "Replay agent trajectories (or sampled agents) against an OpenAI-compatible "
            "/v1/chat/completions server. Every prompt and tool result is synthetic text that "
            "re-encodes to exactly the planned token count."
        ),
        epilog=_paragraphs(
            "exit statuses: 0 every planned request succeeded (or the failures stayed within "
            "--max-failure-rate); 3 the run finished but more requests failed than that "
            "allows (outputs written, the last line says so); 1 a runtime error; 2 a usage "
            "error; 130 / 143 interrupted by SIGINT / SIGTERM (outputs written).",
            "Replay does not reproduce the original text, the model's real replies or "
            "content-dependent effects; compare the live usage.prompt_tokens with the plan "
            "before accepting a capacity result.",
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
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
            type=uint,
            metavar="N",
            help=f"fixed {label} size in {unit} (default: fixed {default})",
        )
        for suffix, kind, typ, what in (
            ("mu", "mu", number, "mu of ln(size)"),
            ("median", "median", number, "median size (mu = ln(median))"),
            ("sigma", "sigma", number, "sigma of ln(size); required for log-normal"),
            ("max", "max", uint, "cap on each sample"),
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
        type=uint,
        metavar="MS",
        help="fixed sleep after each successful response, ms (default: 0 = disabled)",
    )
    shape.add_argument(
        "--tool-call-latency-lognorm-mu",
        type=number,
        metavar="X",
        help="log-normal latency: mu of ln(ms)",
    )
    shape.add_argument(
        "--tool-call-latency-lognorm-median-ms",
        "--tool-call-latency-lognorm-median",
        dest="tool_call_latency_lognorm_median_ms",
        type=number,
        metavar="MS",
        help="log-normal latency: median in ms",
    )
    shape.add_argument(
        "--tool-call-latency-lognorm-sigma",
        type=number,
        metavar="X",
        help="log-normal latency: sigma (required)",
    )
    shape.add_argument(
        "--tool-call-latency-lognorm-max-ms",
        "--tool-call-latency-lognorm-max",
        dest="tool_call_latency_lognorm_max_ms",
        type=uint,
        metavar="MS",
        help="log-normal latency: cap in ms",
    )

    replay = parser.add_argument_group("agents, replay and admission")
    replay.add_argument(
        "--agents", type=uint, help="number of sampled agents (default: 1; not with a manifest)"
    )
    replay.add_argument(
        "--agent-plans-jsonl",
        metavar="PATH",
        help="trajectory manifest (JSONL, schema 1 or 2, see docs/manifest.md) to replay; "
        "`batchbench validate PATH` checks one without running it",
    )
    replay.add_argument(
        "--replay-initial-overhead-tokens",
        type=uint,
        metavar="N",
        help="prompt tokens taken by template/framing on a first or reset request (default: 0)",
    )
    replay.add_argument(
        "--replay-turn-overhead-tokens",
        type=uint,
        metavar="N",
        help="extra framing tokens per appended turn; they accumulate (default: 0)",
    )
    replay.add_argument(
        "--max-active-agents",
        type=positive_uint,
        metavar="N",
        help="concurrent agents; closed loop refills freed slots in FIFO order, open loop "
        "delays an arrival until one is free (default: all)",
    )
    replay.add_argument(
        "--admission",
        type=_admission,
        metavar="{closed-loop,open-loop}",
        help="closed-loop runs up to --max-active-agents at once and starts the next agent "
        "when one finishes; open-loop starts each agent at its own time (a manifest's "
        "start_after_ms, or --arrival-rate) however the server keeps up "
        "(default: closed-loop; open-loop with --arrival-rate)",
    )
    replay.add_argument(
        "--time-scale",
        type=positive_finite,
        metavar="F",
        help="divide every start_after_ms and delay_after_ms by F (default: 1)",
    )
    replay.add_argument(
        "--arrival-rate",
        type=positive_finite,
        metavar="R",
        help="agents arrive at R per second on average, and each starts when it arrives, "
        "not when another finishes (open-loop admission, implied; --max-active-agents "
        "still caps how many run, and an arrival beyond it waits and counts as late); "
        "with --agents N, or a manifest whose trajectories set no start_after_ms "
        "(default: none)",
    )
    replay.add_argument(
        "--arrival-process",
        choices=ARRIVAL_PROCESSES,
        help="how arrivals are spaced: poisson, independent arrivals with exponential gaps "
        "(bursts and lulls, as real users make; drawn from --seed), or constant, exactly "
        "1/R seconds apart (default: poisson)",
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
        "--dp-rank-perfect-routing-num", type=positive_uint, metavar="N", help="number of DP ranks"
    )

    http = parser.add_argument_group("HTTP behaviour and outputs")
    http.add_argument(
        "--request-timeout-secs",
        type=seconds,
        default=60,
        metavar="S",
        help="timeout of one whole attempt, in seconds (fractions allowed: 0.5) "
        "(default: %(default)s)",
    )
    http.add_argument(
        "--max-response-bytes",
        type=byte_size,
        default=DEFAULT_MAX_RESPONSE_BYTES,
        metavar="N",
        help="the most one response may hold once decoded (a body, its gzip/deflate output, "
        "a stream, one SSE line): a larger one fails as response_too_large, so no server "
        "can exhaust the client's memory; bytes, or with KiB, MiB, GiB (default: 64MiB)",
    )
    http.add_argument(
        "--max-retries",
        type=uint,
        default=2,
        metavar="N",
        help="retries after the first attempt (default: %(default)s)",
    )
    http.add_argument(
        "--retry-delay-ms",
        type=uint,
        default=250,
        metavar="MS",
        help="base of the exponential backoff; 0 = no delay (default: %(default)s)",
    )
    http.add_argument(
        "--max-retry-wait",
        type=non_negative_float,
        default=300.0,
        metavar="S",
        help="longest wait before a retry, in seconds: a server's Retry-After is honoured "
        "as sent up to this, and a capped wait is reported (default: %(default)g)",
    )
    http.add_argument(
        "--max-failure-rate",
        type=failure_rate,
        default=0.0,
        metavar="F",
        help="share of sent requests that may fail (0..1, or a percentage such as 2%%) "
        "before the run exits with status 3 (default: 0: any failure)",
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
    http.add_argument("--seed", type=u64, help="root seed for sampling and text (default: random)")
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
        type=non_negative_float,
        default=5.0,
        metavar="S",
        help="after Ctrl+C or SIGTERM, how long requests in flight may finish before they "
        "are cancelled (default: %(default)s)",
    )
    live.add_argument(
        "--no-preflight",
        action="store_true",
        help="skip the check before the run (GET /v1/models, then a 1-token completion) "
        "that turns an unreachable or wrong target (host, path, model, key) into one clear "
        "error within seconds",
    )
    live.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bar (it is only ever drawn when stderr is a terminal)",
    )
    add_window_flags(parser.add_argument_group("objectives, measured window and report"))
    add_scale_flags(parser.add_argument_group("scale-out (batchbench additions)"))
    sim = parser.add_argument_group("embedded simulator (batchbench additions)")
    sim.add_argument(
        "--sim",
        action="store_true",
        help="start `batchbench sim` on a free loopback port, run against it, then stop it; "
        "--host is ignored, and the tokenizer defaults to deepseek-v3",
    )
    sim.add_argument(
        "--sim-dp-ranks",
        type=positive_uint,
        metavar="N",
        help="data-parallel ranks of the simulator (default: its own default, 1)",
    )
    sim.add_argument(
        "--sim-args",
        metavar="ARGS",
        help='more `batchbench sim` options as one string, e.g. "--speed 0 --fault-seed 3"',
    )
    add(
        "--config",
        metavar="FILE",
        help="read options from a TOML file (`name = value`, names as the long options "
        "without dashes, e.g. `max-active-agents = 8`); options given on the command line "
        "override it (a switch set true in the file stays on); relative paths are taken from "
        "the working directory. Runs that write --results-json or --results-csv write their "
        "resolved options beside them as <name>.config.toml, which --config reads back",
    )
    add("--version", action="version", version=version_text())
    return parser


def _parsed(parse):
    """An argparse type from a parser that raises UsageError."""

    def convert(text: str):
        try:
            return parse(text)
        except UsageError as exc:
            text = re.sub(r"^invalid --(slo|goodput|percentiles):? ", "", str(exc))
            raise argparse.ArgumentTypeError(text) from None

    convert.__name__ = parse.__name__
    return convert


def add_window_flags(group) -> None:
    """--slo, --goodput, --percentiles, the window, server metrics and the HTML report."""
    group.add_argument(
        "--slo",
        type=_parsed(parse_slo),
        default=(),
        metavar="OBJECTIVES",
        help="service-level objectives judged on the measured window, e.g. "
        "ttft_p99=2s,itl_p99=100ms,e2e_p95=30s (METRIC_pPERCENTILE=DURATION, METRIC one of "
        "ttft, itl, tpot, e2e; units required: us, ms, s, m) and goodput=95%% (the share of "
        "good requests). Each verdict is pass, fail or unresolved (the window was too short "
        "to tell, at 95%% confidence). ttft, itl and tpot need --stream",
    )
    group.add_argument(
        "--goodput",
        type=_parsed(parse_goodput),
        default=(),
        metavar="THRESHOLDS",
        help="per-request thresholds, e.g. ttft=2s,itl=100ms: a request is good when it meets "
        "all of them (itl: the request's mean gap between chunks). Reported as good requests/s, "
        "goodput ratio and trajectory goodput (trajectories whose every request was good, per "
        "minute). Default: the limits of the --slo latency objectives",
    )
    group.add_argument(
        "--percentiles",
        type=_parsed(parse_percentiles),
        default=DEFAULT_PERCENTILES,
        metavar="LIST",
        help="percentiles reported for TTFT, ITL, TPOT and latency in the JSON and CSV "
        "(default: 50,90,95,99,99.9)",
    )
    group.add_argument(
        "--warmup",
        type=non_negative_float,
        default=0.0,
        metavar="S",
        help="leave requests sent in the first S seconds out of the measured window (default: 0)",
    )
    group.add_argument(
        "--duration",
        type=positive_finite,
        metavar="S",
        help="stop admitting agents after S seconds; pending tool delays end and requests in "
        "flight finish (up to --request-timeout-secs). Not an interruption",
    )
    group.add_argument(
        "--window-trajectories",
        type=positive_uint,
        metavar="N",
        help="stop once N trajectories admitted after the warm-up have finished",
    )
    group.add_argument(
        "--server-metrics",
        metavar="URL",
        help="scrape this Prometheus text endpoint (vLLM, SGLang or llama.cpp /metrics; a URL "
        "without a path means /metrics) during the run: KV-cache use, running and waiting "
        "requests, prefix-cache hits, per rank; `sim` with --sim scrapes the simulator",
    )
    group.add_argument(
        "--server-metrics-interval",
        type=positive_finite,
        default=1.0,
        metavar="S",
        help="seconds between scrapes (default: %(default)s)",
    )
    group.add_argument(
        "--server-metrics-jsonl",
        metavar="PATH",
        help="write every scrape as one JSON line (time and samples)",
    )
    group.add_argument(
        "--report-html",
        metavar="PATH",
        help="write a self-contained HTML report with charts (needs the report extra: "
        "pip install 'batchbench[report]')",
    )


def worker_count(text: str) -> int:
    """--workers: a positive count, or auto (0: one per core but one)."""
    if text.strip().lower() == "auto":
        return 0
    value = uint(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f'"{text}" is not a positive integer or auto')
    return value


def start_time(text: str) -> float:
    """--start-at: ISO 8601 (a time without a zone is UTC) or Unix seconds."""
    try:
        value = float(text)
    except ValueError:
        try:
            moment = datetime.fromisoformat(text.strip().replace("z", "Z"))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f'"{text}" is not a time: give ISO 8601 (2026-12-04T15:00:00Z) or Unix seconds'
            ) from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        return moment.timestamp()
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f'"{text}" is not a time')
    return value


def add_scale_flags(group) -> None:
    """--workers, --shard, --start-at, --ramp-up."""
    group.add_argument(
        "--workers",
        type=worker_count,
        default=1,
        metavar="N",
        help="client processes on this machine, each with its own event loop driving a "
        "disjoint share of the trajectories and of the routing slots (worker i owns slots "
        "i, i+N, ...); one merged summary, CSV, JSON and events output. auto: one per core "
        "but one (default: 1)",
    )
    group.add_argument(
        "--shard",
        metavar="I/N",
        help="run shard I (0-based) of N: the trajectories and routing slots a single run "
        "would give that part, for runs split across machines. I may name an environment "
        "variable holding the index: JOB_COMPLETION_INDEX/N in a Kubernetes Indexed Job. "
        "Needs --results-json; `batchbench merge` joins the shards' results",
    )
    group.add_argument(
        "--start-at",
        type=start_time,
        metavar="TIME",
        help="prepare, then start the benchmark clock at TIME (ISO 8601 such as "
        "2026-12-04T15:00:00Z, or Unix seconds), so shards on different machines start "
        "together; a time already past starts at once, with a warning",
    )
    group.add_argument(
        "--ramp-up",
        type=non_negative_float,
        metavar="S",
        help="closed loop: start the first wave of agents evenly over S seconds (slot s at "
        "s/M of it) instead of all at once. Default: 0 up to 256 active agents, above that "
        "one second per 1,000 agents (10,000 agents start over 10 s)",
    )


def version_text() -> str:
    return f"batchbench {__version__} ({active_implementation()})"


def check_companions(args: argparse.Namespace) -> None:
    """Flags that need another flag, or exclude one: checked right after parsing."""
    check_flag_combinations(
        replay=args.agent_plans_jsonl is not None,
        replay_only=(
            ("--replay-initial-overhead-tokens", args.replay_initial_overhead_tokens),
            ("--replay-turn-overhead-tokens", args.replay_turn_overhead_tokens),
            ("--time-scale", args.time_scale),
        ),
        sim=args.sim,
        sim_only=(("--sim-dp-ranks", args.sim_dp_ranks), ("--sim-args", args.sim_args)),
        endpoint=args.endpoint,
        dry_run=args.dry_run,
        prompt_oracle=args.prompt_oracle,
        prompt_correction=args.prompt_correction,
        chat_template=args.chat_template,
        calibrate=args.calibrate,
        admission=args.admission,
        arrival_rate=args.arrival_rate,
        arrival_process=args.arrival_process,
        routing_pair=(args.dp_rank_perfect_routing, args.dp_rank_perfect_routing_num),
    )


def parse_agent_args(
    argv: Sequence[str], prog: str = "batchbench-agent"
) -> argparse.Namespace | None:
    """Parse (with the --config file's values as defaults) and run the parse-time checks;
    raises UsageError (exit 2). Returns None after ``--help`` or ``--version`` printed."""
    args = parse_with_config(build_parser(prog), argv)
    if args is not None:
        check_companions(args)
    return args


def parse_with_config(parser: argparse.ArgumentParser, argv: Sequence[str]):
    """Parse with the --config file's values as defaults; None after ``--help`` or
    ``--version`` printed (a usage error raises as the parser does)."""
    argv = list(argv)
    path = config_file_argument(argv)
    if path is not None and not {"-h", "--help", "--version"} & set(argv):
        parser.set_defaults(**toml_defaults(parser, path))
    try:
        return parser.parse_args(argv)
    except SystemExit as exc:
        if exc.code in (0, None):
            return None
        raise


def config_file_argument(argv: list[str]) -> str | None:
    """The value of --config (the last one), read before the real parse."""
    path = None
    for index, word in enumerate(argv):
        if word == "--":
            break
        if word == "--config":
            if index + 1 >= len(argv):
                raise UsageError("argument --config: expected one argument")
            path = argv[index + 1]
        elif word.startswith("--config="):
            path = word.split("=", 1)[1]
    return path


def toml_defaults(parser: argparse.ArgumentParser, path: str) -> dict[str, object]:
    """The file's options as parser defaults; every value goes through the option's own
    type check, so a file accepts exactly what the command line accepts."""
    try:
        with open(path, "rb") as handle:
            document = tomllib.load(handle)
    except OSError as exc:
        raise UsageError(f"--config {path}: {exc.strerror or exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"--config {path}: invalid TOML: {exc}") from None
    actions = parser._option_string_actions
    defaults: dict[str, object] = {}
    for name, value in document.items():
        action = actions.get(f"--{name}")
        if name in ("config", "help", "version"):
            raise UsageError(f'{path}: "{name}" cannot be set in an options file')
        if action is None:
            hint = suggestion(parser, f"unrecognized arguments: --{name}")
            hint = hint.split("(", 1)[1].rstrip(")") if "(" in hint else ""
            raise UsageError(f'{path}: unknown option "{name}"' + (f" ({hint})" if hint else ""))
        defaults[action.dest] = _toml_option(path, name, action, value)
    return defaults


def _toml_option(path: str, name: str, action: argparse.Action, value: object) -> object:
    if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction):
        if not isinstance(value, bool):
            raise UsageError(f"{path}: {name}: expected true or false")
        return value if isinstance(action, argparse._StoreTrueAction) else not value
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise UsageError(f"{path}: {name}: expected a string or a number")
    text = repr(value) if isinstance(value, float) else str(value)
    if action.type is None:
        converted: object = text
    else:
        assert not isinstance(action.type, str)  # these parsers name no registered types
        try:
            converted = action.type(text)
        except (argparse.ArgumentTypeError, ValueError) as exc:
            raise UsageError(f"{path}: {name}: {exc}") from None
    if action.choices is not None and converted not in action.choices:
        choices = ", ".join(map(str, action.choices))
        raise UsageError(f"{path}: {name}: invalid choice {text!r} (choose from {choices})")
    return converted


def config_from_argv(argv: Sequence[str], prog: str = "batchbench-agent") -> RunConfig | None:
    """The frozen run configuration of a command line; None after --help or --version."""
    args = parse_agent_args(argv, prog)
    if args is None:
        return None
    return config_from_namespace(args)


def config_from_namespace(args: argparse.Namespace) -> RunConfig:
    """The one place that reads argparse's namespace; checks the result."""
    shape_options = tuple(
        (option, getattr(args, dest))
        for dest, option in shape_option_names_by_dest().items()
        if getattr(args, dest) is not None
    )
    config = RunConfig(
        model=args.model,
        host=args.host,
        endpoint=args.endpoint,
        api_key=api_key_from(args.api_key, args.api_key_env),
        api_key_env=args.api_key_env,
        tokenizer_model=args.tokenizer_model,
        tokenizer_download=args.tokenizer_download,
        agent_plans_jsonl=args.agent_plans_jsonl,
        agents=args.agents,
        shape_options=shape_options,
        seed=args.seed,
        replay_initial_overhead_tokens=args.replay_initial_overhead_tokens,
        replay_turn_overhead_tokens=args.replay_turn_overhead_tokens,
        calibrate=args.calibrate,
        prompt_correction=args.prompt_correction,
        replay_reasoning=args.replay_reasoning,
        prompt_oracle=args.prompt_oracle,
        content_salt=args.content_salt,
        chat_template=args.chat_template,
        max_active_agents=args.max_active_agents,
        admission=args.admission,
        time_scale=args.time_scale,
        arrival_rate=args.arrival_rate,
        arrival_process=args.arrival_process,
        user_prefix=args.user_prefix,
        user_tagging=not args.disable_user_tagging,
        dp_ranks=args.dp_rank_perfect_routing_num if args.dp_rank_perfect_routing else None,
        stream=args.stream,
        request_timeout_secs=args.request_timeout_secs,
        max_response_bytes=args.max_response_bytes,
        max_retries=args.max_retries,
        retry_delay_ms=args.retry_delay_ms,
        max_retry_wait=args.max_retry_wait,
        max_failure_rate=args.max_failure_rate,
        sglang=args.sglang,
        ignore_eos=args.ignore_eos,
        verbose=args.verbose,
        dry_run=args.dry_run,
        grace_seconds=args.grace_seconds,
        preflight=not args.no_preflight,
        progress=not args.no_progress,
        results_csv=args.results_csv,
        results_json=args.results_json,
        agent_events_jsonl=args.agent_events_jsonl,
        request_events_jsonl=args.request_events_jsonl,
        sim=args.sim,
        sim_dp_ranks=args.sim_dp_ranks,
        sim_args=args.sim_args,
        slo=args.slo,
        goodput=args.goodput,
        percentiles=args.percentiles,
        warmup=args.warmup,
        duration=args.duration,
        window_trajectories=args.window_trajectories,
        server_metrics=args.server_metrics,
        server_metrics_interval=args.server_metrics_interval,
        server_metrics_jsonl=args.server_metrics_jsonl,
        report_html=args.report_html,
        workers=args.workers,
        shard=args.shard,
        start_at=args.start_at,
        ramp_up=args.ramp_up,
    )
    config.check()
    if config.shard is not None and config.results_json is None:
        raise UsageError(
            f"--shard {config.shard} needs --results-json: `batchbench merge` reads every "
            "shard's results JSON (and the raw data saved beside it)"
        )
    return config


def shape_option_names_by_dest() -> dict[str, str]:
    """Namespace destination of each sampled-shape option -> its main name (no dashes)."""
    names = {}
    for _label, dest, fixed_flags, lognorm_prefixes in SIZE_FAMILIES:
        names[f"{dest}_fixed"] = fixed_flags[0][2:]
        for kind in ("mu", "median", "sigma", "max"):
            names[f"{dest}_{kind}"] = f"{lognorm_prefixes[0][2:]}-{kind}"
    for dest in LATENCY_DESTS:
        names[dest] = dest.replace("_", "-")
    return names


def resolve_shape(args) -> SampledShape:
    """The sampled shape of a parsed command line."""
    return shape_from_options(
        {
            option: getattr(args, dest)
            for dest, option in shape_option_names_by_dest().items()
            if getattr(args, dest) is not None
        }
    )
