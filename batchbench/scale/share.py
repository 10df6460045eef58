"""Run a shard's part of the workload through the unchanged engine.

The engine admits plans 0..n-1 into slots 0..k-1. A shard runs its own trajectories
under those local numbers; ``ShardAgents`` translates them to the global trajectory ids
and routing slots on the way to the agent loop, and ``global_record`` on the way out, so
every request, header, lifecycle record and per-rank figure carries the numbers a single
process would have used.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from batchbench.results.lifecycle import EngineResult, Outcome, TrajectoryRecord
from batchbench.scale.partition import Share


class ShardAgents:
    """An agent loop seen through a shard's local numbering."""

    def __init__(self, agents: Any, share: Share) -> None:
        self._agents = agents
        self._ids = share.agents
        self._slot = share.global_slot
        # The engine announces its clock to loops that want it; pass that on.
        self.clock_started = getattr(agents, "clock_started", None)
        self.start_window = getattr(agents, "start_window", None)

    async def prepare(self, local: int) -> Any:
        return await self._agents.prepare(self._ids[local])

    async def run(self, local: int, slot: int, prepared: Any) -> Outcome:
        return await self._agents.run(self._ids[local], self._slot(slot), prepared)


def global_record(record: TrajectoryRecord, share: Share) -> TrajectoryRecord:
    """A copy of a local record with the global trajectory id and routing slot."""
    return dataclasses.replace(
        record,
        agent_id=share.agents[record.agent_id],
        routing_slot=share.global_slot(record.routing_slot),
    )


def global_result(result: EngineResult, share: Share) -> EngineResult:
    """The engine's result with every record in global numbers."""
    result.records = [global_record(record, share) for record in result.records]
    return result
