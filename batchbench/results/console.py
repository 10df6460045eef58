"""What a run prints and writes: banner, dry-run lines, summary, CSV and JSON, all from
the run's named records (see docs/outputs.md). Named for the console it mostly serves;
the HTML report is ``batchbench.report``."""

from __future__ import annotations

import csv
import dataclasses
import io
from collections.abc import Iterable, Sequence

import orjson

from batchbench import __version__
from batchbench.config import RunConfig
from batchbench.errors import BatchbenchError
from batchbench.plan.sampling import describe_latency, short_float
from batchbench.plan.workload import Workload
from batchbench.results.documents import (
    ConfigurationSection,
    FailureRow,
    LiveSections,
    ManifestSection,
    SummaryDocument,
    fidelity_results_view,
)
from batchbench.results.formatting import MISSING, csv_cell, fixed, flag
from batchbench.results.lifecycle import EngineResult
from batchbench.results.metrics import percentile
from batchbench.results.placement import (
    placement_lines,
    probe_lines,
    rank_health_lines,
    rank_layout_lines,
)
from batchbench.results.recording import DriftFigures
from batchbench.results.summary import (
    ALL_CSV_COLUMNS,
    CSV_COLUMNS,
    EXTRA_CSV_COLUMNS,
    FIDELITY_CSV_COLUMNS,
    LIVE_CSV_COLUMNS,
    LOSS_CSV_COLUMNS,
    OUTCOME_CSV_COLUMNS,
    LiveFigures,
    RunSetup,
    Summary,
    rank_imbalance,
)
from batchbench.scale.partition import RAMP_FREE_AGENTS, ramp_up_seconds

__all__ = [
    "ALL_CSV_COLUMNS",
    "CSV_COLUMNS",
    "EXTRA_CSV_COLUMNS",
    "FIDELITY_CSV_COLUMNS",
    "LIVE_CSV_COLUMNS",
    "LOSS_CSV_COLUMNS",
    "OUTCOME_CSV_COLUMNS",
    "banner_lines",
    "csv_row",
    "dry_run_lines",
    "live_lines",
    "summary_document",
    "summary_lines",
    "summary_model",
    "write_csv",
    "write_json",
]

Failure = tuple[int, str, int, str]  # (agent, trajectory id, invocation, error)


def scale_lines(config: RunConfig, setup: RunSetup) -> list[str]:
    """The ramp-up of a closed-loop live run, and the shard a process runs."""
    lines = []
    if not config.dry_run and config.admission_mode == "closed-loop":
        ramp = ramp_up_seconds(config, setup.agents)
        if config.ramp_up is not None:
            text = f"{short_float(ramp)} s (--ramp-up)" if ramp > 0 else "none (--ramp-up 0)"
        elif ramp > 0:
            text = f"{short_float(ramp)} s (default above {RAMP_FREE_AGENTS} active agents)"
        else:
            text = f"none (default up to {RAMP_FREE_AGENTS} active agents)"
        lines.append(f"Ramp-up: {text}")
    if config.shard is not None:
        # A worker of --workers W runs shard (i + kN)/(N·W) of the user's shard i/N.
        shard, workers = config.shard_spec(), max(config.workers, 1)
        i, n = shard.index % (shard.count // workers), shard.count // workers
        if n > 1:
            lines.append(f"Shard: {i}/{n} (routing slots {i}, {i + n}, ...)")
        if workers > 1 and n > 1:
            lines.append(
                f"Workers: {workers} processes (worker k runs shard {i}+{n}k of {n * workers})"
            )
        elif workers > 1:
            lines.append(
                f"Workers: {workers} processes (worker k owns routing slots k, k+{workers}, ...)"
            )
    return lines


def banner_lines(config: RunConfig, setup: RunSetup) -> list[str]:
    """The configuration banner, ending with the blank line that follows it."""
    lines = [
        "=== Agent Loop Benchmark Configuration ===",
        f"Endpoint: {config.endpoint_url or 'none (dry run)'}",
        f"Model: {config.model or 'none'}",
        f"Tokenizer: {config.tokenizer}",
        f"Tokenizer file: {setup.tokenizer_source}",
    ]
    if config.workload_mode == "trajectory_replay":
        max_active = (
            "all manifest trajectories"
            if config.max_active_agents is None
            else str(config.max_active_agents)
        )
        lines += [
            f"Workload: trajectory replay from {config.agent_plans_jsonl}",
            f"Trajectory manifest SHA-256: {setup.manifest_sha256}",
            "Replay prompt overhead: initial/reset "
            f"{setup.replay_initial_overhead_tokens or 0} tokens; "
            f"appended turn {setup.replay_turn_overhead_tokens or 0} tokens",
            f"Maximum active agents: {max_active}",
            f"Admission: {config.admission_mode}; "
            f"time scale {short_float(config.time_scale_factor)}",
        ]
    else:
        shape = config.shape
        requested = config.max_active_agents
        active = setup.agents if requested is None else min(requested, setup.agents)
        lines += [
            f"Total synthetic agents: {setup.agents}",
            f"Maximum active agents: {active}",
            f"Initial prompt: {shape.input.describe()}",
            f"Model response: {shape.output.describe()}",
            f"Environment response: {shape.environment.describe()}",
            f"Tool invocations per agent: {shape.tool_invocations.describe()}",
            f"Tool-call latency: {describe_latency(shape.latency)}",
        ]
    if config.arrival_rate is not None:
        lines.append(
            f"Arrivals: open loop, {short_float(config.arrival_rate)} agents/s "
            f"({config.arrival_process_name}, seeded)"
        )
    token_params = (
        "sglang (min_new_tokens/max_new_tokens)"
        if config.sglang
        else "default (min_tokens/max_tokens)"
    )
    routing = f"enabled ({config.dp_ranks} ranks)" if config.dp_ranks else "disabled"
    lines += [
        f"Output token params: {token_params}",
        f"Ignore EOS: {flag(config.ignore_eos)}",
        f"DP-rank perfect routing: {routing}",
        *rank_layout_lines(setup.rank_workers, config.routed_worker_header),
        *probe_lines(setup.probes),
        f"Per-agent user tagging: {'enabled' if config.user_tagging else 'disabled'}",
        f"Content salt: {setup.content_salt}",
    ]
    if not config.dry_run:
        lines.append(f"Prompt correction: {prompt_correction_text(config, setup)}")
    lines += scale_lines(config, setup)
    if setup.calibration is not None:
        calibration = setup.calibration
        verdict = "OK" if calibration["check_ok"] else "MISMATCH"
        lines.append(
            f"Calibrated overhead: initial {calibration['initial_overhead_tokens']} tokens; "
            f"turn {calibration['turn_overhead_tokens']} tokens (check {verdict})"
        )
    lines += ["==========================================", ""]
    return lines


def prompt_correction_text(config: RunConfig, setup: RunSetup) -> str:
    """One phrase: how the run keeps prompts on target."""
    if not config.prompt_correction:
        return "off (plan sizes sent unchanged)"
    parts = ["on"]
    if config.workload_mode != "trajectory_replay":
        parts.append(f"framing initial {setup.framing_initial}, turn {setup.framing_turn} tokens")
    parts.append(
        f"replies counted in the {setup.chat_template} template"
        if setup.chat_template
        else "replies counted on their own"
    )
    if config.prompt_oracle == "server":
        parts.append("sized by the server's count")
    return "; ".join(parts)


def dry_run_lines(workload: Workload, result: EngineResult) -> Iterable[str]:
    """One ``[DRY-RUN]`` line per planned request of each admitted trajectory, by agent id."""
    records = sorted(result.records, key=lambda r: r.agent_id)
    content = workload.input_content_tokens
    output = workload.output_tokens
    environment = workload.environment_tokens
    latency = workload.tool_call_latency_ms
    target = workload.target_prompt_tokens
    reset = workload.reset_before
    blocks = workload.blocks
    stream = workload.request_stream
    cap = workload.request_max_tokens
    for record in records:
        agent = record.agent_id
        prefix = f"[DRY-RUN] agent={agent} invocation="
        ident = workload.trajectory_ids[agent]
        admitted_ms = int(record.admitted_at * 1000.0)
        in_blocks = workload.has_blocks(agent)
        for number, request in enumerate(workload.turns(agent), start=1):
            line = (
                f"{prefix}{number} input_content_tokens={content[request]} "
                f"output_tokens={output[request]} environment_tokens={environment[request]} "
                f"tool_call_latency_ms={int(latency[request])} trajectory_id={ident} "
                f"routing_slot={record.routing_slot} admitted_at_ms={admitted_ms} "
                f"target_prompt_tokens={target[request]} "
                f"reset_before={flag(bool(reset[request]) and number > 1)}"
            )
            if in_blocks:
                assert blocks is not None  # has_blocks
                rows = blocks.of(request)
                live = int(blocks.live[rows.start : rows.stop].sum())
                line += f" blocks={len(rows)} live_blocks={live}"
            if stream is not None and stream[request] >= 0:
                line += f" stream={flag(bool(stream[request]))}"
            if cap is not None and cap[request] > 0:
                line += f" max_tokens={cap[request]}"
            yield line


def _failed_throughput(s: Summary) -> str:
    """After ``requests <x> req/s`` (sent requests, failed ones included: its compatibility
    definition), when some failed: the rate of successful ones."""
    if not s.failed_requests:
        return ""
    duration = s.total_duration_seconds
    succeeded = s.successful_requests / duration if duration > 0 else 0.0
    return f" (failed included; {succeeded:.2f} req/s succeeded)"


def _percentile_line(label: str, p50: float | None, p90: float | None, p99: float | None) -> str:
    return f"{label}: p50={fixed(p50)} p90={fixed(p90)} p99={fixed(p99)}"


def summary_lines(
    summary: Summary,
    failures: Sequence[Failure] = (),
    interrupted_by: str | None = None,
    verbose: bool = False,
) -> list[str]:
    """The console summary: admission, requests and where each planned one went, tokens,
    throughput and latency; the interruption line first; failed attempts by kind and the
    first failed agents last (all of them with ``verbose``)."""
    s = summary
    lines = []
    if interrupted_by:
        lines.append(
            f"Interrupted by {interrupted_by}: admission stopped; results cover work "
            "finished before shutdown"
        )
    lines += [
        f"Agents: {s.completed_agents} completed / {s.agents} total",
        f"Rolling admission: {s.max_active_agents} maximum active; last admission at "
        f"{s.last_agent_admitted_seconds:.2f}s; final drain {s.final_drain_seconds:.2f}s",
    ]
    if s.admission_mode == "open-loop":  # closed loop has no schedule to be late against
        lines.append(
            f"Open-loop admission: {s.late_admissions} late admissions; maximum admission "
            f"lag {s.max_admission_lag_ms:.2f}ms"
        )
    if s.live_block_fallbacks > 0:
        lines.append(
            "Live block fallbacks (generated in place of a missing previous reply): "
            f"{s.live_block_fallbacks}"
        )
    lines += [
        f"Tool invocations: {s.planned_tool_invocations} planned; requests "
        f"{s.total_requests} (success {s.successful_requests}, failure "
        f"{s.failed_requests})",
    ]
    if s.stream is not None:  # a live run: every planned request in exactly one bucket
        lines.append(
            f"Requests by outcome: {s.planned_tool_invocations} planned = "
            f"{s.successful_requests} succeeded + {s.failed_requests} failed + "
            f"{s.cancelled_requests} cancelled + {s.skipped_requests} skipped"
            f"{f' + {s.lost_requests} lost' if s.lost_requests else ''}; "
            f"{s.attempts} attempts ({s.retries} retries)"
        )
    lines += [
        f"Total input tokens sent: {s.total_input_tokens}",
        f"Total output tokens generated: {s.total_output_tokens}",
        "Estimated cached input tokens (perfect server-side caching): "
        f"{s.estimated_cached_input_tokens}",
        f"Total simulated tool-call latency: {s.total_tool_call_latency_seconds:.2f}s",
        f"Total duration: {s.total_duration_seconds:.2f}s; throughput: input "
        f"{s.input_tokens_per_second:.2f} tok/s, output "
        f"{s.output_tokens_per_second:.2f} tok/s, requests "
        f"{s.requests_per_second:.2f} req/s{_failed_throughput(s)}",
        _percentile_line(
            "Request latency (ms)", s.latency_p50_ms, s.latency_p90_ms, s.latency_p99_ms
        ),
        _percentile_line(
            "Agent end-to-end latency (ms, completed agents)",
            s.agent_end_to_end_latency_p50_ms,
            s.agent_end_to_end_latency_p90_ms,
            s.agent_end_to_end_latency_p99_ms,
        ),
    ]
    if s.ttft_p50_ms is not None:
        lines += [
            _percentile_line(
                "Time to first token (ms, streamed requests)",
                s.ttft_p50_ms, s.ttft_p90_ms, s.ttft_p99_ms,
            ),
            _percentile_line(
                "Inter-token latency (ms, streamed requests)",
                s.inter_token_latency_p50_ms, s.inter_token_latency_p90_ms,
                s.inter_token_latency_p99_ms,
            ),
            _percentile_line(
                "Time per output token (ms, streamed requests)",
                s.tpot_p50_ms, s.tpot_p90_ms, s.tpot_p99_ms,
            ),
        ]  # fmt: skip
    lines += error_lines(s)
    shown = failures if verbose else failures[:FAILURES_SHOWN]
    for agent, ident, invocation, error in shown:
        lines.append(
            f'Failure: agent {agent} trajectory "{ident}" invocation {invocation}: {error}'
        )
    if len(failures) > len(shown):
        lines.append(
            f"… and {len(failures) - len(shown)} more failed agents (all of them in the results "
            "JSON, the request events and --verbose)"
        )
    return lines


FAILURES_SHOWN = 10  # failed agents listed one per line; the rest are counted


EXAMPLE_LIMIT = 100


def error_lines(summary: Summary) -> list[str]:
    """Failed attempts by kind: a count and the first message of each kind; requests
    resent because the server closed a kept-alive connection under them."""
    resent = []
    if summary.resent_requests:
        resent.append(
            f"Requests resent on a new connection: {summary.resent_requests} (the server "
            "closed a kept-alive connection as they went out, before answering)"
        )
    kinds = summary.errors_by_kind
    if not kinds:
        return resent
    rows = []
    for kind, entry in sorted(kinds.items(), key=lambda item: (-int(item[1]["count"]), item[0])):
        label = kind
        statuses = entry.get("statuses")
        if statuses:
            label += " (" + ", ".join(f"{code}: {n}" for code, n in statuses.items()) + ")"
        example = str(entry["example"])
        if len(example) > EXAMPLE_LIMIT:
            example = example[: EXAMPLE_LIMIT - 1] + "…"
        rows.append((label, str(entry["count"]), example))
    total = sum(int(entry["count"]) for entry in kinds.values())
    width = max(len("kind"), *(len(row[0]) for row in rows))
    count_width = max(len("attempts"), *(len(row[1]) for row in rows))
    lines = [f"Failed attempts by kind ({total}; every one is in the JSON and request events):"]
    lines.append(f"  {'kind'.ljust(width)}  {'attempts'.rjust(count_width)}  example")
    for label, count, example in rows:
        lines.append(f"  {label.ljust(width)}  {count.rjust(count_width)}  {example}")
    if summary.retry_waits_capped:
        lines.append(f"Retry-After waits capped at --max-retry-wait: {summary.retry_waits_capped}")
    return lines + resent


def verdict_lines(summary: Summary) -> list[str]:
    """The last line of a run whose failures exceed --max-failure-rate (exit status 3), or
    that lost requests with a worker (exit status 1)."""
    if summary.verdict == "incomplete":
        return [
            f"Result: INCOMPLETE: {summary.lost_requests} of "
            f"{summary.planned_tool_invocations} planned requests were lost with a worker "
            "(not recorded); exit status 1"
        ]
    if summary.verdict != "failed":
        return []
    sent = summary.successful_requests + summary.failed_requests
    return [
        f"Result: FAILED: {summary.failed_requests} of {sent} sent requests failed "
        f"({summary.failure_rate * 100:.1f}%; --max-failure-rate "
        f"{summary.max_failure_rate * 100:g}%); exit status 3"
    ]


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
    lines = [drift_line("Prompt fidelity", fidelity.prompt, no_usage)]
    if live.prompt_cause is not None:
        lines.append(live.prompt_cause)
    lines.append(drift_line("Output fidelity", fidelity.output, no_usage))
    if live.output_cause is not None:
        lines.append(live.output_cause)
    if fidelity.limited_requests:
        lines.append(
            f"Prompt correction could not reach the target on {fidelity.limited_requests} "
            "requests (the plan left no room; see correction_note in the request events)"
        )
    if fidelity.inexact_tool_blocks:
        lines.append(
            f"Tool blocks sent at the closest size (no text gives their JSON the planned "
            f"count): {fidelity.inexact_tool_blocks}"
        )
    if fidelity.oracle_seconds:
        ordered = sorted(fidelity.oracle_seconds)
        median = percentile(ordered, 0.5)
        assert median is not None  # there are samples
        lines.append(
            f"Prompt oracle: {fidelity.oracle_queries} server counts, "
            f"p50 {median * 1000.0:.2f}ms per request, "
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
    """After the summary, what only a live run has: fidelity, server-reported cache hits,
    the per-rank table (perfect routing) and the client-health line."""
    lines = fidelity_lines(live)
    if not live.streamed_requests and not live.stream.ttft_ms:  # no request streamed
        why = (
            'every request of the manifest sets "stream": false'
            if live.streaming
            else "--no-stream: replies were not streamed"
        )
        lines.append(f"Time to first token, inter-token latency, TPOT: not measured ({why})")
    if live.server_cached_tokens is not None:
        sent = live.input_tokens
        share = (
            f" ({100.0 * live.server_cached_tokens / sent:.1f}% of input tokens)" if sent else ""
        )
        lines.append(
            f"Server-reported cached input tokens (usage.prompt_tokens_details): "
            f"{live.server_cached_tokens}{share}"
        )
    if live.shared_blocks and live.server_cached_tokens is not None:
        lines.append(
            "Cached input tokens with the blocks trajectories share (perfect prefix caching, "
            f"at most): {live.fidelity.explainable_cached_tokens}; the estimate above counts "
            "each trajectory's own earlier prompts only"
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
        lines.append(f"Rank imbalance (max/mean): requests {fixed(req)}, input tokens {fixed(tok)}")
        lines += placement_lines(live.ranks, live.worker_header, live.rank_headers)
        lines += rank_health_lines(live.ranks, live.rank_failover)
    health = live.health
    if health is not None:
        per_k = health.cpu_seconds_per_1000_requests
        if per_k is None:
            cost = ""
        elif live.requests >= 1000:
            cost = f" ({per_k:.3f} s per 1000 requests)"
        else:  # a per-1000 figure from a handful of requests would be mostly start-up
            cost = f" ({per_k:.2f} ms per request over {live.requests} requests)"
        lines.append(
            f"Client health: event-loop lag p50={fixed(health.lag_p50_ms, unit='ms')} "
            f"p99={fixed(health.lag_p99_ms, unit='ms')} "
            f"max={fixed(health.lag_max_ms, unit='ms')}; "
            f"client CPU {health.cpu_seconds:.2f}s{cost}; "
            f"peak in-flight requests {health.peak_in_flight}"
        )
    return lines


# A baseline scrape this close before the window's start is its start (a scrape is taken
# there, a little early: see MARK_LEAD_SECONDS in batchbench.results.scrape).
COVERED_SLACK_SECONDS = 0.1


def server_rank_lines(rows: Sequence[dict], window: dict | None = None) -> list[str]:
    """Per-rank load from the server's own metrics, when the client does not route;
    ``window`` (the server_metrics document's) names the scrapes the counts run between."""
    if not rows:
        return []
    header = ("rank", "requests", "input_tokens", "output_tokens", "ttft_p50_ms", "ttft_p99_ms")

    def cell(value) -> str:
        if value is None:
            return MISSING
        return (
            f"{value:.2f}"
            if isinstance(value, float) and not value.is_integer()
            else (str(int(value)))
        )

    table = [
        (str(row.get("label", row.get("rank"))), *(cell(row.get(name)) for name in header[1:]))
        for row in rows
    ]
    widths = [max(len(h), *(len(r[c]) for r in table)) for c, h in enumerate(header)]
    covered = "over the measured window"
    low = (window or {}).get("counters_from_seconds")
    high = (window or {}).get("counters_to_seconds")
    if low is not None and high is not None:
        covered = f"counted between scrapes at {low:.2f}s and {high:.2f}s"
        start = (window or {}).get("start_seconds")
        if isinstance(start, int | float) and start - low > COVERED_SLACK_SECONDS:
            covered += f" (the measured window starts at {start:.2f}s)"
    lines = [
        f"Per-rank load ({len(rows)} {'rank' if len(rows) == 1 else 'ranks'}, from the "
        f"server's metrics {covered}; completions counted at scrape times):"
    ]
    lines.append("  " + "  ".join(h.rjust(w) for h, w in zip(header, widths, strict=True)))
    for row in table:
        lines.append("  " + "  ".join(v.rjust(w) for v, w in zip(row, widths, strict=True)))
    requests = [int(r["requests"]) for r in rows if r.get("requests") is not None]
    if len(requests) == len(rows) > 1:
        lines.append(f"Rank imbalance (max/mean): requests {fixed(rank_imbalance(requests))}")
    return lines


def csv_row(summary: Summary) -> list[str]:
    """The single data row, one cell per summary field in column order."""
    return [csv_cell(getattr(summary, name)) for name in ALL_CSV_COLUMNS]


def write_csv(path: str, row: list[str], extra: Sequence[tuple[str, str]] = ()) -> None:
    """Overwrite ``path`` with the header and one row (its directory was checked before
    the run); ``extra`` (column, cell) pairs follow the fixed columns."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow([*ALL_CSV_COLUMNS, *(column for column, _ in extra)])
    writer.writerow([*row, *(cell for _, cell in extra)])
    try:
        with open(path, "w", encoding="utf-8", newline="") as handle:
            handle.write(buffer.getvalue())
    except OSError as exc:
        raise BatchbenchError(f"failed to write {path}: {exc.strerror or exc}") from None


def summary_document(
    config: RunConfig,
    setup: RunSetup,
    summary: Summary,
    failures: Sequence[Failure] = (),
    live: LiveFigures | None = None,
) -> dict:
    """The whole summary as one JSON document (``--results-json``)."""
    return summary_model(config, setup, summary, failures, live).to_json()


def summary_model(
    config: RunConfig,
    setup: RunSetup,
    summary: Summary,
    failures: Sequence[Failure] = (),
    live: LiveFigures | None = None,
) -> SummaryDocument:
    """The run's summary as the typed results document (without the finished run's further
    sections, which ``batchbench.stages.outputs`` adds)."""
    live_sections = None
    if live is not None:
        live_sections = LiveSections(
            fidelity=fidelity_results_view(live.fidelity, live.server_cached_tokens, live.framing),
            ranks=[{"rank": i, **r.as_row()} for i, r in enumerate(live.ranks)],
            client_health=dataclasses.asdict(live.health) if live.health is not None else None,
        )
    return SummaryDocument(
        batchbench_version=__version__,
        timestamp=setup.timestamp,
        interrupted=summary.interrupted,
        interrupted_by=live.interrupted_by if live is not None else None,
        dry_run=config.dry_run,
        manifest=ManifestSection(
            path=config.agent_plans_jsonl,
            sha256=setup.manifest_sha256,
            schema_version=setup.schema_version,
            sources=setup.sources,
        ),
        configuration=ConfigurationSection(
            model=config.model,
            tokenizer_model=config.tokenizer,
            tokenizer_file=setup.tokenizer_source,
            endpoint=config.endpoint_url,
            host=config.host,
            workload_mode=config.workload_mode,
            agents=setup.agents,
            max_active_agents=config.max_active_agents,
            admission=config.admission_mode,
            time_scale=config.time_scale_factor,
            replay_initial_overhead_tokens=setup.replay_initial_overhead_tokens,
            replay_turn_overhead_tokens=setup.replay_turn_overhead_tokens,
            sglang=config.sglang,
            ignore_eos=config.ignore_eos,
            stream=live.streaming if live is not None else False,
            dp_rank_perfect_routing_num=config.dp_ranks,
            user_tagging=config.user_tagging,
            # The seed the run used: --seed, or the one drawn when it was not given (the
            # CSV's seed column keeps its compatibility meaning: --seed as given).
            seed=config.seed if config.seed is not None else setup.root_seed,
            content_salt=setup.content_salt,
            prompt_correction=config.prompt_correction,
            replay_reasoning=config.replay_reasoning,
            prompt_oracle=config.prompt_oracle,
            chat_template=setup.chat_template,
            calibration=setup.calibration,
        ),
        metrics=summary.as_dict(),
        failures=tuple(FailureRow(a, t, i, err) for a, t, i, err in failures),
        live=live_sections,
    )


def write_json(path: str, document: dict) -> None:
    try:
        with open(path, "wb") as handle:
            handle.write(
                orjson.dumps(document, option=orjson.OPT_INDENT_2 | orjson.OPT_APPEND_NEWLINE)
            )
    except OSError as exc:
        raise BatchbenchError(f"failed to write {path}: {exc.strerror or exc}") from None
