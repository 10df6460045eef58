"""The resolved configuration of one run: built once (from the command line, a TOML file or
Python), frozen, and read by every later stage. Changing a value means building a new one
with ``dataclasses.replace``.

Every field declares its command-line option(s) in its metadata (``option(...)``; see
``batchbench.options.declare`` for why there and not in a table): the parsers of
``batchbench-agent``, ``batchbench capacity`` and ``batchbench calibrate``, TOML options
files, ``RunConfig.options()`` and the resolved-options file all derive from it."""

from __future__ import annotations

import dataclasses
import inspect
import json
import math
import os
import re
import shlex
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar
from urllib.parse import urlsplit, urlunsplit

from batchbench.drive.failover import DEFAULT_RANK_FAILOVER, RANK_FAILOVER_POLICIES
from batchbench.drive.simlaunch import sim_command
from batchbench.drive.transport import DEFAULT_MAX_RESPONSE_BYTES, DEFAULT_WORKER_HEADER
from batchbench.drive.wire import DEFAULT_DP_RANK_HEADER, DP_RANK_HEADERS
from batchbench.errors import KeywordError, UsageError
from batchbench.options.agent import config_from_argv
from batchbench.options.checks import (
    check_api_key,
    check_flag_combinations,
    check_output_path,
    check_url,
)
from batchbench.options.declare import (
    Flag,
    Variant,
    closest,
    option,
    option_values,
    output_fields,
)
from batchbench.options.sections import (
    AGENT_ONLY,
    CALIBRATE_SIM,
    FIDELITY,
    HTTP,
    LIVE,
    OPTION_GROUPS,
    PROBES,
    REPLAY,
    ROUTING,
    SCALE,
    SIM,
    TARGET,
    WINDOW,
    WITH_CALIBRATE,
    Group,
)
from batchbench.options.shape import (
    SHAPE_FLAGS,
    SHAPE_KEYWORDS,
    in_flag_order,
    resolve_shape,
    shape_option_names,
)
from batchbench.options.simulator import check_sim_command
from batchbench.options.values import admission as admission_mode
from batchbench.options.values import (
    byte_size,
    failure_rate,
    from_usage_parser,
    header_name,
    is_header_name,
    non_negative_float,
    positive_finite,
    positive_uint,
    seconds,
    start_time,
    u64,
    uint,
    worker_count,
)
from batchbench.plan.arrivals import ARRIVAL_PROCESSES, DEFAULT_ARRIVAL_PROCESS, arrival_offsets
from batchbench.plan.limits import MAX_REQUEST_TOKENS
from batchbench.plan.manifest import check_manifest_opens
from batchbench.plan.workload import SampledShape
from batchbench.results.scrape import check_metrics_url
from batchbench.results.slo import (
    DEFAULT_PERCENTILES,
    STREAMED_METRICS,
    Objective,
    goodput_text,
    parse_goodput,
    parse_percentiles,
    parse_slo,
    percentile_label,
    slo_text,
)
from batchbench.scale.partition import parse_shard
from batchbench.secrets import remember

DEFAULT_ENDPOINT = "/v1/chat/completions"
SIM_DEFAULT_TOKENIZER = "deepseek-v3"


class ApiKey:
    """An API key whose ``repr`` and ``str`` never show it; ``reveal()`` is the only way out."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "ApiKey('<redacted>')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ApiKey) and other._value == self._value

    def __hash__(self) -> int:
        return hash(("ApiKey", self._value))


def host_ends_in_v1(host: str | None, endpoint: str) -> bool:
    """True for the OpenAI SDK's ``base_url`` habit: ``--host http://x:8000/v1`` with the
    default ``/v1/...`` endpoint path, which would otherwise become ``/v1/v1/...``."""
    return (
        host is not None
        and host.rstrip("/").endswith("/v1")
        and not endpoint.startswith(("http://", "https://"))
        and endpoint.lstrip("/").startswith("v1/")
    )


def check_base_url(host: str, endpoint: str) -> None:
    """Refuse a --host that carries an API path past ``/v1`` (``…/v1/chat``,
    ``…/v1/chat/completions``) when --endpoint is a ``/v1/...`` path: requests go to
    --host plus --endpoint, so such a host would double the path. A trailing ``/v1`` alone
    is the SDK's base_url, dropped (``host_ends_in_v1``)."""
    if not endpoint.lstrip("/").startswith("v1/"):
        return  # a custom path: the host's own path may be the gateway's
    path = urlsplit(host).path
    found = re.search(r"/v1/+[^/]", path)
    if found is None:
        return
    api = "/" + "/".join(part for part in path[found.start() :].split("/") if part)
    parts = urlsplit(host)
    base = urlunsplit((parts.scheme, parts.netloc, path[: found.start()], "", ""))
    raise UsageError(
        f"--host {host} carries the API path {api}: give the server's base URL "
        f"(e.g. --host {base}); requests go to --host plus --endpoint ({endpoint})"
    )


def resolve_endpoint(host: str, endpoint: str) -> str:
    """The request URL: an endpoint that is a full URL replaces the host; otherwise the host
    (https:// when it names no scheme, trailing slashes and a doubled /v1 dropped) joined
    with the path."""
    if endpoint.startswith(("http://", "https://")):
        url = endpoint
    else:
        if not host.startswith(("http://", "https://")):
            host = "https://" + host
        host = host.rstrip("/")
        if host_ends_in_v1(host, endpoint):
            host = host[: -len("/v1")]
        url = host + "/" + endpoint.lstrip("/")
    try:
        parts = urlsplit(url)
        valid = parts.scheme in ("http", "https") and bool(parts.hostname)
        _ = parts.port  # raises ValueError for a port that is not a number in range
    except ValueError:
        valid = False
    if not valid:
        raise UsageError(f"invalid endpoint URL: {url}")
    return url


def api_key_from(flag_value: str | None, env: str) -> ApiKey | None:
    """--api-key, else the variable named by --api-key-env; empty means none."""
    key = flag_value if flag_value is not None else os.environ.get(env)
    return ApiKey(key) if key else None


def _stream_value(stream: bool | None, no_stream: bool | None) -> bool:
    """Streaming from --stream (a no-op: the default) and --no-stream; an options file's
    ``stream = false`` (as files written before streaming became the default say) turns
    it off too."""
    if stream and no_stream:
        raise UsageError("--stream and --no-stream contradict each other: give one of them")
    return not no_stream and stream is not False


def _calibrate_value(calibrate: bool | None, no_calibrate: bool | None) -> bool | None:
    """None (the default: calibrate a live run, a failure is one note), True (--calibrate:
    a failure fails the run) or False (--no-calibrate)."""
    if calibrate and no_calibrate:
        raise UsageError("--calibrate and --no-calibrate contradict each other: give one of them")
    if no_calibrate:
        return False
    return True if calibrate else None


# Configurations that passed every check, by identity (a weak map: a configuration held
# nowhere else is forgotten, so a reused id never stands for another one).
_FULLY_CHECKED: weakref.WeakValueDictionary[int, RunConfig] = weakref.WeakValueDictionary()


@dataclass(frozen=True, slots=True, kw_only=True, weakref_slot=True)
class RunConfig:
    """Everything one run needs, resolved. Field names follow the command-line options
    (``max_active_agents`` is ``--max-active-agents``); None means "not given" where the
    reports must show that. ``RunConfig.from_args`` builds one from ``batchbench-agent``
    arguments; ``batchbench.run(config)`` runs it.

    The 25 sampled-shape options are one field, ``shape_options`` ((name, value) pairs, kept
    in command-line order), and are also taken as keywords by their Python names:
    ``RunConfig(agents=20, tool_invocations=3, input_tokens=512)`` is
    ``RunConfig(agents=20, shape_options=(("input-tokens", 512), ("tool-invocations", 3)))``
    (see ``_init`` below). A keyword it does not take raises KeywordError, a TypeError
    whose one line names the keyword probably meant.

    Each field is also the declaration of its command-line option(s) (see
    ``batchbench.options.declare``): the parsers, the options file and ``options()`` are
    derived from these fields."""

    OPTION_GROUPS: ClassVar[tuple[Group, ...]] = OPTION_GROUPS

    # target
    model: str | None = option(
        None,  # None: the one model the server lists (live runs)
        Flag(
            "model",
            "model name sent in each body (default: the model the server lists at "
            "GET /v1/models, when it lists exactly one)",
            TARGET,
            commands=WITH_CALIBRATE,
        ),
    )
    tokenizer_model: str | None = option(
        None,  # None: the model name (with sim, deepseek-v3)
        Flag(
            "tokenizer-model",
            "tokenizer for synthetic text: a tokenizer.json file, a directory containing one, "
            "a built-in name (deepseek-v3; see `batchbench tokenizers`) or a hub id "
            "(default: the --model value)",
            TARGET,
            commands=WITH_CALIBRATE,
        ),
    )
    tokenizer_download: bool = option(
        False,  # may fetch a hub id (otherwise offline only)
        Flag(
            "tokenizer-download",
            "allow --tokenizer-model to name a Hugging Face hub id and download it "
            "(otherwise only local files and built-in names are used, and nothing is fetched)",
            TARGET,
            switch=True,
            commands=WITH_CALIBRATE,
        ),
    )
    host: str | None = option(
        None,  # the server's base URL; None only for --sim and dry runs
        Flag(
            "host",
            "base URL of the OpenAI-compatible server, http:// or https:// (e.g. "
            "http://127.0.0.1:8000; a trailing /v1 as in the OpenAI SDK's base_url is fine); "
            "required unless --sim or --dry-run",
            TARGET,
            commands=WITH_CALIBRATE,
        ),
    )
    endpoint: str = option(
        DEFAULT_ENDPOINT,
        Flag(
            "endpoint",
            "path appended to --host, or a full URL that replaces it (default: %(default)s)",
            TARGET,
            commands=WITH_CALIBRATE,
        ),
    )
    api_key: ApiKey | None = option(  # noqa: RUF009 - option() is a field specifier
        None,
        Flag(
            "api-key",
            "API key (takes precedence over --api-key-env); never printed",
            TARGET,
            commands=WITH_CALIBRATE,
        ),
        read=lambda args: api_key_from(args.api_key, args.api_key_env),
        write=lambda _key: {},  # never written
    )
    api_key_env: str = option(
        "OPENAI_API_KEY",  # where the key came from; the key is never written
        Flag(
            "api-key-env",
            "environment variable holding the API key (default: %(default)s)",
            TARGET,
            commands=WITH_CALIBRATE,
        ),
    )
    # workload: a manifest, or sampled agents of a shape
    agent_plans_jsonl: str | None = option(
        None,
        Flag(
            "agent-plans-jsonl",
            "trajectory manifest (JSONL, schema 1 or 2, see docs/manifest.md) to replay; "
            "`batchbench validate PATH` checks one without running it",
            REPLAY,
            metavar="PATH",
        ),
    )
    agents: int | None = option(
        None,
        Flag(
            "agents",
            "number of sampled agents (default: 1; not with a manifest)",
            REPLAY,
            parse=uint,
        ),
    )
    shape_options: tuple[tuple[str, float | int], ...] = option(
        (),  # the given shape options by name
        *SHAPE_FLAGS,
        read=lambda args: tuple(
            (flag.name, getattr(args, flag.dest))
            for flag in SHAPE_FLAGS
            if getattr(args, flag.dest) is not None
        ),
        write=dict,
    )
    seed: int | None = option(
        None,
        Flag("seed", "root seed for sampling and text (default: random)", HTTP, parse=u64),
    )
    # prompt sizing and fidelity
    replay_initial_overhead_tokens: int | None = option(
        None,
        Flag(
            "replay-initial-overhead-tokens",
            "prompt tokens taken by template/framing on a first or reset request (default: 0)",
            REPLAY,
            parse=uint,
            metavar="N",
        ),
    )
    replay_turn_overhead_tokens: int | None = option(
        None,
        Flag(
            "replay-turn-overhead-tokens",
            "extra framing tokens per appended turn; they accumulate (default: 0)",
            REPLAY,
            parse=uint,
            metavar="N",
        ),
    )
    calibrate: bool | None = option(
        None,  # None: calibrate a live run, a failure is a note; True: asked, a failure fails
        Flag(
            "calibrate",
            "before the run, measure the server's initial and per-turn framing overhead "
            "with probe requests (as `batchbench calibrate` does) and use them: the default "
            "for a live run, where a server that cannot be calibrated costs one note; given, "
            "a failed calibration fails the run; explicit --replay-*-overhead-tokens flags "
            "still win",
            FIDELITY,
            switch=True,
        ),
        Flag(
            "no-calibrate",
            "send no calibration probes: the run starts from --replay-*-overhead-tokens (or "
            "0) and learns the framing from usage.prompt_tokens as it goes",
            FIDELITY,
            switch=True,
        ),
        read=lambda args: _calibrate_value(args.calibrate, args.no_calibrate),
        write=lambda value: {
            "calibrate": True if value else None,
            "no-calibrate": True if value is False else None,
        },
    )
    prompt_correction: bool = option(
        True,
        Flag(
            "no-prompt-correction",
            "send the plan's sizes unchanged: no reply accounting and no correction from "
            "usage.prompt_tokens (for comparison; the fidelity lines still measure the drift)",
            FIDELITY,
            switch=True,
            negates=True,
        ),
    )
    replay_reasoning: str = option(
        "keep",  # "keep": the reply's reasoning_content is sent back
        Flag(
            "replay-reasoning",
            "keep: a reply's reasoning (reasoning_content, or reasoning as vLLM 0.17 and "
            "later name it) is sent back with it in the next request under the same name, as "
            "agents that keep their thinking do, and counted as the server's template renders "
            "it (many templates render it only after the last user message, some never); "
            "drop: it is left out of the history, as OpenAI-style clients do "
            "(default: %(default)s)",
            FIDELITY,
            choices=("keep", "drop"),
        ),
    )
    prompt_oracle: str = option(
        "none",
        Flag(
            "prompt-oracle",
            "server: before sending each request, ask the server to count it through its "
            "own chat template (vLLM POST /tokenize with messages, or llama.cpp "
            "/apply-template + /tokenize) and resize its new content to the exact target "
            "(default: %(default)s)",
            FIDELITY,
            choices=("none", "server"),
        ),
    )
    content_salt: str | None = option(
        None,  # None: a random salt per run
        Flag(
            "content-salt",
            "salt of every trajectory's private text: equal manifest, seed, salt and "
            "tokenizer give byte-identical requests, and a new salt changes the text but no "
            "token count, so a warm server cannot serve this run from an earlier run's cache "
            "(default: random, shown in the banner)",
            FIDELITY,
            metavar="S",
        ),
    )
    chat_template: str | None = option(
        None,
        Flag(
            "chat-template",
            "the chat template the server renders with, used to count the model's replies "
            "as the next prompt will render them: chatml, gemma, llama3, qwen3 (the "
            "simulator's built-ins), `tokenizer` (the chat_template.jinja or "
            "tokenizer_config.json beside the tokenizer file), or a .jinja file (default: the "
            "template beside the tokenizer when there is one; with --sim, the simulator's: a "
            "built-in name or tokenizer given here is passed on to it)",
            FIDELITY,
            metavar="TEMPLATE",
            commands=WITH_CALIBRATE,
            variants=(("calibrate", Variant(group=PROBES)),),
        ),
    )
    # admission
    max_active_agents: int | None = option(
        None,
        Flag(
            "max-active-agents",
            "concurrent agents; closed loop refills freed slots in FIFO order, open loop "
            "delays an arrival until one is free (default: all). --concurrency is the same "
            "option (the name other benchmarks use)",
            REPLAY,
            parse=positive_uint,
            metavar="N",
            aliases=("--concurrency",),
            commands=AGENT_ONLY,  # a capacity search sets it per step
        ),
    )
    admission: str | None = option(
        None,  # None: open-loop with an arrival rate, else closed-loop
        Flag(
            "admission",
            "closed-loop runs up to --max-active-agents at once and starts the next agent "
            "when one finishes; open-loop starts each agent at its own time (a manifest's "
            "start_after_ms, or --arrival-rate) however the server keeps up "
            "(default: closed-loop; open-loop with --arrival-rate)",
            REPLAY,
            parse=admission_mode,
            metavar="{closed-loop,open-loop}",
        ),
    )
    time_scale: float | None = option(
        None,  # None: 1
        Flag(
            "time-scale",
            "divide every start_after_ms and delay_after_ms by F (default: 1)",
            REPLAY,
            parse=positive_finite,
            metavar="F",
        ),
    )
    arrival_rate: float | None = option(
        None,  # agents per second, open loop; None: no arrivals
        Flag(
            "arrival-rate",
            "agents arrive at R per second on average, and each starts when it arrives, "
            "not when another finishes (open-loop admission, implied; --max-active-agents "
            "still caps how many run, and an arrival beyond it waits and counts as late); "
            "with --agents N, or a manifest whose trajectories set no start_after_ms "
            "(default: none)",
            REPLAY,
            parse=positive_finite,
            metavar="R",
        ),
    )
    arrival_process: str | None = option(
        None,  # poisson or constant; None: poisson
        Flag(
            "arrival-process",
            "how arrivals are spaced: poisson, independent arrivals with exponential gaps "
            "(bursts and lulls, as real users make; drawn from --seed), or constant, exactly "
            "1/R seconds apart (default: poisson)",
            REPLAY,
            choices=ARRIVAL_PROCESSES,
        ),
    )
    # routing and identity
    user_prefix: str | None = option(
        None,
        Flag("user-prefix", "user tag <prefix>-<agent_id> instead of a UUIDv4", ROUTING),
    )
    user_tagging: bool = option(
        True,
        Flag(
            "disable-user-tagging",
            "send no user field and no routing key",
            ROUTING,
            switch=True,
            negates=True,
            commands=WITH_CALIBRATE,
            variants=(
                ("calibrate", Variant(help="send no user field in the probes", group=PROBES)),
            ),
        ),
    )
    dp_ranks: int | None = option(
        None,  # perfect routing over this many ranks
        Flag(
            "dp-rank-perfect-routing",
            "send X-SMG-Target-Worker = routing slot %% ranks",
            ROUTING,
            switch=True,
        ),
        Flag(
            "dp-rank-perfect-routing-num",
            "number of DP ranks",
            ROUTING,
            parse=positive_uint,
            metavar="N",
        ),
        read=lambda args: (
            args.dp_rank_perfect_routing_num if args.dp_rank_perfect_routing else None
        ),
        write=lambda ranks: {
            "dp-rank-perfect-routing": ranks is not None,
            "dp-rank-perfect-routing-num": ranks,
        },
    )
    dp_rank_header: str = option(
        DEFAULT_DP_RANK_HEADER,
        Flag(
            "dp-rank-header",
            "the header naming each request's rank under --dp-rank-perfect-routing: smg, "
            "X-SMG-Target-Worker (smg's gateway: the i-th worker in registration order, "
            "honoured by its consistent_hashing policy, not by its default cache_aware); "
            "vllm, X-data-parallel-rank (vLLM's and SGLang's own data parallelism); both "
            "(default: %(default)s)",
            ROUTING,
            choices=tuple(DP_RANK_HEADERS),
        ),
    )
    rank_failover: str = option(
        DEFAULT_RANK_FAILOVER,
        Flag(
            "rank-failover",
            "what the agents of a DP rank do once the gateway answers one of its requests "
            "that no worker is available (smg's no_available_workers or "
            "call_upstream_connection_failed): none, they fail as their requests do; "
            "rehash, each continues on the next live rank, its failed request sent again "
            "there, carrying its routing key (and X-data-parallel-rank) but no "
            "X-SMG-Target-Worker. Either way the summary names the down ranks and the "
            "failed agents per rank (default: %(default)s)",
            ROUTING,
            choices=RANK_FAILOVER_POLICIES,
        ),
    )
    routed_worker_header: str = option(
        DEFAULT_WORKER_HEADER,
        Flag(
            "routed-worker-header",
            "the response header that names the worker which served a request (smg's "
            "gateway sends x-smg-routed-worker-id); each request event records it, and the "
            "per-rank table counts, per rank, the workers its requests reached, misplaced "
            "requests and agents that switched workers (default: %(default)s)",
            ROUTING,
            parse=header_name,
            metavar="NAME",
        ),
    )
    # HTTP
    stream: bool = option(
        True,
        Flag(
            "stream",
            "stream every reply (SSE with stream_options.include_usage) and report TTFT, "
            "inter-token latency and time per output token: the default (this flag only "
            "confirms it)",
            LIVE,
            switch=True,
            commands=WITH_CALIBRATE,
            variants=(
                ("calibrate", Variant(help="stream the probe replies (the default)", group=PROBES)),
            ),
        ),
        Flag(
            "no-stream",
            "do not stream: plain JSON replies, as the Rust batchbench-agent's request bodies "
            "(no TTFT, inter-token latency or time per output token)",
            LIVE,
            switch=True,
            negates=True,
            commands=WITH_CALIBRATE,
            variants=(
                ("calibrate", Variant(help="do not stream the probe replies", group=PROBES)),
            ),
        ),
        read=lambda args: _stream_value(args.stream, args.no_stream),
        write=lambda value: {"no-stream": not value},
    )
    request_timeout_secs: float = option(
        60,  # an int when whole (options files say 60, not 60.0)
        Flag(
            "request-timeout-secs",
            "timeout of one whole attempt, in seconds (fractions allowed: 0.5) "
            "(default: %(default)s)",
            HTTP,
            parse=seconds,
            metavar="S",
            commands=WITH_CALIBRATE,
            variants=(
                (
                    "calibrate",
                    Variant(
                        help="timeout of one probe request (default: %(default)s)",
                        parse=positive_finite,
                        group=PROBES,
                    ),
                ),
            ),
        ),
    )
    max_response_bytes: int = option(
        DEFAULT_MAX_RESPONSE_BYTES,  # decoded bytes one response may hold
        Flag(
            "max-response-bytes",
            "the most one response may hold once decoded (a body, its gzip/deflate output, "
            "a stream, one SSE line): a larger one fails as response_too_large, so no server "
            "can exhaust the client's memory; bytes, or with KiB, MiB, GiB (default: 64MiB)",
            HTTP,
            parse=byte_size,
            metavar="N",
        ),
    )
    max_retries: int = option(
        2,
        Flag(
            "max-retries",
            "retries after the first attempt (default: %(default)s)",
            HTTP,
            parse=uint,
            metavar="N",
        ),
    )
    retry_delay_ms: int = option(
        250,
        Flag(
            "retry-delay-ms",
            "base of the exponential backoff; 0 = no delay (default: %(default)s)",
            HTTP,
            parse=uint,
            metavar="MS",
        ),
    )
    max_retry_wait: float = option(
        300.0,  # seconds: the longest wait before a retry (Retry-After)
        Flag(
            "max-retry-wait",
            "longest wait before a retry, in seconds: a server's Retry-After is honoured "
            "as sent up to this, and a capped wait is reported (default: %(default)g)",
            HTTP,
            parse=non_negative_float,
            metavar="S",
        ),
    )
    max_failure_rate: float = option(
        0.0,  # failed / sent requests allowed before exit status 3
        Flag(
            "max-failure-rate",
            "share of sent requests that may fail (0..1, or a percentage such as 2%%) "
            "before the run exits with status 3 (default: 0: any failure)",
            HTTP,
            parse=failure_rate,
            metavar="F",
        ),
    )
    sglang: bool = option(
        False,
        Flag(
            "sglang",
            "send max_new_tokens/min_new_tokens",
            HTTP,
            switch=True,
            commands=WITH_CALIBRATE,
            variants=(("calibrate", Variant(group=PROBES)),),
        ),
    )
    ignore_eos: bool = option(
        False,
        Flag(
            "ignore-eos",
            'add "ignore_eos": true to every body',
            HTTP,
            switch=True,
            commands=WITH_CALIBRATE,
            variants=(("calibrate", Variant(help='add "ignore_eos": true', group=PROBES)),),
        ),
    )
    verbose: bool = option(
        False,
        Flag(
            "verbose",
            "print truncated request/response JSON per attempt",
            HTTP,
            switch=True,
            aliases=("-v",),
        ),
    )
    # run and outputs
    dry_run: bool = option(
        False,
        Flag(
            "dry-run",
            "build plans, generate all text, run admission; send nothing",
            HTTP,
            switch=True,
            commands=AGENT_ONLY,  # a capacity search needs a live server
        ),
    )
    grace_seconds: float = option(
        5.0,
        Flag(
            "grace-seconds",
            "after Ctrl+C or SIGTERM, how long requests in flight may finish before they "
            "are cancelled (default: %(default)s)",
            LIVE,
            parse=non_negative_float,
            metavar="S",
        ),
    )
    preflight: bool = option(
        True,  # check the target (GET /v1/models) before anything starts
        Flag(
            "no-preflight",
            "skip the check before the run (GET /v1/models, then a 1-token completion) "
            "that turns an unreachable or wrong target (host, path, model, key) into one clear "
            "error within seconds",
            LIVE,
            switch=True,
            negates=True,
        ),
    )
    progress: bool = option(
        False,  # a progress bar on stderr when it is a terminal
        Flag(
            "no-progress",
            "no progress bar (it is only ever drawn when stderr is a terminal)",
            LIVE,
            switch=True,
            negates=True,
        ),
    )
    results_csv: str | None = option(
        None,
        Flag(
            "results-csv",
            "write a one-row CSV summary",
            HTTP,
            metavar="PATH",
            commands=AGENT_ONLY,
            output=True,
        ),
    )
    results_json: str | None = option(
        None,
        Flag(
            "results-json",
            "write the whole summary (metrics, configuration, manifest SHA-256) as JSON",
            LIVE,
            metavar="PATH",
            commands=AGENT_ONLY,
            output=True,
        ),
    )
    agent_events_jsonl: str | None = option(
        None,
        Flag(
            "agent-events-jsonl",
            "write one lifecycle record per trajectory",
            HTTP,
            metavar="PATH",
            commands=AGENT_ONLY,
            output=True,
        ),
    )
    request_events_jsonl: str | None = option(
        None,
        Flag(
            "request-events-jsonl",
            "write one JSON line per request (tokens, latency, TTFT, attempts, status)",
            LIVE,
            metavar="PATH",
            commands=AGENT_ONLY,
            output=True,
        ),
    )
    # embedded simulator
    sim: bool = option(
        False,
        Flag(
            "sim",
            "start `batchbench sim` on a free loopback port, run against it, then stop it; "
            "--host is ignored, and the tokenizer defaults to deepseek-v3",
            SIM,
            switch=True,
            commands=WITH_CALIBRATE,
            variants=(
                (
                    "calibrate",
                    Variant(
                        help="calibrate against a `batchbench sim` started here",
                        group=CALIBRATE_SIM,
                    ),
                ),
            ),
        ),
    )
    sim_dp_ranks: int | None = option(
        None,
        Flag(
            "sim-dp-ranks",
            "data-parallel ranks of the simulator (default: its own default, 1)",
            SIM,
            parse=positive_uint,
            metavar="N",
        ),
    )
    sim_args: str | None = option(
        None,
        Flag(
            "sim-args",
            'more `batchbench sim` options as one string, e.g. "--speed 0 --fault-seed 3"',
            SIM,
            metavar="ARGS",
            commands=WITH_CALIBRATE,
            variants=(
                ("calibrate", Variant(help="more `batchbench sim` options", group=CALIBRATE_SIM)),
            ),
        ),
    )
    # measured window, objectives, server metrics and the report (strings parse as the
    # command line spells them: slo="ttft_p99=2s", goodput="ttft=2s", percentiles="50,99")
    slo: tuple[Objective, ...] = option(
        (),
        Flag(
            "slo",
            "service-level objectives judged on the measured window, e.g. "
            "ttft_p99=2s,itl_p99=100ms,e2e_p95=30s (METRIC_pPERCENTILE=DURATION, METRIC one of "
            "ttft, itl, tpot, e2e; units required: us, ms, s, m), output_speed_p10>=30 (a floor "
            "in output tokens/s on a low percentile of per-request output speed) and "
            "goodput=95%% (the share of good requests). Each verdict is pass, fail or "
            "unresolved (the window was too short to tell, at 95%% confidence). ttft, itl, "
            "tpot and output_speed need streamed replies (not --no-stream)",
            WINDOW,
            parse=from_usage_parser(parse_slo, "slo"),
            metavar="OBJECTIVES",
        ),
        write=lambda objectives: {"slo": slo_text(objectives) or None},
    )
    goodput: tuple[tuple[str, float], ...] = option(
        (),  # (metric, limit ms)
        Flag(
            "goodput",
            "per-request thresholds, e.g. ttft=2s,itl=100ms,output_speed=30: a request is good "
            "when it meets all of them (itl: the request's mean gap between chunks; "
            "output_speed: at least this many output tokens/s). Reported as good "
            "requests/s, goodput ratio and trajectory goodput (trajectories whose every "
            "request was good, per minute). Default: the limits of the --slo latency "
            "and output-speed objectives",
            WINDOW,
            parse=from_usage_parser(parse_goodput, "goodput"),
            metavar="THRESHOLDS",
        ),
        write=lambda thresholds: {"goodput": goodput_text(thresholds) or None},
    )
    percentiles: tuple[float, ...] = option(
        DEFAULT_PERCENTILES,
        Flag(
            "percentiles",
            "percentiles reported for TTFT, ITL, TPOT and latency in the JSON and CSV "
            "(default: 50,90,95,99,99.9)",
            WINDOW,
            parse=from_usage_parser(parse_percentiles, "percentiles"),
            metavar="LIST",
        ),
        write=lambda chosen: {"percentiles": ",".join(percentile_label(p)[1:] for p in chosen)},
    )
    warmup: float = option(
        0.0,  # seconds: requests sent earlier are left out of the window
        Flag(
            "warmup",
            "leave requests sent in the first S seconds out of the measured window (default: 0)",
            WINDOW,
            parse=non_negative_float,
            metavar="S",
            commands=AGENT_ONLY,  # a capacity search declares its own (per step, default 5)
        ),
    )
    duration: float | None = option(
        None,  # seconds: stop admitting then; requests in flight finish
        Flag(
            "duration",
            "stop admitting agents after S seconds; pending tool delays end and requests in "
            "flight finish (up to --request-timeout-secs). Not an interruption",
            WINDOW,
            parse=positive_finite,
            metavar="S",
            commands=AGENT_ONLY,  # each step of a search runs --warmup plus --window
        ),
    )
    window_trajectories: int | None = option(
        None,  # stop once this many admitted after warm-up end
        Flag(
            "window-trajectories",
            "stop once N trajectories admitted after the warm-up have finished",
            WINDOW,
            parse=positive_uint,
            metavar="N",
            commands=AGENT_ONLY,  # a capacity search declares its own (per step)
        ),
    )
    server_metrics: tuple[str, ...] = option(
        (),  # the Prometheus text endpoints scraped during the run, in the order given
        Flag(
            "server-metrics",
            "scrape this Prometheus text endpoint (vLLM, SGLang, llama.cpp or smg /metrics; "
            "a URL without a path means /metrics) during the run: KV-cache use, running and "
            "waiting requests, prefix-cache hits, per rank; smg's requests per worker and "
            "policy branches; repeat it for each engine and the gateway (each summarized "
            "on its own, labelled by URL); `sim` with --sim scrapes the simulator",
            WINDOW,
            metavar="URL",
            repeat=True,
        ),
    )
    server_metrics_interval: float = option(
        1.0,
        Flag(
            "server-metrics-interval",
            "seconds between scrapes (default: %(default)s)",
            WINDOW,
            parse=positive_finite,
            metavar="S",
        ),
    )
    server_metrics_jsonl: str | None = option(
        None,
        Flag(
            "server-metrics-jsonl",
            "write every scrape as one JSON line (time and samples)",
            WINDOW,
            metavar="PATH",
            commands=AGENT_ONLY,  # each step's results JSON holds its server metrics
            output=True,
        ),
    )
    report_html: str | None = option(
        None,
        Flag(
            "report-html",
            "write a self-contained HTML report with charts (needs the report extra: "
            "pip install 'batchbench[report]')",
            WINDOW,
            metavar="PATH",
            output=True,
        ),
    )
    # scale-out (docs/scale-out.md)
    workers: int = option(
        1,  # processes on this machine; 0: auto (cores - 1)
        Flag(
            "workers",
            "client processes on this machine, each with its own event loop driving a "
            "disjoint share of the trajectories and of the routing slots (worker i owns slots "
            "i, i+N, ...); one merged summary, CSV, JSON and events output. auto: one per "
            "core but one (default: 1)",
            SCALE,
            parse=worker_count,
            metavar="N",
        ),
        write=lambda count: {"workers": "auto" if count == 0 else count},
    )
    shard: str | None = option(
        None,  # "I/N" as given (I may name an environment variable)
        Flag(
            "shard",
            "run shard I (0-based) of N: the trajectories and routing slots a single run "
            "would give that part, for runs split across machines. I may name an environment "
            "variable holding the index: JOB_COMPLETION_INDEX/N in a Kubernetes Indexed Job. "
            "Needs --results-json; `batchbench merge` joins the shards' results",
            SCALE,
            metavar="I/N",
            commands=AGENT_ONLY,  # needs --results-json, which a capacity search refuses
        ),
    )
    start_at: float | None = option(
        None,  # Unix time every shard starts its clock at
        Flag(
            "start-at",
            "prepare, then start the benchmark clock at TIME (ISO 8601 such as "
            "2026-12-04T15:00:00Z, or Unix seconds), so shards on different machines start "
            "together; a time already past starts at once, with a warning",
            SCALE,
            parse=start_time,
            metavar="TIME",
            commands=AGENT_ONLY,  # for shards; a search's steps start one after another
        ),
    )
    ramp_up: float | None = option(
        None,  # seconds over which closed-loop agents start; None: default
        Flag(
            "ramp-up",
            "closed loop: start the first wave of agents evenly over S seconds (slot s at "
            "s/M of it) instead of all at once. Default: 0 up to 256 active agents, above that "
            "one second per 1,000 agents (10,000 agents start over 10 s)",
            SCALE,
            parse=non_negative_float,
            metavar="S",
        ),
    )

    # Not an option: a calibration already made for this run (a --workers parent's, or a
    # capacity search's before its first step), or the note of one that failed there (a
    # str); the run then sends no probes of its own.
    preset_calibration: Any = dataclasses.field(default=None, repr=False, compare=False)

    # -- derived values ---------------------------------------------------------------
    @property
    def calibrates(self) -> bool:
        """Whether the run probes the server's framing before it starts: a live run does
        unless --no-calibrate, both --replay-*-overhead-tokens flags (which win anyway),
        --prompt-oracle server (the server counts every prompt) or a preset calibration;
        --calibrate asks for it whatever the flags say."""
        if self.calibrate is False or self.dry_run or self.preset_calibration is not None:
            return False
        if self.calibrate:
            return True
        both = (
            self.replay_initial_overhead_tokens is not None
            and self.replay_turn_overhead_tokens is not None
        )
        return not both and self.prompt_oracle != "server"

    @property
    def endpoint_url(self) -> str | None:
        """The request URL; None without a target (a dry run without --host)."""
        if self.host is None and not self.endpoint.startswith(("http://", "https://")):
            return None
        return resolve_endpoint(self.host or "", self.endpoint)

    @property
    def replay(self) -> bool:
        return self.agent_plans_jsonl is not None

    @property
    def workload_mode(self) -> str:
        return "trajectory_replay" if self.replay else "synthetic"

    @property
    def tokenizer(self) -> str | None:
        """The tokenizer to load: --tokenizer-model, else the simulator's or the model's."""
        if self.tokenizer_model:
            return self.tokenizer_model
        return SIM_DEFAULT_TOKENIZER if self.sim else self.model

    @property
    def shape(self) -> SampledShape:
        """The sampled shape the shape options describe (defaults for the others)."""
        return resolve_shape(dict(self.shape_options))

    @property
    def admission_mode(self) -> str:
        """--admission, else open-loop when agents arrive at a rate, else closed-loop."""
        if self.admission is not None:
            return self.admission
        return "open-loop" if self.arrival_rate is not None else "closed-loop"

    @property
    def arrival_process_name(self) -> str:
        """--arrival-process, or its default, poisson."""
        return self.arrival_process or DEFAULT_ARRIVAL_PROCESS

    @property
    def time_scale_factor(self) -> float:
        return self.time_scale or 1.0

    def arrival_offsets(self, count: int, seed: int) -> list[float]:
        """Start offsets in seconds of ``count`` agents arriving at ``arrival_rate`` by the
        arrival process, drawn from ``seed`` (the run's root seed) as
        ``batchbench.plan.arrivals.arrival_offsets`` does; ValueError without a rate."""
        if self.arrival_rate is None:
            raise ValueError("no arrival rate: the start times come from elsewhere")
        return arrival_offsets(count, self.arrival_rate, self.arrival_process_name, seed).tolist()

    def option(self, name: str) -> float | int | None:
        """A sampled-shape option's value by its main name, None when not given."""
        return dict(self.shape_options).get(name)

    # -- building ---------------------------------------------------------------------
    @classmethod
    def from_args(cls, argv: Sequence[str]) -> RunConfig:
        """A config from ``batchbench-agent`` arguments (``--config run.toml`` included);
        raises UsageError with the command line's message. ``--help`` prints and exits."""
        config = config_from_argv(cls, argv)
        if config is None:
            raise SystemExit(0)
        return config

    def __post_init__(self) -> None:
        pairs = self.shape_options
        if isinstance(pairs, tuple | list) and all(_is_pair(pair) for pair in pairs):
            # command-line order: equal options make equal configs, however they were given
            object.__setattr__(
                self, "shape_options", in_flag_order(tuple((n, v) for n, v in pairs))
            )
        if isinstance(self.api_key, str):  # a plain string from Python: hide it at once
            object.__setattr__(self, "api_key", ApiKey(self.api_key) if self.api_key else None)
        parsers = (("slo", parse_slo), ("goodput", parse_goodput))
        for name, parse in (*parsers, ("percentiles", parse_percentiles)):
            value = getattr(self, name)
            if isinstance(value, str):
                object.__setattr__(self, name, parse(value) if value else ())

    @property
    def goodput_thresholds(self) -> tuple[tuple[str, float], ...]:
        """What makes a request good: --goodput, else the bounds of the latency and speed
        objectives of --slo (per metric, the limit of its highest percentile, or the floor
        of a speed's lowest percentile)."""
        if self.goodput:
            return self.goodput
        chosen: dict[str, Objective] = {}
        for objective in self.slo:
            if objective.at_least:
                if objective.minimum is None:
                    continue
                best = chosen.get(objective.metric)
                if best is None or objective.quantile < best.quantile:
                    chosen[objective.metric] = objective
                continue
            if objective.metric == "goodput" or objective.limit_ms is None:
                continue
            best = chosen.get(objective.metric)
            if best is None or objective.quantile > best.quantile:
                chosen[objective.metric] = objective
        return tuple(
            (m, o.minimum if o.at_least else o.limit_ms)  # type: ignore[misc]
            for m, o in chosen.items()
            if (o.minimum if o.at_least else o.limit_ms) is not None
        )

    def resolved_api_key(self) -> str | None:
        """The key to send: ``api_key``, else the variable named by ``api_key_env``."""
        key = self.api_key.reveal() if self.api_key is not None else None
        key = key or os.environ.get(self.api_key_env) or None
        remember(key)  # a server that echoes it cannot make the run print it
        return key

    def check(self, *, combinations: bool = True) -> None:
        """The checks a command line gets after parsing, in the same order and words, for
        configs built in Python too; raises UsageError (ManifestError for a manifest that
        cannot be opened). ``combinations=False``: the options that need or exclude another
        were checked already (a command line checks them right after parsing)."""
        self._check_values()
        if self.replay and self.agents is not None:
            raise UsageError(
                "--agents cannot be combined with --agent-plans-jsonl; "
                "the manifest defines the total agent count"
            )
        if self.replay and self.shape_options:
            raise UsageError(
                "synthetic workload-shape flags cannot be combined with --agent-plans-jsonl"
            )
        if self.agent_plans_jsonl is not None:
            check_manifest_opens(self.agent_plans_jsonl)  # its error before the rest
        if self.agents == 0:
            raise UsageError("agents must be greater than zero")
        if self.request_timeout_secs == 0:
            raise UsageError("request-timeout-secs must be greater than zero")
        _ = self.shape  # its errors name the family and the missing or bad option
        if self.model is not None and not self.model:
            raise UsageError("model must not be empty")
        if self.dry_run and self.tokenizer is None:
            raise UsageError(
                "a dry run needs --tokenizer-model (or --model, whose name it defaults to)"
            )
        if combinations:
            self.check_combinations()
        self._check_choices()
        self._check_window()
        self._check_scale()
        if self.sim and self.sim_args:  # the simulator's options, as it will read them
            check_sim_command(self.sim_child_command())
        if not self.sim:
            self._check_target()
        key = self.resolved_api_key()
        if key is not None:
            check_api_key(key, self.api_key_env)
        for flag, path in self.output_paths():
            check_output_path(flag, path)
        for name, value in self.shape_options:
            sized = name.endswith(("-tokens", "-max")) and "latency" not in name
            if sized and value > MAX_REQUEST_TOKENS:
                raise UsageError(
                    f"--{name} {value} is more than one request can hold "
                    f"(at most {MAX_REQUEST_TOKENS} tokens)"
                )

    def check_once(self) -> None:
        """``check()``, unless this very configuration passed every check already (a command
        line checks right after parsing; the run then does not repeat it)."""
        if _FULLY_CHECKED.get(id(self)) is not self:
            self.check()

    def mark_checked(self) -> None:
        """Record that every check passed (the command line's own order: the options that
        need another right after parsing, then ``check(combinations=False)``)."""
        _FULLY_CHECKED[id(self)] = self

    def check_combinations(self, routing_pair: tuple[bool, int | None] | None = None) -> None:
        """Options that need another option, or exclude one (``routing_pair``: the two
        --dp-rank-perfect-routing flags as given, which a config holds as one value)."""
        check_flag_combinations(
            replay=self.replay,
            replay_only=(
                ("--replay-initial-overhead-tokens", self.replay_initial_overhead_tokens),
                ("--replay-turn-overhead-tokens", self.replay_turn_overhead_tokens),
                ("--time-scale", self.time_scale),
            ),
            sim=self.sim,
            sim_only=(("--sim-dp-ranks", self.sim_dp_ranks), ("--sim-args", self.sim_args)),
            endpoint=self.endpoint,
            dry_run=self.dry_run,
            prompt_oracle=self.prompt_oracle,
            prompt_correction=self.prompt_correction,
            chat_template=self.chat_template,
            calibrate=bool(self.calibrate),
            admission=self.admission,
            arrival_rate=self.arrival_rate,
            arrival_process=self.arrival_process,
            routing_pair=routing_pair,
        )

    def _check_choices(self) -> None:
        """Values a command line's choices guarantee, for configs built in Python."""
        if self.admission not in (None, "closed-loop", "open-loop"):
            raise UsageError(f'invalid admission "{self.admission}" (closed-loop or open-loop)')
        if self.arrival_process not in (None, *ARRIVAL_PROCESSES):
            raise UsageError(
                f'invalid arrival process "{self.arrival_process}" (poisson or constant)'
            )
        if self.time_scale is not None and not (
            math.isfinite(self.time_scale) and self.time_scale > 0
        ):
            raise UsageError("time-scale must be a positive finite number")
        if self.prompt_oracle not in ("none", "server"):
            raise UsageError(f'invalid prompt oracle "{self.prompt_oracle}" (none or server)')
        if not isinstance(self.routed_worker_header, str) or not is_header_name(
            self.routed_worker_header
        ):
            raise UsageError(
                f"--routed-worker-header {self.routed_worker_header!r} is not an HTTP header name"
            )
        if self.rank_failover not in RANK_FAILOVER_POLICIES:
            raise UsageError(f'invalid --rank-failover "{self.rank_failover}" (none or rehash)')
        if self.dp_rank_header not in DP_RANK_HEADERS:
            raise UsageError(
                f'invalid --dp-rank-header "{self.dp_rank_header}" (smg, vllm or both)'
            )

    def sim_child_command(self) -> list[str]:
        """The command line of the ``--sim`` child: the simulator with this run's
        tokenizer, ranks, template and ``--sim-args``."""
        extra = self.sim_args or ""
        if self.tokenizer_download:
            extra = f"--tokenizer-download {extra}"
        if self.chat_template is not None:
            extra = f"--chat-template {shlex.quote(self.chat_template)} {extra}"
        tokenizer = self.tokenizer
        assert tokenizer is not None  # with --sim: the simulator's when not given
        return sim_command(tokenizer, self.sim_dp_ranks, extra or None)

    def _check_values(self) -> None:
        """Types and ranges a command line's parser guarantees, for configs built in Python."""
        known = set(shape_option_names())
        for name, value in self.shape_options:
            if name not in known:
                hint = closest(name, known) if isinstance(name, str) else None
                meant = f" (did you mean {hint}?)" if hint else ""
                raise UsageError(f"unknown shape option {name!r}{meant}")
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise UsageError(f"shape option {name!r} must be a number, not {value!r}")
        at_least = (
            ("agents", self.agents, 0),
            ("max-active-agents", self.max_active_agents, 1),
            ("max-response-bytes", self.max_response_bytes, 1),
            ("max-retries", self.max_retries, 0),
            ("retry-delay-ms", self.retry_delay_ms, 0),
            ("dp-rank-perfect-routing-num", self.dp_ranks, 1),
            ("sim-dp-ranks", self.sim_dp_ranks, 1),
            ("replay-initial-overhead-tokens", self.replay_initial_overhead_tokens, 0),
            ("replay-turn-overhead-tokens", self.replay_turn_overhead_tokens, 0),
        )
        for name, count, low in at_least:
            if count is not None and (not isinstance(count, int) or count < low):
                raise UsageError(f"--{name} must be an integer of at least {low}, not {count!r}")
        if self.arrival_rate is not None and not (
            isinstance(self.arrival_rate, int | float)
            and not isinstance(self.arrival_rate, bool)
            and math.isfinite(self.arrival_rate)
            and self.arrival_rate > 0
        ):
            raise UsageError(
                f"--arrival-rate must be a positive finite number, not {self.arrival_rate!r}"
            )
        if self.seed is not None and not (isinstance(self.seed, int) and 0 <= self.seed < 1 << 64):
            raise UsageError(f"--seed must be an integer in 0..2^64-1, not {self.seed!r}")
        for name, value in (
            ("request-timeout-secs", self.request_timeout_secs),
            ("grace-seconds", self.grace_seconds),
            ("max-retry-wait", self.max_retry_wait),
        ):
            if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
                raise UsageError(f"--{name} must be a non-negative number, not {value!r}")
        if not (isinstance(self.max_failure_rate, int | float) and 0 <= self.max_failure_rate <= 1):
            raise UsageError(
                f"--max-failure-rate must be between 0 and 1, not {self.max_failure_rate!r}"
            )

    def _check_window(self) -> None:
        """Objectives that need streaming, the window's bounds and the metrics endpoint."""
        if not self.stream:
            named = [o.name for o in self.slo if o.metric in STREAMED_METRICS]
            named += [f"--goodput {m}" for m, _ in self.goodput if m in STREAMED_METRICS]
            if named:
                raise UsageError(
                    f"{', '.join(named)} cannot be combined with --no-stream: TTFT, ITL and "
                    "TPOT are measured only on streamed replies"
                )
        if any(o.metric == "goodput" for o in self.slo) and not self.goodput_thresholds:
            raise UsageError(
                "--slo goodput=... needs --goodput thresholds (e.g. --goodput ttft=2s) or a "
                "latency objective such as ttft_p99=2s"
            )
        for name, value, positive in (
            ("warmup", self.warmup, False),
            ("duration", self.duration, True),
            ("server-metrics-interval", self.server_metrics_interval, True),
        ):
            if value is None:
                continue
            if not (
                isinstance(value, int | float)
                and not isinstance(value, bool)
                and math.isfinite(value)
                and (value > 0 if positive else value >= 0)
            ):
                kind = "a positive" if positive else "a non-negative"
                raise UsageError(f"--{name} must be {kind} number of seconds, not {value!r}")
        if self.duration is not None and self.warmup >= self.duration:
            raise UsageError(
                f"--warmup ({self.warmup:g} s) must end before --duration ({self.duration:g} s)"
            )
        if self.window_trajectories is not None and not (
            isinstance(self.window_trajectories, int) and self.window_trajectories >= 1
        ):
            raise UsageError(
                "--window-trajectories must be an integer of at least 1, "
                f"not {self.window_trajectories!r}"
            )
        if self.dp_rank_header != DEFAULT_DP_RANK_HEADER and self.dp_ranks is None:
            raise UsageError(
                f"--dp-rank-header {self.dp_rank_header} needs --dp-rank-perfect-routing "
                "(the header names the rank perfect routing gives each agent)"
            )
        if self.rank_failover != DEFAULT_RANK_FAILOVER and self.dp_ranks is None:
            raise UsageError(
                f"--rank-failover {self.rank_failover} needs --dp-rank-perfect-routing "
                "(without it the gateway already picks every request's worker)"
            )
        if self.server_metrics_jsonl is not None and not self.server_metrics:
            raise UsageError("--server-metrics-jsonl needs --server-metrics (the URL to scrape)")
        if isinstance(self.server_metrics, str):
            raise UsageError(
                f"--server-metrics takes a tuple of URLs, not the string {self.server_metrics!r}"
            )
        for url in self.server_metrics:
            if url == "sim":
                if not self.sim:
                    raise UsageError("--server-metrics sim needs --sim (the embedded simulator)")
            else:
                check_metrics_url(url)
        if len(set(self.server_metrics)) != len(self.server_metrics):
            twice = next(u for u in self.server_metrics if self.server_metrics.count(u) > 1)
            raise UsageError(f"--server-metrics {twice!r} given twice (each URL is scraped once)")
        if self.dry_run and (self.server_metrics or self.report_html):
            flag = "--server-metrics" if self.server_metrics else "--report-html"
            raise UsageError(f"{flag} needs a live run (not --dry-run)")

    @property
    def worker_count(self) -> int:
        """--workers resolved: ``auto`` is one process per core but one (at least 1)."""
        if self.workers == 0:
            return max((os.cpu_count() or 1) - 1, 1)
        return self.workers

    def shard_spec(self):
        """--shard resolved (an environment variable read now); None without it."""
        if self.shard is None:
            return None
        return parse_shard(self.shard)

    def _check_scale(self) -> None:
        """--workers, --shard, --start-at and --ramp-up."""
        if isinstance(self.workers, bool) or not isinstance(self.workers, int) or self.workers < 0:
            raise UsageError(f"--workers must be a positive integer or auto, not {self.workers!r}")
        shard = self.shard_spec()
        if shard is not None and self.sim:
            raise UsageError(
                f"--shard {self.shard} cannot be combined with --sim: each shard would start "
                "its own simulator; start `batchbench sim` once and give its URL with --host"
            )
        if shard is not None and self.seed is None:
            raise UsageError(
                f"--shard {self.shard} needs --seed: every shard must draw the same workload "
                "and content (give all shards the same --seed)"
            )
        if self.start_at is not None and not (
            isinstance(self.start_at, int | float)
            and not isinstance(self.start_at, bool)
            and math.isfinite(self.start_at)
            and self.start_at > 0
        ):
            raise UsageError(f"--start-at must be a time, not {self.start_at!r}")
        if self.ramp_up is not None:
            if not (
                isinstance(self.ramp_up, int | float)
                and not isinstance(self.ramp_up, bool)
                and math.isfinite(self.ramp_up)
                and self.ramp_up >= 0
            ):
                raise UsageError(
                    f"--ramp-up must be a non-negative number of seconds, not {self.ramp_up!r}"
                )
            if self.admission_mode == "open-loop" and self.ramp_up > 0:
                raise UsageError(
                    "--ramp-up spreads closed-loop starts; an open-loop run starts each agent "
                    "at its own time already (drop --ramp-up)"
                )
        if (
            shard is not None
            and self.max_active_agents is not None
            and self.max_active_agents < shard.count
        ):
            raise UsageError(
                f"--max-active-agents {self.max_active_agents} is fewer than the "
                f"{shard.count} shards: each needs at least one agent slot"
            )

    def _check_target(self) -> None:
        """A live run needs an http(s) server: --host, or a full-URL --endpoint."""
        full = self.endpoint.startswith(("http://", "https://"))
        if self.host is None and not full:
            if self.dry_run:
                return
            raise UsageError(
                "no server to run against: give --host with its URL "
                "(e.g. --host http://127.0.0.1:8000), or --sim for the embedded simulator"
            )
        if self.host is not None and not full:
            check_url("--host", self.host)
            check_base_url(self.host, self.endpoint)
        if full:
            check_url("--endpoint", self.endpoint)
        _ = self.endpoint_url  # an unusable URL is a usage error before anything runs

    def output_paths(self) -> list[tuple[str, str]]:
        """(option, path) of every file the run will write (a dry run writes no request
        events)."""
        paths = []
        for name, field_name in output_fields(type(self)):
            path = getattr(self, field_name)
            if path is not None and not (self.dry_run and name == "request-events-jsonl"):
                paths.append((f"--{name}", path))
        return paths

    # -- writing ----------------------------------------------------------------------
    def options(self) -> dict[str, object]:
        """Every option as ``batchbench-agent`` spells it (without the dashes), for a TOML
        file that ``--config`` reads back. The API key is never included."""
        return option_values(self)

    def to_toml(self, salt_used: str | None = None) -> str:
        """The options as a TOML document (one ``name = value`` line each). Output paths,
        and a random content salt (``salt_used``), are written as comments: a run from this
        file neither overwrites the first run's results nor, unless asked, reuses its
        salt (a warm server could then answer from its cache)."""
        lines = [
            "# batchbench-agent options: batchbench-agent --config FILE [more options]",
            "# Uncomment the output paths to write results, and the salt to repeat the",
            "# exact bytes of the run (a warm server may then answer from its prefix cache).",
        ]
        options = self.options()
        if self.content_salt is None and salt_used is not None:
            options["content-salt"] = salt_used
        commented = {name for name, _field in output_fields(type(self))}
        if self.content_salt is None:
            commented.add("content-salt")
        for name, value in options.items():
            prefix = "# " if name in commented else ""
            lines.append(f"{prefix}{name} = {toml_value(value)}")
        return "\n".join(lines) + "\n"


def _is_pair(pair: object) -> bool:
    return isinstance(pair, tuple | list) and len(pair) == 2 and isinstance(pair[0], str)


# -- the shape options as keywords ------------------------------------------------------------
# Why a wrapper of the generated __init__ rather than 25 more fields or a factory: the 25
# shape options stay one declared field (the parsers, TOML, options() and the resolved
# options file keep reading it as before), the keywords come from the same declaration
# (SHAPE_FLAGS), and ``RunConfig(...)`` itself, which every caller and ``dataclasses.replace``
# use, takes them; a factory would leave the plain constructor with the bare TypeError.
# Type checkers see the generated signature; ``inspect.signature`` (and so a notebook's
# completion) shows the keywords.
_FIELDS = frozenset(spec.name for spec in dataclasses.fields(RunConfig) if spec.init)
_KEYWORDS = sorted(_FIELDS | {flag.dest for flag in SHAPE_FLAGS})
_generated_init = RunConfig.__init__


def _init(self: RunConfig, **given: Any) -> None:
    """The dataclass's __init__, taking each shape option also as a keyword (None: not
    given); a keyword overrides the same option in ``shape_options`` (so
    ``dataclasses.replace(config, input_tokens=512)`` replaces it)."""
    keywords: dict[str, float | int] = {}
    for name in [name for name in given if name not in _FIELDS]:
        option_name = SHAPE_KEYWORDS.get(name)
        if option_name is None:
            hint = closest(name, _KEYWORDS)
            meant = f" (did you mean {hint}?)" if hint else ""
            raise KeywordError(f"RunConfig() got an unexpected keyword argument {name!r}{meant}")
        value = given.pop(name)
        if value is not None:
            keywords[option_name] = value
    if keywords:
        pairs = given.get("shape_options") or ()
        kept = [pair for pair in pairs if not (_is_pair(pair) and pair[0] in keywords)]
        given["shape_options"] = (*kept, *keywords.items())
    _generated_init(self, **given)


_init.__qualname__ = "RunConfig.__init__"  # as Python's own errors name it
_init.__signature__ = inspect.signature(_generated_init).replace(  # type: ignore[attr-defined]
    parameters=[
        *inspect.signature(_generated_init).parameters.values(),
        *(
            inspect.Parameter(
                flag.dest,
                inspect.Parameter.KEYWORD_ONLY,
                default=None,
                annotation="int | float | None",
            )
            for flag in SHAPE_FLAGS
        ),
    ]
)
setattr(RunConfig, "__init__", _init)  # noqa: B010 - mypy refuses assigning a method

# the options that name a file the run writes (an options file shows them as comments)
OUTPUT_OPTIONS = tuple(name for name, _field in output_fields(RunConfig))
TOML_INT_MAX = (1 << 63) - 1


def toml_value(value: object) -> str:
    """A TOML scalar, or an array of them for a repeatable option: JSON's string escapes
    are valid TOML basic strings (DEL, which TOML
    forbids raw, is escaped too); integers beyond TOML's 64-bit signed range are written
    as strings, which the options reader accepts."""
    if isinstance(value, tuple):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value) if -TOML_INT_MAX - 1 <= value <= TOML_INT_MAX else f'"{value}"'

    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    return json.dumps(str(value), ensure_ascii=False).replace("\x7f", "\\u007f")
