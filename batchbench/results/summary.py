"""The run's summary as one named record: the console summary, the CSV row (its fields are
the columns, in order) and the results JSON's ``metrics`` are all rendered from it.
Every figure is defined in docs/metrics.md and every column in docs/outputs.md."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from batchbench import __version__
from batchbench.config import RunConfig
from batchbench.drive.transport import DEFAULT_WORKER_HEADER
from batchbench.results.failures import KindEntry
from batchbench.results.lifecycle import EngineResult
from batchbench.results.metrics import RunTotals, StreamSamples, percentiles
from batchbench.results.recording import ClientHealth, FidelityFigures, RankFigures


@dataclass(frozen=True, slots=True)
class RunSetup:
    """What the run resolved before it sent anything (beyond its configuration)."""

    timestamp: str  # when the run started, ISO 8601 UTC
    agents: int  # trajectories in the workload
    manifest_sha256: str | None
    schema_version: int | None
    tokenizer_source: str  # the tokenizer file that was loaded
    root_seed: int
    content_salt: str
    chat_template: str | None  # the template replies were counted in, when known
    calibration: dict | None  # ``Calibration.as_dict()`` when --calibrate ran
    replay_initial_overhead_tokens: int | None  # as reported: the flag, or the calibrated value
    replay_turn_overhead_tokens: int | None
    framing_initial: int  # framing overheads the run started from (flags, calibration or 0)
    framing_turn: int
    framing_measured: bool  # from flags or calibration, not a default
    # The manifest's provenance summary (``provenance.summarize``; [] when no trajectory has
    # any); None in sampled mode and in shard data written before it existed.
    sources: list[dict[str, Any]] | None = None
    # Per rank index, the worker its preflight probe reached, as the reply named it (None:
    # not named); None when the ranks were not probed.
    rank_workers: list[str | None] | None = None
    # Chat requests sent before the run under perfect routing, by what sent them
    # ("preflight", "rank_layout", "calibration"); None without perfect routing.
    probes: dict[str, int] | None = None
    # Why a run that would have calibrated did not (the note it printed): None when it
    # calibrated, or was not to (--no-calibrate, a dry run, both overhead flags given).
    calibration_note: str | None = None


@dataclass
class LiveFigures:
    """What only a live run has: streaming samples, per-rank load, client health, fidelity."""

    stream: StreamSamples = field(default_factory=StreamSamples)
    server_cached_tokens: int | None = None
    ranks: list[RankFigures] = field(default_factory=list)
    health: ClientHealth | None = None
    interrupted_by: str | None = None
    streaming: bool = False  # --stream (the run's default)
    # Some request streamed (--stream, or a manifest request's own "stream": true).
    streamed_requests: bool = False
    # Some block seed is shared by several trajectories (schema v2).
    shared_blocks: bool = False
    fidelity: FidelityFigures = field(default_factory=FidelityFigures)
    framing: dict | None = None  # what the run learned of the server's framing
    prompt_cause: str | None = None  # why prompt fidelity is below 100 % (one line)
    output_cause: str | None = None  # why output fidelity is below 100 % (one line)
    no_usage_failures: int = 0  # failed requests whose server sent no usage
    requests: int = 0  # sent requests (succeeded or failed)
    input_tokens: int = 0  # prompt tokens the server counted
    # The header naming each reply's worker, and the ones that named each request's rank.
    worker_header: str = DEFAULT_WORKER_HEADER
    rank_headers: tuple[str, ...] = ()
    rank_failover: str = "none"  # --rank-failover


# Column groups, in CSV order: the original tool's columns, then this package's streaming
# latency columns and the interruption flag, live-run figures, and prompt fidelity.
CSV_COLUMNS = (
    "timestamp", "model", "workload_mode", "agent_plans_jsonl", "agent_plans_sha256",
    "trajectory_schema_version", "admission_mode", "time_scale", "agents",
    "requested_max_active_agents", "max_active_agents", "late_admissions",
    "max_admission_lag_ms", "live_block_fallbacks", "completed_agents",
    "planned_tool_invocations", "total_requests", "successful_requests", "failed_requests",
    "total_input_tokens", "total_output_tokens", "estimated_cached_input_tokens",
    "total_tool_call_latency_seconds", "total_duration_seconds", "last_agent_admitted_seconds",
    "final_drain_seconds", "requests_per_second", "input_tokens_per_second",
    "output_tokens_per_second", "latency_p50_ms", "latency_p90_ms", "latency_p99_ms",
    "agent_end_to_end_latency_p50_ms", "agent_end_to_end_latency_p90_ms",
    "agent_end_to_end_latency_p99_ms", "host", "endpoint", "sglang", "ignore_eos",
    "user_tagging", "dp_rank_perfect_routing", "dp_rank_perfect_routing_num", "seed",
    "replay_initial_overhead_tokens", "replay_turn_overhead_tokens", "agent_events_jsonl",
    "tool_call_latency_ms", "tool_call_latency_lognorm_mu",
    "tool_call_latency_lognorm_median_ms", "tool_call_latency_lognorm_sigma",
    "tool_call_latency_lognorm_max_ms",
)  # fmt: skip
EXTRA_CSV_COLUMNS = (
    "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms", "inter_token_latency_p50_ms",
    "inter_token_latency_p90_ms", "inter_token_latency_p99_ms", "tpot_p50_ms", "tpot_p90_ms",
    "tpot_p99_ms", "interrupted",
)  # fmt: skip
LIVE_CSV_COLUMNS = (
    "stream", "server_cached_input_tokens", "rank_requests_imbalance",
    "rank_input_tokens_imbalance", "event_loop_lag_p50_ms", "event_loop_lag_p99_ms",
    "event_loop_lag_max_ms", "client_cpu_seconds", "client_cpu_seconds_per_1000_requests",
    "peak_in_flight_requests", "batchbench_version",
)  # fmt: skip
FIDELITY_CSV_COLUMNS = (
    "content_salt", "prompt_correction", "prompt_oracle", "calibrated_initial_overhead_tokens",
    "calibrated_turn_overhead_tokens", "prompt_fidelity_requests", "prompt_exact_requests",
    "prompt_exact_percent", "prompt_drift_mean_abs_tokens", "prompt_drift_max_abs_tokens",
    "output_exact_requests", "output_exact_percent", "output_drift_mean_abs_tokens",
    "output_drift_max_abs_tokens", "corrected_requests", "correction_limited_requests",
    "explainable_cached_input_tokens",
)  # fmt: skip
# Where every planned request went, and the run's verdict.
OUTCOME_CSV_COLUMNS = (
    "cancelled_requests", "skipped_requests", "attempts", "retries", "retry_waits_capped",
    "failure_rate", "max_failure_rate", "verdict",
)  # fmt: skip
# Added later, so after every earlier column: a lost worker's unrecorded share.
LOSS_CSV_COLUMNS = ("lost_requests",)
ALL_CSV_COLUMNS = (
    CSV_COLUMNS
    + EXTRA_CSV_COLUMNS
    + LIVE_CSV_COLUMNS
    + FIDELITY_CSV_COLUMNS
    + OUTCOME_CSV_COLUMNS
    + LOSS_CSV_COLUMNS
)
JSON_ONLY_METRICS = ("errors_by_kind", "resent_requests")


@dataclass(frozen=True, slots=True)
class Summary:
    """Every summary figure by name; the field order is the CSV column order. Figures only
    a live run has are None in a dry run; percentiles are None without samples."""

    timestamp: str
    model: str | None
    workload_mode: str
    agent_plans_jsonl: str | None
    agent_plans_sha256: str | None
    trajectory_schema_version: int | None
    admission_mode: str
    time_scale: float
    agents: int
    requested_max_active_agents: int | None
    max_active_agents: int
    late_admissions: int
    max_admission_lag_ms: float
    live_block_fallbacks: int
    completed_agents: int
    planned_tool_invocations: int
    total_requests: int
    successful_requests: int
    failed_requests: int
    total_input_tokens: int
    total_output_tokens: int
    estimated_cached_input_tokens: int
    total_tool_call_latency_seconds: float
    total_duration_seconds: float
    last_agent_admitted_seconds: float
    final_drain_seconds: float
    requests_per_second: float
    input_tokens_per_second: float
    output_tokens_per_second: float
    latency_p50_ms: float | None
    latency_p90_ms: float | None
    latency_p99_ms: float | None
    agent_end_to_end_latency_p50_ms: float | None
    agent_end_to_end_latency_p90_ms: float | None
    agent_end_to_end_latency_p99_ms: float | None
    host: str | None
    endpoint: str | None
    sglang: bool
    ignore_eos: bool
    user_tagging: bool
    dp_rank_perfect_routing: bool
    dp_rank_perfect_routing_num: int | None
    seed: int | None
    replay_initial_overhead_tokens: int | None
    replay_turn_overhead_tokens: int | None
    agent_events_jsonl: str | None
    tool_call_latency_ms: int | None
    tool_call_latency_lognorm_mu: float | None
    tool_call_latency_lognorm_median_ms: float | None
    tool_call_latency_lognorm_sigma: float | None
    tool_call_latency_lognorm_max_ms: int | None
    ttft_p50_ms: float | None
    ttft_p90_ms: float | None
    ttft_p99_ms: float | None
    inter_token_latency_p50_ms: float | None
    inter_token_latency_p90_ms: float | None
    inter_token_latency_p99_ms: float | None
    tpot_p50_ms: float | None
    tpot_p90_ms: float | None
    tpot_p99_ms: float | None
    interrupted: bool
    stream: bool | None
    server_cached_input_tokens: int | None
    rank_requests_imbalance: float | None
    rank_input_tokens_imbalance: float | None
    event_loop_lag_p50_ms: float | None
    event_loop_lag_p99_ms: float | None
    event_loop_lag_max_ms: float | None
    client_cpu_seconds: float | None
    client_cpu_seconds_per_1000_requests: float | None
    peak_in_flight_requests: int | None
    batchbench_version: str
    content_salt: str
    prompt_correction: bool | None
    prompt_oracle: str | None
    calibrated_initial_overhead_tokens: int | None
    calibrated_turn_overhead_tokens: int | None
    prompt_fidelity_requests: int | None
    prompt_exact_requests: int | None
    prompt_exact_percent: float | None
    prompt_drift_mean_abs_tokens: float | None
    prompt_drift_max_abs_tokens: int | None
    output_exact_requests: int | None
    output_exact_percent: float | None
    output_drift_mean_abs_tokens: float | None
    output_drift_max_abs_tokens: int | None
    corrected_requests: int | None
    correction_limited_requests: int | None
    explainable_cached_input_tokens: int | None
    cancelled_requests: int
    skipped_requests: int
    attempts: int
    retries: int
    retry_waits_capped: int
    failure_rate: float
    max_failure_rate: float
    # "ok", "failed" (failures beyond --max-failure-rate), "incomplete" (requests lost with
    # a worker) or "interrupted"
    verdict: str
    lost_requests: int
    errors_by_kind: dict[str, KindEntry]  # JSON only: failed attempts by kind
    resent_requests: int  # JSON only: resent after the server closed a kept-alive connection

    def as_dict(self) -> dict[str, object]:
        """Field name -> value, in column order (the results JSON's ``metrics``)."""
        return {name: getattr(self, name) for name in ALL_CSV_COLUMNS + JSON_ONLY_METRICS}


assert tuple(f.name for f in dataclasses.fields(Summary)) == ALL_CSV_COLUMNS + JSON_ONLY_METRICS


def verdict_of(
    failed: int, succeeded: int, max_failure_rate: float, interrupted: bool, lost: int = 0
):
    """(failure rate, verdict): the share of sent requests that failed, and "failed" when it
    is above the allowed rate; "incomplete" when requests were lost with a worker."""
    sent = failed + succeeded
    failure_rate = failed / sent if sent else 0.0
    if interrupted:
        return failure_rate, "interrupted"
    if lost:
        return failure_rate, "incomplete"
    if failed and failure_rate > max_failure_rate:
        return failure_rate, "failed"
    return failure_rate, "ok"


def rate(total: float, seconds: float) -> float:
    return total / seconds if seconds > 0 else 0.0


def rank_imbalance(values: list[int]) -> float | None:
    """max / mean of per-rank values; None when nothing was sent."""
    if not values:
        return None
    mean = sum(values) / len(values)
    return max(values) / mean if mean > 0 else None


def build_summary(
    config: RunConfig,
    setup: RunSetup,
    totals: RunTotals,
    engine: EngineResult,
    live: LiveFigures | None,
    interrupted: bool,
) -> Summary:
    """The named record of one finished run."""
    duration = engine.total_duration
    replay = config.replay
    latency = percentiles(totals.request_latencies_ms)
    agent_latency = percentiles(totals.agent_latencies_ms)
    no_samples: tuple[float | None, float | None, float | None] = (None, None, None)
    ttft = itl = tpot = no_samples
    if live is not None:
        ttft = percentiles(live.stream.ttft_ms)
        itl = percentiles(live.stream.itl_ms)
        tpot = percentiles(live.stream.tpot_ms)
    health = live.health if live is not None else None
    fidelity = live.fidelity if live is not None else None
    prompt = fidelity.prompt if fidelity is not None else None
    output = fidelity.output if fidelity is not None else None
    calibration = setup.calibration or {}
    failure_rate, verdict = verdict_of(
        totals.failed_requests,
        totals.successful_requests,
        config.max_failure_rate,
        interrupted,
        totals.lost_requests,
    )
    sent = totals.successful_requests + totals.failed_requests + totals.cancelled_requests
    return Summary(
        timestamp=setup.timestamp,
        model=config.model,
        workload_mode=config.workload_mode,
        agent_plans_jsonl=config.agent_plans_jsonl if replay else None,
        agent_plans_sha256=setup.manifest_sha256 if replay else None,
        trajectory_schema_version=setup.schema_version if replay else None,
        admission_mode=config.admission_mode,
        time_scale=config.time_scale_factor,
        agents=totals.agents,  # this process's trajectories: a shard's part, else all
        requested_max_active_agents=config.max_active_agents,
        max_active_agents=engine.max_active_agents,
        late_admissions=engine.late_admissions,
        max_admission_lag_ms=engine.max_admission_lag * 1000.0,
        live_block_fallbacks=totals.live_block_fallbacks,
        completed_agents=totals.completed_agents,
        planned_tool_invocations=totals.planned_tool_invocations,
        total_requests=totals.total_requests,
        successful_requests=totals.successful_requests,
        failed_requests=totals.failed_requests,
        total_input_tokens=totals.total_input_tokens,
        total_output_tokens=totals.total_output_tokens,
        estimated_cached_input_tokens=totals.estimated_cached_input_tokens,
        total_tool_call_latency_seconds=totals.total_tool_call_latency_seconds,
        total_duration_seconds=duration,
        last_agent_admitted_seconds=engine.last_agent_admitted_at,
        final_drain_seconds=max(duration - engine.last_agent_admitted_at, 0.0),
        requests_per_second=rate(totals.total_requests, duration),
        input_tokens_per_second=rate(totals.total_input_tokens, duration),
        output_tokens_per_second=rate(totals.total_output_tokens, duration),
        latency_p50_ms=latency[0],
        latency_p90_ms=latency[1],
        latency_p99_ms=latency[2],
        agent_end_to_end_latency_p50_ms=agent_latency[0],
        agent_end_to_end_latency_p90_ms=agent_latency[1],
        agent_end_to_end_latency_p99_ms=agent_latency[2],
        host=config.host,
        endpoint=config.endpoint_url,
        sglang=config.sglang,
        ignore_eos=config.ignore_eos,
        user_tagging=config.user_tagging,
        dp_rank_perfect_routing=config.dp_ranks is not None,
        dp_rank_perfect_routing_num=config.dp_ranks,
        seed=config.seed,
        replay_initial_overhead_tokens=setup.replay_initial_overhead_tokens,
        replay_turn_overhead_tokens=setup.replay_turn_overhead_tokens,
        agent_events_jsonl=config.agent_events_jsonl,
        # whole numbers from the parser (uint); any number in a config built in Python
        tool_call_latency_ms=config.option("tool-call-latency-ms"),  # type: ignore[arg-type]
        tool_call_latency_lognorm_mu=config.option("tool-call-latency-lognorm-mu"),
        tool_call_latency_lognorm_median_ms=config.option("tool-call-latency-lognorm-median-ms"),
        tool_call_latency_lognorm_sigma=config.option("tool-call-latency-lognorm-sigma"),
        tool_call_latency_lognorm_max_ms=config.option("tool-call-latency-lognorm-max-ms"),  # type: ignore[arg-type]
        ttft_p50_ms=ttft[0],
        ttft_p90_ms=ttft[1],
        ttft_p99_ms=ttft[2],
        inter_token_latency_p50_ms=itl[0],
        inter_token_latency_p90_ms=itl[1],
        inter_token_latency_p99_ms=itl[2],
        tpot_p50_ms=tpot[0],
        tpot_p90_ms=tpot[1],
        tpot_p99_ms=tpot[2],
        interrupted=interrupted,
        stream=live.streaming if live is not None else None,
        server_cached_input_tokens=live.server_cached_tokens if live is not None else None,
        rank_requests_imbalance=(
            rank_imbalance([r.requests for r in live.ranks]) if live is not None else None
        ),
        rank_input_tokens_imbalance=(
            rank_imbalance([r.input_tokens for r in live.ranks]) if live is not None else None
        ),
        event_loop_lag_p50_ms=health.lag_p50_ms if health else None,
        event_loop_lag_p99_ms=health.lag_p99_ms if health else None,
        event_loop_lag_max_ms=health.lag_max_ms if health else None,
        client_cpu_seconds=health.cpu_seconds if health else None,
        client_cpu_seconds_per_1000_requests=(
            health.cpu_seconds_per_1000_requests if health else None
        ),
        peak_in_flight_requests=health.peak_in_flight if health else None,
        batchbench_version=__version__,
        content_salt=setup.content_salt,
        prompt_correction=config.prompt_correction if live is not None else None,
        prompt_oracle=config.prompt_oracle if live is not None else None,
        calibrated_initial_overhead_tokens=calibration.get("initial_overhead_tokens"),
        calibrated_turn_overhead_tokens=calibration.get("turn_overhead_tokens"),
        prompt_fidelity_requests=prompt.requests if prompt is not None else None,
        prompt_exact_requests=prompt.exact if prompt is not None else None,
        prompt_exact_percent=prompt.exact_percent if prompt is not None else None,
        prompt_drift_mean_abs_tokens=prompt.mean_abs if prompt is not None else None,
        prompt_drift_max_abs_tokens=prompt.max_abs if prompt and prompt.requests else None,
        output_exact_requests=output.exact if output is not None else None,
        output_exact_percent=output.exact_percent if output is not None else None,
        output_drift_mean_abs_tokens=output.mean_abs if output is not None else None,
        output_drift_max_abs_tokens=output.max_abs if output and output.requests else None,
        corrected_requests=fidelity.corrected_requests if fidelity is not None else None,
        correction_limited_requests=fidelity.limited_requests if fidelity is not None else None,
        explainable_cached_input_tokens=(
            fidelity.explainable_cached_tokens if fidelity is not None else None
        ),
        cancelled_requests=totals.cancelled_requests,
        skipped_requests=totals.skipped_requests,
        attempts=totals.attempts,
        retries=max(totals.attempts - sent, 0),
        retry_waits_capped=totals.retry_waits_capped,
        failure_rate=failure_rate,
        max_failure_rate=config.max_failure_rate,
        verdict=verdict,
        lost_requests=totals.lost_requests,
        errors_by_kind=totals.errors.as_dict(),
        resent_requests=totals.resent_requests,
    )
