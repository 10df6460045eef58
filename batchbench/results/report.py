"""What a run prints and writes: banner, dry-run lines, summary, CSV (COMPAT §6)."""

from __future__ import annotations

import csv
import dataclasses
import io
import os
from collections.abc import Iterable
from dataclasses import dataclass, field

import orjson

from batchbench import __version__
from batchbench.config import RunConfig
from batchbench.errors import BatchbenchError
from batchbench.plan.sampling import describe_latency, short_float
from batchbench.plan.workload import Workload
from batchbench.results.metrics import RunTotals, StreamSamples, percentile, percentiles
from batchbench.results.recording import ClientHealth, DriftFigures, FidelityFigures, RankFigures
from batchbench.run.engine import EngineResult

CSV_COLUMNS = (
    "timestamp",
    "model",
    "workload_mode",
    "agent_plans_jsonl",
    "agent_plans_sha256",
    "trajectory_schema_version",
    "admission_mode",
    "time_scale",
    "agents",
    "requested_max_active_agents",
    "max_active_agents",
    "late_admissions",
    "max_admission_lag_ms",
    "live_block_fallbacks",
    "completed_agents",
    "planned_tool_invocations",
    "total_requests",
    "successful_requests",
    "failed_requests",
    "total_input_tokens",
    "total_output_tokens",
    "estimated_cached_input_tokens",
    "total_tool_call_latency_seconds",
    "total_duration_seconds",
    "last_agent_admitted_seconds",
    "final_drain_seconds",
    "requests_per_second",
    "input_tokens_per_second",
    "output_tokens_per_second",
    "latency_p50_ms",
    "latency_p90_ms",
    "latency_p99_ms",
    "agent_end_to_end_latency_p50_ms",
    "agent_end_to_end_latency_p90_ms",
    "agent_end_to_end_latency_p99_ms",
    "host",
    "endpoint",
    "sglang",
    "ignore_eos",
    "user_tagging",
    "dp_rank_perfect_routing",
    "dp_rank_perfect_routing_num",
    "seed",
    "replay_initial_overhead_tokens",
    "replay_turn_overhead_tokens",
    "agent_events_jsonl",
    "tool_call_latency_ms",
    "tool_call_latency_lognorm_mu",
    "tool_call_latency_lognorm_median_ms",
    "tool_call_latency_lognorm_sigma",
    "tool_call_latency_lognorm_max_ms",
)
# D18: this package's columns, only after the 51 compatible ones.
EXTRA_CSV_COLUMNS = (
    "ttft_p50_ms",
    "ttft_p90_ms",
    "ttft_p99_ms",
    "inter_token_latency_p50_ms",
    "inter_token_latency_p90_ms",
    "inter_token_latency_p99_ms",
    "tpot_p50_ms",
    "tpot_p90_ms",
    "tpot_p99_ms",
    "interrupted",
)


def _bool(value: bool) -> str:
    return "true" if value else "false"


def banner_lines(config: RunConfig) -> list[str]:
    """The configuration banner (§6.2), ending with the blank line that follows it."""
    lines = [
        "=== Agent Loop Benchmark Configuration ===",
        f"Endpoint: {config.endpoint_url}",
        f"Model: {config.model}",
        f"Tokenizer: {config.tokenizer_model}",
        f"Tokenizer file: {config.tokenizer_source}",
    ]
    if config.workload_mode == "trajectory_replay":
        max_active = (
            "all manifest trajectories"
            if config.max_active_requested is None
            else str(config.max_active_requested)
        )
        lines += [
            f"Workload: trajectory replay from {config.manifest_path}",
            f"Trajectory manifest SHA-256: {config.manifest_sha256}",
            "Replay prompt overhead: initial/reset "
            f"{config.initial_overhead or 0} tokens; "
            f"appended turn {config.turn_overhead or 0} tokens",
            f"Maximum active agents: {max_active}",
            f"Admission: {config.admission}; time scale {short_float(config.time_scale)}",
        ]
    else:
        shape = config.shape
        assert shape is not None
        lines += [
            f"Total synthetic agents: {config.agents}",
            f"Maximum active agents: {config.effective_max_active}",
            f"Initial prompt: {shape.input.describe()}",
            f"Model response: {shape.output.describe()}",
            f"Environment response: {shape.environment.describe()}",
            f"Tool invocations per agent: {shape.tool_invocations.describe()}",
            f"Tool-call latency: {describe_latency(shape.latency)}",
        ]
    token_params = (
        "sglang (min_new_tokens/max_new_tokens)"
        if config.sglang
        else "default (min_tokens/max_tokens)"
    )
    routing = f"enabled ({config.dp_ranks} ranks)" if config.dp_ranks else "disabled"
    lines += [
        f"Output token params: {token_params}",
        f"Ignore EOS: {_bool(config.ignore_eos)}",
        f"DP-rank perfect routing: {routing}",
        f"Per-agent user tagging: {'enabled' if config.user_tagging else 'disabled'}",
        f"Content salt: {config.content_salt}",
    ]
    if not config.dry_run:
        lines.append(f"Prompt correction: {prompt_correction_text(config)}")
    if config.calibration is not None:
        calibration = config.calibration
        verdict = "OK" if calibration["check_ok"] else "MISMATCH"
        lines.append(
            f"Calibrated overhead: initial {calibration['initial_overhead_tokens']} tokens; "
            f"turn {calibration['turn_overhead_tokens']} tokens (check {verdict})"
        )
    lines += ["==========================================", ""]
    return lines


def prompt_correction_text(config: RunConfig) -> str:
    """One phrase: how the run keeps prompts on target."""
    if not config.prompt_correction:
        return "off (plan sizes sent unchanged)"
    parts = ["on"]
    if config.workload_mode != "trajectory_replay":
        parts.append(f"framing initial {config.framing_initial}, turn {config.framing_turn} tokens")
    parts.append(
        f"replies counted in the {config.chat_template} template"
        if config.chat_template
        else "replies counted on their own"
    )
    if config.prompt_oracle == "server":
        parts.append("sized by the server's count")
    return "; ".join(parts)


def dry_run_lines(workload: Workload, result: EngineResult) -> Iterable[str]:
    """One ``[DRY-RUN]`` line per planned request of each admitted trajectory (§6.3)."""
    records = sorted(result.records, key=lambda r: r.agent_id)
    content = workload.input_content_tokens
    output = workload.output_tokens
    environment = workload.environment_tokens
    latency = workload.tool_call_latency_ms
    target = workload.target_prompt_tokens
    reset = workload.reset_before
    for record in records:
        agent = record.agent_id
        prefix = f"[DRY-RUN] agent={agent} invocation="
        ident = workload.trajectory_ids[agent]
        admitted_ms = int(record.admitted_at * 1000.0)
        for number, request in enumerate(workload.turns(agent), start=1):
            yield (
                f"{prefix}{number} input_content_tokens={content[request]} "
                f"output_tokens={output[request]} environment_tokens={environment[request]} "
                f"tool_call_latency_ms={int(latency[request])} trajectory_id={ident} "
                f"routing_slot={record.routing_slot} admitted_at_ms={admitted_ms} "
                f"target_prompt_tokens={target[request]} "
                f"reset_before={_bool(bool(reset[request]) and number > 1)}"
            )


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def _rate(total: float, seconds: float) -> float:
    return total / seconds if seconds > 0 else 0.0


@dataclass
class LiveFigures:
    """What only a live run has: streaming samples, per-rank load, client health, fidelity."""

    stream: StreamSamples = field(default_factory=StreamSamples)
    server_cached_tokens: int | None = None
    ranks: list[RankFigures] = field(default_factory=list)
    health: ClientHealth | None = None
    interrupted_by: str | None = None
    streaming: bool = False
    fidelity: FidelityFigures = field(default_factory=FidelityFigures)
    framing: dict | None = None  # what the run learned of the server's framing
    no_usage_failures: int = 0  # failed requests whose server sent no usage


def _percentile_line(label: str, values) -> str:
    p = percentiles(values)
    return f"{label}: p50={_ms(p[0])} p90={_ms(p[1])} p99={_ms(p[2])}"


def summary_lines(
    totals: RunTotals, result: EngineResult, live: LiveFigures | None = None
) -> list[str]:
    """The console summary of §6.4, with D5/D6 lines when they apply."""
    duration = result.total_duration
    drain = max(duration - result.last_agent_admitted_at, 0.0)
    lines = []
    if live is not None and live.interrupted_by:
        lines.append(
            f"Interrupted by {live.interrupted_by}: admission stopped; results cover work "
            "finished before shutdown"
        )
    lines += [
        f"Agents: {totals.completed_agents} completed / {totals.agents} total",
        f"Rolling admission: {result.max_active_agents} maximum active; last admission at "
        f"{result.last_agent_admitted_at:.2f}s; final drain {drain:.2f}s",
        f"Open-loop admission: {result.late_admissions} late admissions; maximum admission lag "
        f"{result.max_admission_lag * 1000.0:.2f}ms",
    ]
    if totals.live_block_fallbacks > 0:
        lines.append(
            "Live block fallbacks (generated in place of a missing previous reply): "
            f"{totals.live_block_fallbacks}"
        )
    lines += [
        f"Tool invocations: {totals.planned_tool_invocations} planned; requests "
        f"{totals.total_requests} (success {totals.successful_requests}, failure "
        f"{totals.failed_requests})",
        f"Total input tokens sent: {totals.total_input_tokens}",
        f"Total output tokens generated: {totals.total_output_tokens}",
        "Estimated cached input tokens (perfect server-side caching): "
        f"{totals.estimated_cached_input_tokens}",
        f"Total simulated tool-call latency: {totals.total_tool_call_latency_seconds:.2f}s",
        f"Total duration: {duration:.2f}s; throughput: input "
        f"{_rate(totals.total_input_tokens, duration):.2f} tok/s, output "
        f"{_rate(totals.total_output_tokens, duration):.2f} tok/s, requests "
        f"{_rate(totals.total_requests, duration):.2f} req/s",
        _percentile_line("Request latency (ms)", totals.request_latencies_ms),
        _percentile_line(
            "Agent end-to-end latency (ms, completed agents)", totals.agent_latencies_ms
        ),
    ]
    if live is not None and live.stream.ttft_ms:
        stream = live.stream
        lines += [
            _percentile_line("Time to first token (ms, streamed requests)", stream.ttft_ms),
            _percentile_line("Inter-token latency (ms, streamed requests)", stream.itl_ms),
            _percentile_line("Time per output token (ms, streamed requests)", stream.tpot_ms),
        ]
    for agent, ident, invocation, error in totals.failures:
        lines.append(
            f'Failure: agent {agent} trajectory "{ident}" invocation {invocation}: {error}'
        )
    return lines


def rank_imbalance(values: list[int]) -> float | None:
    """max / mean of per-rank values; None when nothing was sent."""
    if not values:
        return None
    mean = sum(values) / len(values)
    return max(values) / mean if mean > 0 else None


def drift_line(label: str, figures: DriftFigures, no_usage: bool) -> str:
    """``<label>: <exact>/<n> exact (<pct>%), mean |drift| <x> tokens, max <y>``."""
    if not figures.requests:
        reason = "server sent no usage" if no_usage else "no successful request"
        return f"{label}: not measurable ({reason})"
    return (
        f"{label}: {figures.exact}/{figures.requests} exact ({figures.exact_percent:.1f}%), "
        f"mean |drift| {figures.mean_abs:.2f} tokens, max {figures.max_abs}"
    )


def fidelity_lines(live: LiveFigures) -> list[str]:
    """Prompt and output fidelity, what correction could not do, and cache hits that this
    run's own content cannot explain."""
    fidelity = live.fidelity
    no_usage = live.no_usage_failures > 0
    lines = [
        drift_line("Prompt fidelity", fidelity.prompt, no_usage),
        drift_line("Output fidelity", fidelity.output, no_usage),
    ]
    if fidelity.limited_requests:
        lines.append(
            f"Prompt correction could not reach the target on {fidelity.limited_requests} "
            "requests (the plan left no room; see correction_note in the request events)"
        )
    if fidelity.oracle_seconds:
        ordered = sorted(fidelity.oracle_seconds)
        lines.append(
            f"Prompt oracle: {fidelity.oracle_queries} server counts, "
            f"p50 {percentile(ordered, 0.5) * 1000.0:.2f}ms per request, "
            f"total {sum(ordered):.2f}s"
        )
    cached = live.server_cached_tokens
    if cached is not None and cached > fidelity.explainable_cached_tokens:
        lines.append(
            f"Warning: the server reported {cached} cached prompt tokens, more than perfect "
            f"caching of this run can explain ({fidelity.explainable_cached_tokens}): it holds "
            "prompts this run did not send, e.g. from an earlier run with the same "
            "--content-salt; the cache figures overstate this workload"
        )
    return lines


def live_lines(live: LiveFigures) -> list[str]:
    """This package's additions after the COMPAT summary: fidelity, server-reported cache
    hits, the per-rank table (perfect routing) and the client-health line."""
    lines = fidelity_lines(live)
    if live.server_cached_tokens is not None:
        lines.append(
            f"Server-reported cached input tokens (usage.prompt_tokens_details): "
            f"{live.server_cached_tokens}"
        )
    if live.ranks:
        lines.append(f"Per-rank load ({len(live.ranks)} ranks, perfect routing):")
        header = ("rank", "trajectories", "requests", "input_tokens", "output_tokens", "cached")
        rows = [
            (str(i), str(r.trajectories), str(r.requests), str(r.input_tokens),
             str(r.output_tokens), str(r.cached_tokens))
            for i, r in enumerate(live.ranks)
        ]  # fmt: skip
        widths = [max(len(h), *(len(row[c]) for row in rows)) for c, h in enumerate(header)]
        lines.append("  " + "  ".join(h.rjust(w) for h, w in zip(header, widths, strict=True)))
        for row in rows:
            lines.append("  " + "  ".join(v.rjust(w) for v, w in zip(row, widths, strict=True)))
        req = rank_imbalance([r.requests for r in live.ranks])
        tok = rank_imbalance([r.input_tokens for r in live.ranks])
        lines.append(
            f"Rank imbalance (max/mean): requests {_ratio(req)}, input tokens {_ratio(tok)}"
        )
    health = live.health
    if health is not None:
        per_k = health.cpu_seconds_per_1000_requests
        lines.append(
            f"Client health: event-loop lag p50={_ms_unit(health.lag_p50_ms)} "
            f"p99={_ms_unit(health.lag_p99_ms)} max={_ms_unit(health.lag_max_ms)}; "
            f"client CPU {health.cpu_seconds:.2f}s "
            f"({'n/a' if per_k is None else f'{per_k:.3f}'} s per 1000 requests); "
            f"peak in-flight requests {health.peak_in_flight}"
        )
    return lines


def _ms_unit(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}ms"


def _ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def _cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return _bool(value)
    if isinstance(value, float):
        return repr(value)
    return str(value)


@dataclass
class CsvContext:
    """Values of the CSV row that come from outside the engine and totals."""

    timestamp: str
    interrupted: bool = False
    live: LiveFigures | None = None


# This package's columns after D18's ten (live-run figures; empty in dry-run).
LIVE_CSV_COLUMNS = (
    "stream",
    "server_cached_input_tokens",
    "rank_requests_imbalance",
    "rank_input_tokens_imbalance",
    "event_loop_lag_p50_ms",
    "event_loop_lag_p99_ms",
    "event_loop_lag_max_ms",
    "client_cpu_seconds",
    "client_cpu_seconds_per_1000_requests",
    "peak_in_flight_requests",
    "batchbench_version",
)
# Prompt fidelity (after the columns above).
FIDELITY_CSV_COLUMNS = (
    "content_salt",
    "prompt_correction",
    "prompt_oracle",
    "calibrated_initial_overhead_tokens",
    "calibrated_turn_overhead_tokens",
    "prompt_fidelity_requests",
    "prompt_exact_requests",
    "prompt_exact_percent",
    "prompt_drift_mean_abs_tokens",
    "prompt_drift_max_abs_tokens",
    "output_exact_requests",
    "output_exact_percent",
    "output_drift_mean_abs_tokens",
    "output_drift_max_abs_tokens",
    "corrected_requests",
    "correction_limited_requests",
    "explainable_cached_input_tokens",
)
ALL_CSV_COLUMNS = CSV_COLUMNS + EXTRA_CSV_COLUMNS + LIVE_CSV_COLUMNS + FIDELITY_CSV_COLUMNS


def summary_values(
    config: RunConfig, totals: RunTotals, result: EngineResult, ctx: CsvContext
) -> dict[str, object]:
    """Every CSV column by name, as typed values (None for a missing value)."""
    duration = result.total_duration
    p = percentiles(totals.request_latencies_ms)
    e = percentiles(totals.agent_latencies_ms)
    replay = config.workload_mode == "trajectory_replay"
    live = ctx.live
    values = [
        ctx.timestamp,
        config.model,
        config.workload_mode,
        config.manifest_path if replay else None,
        config.manifest_sha256 if replay else None,
        config.schema_version if replay else None,
        config.admission,
        config.time_scale,
        config.agents,
        config.max_active_requested,
        result.max_active_agents,
        result.late_admissions,
        result.max_admission_lag * 1000.0,
        totals.live_block_fallbacks,
        totals.completed_agents,
        totals.planned_tool_invocations,
        totals.total_requests,
        totals.successful_requests,
        totals.failed_requests,
        totals.total_input_tokens,
        totals.total_output_tokens,
        totals.estimated_cached_input_tokens,
        totals.total_tool_call_latency_seconds,
        duration,
        result.last_agent_admitted_at,
        max(duration - result.last_agent_admitted_at, 0.0),
        _rate(totals.total_requests, duration),
        _rate(totals.total_input_tokens, duration),
        _rate(totals.total_output_tokens, duration),
        *p,
        *e,
        config.host,
        config.endpoint_url,
        config.sglang,
        config.ignore_eos,
        config.user_tagging,
        config.dp_ranks is not None,
        config.dp_ranks,
        config.seed_given,
        config.initial_overhead,
        config.turn_overhead,
        config.agent_events_jsonl,
        *config.latency_flags,
    ]
    if live is not None:
        stream = live.stream
        values += [*percentiles(stream.ttft_ms), *percentiles(stream.itl_ms)]
        values += [*percentiles(stream.tpot_ms)]
    else:
        values += [None] * 9
    values.append(ctx.interrupted)
    health = live.health if live is not None else None
    values += [
        live.streaming if live is not None else None,
        live.server_cached_tokens if live is not None else None,
        rank_imbalance([r.requests for r in live.ranks]) if live is not None else None,
        rank_imbalance([r.input_tokens for r in live.ranks]) if live is not None else None,
        health.lag_p50_ms if health else None,
        health.lag_p99_ms if health else None,
        health.lag_max_ms if health else None,
        health.cpu_seconds if health else None,
        health.cpu_seconds_per_1000_requests if health else None,
        health.peak_in_flight if health else None,
        __version__,
    ]
    calibration = config.calibration or {}
    fidelity = live.fidelity if live is not None else None
    values += [
        config.content_salt,
        config.prompt_correction if live is not None else None,
        config.prompt_oracle if live is not None else None,
        calibration.get("initial_overhead_tokens"),
        calibration.get("turn_overhead_tokens"),
    ]
    if fidelity is not None:
        prompt, output = fidelity.prompt, fidelity.output
        values += [
            prompt.requests,
            prompt.exact,
            prompt.exact_percent,
            prompt.mean_abs,
            prompt.max_abs if prompt.requests else None,
            output.exact,
            output.exact_percent,
            output.mean_abs,
            output.max_abs if output.requests else None,
            fidelity.corrected_requests,
            fidelity.limited_requests,
            fidelity.explainable_cached_tokens,
        ]
    else:
        values += [None] * 12
    return dict(zip(ALL_CSV_COLUMNS, values, strict=True))


def csv_row(
    config: RunConfig, totals: RunTotals, result: EngineResult, ctx: CsvContext
) -> list[str]:
    """The single data row: the 51 compatible columns, then this package's (D18)."""
    return [_cell(v) for v in summary_values(config, totals, result, ctx).values()]


def _ensure_parent(path: str) -> None:
    parent = os.path.dirname(path)
    if parent:
        try:
            os.makedirs(parent, exist_ok=True)
        except OSError as exc:
            raise BatchbenchError(f"failed to create {parent}: {exc.strerror or exc}") from None


def write_csv(path: str, row: list[str]) -> None:
    """Overwrite ``path`` with the header and one row, creating parent directories."""
    _ensure_parent(path)
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(ALL_CSV_COLUMNS)
    writer.writerow(row)
    try:
        with open(path, "w", encoding="utf-8", newline="") as handle:
            handle.write(buffer.getvalue())
    except OSError as exc:
        raise BatchbenchError(f"failed to write {path}: {exc.strerror or exc}") from None


def summary_document(
    config: RunConfig, totals: RunTotals, result: EngineResult, ctx: CsvContext
) -> dict:
    """The whole summary as one JSON document (``--results-json``)."""
    values = summary_values(config, totals, result, ctx)
    live = ctx.live
    document: dict = {
        "batchbench_version": __version__,
        "timestamp": ctx.timestamp,
        "interrupted": ctx.interrupted,
        "interrupted_by": live.interrupted_by if live is not None else None,
        "dry_run": config.dry_run,
        "manifest": {
            "path": config.manifest_path,
            "sha256": config.manifest_sha256,
            "schema_version": config.schema_version,
        },
        "configuration": {
            "model": config.model,
            "tokenizer_model": config.tokenizer_model,
            "tokenizer_file": config.tokenizer_source,
            "endpoint": config.endpoint_url,
            "host": config.host,
            "workload_mode": config.workload_mode,
            "agents": config.agents,
            "max_active_agents": config.max_active_requested,
            "admission": config.admission,
            "time_scale": config.time_scale,
            "replay_initial_overhead_tokens": config.initial_overhead,
            "replay_turn_overhead_tokens": config.turn_overhead,
            "sglang": config.sglang,
            "ignore_eos": config.ignore_eos,
            "stream": live.streaming if live is not None else False,
            "dp_rank_perfect_routing_num": config.dp_ranks,
            "user_tagging": config.user_tagging,
            "seed": config.seed_given,
            "content_salt": config.content_salt,
            "prompt_correction": config.prompt_correction,
            "prompt_oracle": config.prompt_oracle,
            "chat_template": config.chat_template,
            "calibration": config.calibration,
        },
        "metrics": values,
        "failures": [
            {"agent_id": a, "trajectory_id": t, "invocation": i, "error": err}
            for a, t, i, err in totals.failures
        ],
    }
    if live is not None:
        document["fidelity"] = fidelity_document(live)
        document["ranks"] = [{"rank": i, **dataclasses.asdict(r)} for i, r in enumerate(live.ranks)]
        if live.health is not None:
            document["client_health"] = dataclasses.asdict(live.health)
    return document


def _drift_document(figures: DriftFigures) -> dict:
    return {
        "requests": figures.requests,
        "exact": figures.exact,
        "exact_percent": figures.exact_percent,
        "mean_abs_drift": figures.mean_abs,
        "max_abs_drift": figures.max_abs if figures.requests else None,
        "histogram": {str(k): v for k, v in sorted(figures.histogram.items())},
    }


def fidelity_document(live: LiveFigures) -> dict:
    """The fidelity section of the results JSON: figures, drift histograms and drift by
    turn index (0-based request number within its trajectory)."""
    fidelity = live.fidelity
    return {
        "prompt": _drift_document(fidelity.prompt),
        "output": _drift_document(fidelity.output),
        "prompt_by_turn": {
            str(turn): _drift_document(figures)
            for turn, figures in sorted(fidelity.prompt_by_turn.items())
        },
        "corrected_requests": fidelity.corrected_requests,
        "correction_limited_requests": fidelity.limited_requests,
        "oracle_queries": fidelity.oracle_queries,
        "oracle_seconds_total": sum(fidelity.oracle_seconds),
        "explainable_cached_input_tokens": fidelity.explainable_cached_tokens,
        "server_cached_input_tokens": live.server_cached_tokens,
        "framing": live.framing,
    }


def write_json(path: str, document: dict) -> None:
    _ensure_parent(path)
    try:
        with open(path, "wb") as handle:
            handle.write(
                orjson.dumps(document, option=orjson.OPT_INDENT_2 | orjson.OPT_APPEND_NEWLINE)
            )
    except OSError as exc:
        raise BatchbenchError(f"failed to write {path}: {exc.strerror or exc}") from None
