"""Stage 5, finishing: what the run measured as a ``RunResult`` (the summary, the measured
window, the results JSON sections, the exit status); a shard's raw data beside it. Writes
nothing (``outputs`` does)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import orjson

from batchbench.config import RunConfig
from batchbench.drive.wire import DP_RANK_HEADERS, MISSING_USAGE, NO_STREAM_USAGE
from batchbench.plan.workload import Workload
from batchbench.results.console import dry_run_lines, summary_model
from batchbench.results.documents import SummaryDocument
from batchbench.results.fidelitycause import output_fidelity_cause, prompt_fidelity_cause
from batchbench.results.lifecycle import EngineResult
from batchbench.results.metrics import RunTotals, StreamSamples
from batchbench.results.recording import ClientHealth, FidelityFigures, RankFigures
from batchbench.results.sections import distributions, rank_rows
from batchbench.results.summary import LiveFigures, RunSetup, Summary, build_summary
from batchbench.results.window import WindowFigures, WindowInputs, server_verdict, window_figures
from batchbench.stages.admission import planned_counts
from batchbench.stages.liverun import LiveRun

if TYPE_CHECKING:  # the client's stages: a merge finishes its result without loading them
    from batchbench.scale.partial import ShardData
    from batchbench.stages.execute import Executed
    from batchbench.stages.prepare import Prepared

NO_USAGE_ERRORS = (MISSING_USAGE, NO_STREAM_USAGE)
EXIT_REQUESTS_FAILED = 3  # the run finished, but more requests failed than allowed
EXIT_REQUESTS_LOST = 1  # the run finished, but a worker died with requests not recorded
Failure = tuple[int, str, int, str]  # (agent, trajectory id, invocation, error)


@dataclass(frozen=True, repr=False)
class RunResult:
    """Everything one run measured, by name.

    ``summary`` holds every summary figure (the CSV columns and the results JSON's
    ``metrics`` keys); the rest is what the console and the JSON show beyond it, with what
    only a live run has in ``live`` (and by name: ``ranks``, ``fidelity``, ...). Its repr
    is short: asyncio's runner builds the repr of the task that returned it (3.8 s for
    100,000 dry-run trajectories when it spelled out every record).
    """

    config: RunConfig  # as run: with --sim, the simulator's URL as host
    setup: RunSetup
    summary: Summary
    failures: tuple[Failure, ...]  # one per failed agent, with its last error
    lifecycle: Sequence[dict[str, Any]]  # the lifecycle records, in finish order
    exit_status: int  # 0; 3 when failures exceed --max-failure-rate; 130/143 interrupted
    workload: Workload | None  # None for results merged from shards
    engine: EngineResult
    written: tuple[tuple[str, str], ...] = ()  # (what, path) of every file written
    live: LiveFigures | None = None  # what only a live run measures
    window: WindowFigures | None = None  # the measured window (live runs)
    sections: dict[str, Any] | None = None  # results JSON sections beyond the summary
    finished_by: str | None = None  # "duration" / "window" when a planned end stopped it
    shard_data: ShardData | None = None  # a shard's raw measurements (--shard, workers)
    merged_dry_run_lines: tuple[str, ...] = ()  # merged dry-run shards: their lines
    lost_workers: tuple[str, ...] = ()  # --workers: each worker that died, and what it cost

    @property
    def dry_run(self) -> bool:
        return self.config.dry_run

    @property
    def ranks(self) -> tuple[RankFigures, ...]:
        """Per DP rank with perfect routing (live runs)."""
        return tuple(self.live.ranks) if self.live is not None else ()

    @property
    def fidelity(self) -> FidelityFigures | None:
        return self.live.fidelity if self.live is not None else None

    @property
    def client_health(self) -> ClientHealth | None:
        return self.live.health if self.live is not None else None

    @property
    def stream(self) -> StreamSamples | None:
        """Streamed latency samples (live runs)."""
        return self.live.stream if self.live is not None else None

    @property
    def framing(self) -> dict | None:
        """What the run learned of the server's framing."""
        return self.live.framing if self.live is not None else None

    @property
    def interrupted_by(self) -> str | None:
        """ "SIGINT" or "SIGTERM" when a signal stopped the run."""
        return self.live.interrupted_by if self.live is not None else None

    def document(self) -> SummaryDocument:
        """The results JSON as the typed document ``--results-json`` writes (a shard's
        ``shard`` section, which names the raw data file, only in the file)."""
        model = summary_model(self.config, self.setup, self.summary, self.failures, self.live)
        return replace(model, sections=dict(self.sections or {}))

    def to_dict(self) -> dict[str, Any]:
        """The results JSON document, exactly as ``--results-json`` holds it: plain JSON
        values (lists, dicts, str, int, float, bool, None), with or without that file."""
        return orjson.loads(orjson.dumps(self.document().to_json()))

    def __repr__(self) -> str:
        return (
            f"RunResult(exit_status={self.exit_status}, dry_run={self.dry_run}, "
            f"trajectories={len(self.engine.records)}, written={self.written!r})"
        )


def finish(prepared: Prepared, executed: Executed) -> RunResult:
    """The result of this process's run; a shard's carries its raw data for the merge."""
    config, workload, share = prepared.config, prepared.workload, prepared.share
    counts = planned_counts(workload, share)
    live = executed.live
    never = None
    if live is not None:  # trajectories never started: all their requests were skipped
        started_agents = live.recorder.started_agents
        ids = share.agents if share is not None else range(len(workload))
        never = sum(len(workload.turns(a)) for a in ids if a not in started_agents)
    result = finish_run(
        config, prepared.setup, counts, never, workload, executed.engine, live,
        executed.lifecycle,
    )  # fmt: skip
    shard = config.shard_spec()
    if shard is None:
        return result
    # A dry run's lines need the workload, which a merge may not have.
    lines = list(dry_run_lines(workload, executed.engine)) if config.dry_run else None
    from batchbench.scale.snapshot import snapshot  # lazy: shard runs only (start-up)

    data = snapshot(config, prepared.setup, (shard.index, shard.count), counts,
                    executed.engine, live, executed.lifecycle, executed.wall_origin,
                    dry_run_lines=lines)  # fmt: skip
    return replace(result, shard_data=data)


def finish_run(
    config: RunConfig,
    setup: RunSetup,
    planned: tuple[int, int],
    never_started_requests: int | None,
    workload: Workload | None,
    engine: EngineResult,
    live: LiveRun | None,
    lifecycle: Sequence[dict[str, Any]],
) -> RunResult:
    """The result of a finished run (or of merged shards): ``planned`` is (trajectories,
    requests) the run owned; ``never_started_requests`` the requests of trajectories that
    never started (counted as skipped). Writes nothing."""
    completed = [r for r in engine.records if r.completed]
    if live is None:
        totals = RunTotals()  # a dry run sends nothing: no request counts as sent
        figures = None
    else:
        totals = live.recorder.totals
        recorder = live.recorder
        figures = LiveFigures(
            stream=recorder.stream,
            server_cached_tokens=recorder.server_cached_tokens,
            ranks=recorder.ranks,
            health=recorder.health(),
            interrupted_by=live.interrupted_by,
            streaming=config.stream,
            streamed_requests=_streamed_requests(config, workload),
            shared_blocks=(
                workload is not None
                and workload.blocks is not None
                and bool(workload.blocks.shared.any())
            ),
            fidelity=recorder.fidelity,
            framing=live.framing.learned() if config.prompt_correction else None,
            prompt_cause=prompt_fidelity_cause(
                recorder.fidelity,
                live.framing.learned() if config.prompt_correction else None,
                no_usage=any(f[3] in NO_USAGE_ERRORS for f in totals.failures),
                prompt_correction=config.prompt_correction,
                calibrate=config.calibrate,
                calibrated=setup.calibration is not None,
                calibration_check_ok=(
                    setup.calibration.get("check_ok") if setup.calibration is not None else None
                ),
                calibration_note=setup.calibration_note,
                started_from=(setup.framing_initial, setup.framing_turn),
                flags=(config.replay_initial_overhead_tokens, config.replay_turn_overhead_tokens),
                tokenizer=config.tokenizer,
                chat_template=setup.chat_template,
            ),
            output_cause=output_fidelity_cause(
                recorder.fidelity, ignore_eos=config.ignore_eos, sglang=config.sglang
            ),
            no_usage_failures=sum(1 for f in totals.failures if f[3] in NO_USAGE_ERRORS),
            requests=totals.total_requests,
            input_tokens=totals.total_input_tokens,
            worker_header=config.routed_worker_header,
            rank_headers=DP_RANK_HEADERS[config.dp_rank_header],
            rank_failover=config.rank_failover,
        )
    if live is not None and never_started_requests:
        live.recorder.requests_skipped(None, never_started_requests)
    totals.agents = planned[0]
    totals.completed_agents = len(completed)
    totals.planned_tool_invocations = planned[1]
    totals.agent_latencies_ms = [r.loop_seconds * 1000.0 for r in completed]
    interrupted = live is not None and bool(live.interrupted_by)
    summary = build_summary(config, setup, totals, engine, figures, interrupted)
    exit_status = live.exit_status if live is not None else 0
    if exit_status == 0 and summary.verdict == "failed":
        exit_status = EXIT_REQUESTS_FAILED
    if exit_status == 0 and summary.verdict == "incomplete":
        exit_status = EXIT_REQUESTS_LOST
    window, sections = _measured(config, engine, live, figures)
    return RunResult(
        config=config,
        setup=setup,
        summary=summary,
        failures=tuple(totals.failures),
        lifecycle=lifecycle,
        exit_status=exit_status,
        workload=workload,
        engine=engine,
        live=figures,
        window=window,
        sections=sections,
        finished_by=live.finished_by if live is not None else None,
    )


def _streamed_requests(config: RunConfig, workload: Workload | None) -> bool:
    """Whether some request of the run streams: the run's --stream, unless every request
    sets its own ``stream``; a manifest request with ``"stream": true``."""
    column = workload.request_stream if workload is not None else None
    if column is None or len(column) == 0:
        return config.stream
    return bool((column == 1).any() or (config.stream and (column < 0).any()))


def _measured(
    config: RunConfig, engine: EngineResult, live: LiveRun | None, figures: LiveFigures | None
) -> tuple[WindowFigures | None, dict[str, Any] | None]:
    """The measured window and the results JSON sections drawn from per-request samples."""
    if live is None or figures is None:
        return None, None
    recorder = live.recorder
    inputs = WindowInputs(
        samples=recorder.samples,
        gaps_ms=recorder.stream.itl_ms,
        records=engine.records,
        series=recorder.series,
        health=figures.health,
        wall_seconds=recorder.wall_seconds or engine.total_duration,
        goodput=config.goodput_thresholds,
        objectives=config.slo,
        percents=config.percentiles,
    )
    end = live.window_end if live.window_end is not None else engine.total_duration
    window = window_figures(inputs, min(config.warmup, end), end)
    metrics = live.server_metrics
    if metrics is not None:
        ttft = window.latency.get("ttft_ms")
        verdict = server_verdict(metrics.get("concepts"), ttft.get(50.0) if ttft else None)
        window = replace(window, server=verdict)
    ranks, source = rank_rows(figures.ranks, inputs, metrics)
    sections: dict[str, Any] = {
        "kind": "run",
        "finished_by": live.finished_by,
        "window": window.as_dict(),
        "distributions": distributions(inputs, window),
        "timeseries": recorder.series.document(),
        "ranks": ranks,
        "ranks_source": source,
        "server_metrics": metrics,
    }
    return window, sections
