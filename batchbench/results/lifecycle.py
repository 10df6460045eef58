"""What admission records of each trajectory, and how an agent's loop ended."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum


class Outcome(IntEnum):
    """How one trajectory's loop ended."""

    FAILED = 0  # a request failed after its retries; the agent stopped there
    COMPLETED = 1  # every planned request succeeded
    INTERRUPTED = 2  # cut short by Ctrl+C or SIGTERM: neither completed nor a failure


@dataclass(slots=True)
class TrajectoryRecord:
    """One admitted trajectory's lifecycle on the benchmark clock (seconds)."""

    agent_id: int
    routing_slot: int
    scheduled_at: float
    admitted_at: float
    finished_at: float = 0.0
    loop_seconds: float = 0.0
    completed: bool = False
    interrupted: bool = False
    finish_sequence: int = 0


@dataclass
class EngineResult:
    """Everything admission measured; records are in finish (collection) order."""

    records: list[TrajectoryRecord] = field(default_factory=list)
    total_duration: float = 0.0
    max_active_agents: int = 0
    last_agent_admitted_at: float = 0.0
    late_admissions: int = 0
    max_admission_lag: float = 0.0


def admission_lags(result: EngineResult) -> list[float]:
    """Each admitted trajectory's admission lag in seconds (admitted_at - scheduled_at,
    floored at 0), in record order: with ``max_admission_lag`` its maximum, the figures
    for lag percentiles. Open loop: how late against the schedule; closed loop, where
    every scheduled_at is 0: the wait for a slot."""
    return [max(record.admitted_at - record.scheduled_at, 0.0) for record in result.records]
