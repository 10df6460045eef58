"""What a run prints and writes: banner, dry-run lines, summary, CSV (COMPAT §6)."""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Iterable
from dataclasses import dataclass

from batchbench.config import RunConfig
from batchbench.engine import EngineResult
from batchbench.metrics import RunTotals, percentiles
from batchbench.sampling import describe_latency, short_float
from batchbench.workload import Workload

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
        "==========================================",
        "",
    ]
    return lines


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


def summary_lines(totals: RunTotals, result: EngineResult) -> list[str]:
    """The console summary of §6.4."""
    duration = result.total_duration
    drain = max(duration - result.last_agent_admitted_at, 0.0)
    lines = [
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
    p = percentiles(totals.request_latencies_ms)
    e = percentiles(totals.agent_latencies_ms)
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
        f"Request latency (ms): p50={_ms(p[0])} p90={_ms(p[1])} p99={_ms(p[2])}",
        "Agent end-to-end latency (ms, completed agents): "
        f"p50={_ms(e[0])} p90={_ms(e[1])} p99={_ms(e[2])}",
    ]
    for agent, ident, invocation, error in totals.failures:
        lines.append(
            f'Failure: agent {agent} trajectory "{ident}" invocation {invocation}: {error}'
        )
    return lines


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


def csv_row(
    config: RunConfig, totals: RunTotals, result: EngineResult, ctx: CsvContext
) -> list[str]:
    """The single data row: the 51 compatible columns, then this package's (D18)."""
    duration = result.total_duration
    p = percentiles(totals.request_latencies_ms)
    e = percentiles(totals.agent_latencies_ms)
    replay = config.workload_mode == "trajectory_replay"
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
    values += [None] * 9 + [ctx.interrupted]  # streaming percentiles arrive with the driver
    return [_cell(v) for v in values]


def write_csv(path: str, row: list[str]) -> None:
    """Overwrite ``path`` with the header and one row, creating parent directories."""
    parent = os.path.dirname(path)
    if parent:
        os.makedirs(parent, exist_ok=True)
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(CSV_COLUMNS + EXTRA_CSV_COLUMNS)
    writer.writerow(row)
    with open(path, "w", encoding="utf-8", newline="") as handle:
        handle.write(buffer.getvalue())
