"""Stage 4, execution: the prepared workload through admission, dry (texts generated, no
requests) or live (``live``), with every trajectory's lifecycle record written as it ends."""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from batchbench.drive.dryrun import DryRunLoop
from batchbench.drive.engine import StartGate
from batchbench.results.events import LifecycleWriter
from batchbench.results.lifecycle import EngineResult
from batchbench.stages.admission import admit
from batchbench.stages.console import RunOutput
from batchbench.stages.hosting import Hosting
from batchbench.stages.live import drive_live
from batchbench.stages.liverun import LiveRun
from batchbench.stages.prepare import Prepared

# Young-generation threshold during a live run: per-request objects are short-lived, and
# with thousands of agents the default (700) made full collections take ~45% of client CPU.
GC_THRESHOLDS = (50_000, 50, 100)


@dataclass(frozen=True)
class Executed:
    """What ran: the engine's records, the live measurements (None for a dry run), the
    lifecycle records in finish order, and the Unix time of the benchmark clock's start."""

    engine: EngineResult
    live: LiveRun | None
    lifecycle: Sequence[dict[str, Any]]
    wall_origin: float


async def execute(prepared: Prepared, out: RunOutput, hosting: Hosting) -> Executed:
    """Run the prepared workload as ``hosting`` allows."""
    config, workload = prepared.config, prepared.workload
    events = LifecycleWriter(
        config.agent_events_jsonl,
        config.dp_ranks,
        workload.trajectory_ids,
        True,
        workload.recorded_start_after_ms,
        workload.request_offsets,
        workload.source_rows,
    )
    live: LiveRun | None = None
    wall_origin = time.time()
    try:
        if config.dry_run:
            engine = await dry_run(prepared, events, hosting.gate)
            wall_origin = time.time() - engine.total_duration
        else:
            with tuned_gc(hosting.tune_gc), generation_pool() as pool:
                live = await drive_live(prepared, events, pool, out, hosting)
            engine = live.engine
            wall_origin = live.wall_origin if live.wall_origin is not None else wall_origin
    finally:
        events.close()
    lifecycle = events.log
    assert lifecycle is not None
    return Executed(engine, live, lifecycle, wall_origin)


async def dry_run(
    prepared: Prepared, events: LifecycleWriter, gate: StartGate | None = None
) -> EngineResult:
    """Admission with instant completion while every text is generated."""
    with ThreadPoolExecutor(
        max_workers=generation_workers(), thread_name_prefix="batchbench-text"
    ) as pool:
        agents = DryRunLoop(prepared.factory, prepared.workload, pool)
        return await admit(
            prepared.config,
            prepared.workload,
            prepared.factory.root_seed,
            prepared.share,
            agents,
            events.write,
            gate=gate,
        )


def generation_workers() -> int:
    """Size of the text-generation pool: min(CPU count, 32)."""
    return min(os.cpu_count() or 1, 32)


@contextmanager
def generation_pool() -> Iterator[ThreadPoolExecutor]:
    """The live run's text-generation threads; texts prepared ahead for turns that will
    never run are not waited for."""
    pool = ThreadPoolExecutor(
        max_workers=generation_workers(), thread_name_prefix="batchbench-text"
    )
    try:
        yield pool
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


@contextmanager
def tuned_gc(tune: bool) -> Iterator[None]:
    """With ``tune``: what setup allocated frozen (collections skip it) and a high
    young-generation threshold, both restored afterwards."""
    thresholds = gc.get_threshold()
    if tune:
        gc.collect()
        gc.freeze()
        gc.set_threshold(*GC_THRESHOLDS)
    try:
        yield
    finally:
        if tune:
            gc.unfreeze()
            gc.set_threshold(*thresholds)
