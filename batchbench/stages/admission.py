"""Admission, the heart of stage 4: this process's trajectories through closed- or
open-loop admission, the start gates that hold the clock back, and what the process owns."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from batchbench.config import RunConfig
from batchbench.drive.engine import StartGate, run_closed_loop, run_open_loop
from batchbench.drive.shutdown import Shutdown
from batchbench.plan.workload import Workload
from batchbench.results.lifecycle import EngineResult, TrajectoryRecord
from batchbench.scale.partition import Share, ramp_delays, ramp_up_seconds
from batchbench.scale.share import ShardAgents, global_record, global_result
from batchbench.stages.plans import start_offsets

Sink = Callable[[TrajectoryRecord], None]


async def admit(
    config: RunConfig,
    workload: Workload,
    root_seed: int,
    share: Share | None,
    agents: Any,  # an AgentLoop (the HTTP driver's declares int, an Outcome's base)
    sink: Sink | None = None,
    shutdown: Shutdown | None = None,
    gate: StartGate | None = None,
) -> EngineResult:
    """Run this process's trajectories through closed- or open-loop admission (a shard's in
    its local numbering, reported in global ids and slots)."""
    if share is not None:
        agents = ShardAgents(agents, share)
        if sink is not None:
            outer = sink

            def sink(record, share=share):
                outer(global_record(record, share))

    n_all = len(workload)
    if config.admission_mode == "open-loop":
        if share is not None:
            offsets, cap = list(share.offsets or ()), share.cap
        else:
            offsets, cap = start_offsets(config, workload, root_seed), config.max_active_agents
        result = await run_open_loop(offsets, cap, agents, sink, shutdown, gate)
    else:
        n = len(share.agents) if share is not None else n_all
        cap = share.cap if share is not None else config.max_active_agents
        total = min(config.max_active_agents or n_all, n_all)
        ramp = ramp_up_seconds(config, n_all)
        delays = None
        if ramp > 0 and total > 0:
            delays = (
                ramp_delays(share, total, ramp)
                if share is not None
                else [ramp * slot / total for slot in range(total)]
            )
        result = await run_closed_loop(n, cap or None, agents, sink, shutdown, delays, gate)
    return global_result(result, share) if share is not None else result


def planned_counts(workload: Workload, share: Share | None) -> tuple[int, int]:
    """(trajectories, requests) this process runs."""
    if share is None:
        return len(workload), workload.n_requests
    return len(share.agents), sum(len(workload.turns(agent)) for agent in share.agents)


def stoppable(gate: StartGate, shutdown: Shutdown) -> StartGate:
    """A start gate that a shutdown (Ctrl+C while waiting for --start-at) ends at once."""

    async def wait() -> None:
        waiting = asyncio.ensure_future(gate())
        stopping = asyncio.ensure_future(shutdown.stop_event.wait())
        try:
            await asyncio.wait({waiting, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (waiting, stopping):
                task.cancel()
            await asyncio.gather(waiting, stopping, return_exceptions=True)

    return wait


def start_at_gate(start_at: float, warn: Callable[[str], None]) -> StartGate:
    """Wait until the wall-clock time ``start_at`` (--start-at); warn when it has passed."""

    async def wait() -> None:
        delay = start_at - time.time()
        if delay < 0:
            warn(f"warning: --start-at was {-delay:.1f} s ago; starting now")
            return
        await asyncio.sleep(delay)

    return wait
