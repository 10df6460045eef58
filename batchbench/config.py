"""The resolved configuration of one run: built once (from the command line, a TOML file or
Python), frozen, and read by every later stage. Changing a value means building a new one
with ``dataclasses.replace``."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from batchbench.drive.transport import DEFAULT_MAX_RESPONSE_BYTES
from batchbench.errors import UsageError
from batchbench.plan.arrivals import ARRIVAL_PROCESSES, DEFAULT_ARRIVAL_PROCESS, arrival_offsets
from batchbench.plan.limits import MAX_REQUEST_TOKENS
from batchbench.plan.manifest import check_manifest_opens
from batchbench.plan.sampling import FamilyFlags, resolve_latency_spec, resolve_size_spec
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
SIM_TEMPLATES = ("chatml", "gemma", "llama3", "qwen3", "tokenizer")  # what the simulator renders

# (label, option names of the fixed size, log-normal option prefixes, default fixed size)
SIZE_FAMILIES = (
    ("input", ("input-tokens", "initial-prompt-tokens"), ("input-lognorm",), 128),
    ("output", ("output-tokens", "model-response-tokens"), ("output-lognorm",), 64),
    ("environment", ("environment-tokens",), ("environment-lognorm",), 64),
    ("tool-invocations", ("tool-invocations",), ("tool-invocations-lognorm",), 4),
)
LATENCY_OPTIONS = (
    "tool-call-latency-ms",
    "tool-call-latency-lognorm-mu",
    "tool-call-latency-lognorm-median-ms",
    "tool-call-latency-lognorm-sigma",
    "tool-call-latency-lognorm-max-ms",
)


def shape_option_names() -> list[str]:
    """The 25 sampled-shape options by their main names, in command-line order."""
    names = []
    for _label, fixed, lognorm, _default in SIZE_FAMILIES:
        names.append(fixed[0])
        names += [f"{lognorm[0]}-{suffix}" for suffix in ("mu", "median", "sigma", "max")]
    return names + list(LATENCY_OPTIONS)


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


def check_flag_combinations(
    *,
    replay: bool,
    replay_only: tuple[tuple[str, object], ...],
    sim: bool,
    sim_only: tuple[tuple[str, object], ...],
    endpoint: str,
    dry_run: bool,
    prompt_oracle: str,
    prompt_correction: bool,
    chat_template: str | None,
    calibrate: bool,
    admission: str | None = None,
    arrival_rate: float | None = None,
    arrival_process: str | None = None,
    routing_pair: tuple[bool, int | None] | None = None,
) -> None:
    """Options that need another option, or exclude one; ``(flag, value)`` pairs count as
    given when the value is not None. The command line checks them right after parsing
    (with the --dp-rank-perfect-routing pair, which a config holds as one value)."""
    if not replay:
        for flag, value in replay_only:
            if value is not None:
                raise UsageError(f"{flag} requires --agent-plans-jsonl")
    check_arrivals(replay, admission, arrival_rate, arrival_process)
    if routing_pair is not None:
        enabled, ranks = routing_pair
        if enabled and ranks is None:
            raise UsageError("--dp-rank-perfect-routing requires --dp-rank-perfect-routing-num")
        if ranks is not None and not enabled:
            raise UsageError("--dp-rank-perfect-routing-num requires --dp-rank-perfect-routing")
    if not sim:
        for flag, value in sim_only:
            if value is not None:
                raise UsageError(f"{flag} requires --sim")
    if sim and endpoint.startswith(("http://", "https://")):
        raise UsageError(
            "--sim cannot be combined with a full-URL --endpoint; give a path such as "
            "/v1/chat/completions"
        )
    if sim and dry_run:
        raise UsageError("--sim cannot be combined with --dry-run; a dry-run sends nothing")
    if prompt_oracle == "server" and not prompt_correction:
        raise UsageError("--prompt-oracle server cannot be combined with --no-prompt-correction")
    if prompt_oracle == "server" and dry_run:
        raise UsageError("--prompt-oracle server cannot be combined with --dry-run")
    if sim and chat_template is not None:
        if chat_template not in SIM_TEMPLATES:
            raise UsageError(
                "with --sim, --chat-template must be chatml, gemma, llama3, qwen3 or tokenizer "
                "(the simulator's templates)"
            )
        if "--chat-template" in str(dict(sim_only).get("--sim-args") or ""):
            raise UsageError("give --chat-template once: as a flag or inside --sim-args, not both")
    if calibrate and dry_run:
        raise UsageError("--calibrate cannot be combined with --dry-run; a dry-run sends nothing")


def check_arrivals(
    replay: bool, admission: str | None, arrival_rate: float | None, arrival_process: str | None
) -> None:
    """Open loop needs start times: a manifest's, or an arrival rate's. An arrival rate
    implies open loop, so it excludes closed loop; its process needs it."""
    if arrival_process is not None and arrival_rate is None:
        raise UsageError("--arrival-process requires --arrival-rate")
    if arrival_rate is not None and admission == "closed-loop":
        raise UsageError(
            "--arrival-rate cannot be combined with --admission closed-loop; "
            "agents that arrive at a rate are admitted open-loop"
        )
    if admission is not None and not replay and arrival_rate is None:
        if admission == "open-loop":
            raise UsageError("--admission open-loop requires --agent-plans-jsonl or --arrival-rate")
        raise UsageError("--admission requires --agent-plans-jsonl")


def check_url(flag: str, value: str) -> None:
    """An http:// or https:// URL, or a usage error that shows the fix."""
    scheme, separator, rest = value.partition("://")
    if not separator:
        raise UsageError(
            f"{flag} {value} has no scheme: use {flag} http://{value} (or https://{value})"
        )
    if scheme.lower() not in ("http", "https"):
        raise UsageError(f"{flag} {value}: only http:// and https:// servers are supported")
    if not rest.strip("/"):
        raise UsageError(f"{flag} {value} names no host")


def check_output_path(flag: str, path: str) -> None:
    """Before the run: the file can be created or replaced (its directory exists, it is not
    a directory, and it may be written), so no result is lost at the end."""
    if os.path.isdir(path):
        raise UsageError(f"{flag} {path} is a directory; give a file name")
    parent = os.path.dirname(path) or "."
    if not os.path.isdir(parent):
        raise UsageError(f"{flag} {path}: the directory {parent} does not exist")
    exists = os.path.exists(path)
    if not os.access(parent, os.W_OK | os.X_OK) or (exists and not os.access(path, os.W_OK)):
        raise UsageError(f"{flag} {path} cannot be written (permission denied)")


def check_api_key(key: str, env: str) -> None:
    """The key must fit an HTTP header: visible ASCII (spaces inside allowed)."""
    for position, char in enumerate(key, 1):
        if not " " <= char <= "~":
            what = "a control character" if ord(char) < 32 or ord(char) == 127 else "non-ASCII"
            raise UsageError(
                f"the API key (--api-key or ${env}) cannot be sent in an HTTP header: "
                f"character {position} is {what}"
            )
    if key != key.strip():
        raise UsageError(
            f"the API key (--api-key or ${env}) starts or ends with whitespace; remove it"
        )


def resolve_shape(options: dict[str, float | int]) -> SampledShape:
    """The four size families and the tool latency from the given shape options (missing
    ones take their defaults: fixed 128/64/64 tokens, 4 invocations, no latency)."""
    specs = {}
    for label, fixed, lognorm, default in SIZE_FAMILIES:
        prefix = lognorm[0]
        # fixed and cap are whole numbers from the parser (uint); _check_values lets any
        # number through for a config built in Python.
        flags = FamilyFlags(
            fixed=options.get(fixed[0]),  # type: ignore[arg-type]
            mu=options.get(f"{prefix}-mu"),
            median=options.get(f"{prefix}-median"),
            sigma=options.get(f"{prefix}-sigma"),
            cap=options.get(f"{prefix}-max"),  # type: ignore[arg-type]
        )
        specs[label] = resolve_size_spec(label, flags, default)
    # fixed and cap as above
    latency_flags = FamilyFlags(*(options.get(name) for name in LATENCY_OPTIONS))  # type: ignore[arg-type]
    latency = resolve_latency_spec(latency_flags)
    return SampledShape(
        input=specs["input"],
        output=specs["output"],
        environment=specs["environment"],
        tool_invocations=specs["tool-invocations"],
        latency=latency,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class RunConfig:
    """Everything one run needs, resolved. Field names follow the command-line options
    (``max_active_agents`` is ``--max-active-agents``); None means "not given" where the
    reports must show that. ``RunConfig.from_args`` builds one from ``batchbench-agent``
    arguments; ``batchbench.run(config)`` runs it."""

    # target
    model: str | None = None  # None: the one model the server lists (live runs)
    host: str | None = None  # the server's base URL; None only for --sim and dry runs
    endpoint: str = DEFAULT_ENDPOINT
    api_key: ApiKey | None = None
    api_key_env: str = "OPENAI_API_KEY"  # where the key came from; the key is never written
    tokenizer_model: str | None = None  # None: the model name (with sim, deepseek-v3)
    tokenizer_download: bool = False  # may fetch a hub id (otherwise offline only)
    # workload: a manifest, or sampled agents of a shape
    agent_plans_jsonl: str | None = None
    agents: int | None = None
    shape_options: tuple[tuple[str, float | int], ...] = ()  # given shape options by name
    seed: int | None = None
    # prompt sizing and fidelity
    replay_initial_overhead_tokens: int | None = None
    replay_turn_overhead_tokens: int | None = None
    calibrate: bool = False
    prompt_correction: bool = True
    replay_reasoning: str = "keep"  # "keep": the reply's reasoning_content is sent back
    prompt_oracle: str = "none"
    content_salt: str | None = None  # None: a random salt per run
    chat_template: str | None = None
    # admission
    max_active_agents: int | None = None
    admission: str | None = None  # None: open-loop with an arrival rate, else closed-loop
    time_scale: float | None = None  # None: 1
    arrival_rate: float | None = None  # agents per second, open loop; None: no arrivals
    arrival_process: str | None = None  # poisson or constant; None: poisson
    # routing and identity
    user_prefix: str | None = None
    user_tagging: bool = True
    dp_ranks: int | None = None  # perfect routing over this many ranks
    # HTTP
    stream: bool = False
    request_timeout_secs: float = 60  # an int when whole (options files say 60, not 60.0)
    max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES  # decoded bytes one response may hold
    max_retries: int = 2
    retry_delay_ms: int = 250
    max_retry_wait: float = 300.0  # seconds: the longest wait before a retry (Retry-After)
    max_failure_rate: float = 0.0  # failed / sent requests allowed before exit status 3
    sglang: bool = False
    ignore_eos: bool = False
    verbose: bool = False
    # run and outputs
    dry_run: bool = False
    grace_seconds: float = 5.0
    preflight: bool = True  # check the target (GET /v1/models) before anything starts
    progress: bool = False  # a progress bar on stderr when it is a terminal
    results_csv: str | None = None
    results_json: str | None = None
    agent_events_jsonl: str | None = None
    request_events_jsonl: str | None = None
    # embedded simulator
    sim: bool = False
    sim_dp_ranks: int | None = None
    sim_args: str | None = None
    # measured window, objectives, server metrics and the report (strings parse as the
    # command line spells them: slo="ttft_p99=2s", goodput="ttft=2s", percentiles="50,99")
    slo: tuple[Objective, ...] = ()
    goodput: tuple[tuple[str, float], ...] = ()  # (metric, limit ms)
    percentiles: tuple[float, ...] = DEFAULT_PERCENTILES
    warmup: float = 0.0  # seconds: requests sent earlier are left out of the window
    duration: float | None = None  # seconds: stop admitting then; requests in flight finish
    window_trajectories: int | None = None  # stop once this many admitted after warm-up end
    server_metrics: str | None = None  # a Prometheus text endpoint scraped during the run
    server_metrics_interval: float = 1.0
    server_metrics_jsonl: str | None = None
    report_html: str | None = None
    # scale-out (docs/scale-out.md)
    workers: int = 1  # processes on this machine; 0: auto (cores - 1)
    shard: str | None = None  # "I/N" as given (I may name an environment variable)
    start_at: float | None = None  # Unix time every shard starts its clock at
    ramp_up: float | None = None  # seconds over which closed-loop agents start; None: default

    # -- derived values ---------------------------------------------------------------
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
        from batchbench.cli.agent_args import config_from_argv

        config = config_from_argv(argv)
        if config is None:
            raise SystemExit(0)
        return config

    def __post_init__(self) -> None:
        if isinstance(self.api_key, str):  # a plain string from Python: hide it at once
            object.__setattr__(self, "api_key", ApiKey(self.api_key) if self.api_key else None)
        parsers = (("slo", parse_slo), ("goodput", parse_goodput))
        for name, parse in (*parsers, ("percentiles", parse_percentiles)):
            value = getattr(self, name)
            if isinstance(value, str):
                object.__setattr__(self, name, parse(value) if value else ())

    @property
    def goodput_thresholds(self) -> tuple[tuple[str, float], ...]:
        """What makes a request good: --goodput, else the limits of the latency objectives
        of --slo (per metric, the limit of its highest percentile)."""
        if self.goodput:
            return self.goodput
        chosen: dict[str, Objective] = {}
        for objective in self.slo:
            if objective.metric == "goodput" or objective.limit_ms is None:
                continue
            best = chosen.get(objective.metric)
            if best is None or objective.quantile > best.quantile:
                chosen[objective.metric] = objective
        return tuple((m, o.limit_ms) for m, o in chosen.items() if o.limit_ms is not None)

    def resolved_api_key(self) -> str | None:
        """The key to send: ``api_key``, else the variable named by ``api_key_env``."""
        key = self.api_key.reveal() if self.api_key is not None else None
        key = key or os.environ.get(self.api_key_env) or None
        remember(key)  # a server that echoes it cannot make the run print it
        return key

    def check(self) -> None:
        """The checks a command line gets after parsing, in the same order and words, for
        configs built in Python too; raises UsageError (ManifestError for a manifest that
        cannot be opened)."""
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
            calibrate=self.calibrate,
            admission=self.admission,
            arrival_rate=self.arrival_rate,
            arrival_process=self.arrival_process,
        )
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
        self._check_window()
        self._check_scale()
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

    def _check_values(self) -> None:
        """Types and ranges a command line's parser guarantees, for configs built in Python."""
        known = set(shape_option_names())
        for name, value in self.shape_options:
            if name not in known:
                raise UsageError(f"unknown shape option {name!r}")
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
                    f"{', '.join(named)} needs --stream: TTFT, ITL and TPOT are measured only "
                    "on streamed replies"
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
        if self.server_metrics_jsonl is not None and self.server_metrics is None:
            raise UsageError("--server-metrics-jsonl needs --server-metrics (the URL to scrape)")
        if self.server_metrics == "sim":
            if not self.sim:
                raise UsageError("--server-metrics sim needs --sim (the embedded simulator)")
        elif self.server_metrics is not None:
            check_metrics_url(self.server_metrics)
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
        if full:
            check_url("--endpoint", self.endpoint)
        _ = self.endpoint_url  # an unusable URL is a usage error before anything runs

    def output_paths(self) -> list[tuple[str, str]]:
        """(option, path) of every file the run will write."""
        paths = [
            ("--results-csv", self.results_csv),
            ("--results-json", self.results_json),
            ("--agent-events-jsonl", self.agent_events_jsonl),
            ("--request-events-jsonl", None if self.dry_run else self.request_events_jsonl),
            ("--server-metrics-jsonl", self.server_metrics_jsonl),
            ("--report-html", self.report_html),
        ]
        return [(flag, path) for flag, path in paths if path is not None]

    # -- writing ----------------------------------------------------------------------
    def options(self) -> dict[str, object]:
        """Every option as ``batchbench-agent`` spells it (without the dashes), for a TOML
        file that ``--config`` reads back. The API key is never included."""
        values: dict[str, object] = {
            "model": self.model,
            "tokenizer-model": self.tokenizer_model,
            "tokenizer-download": self.tokenizer_download,
            "host": self.host,
            "endpoint": self.endpoint,
            "api-key-env": self.api_key_env,
            "agent-plans-jsonl": self.agent_plans_jsonl,
            "agents": self.agents,
            **dict(self.shape_options),
            "seed": self.seed,
            "replay-initial-overhead-tokens": self.replay_initial_overhead_tokens,
            "replay-turn-overhead-tokens": self.replay_turn_overhead_tokens,
            "calibrate": self.calibrate,
            "no-prompt-correction": not self.prompt_correction,
            "replay-reasoning": self.replay_reasoning,
            "prompt-oracle": self.prompt_oracle,
            "content-salt": self.content_salt,
            "chat-template": self.chat_template,
            "max-active-agents": self.max_active_agents,
            "admission": self.admission,
            "time-scale": self.time_scale,
            "arrival-rate": self.arrival_rate,
            "arrival-process": self.arrival_process,
            "user-prefix": self.user_prefix,
            "disable-user-tagging": not self.user_tagging,
            "dp-rank-perfect-routing": self.dp_ranks is not None,
            "dp-rank-perfect-routing-num": self.dp_ranks,
            "stream": self.stream,
            "request-timeout-secs": self.request_timeout_secs,
            "max-response-bytes": self.max_response_bytes,
            "max-retries": self.max_retries,
            "retry-delay-ms": self.retry_delay_ms,
            "max-retry-wait": self.max_retry_wait,
            "max-failure-rate": self.max_failure_rate,
            "sglang": self.sglang,
            "ignore-eos": self.ignore_eos,
            "verbose": self.verbose,
            "dry-run": self.dry_run,
            "grace-seconds": self.grace_seconds,
            "no-preflight": not self.preflight,
            "no-progress": not self.progress,
            "results-csv": self.results_csv,
            "results-json": self.results_json,
            "agent-events-jsonl": self.agent_events_jsonl,
            "request-events-jsonl": self.request_events_jsonl,
            "sim": self.sim,
            "sim-dp-ranks": self.sim_dp_ranks,
            "sim-args": self.sim_args,
            "slo": slo_text(self.slo) or None,
            "goodput": goodput_text(self.goodput) or None,
            "percentiles": ",".join(percentile_label(p)[1:] for p in self.percentiles),
            "warmup": self.warmup,
            "duration": self.duration,
            "window-trajectories": self.window_trajectories,
            "server-metrics": self.server_metrics,
            "server-metrics-interval": self.server_metrics_interval,
            "server-metrics-jsonl": self.server_metrics_jsonl,
            "report-html": self.report_html,
        }
        values.update(
            {
                "workers": "auto" if self.workers == 0 else self.workers,
                "shard": self.shard,
                "start-at": self.start_at,
                "ramp-up": self.ramp_up,
            }
        )
        return {name: value for name, value in values.items() if value is not None}

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
        commented = set(OUTPUT_OPTIONS)
        if self.content_salt is None:
            commented.add("content-salt")
        for name, value in options.items():
            prefix = "# " if name in commented else ""
            lines.append(f"{prefix}{name} = {toml_value(value)}")
        return "\n".join(lines) + "\n"


OUTPUT_OPTIONS = (
    "results-csv",
    "results-json",
    "agent-events-jsonl",
    "request-events-jsonl",
    "server-metrics-jsonl",
    "report-html",
)
TOML_INT_MAX = (1 << 63) - 1


def toml_value(value: object) -> str:
    """A TOML scalar: JSON's string escapes are valid TOML basic strings (DEL, which TOML
    forbids raw, is escaped too); integers beyond TOML's 64-bit signed range are written
    as strings, which the options reader accepts."""
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
