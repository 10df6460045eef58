"""A dead worker's raw data, rebuilt from the files it wrote as it ran.

A worker that dies (``kill -9``, a crash) never sends its measurements. What it recorded
is still on disk: one request event per settled request, and one lifecycle record per
finished trajectory (both whole lines, written as they happen). Replaying those lines
through a fresh ``Recorder`` gives the worker's ``ShardData`` in the form a live worker
sends, so the merge treats it like any other: every recorded request lands in its bucket
(succeeded, failed, cancelled; a finished trajectory's skipped requests), and the rest of
the worker's planned share is counted as ``lost``. What the files do not carry stays out:
inter-token gaps, TPOT and output speed (so goodput limits on them are not applied to these
requests), event-loop lag, the time series, client CPU, tool time. Without request events, the
finished trajectories' records still give their requests' buckets and tokens.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from batchbench.config import RunConfig
from batchbench.results.failures import AttemptError
from batchbench.results.lifecycle import EngineResult, TrajectoryRecord
from batchbench.results.recording import AgentFigures, Recorder
from batchbench.results.summary import RunSetup
from batchbench.scale.merge import LearnedFraming
from batchbench.scale.partial import ShardData
from batchbench.scale.snapshot import snapshot
from batchbench.stages.liverun import LiveRun


@dataclass(frozen=True)
class WorkerStart:
    """What a worker reported as its run started: enough to account for its share."""

    planned: tuple[int, int]  # (trajectories, requests) it owns
    setup: dict[str, Any]  # its RunSetup as a dict


@dataclass(frozen=True)
class Salvaged:
    data: ShardData
    recorded: int  # planned requests accounted for by the files
    lost: int  # the rest of its planned requests


def json_lines(path: str | None) -> Iterator[dict[str, Any]]:
    """The objects of a JSONL file a dead process wrote; a missing file is empty, and a
    line that is not a JSON object (cut short by the death) is left out."""
    if not path:
        return
    try:
        handle = open(path, "rb")  # noqa: SIM115 - closed by the with below
    except OSError:
        return
    with handle:
        for line in handle:
            try:
                value = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            if isinstance(value, dict):
                yield value


def _errors(event: dict[str, Any]) -> list[AttemptError]:
    errors = []
    for item in event.get("errors") or ():
        # The kind as written (the recorder tallies it by its text).
        errors.append(
            AttemptError(
                int(item.get("attempt") or 0),
                str(item.get("kind")),  # type: ignore[arg-type]
                str(item.get("message")),
                item.get("status"),
            )
        )
    return errors


def _number(value: Any, default: float = math.nan) -> float:
    return float(value) if isinstance(value, int | float) else default


def _replay(recorder: Recorder, events: Iterator[dict[str, Any]], framing_initial: int) -> int:
    """Feed request events to ``recorder`` as the driver would have; the settled count."""
    agents: dict[int, AgentFigures] = {}
    settled = 0
    for event in events:
        agent = int(event["agent_id"])
        figures = agents.get(agent)
        if figures is None:
            figures = agents[agent] = recorder.agent_started(agent, int(event["routing_slot"]))
        rank = event.get("dp_rank")
        attempts = int(event.get("attempts") or 0)
        errors = _errors(event)
        status = event.get("status")
        invocation = int(event.get("invocation") or 1)
        if status == "ok":
            prompt = int(event["prompt_tokens"])
            completion = int(event["completion_tokens"])
            ttft = event.get("ttft_seconds")
            recorder.request_succeeded(
                figures, rank, prompt, completion, event.get("cached_tokens"),
                _number(event.get("latency_seconds"), 0.0),
                ttft if isinstance(ttft, int | float) else None,
                None, None, attempts, errors, _number(event.get("start_offset_seconds")),
            )  # fmt: skip
            worker = event.get("worker")
            if isinstance(worker, str):
                recorder.request_placed(figures, rank, worker)
            recorder.request_fidelity(
                figures, invocation - 1, int(event["target_prompt_tokens"]), prompt,
                completion, int(event["planned_output_tokens"]), invocation == 1,
                framing_initial, attempts,
            )  # fmt: skip
            recorder.request_done(figures, prompt, completion)
            oracle = event.get("oracle_seconds")
            if isinstance(oracle, int | float):
                recorder.fidelity.oracle_seconds.append(float(oracle))
        elif status == "failed":
            recorder.request_failed(
                figures, rank, agent, str(event.get("trajectory_id")), invocation, errors,
                attempts, _number(event.get("start_offset_seconds")),
                _number(event.get("latency_seconds"), 0.0),
            )  # fmt: skip
        elif status == "cancelled":
            recorder.request_cancelled(figures, errors, attempts)
        else:
            continue
        corrected = bool(event.get("prompt_correction_tokens"))
        limited = event.get("correction_note") is not None
        if corrected or limited:
            recorder.request_sized(corrected, limited)
        settled += 1
    return settled


def _count_from_records(recorder: Recorder, lifecycle: tuple[dict[str, Any], ...]) -> int:
    """Without request events, the finished trajectories' own counts and tokens (no
    latencies); the settled count."""
    totals = recorder.totals
    settled = 0
    for event in lifecycle:
        ok = int(event.get("successful_requests") or 0)
        failed = int(event.get("failed_requests") or 0)
        cancelled = int(event.get("cancelled_requests") or 0)
        totals.successful_requests += ok
        totals.failed_requests += failed
        totals.cancelled_requests += cancelled
        totals.attempts += ok + failed + cancelled  # its retries are not known
        totals.total_input_tokens += int(event.get("input_tokens") or 0)
        totals.total_output_tokens += int(event.get("output_tokens") or 0)
        if event.get("error") is not None and failed:
            totals.failures.append(
                (
                    int(event["agent_id"]),
                    str(event.get("trajectory_id")),
                    ok + failed,
                    str(event["error"]),
                )
            )
        settled += ok + failed + cancelled
    return settled


def _record(event: dict[str, Any]) -> TrajectoryRecord:
    admitted = float(event["admitted_at_seconds"])
    finished = float(event["finished_at_seconds"])
    return TrajectoryRecord(
        int(event["agent_id"]),
        int(event["routing_slot"]),
        float(event["scheduled_at_seconds"]),
        admitted,
        finished,
        finished - admitted,
        bool(event.get("completed")),
        bool(event.get("interrupted")),
    )


def salvage(
    config: RunConfig,
    shard: tuple[int, int],
    start: WorkerStart,
    wall_origin: float,
    ended_at: float,
    peak_active: int,
) -> Salvaged:
    """The dead worker's ``ShardData`` from its events files (``config`` names them).
    ``wall_origin``: Unix time its clock started; ``ended_at``: when it died, on that
    clock; ``peak_active``: the most agents it reported active at once."""
    setup = RunSetup(**start.setup)
    recorder = Recorder(dp_ranks=config.dp_ranks, goodput=config.goodput_thresholds)
    recorder.origin = 0.0
    settled = _replay(recorder, json_lines(config.request_events_jsonl), setup.framing_initial)
    lifecycle = tuple(json_lines(config.agent_events_jsonl))
    records = [_record(event) for event in lifecycle]
    skipped = sum(int(event.get("skipped_requests") or 0) for event in lifecycle)
    recorder.totals.skipped_requests = skipped
    if config.request_events_jsonl is None:  # only the trajectories' figures exist
        settled = _count_from_records(recorder, lifecycle)
    recorder.started_agents.update(record.agent_id for record in records)
    planned_requests = int(start.planned[1])
    recorded = min(settled + skipped, planned_requests)
    lost = planned_requests - recorded
    recorder.totals.lost_requests = lost
    recorder.agents.clear()  # nothing runs any more
    ends = [record.finished_at for record in records] + [ended_at]
    recorder.wall_seconds = max(ends)
    engine = EngineResult(
        records=records,
        total_duration=max(ends),
        max_active_agents=peak_active,
        last_agent_admitted_at=max((r.admitted_at for r in records), default=0.0),
    )
    live = LiveRun(
        engine=engine,
        recorder=recorder,
        interrupted_by=None,
        exit_status=0,
        framing=LearnedFraming(None),
        window_end=None,
        wall_origin=wall_origin,
    )
    data = snapshot(config, setup, shard, start.planned, engine, live, lifecycle, wall_origin)
    return Salvaged(data, recorded, lost)
