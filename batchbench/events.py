"""Lifecycle JSONL (COMPAT §6.6, D7): one compact record per trajectory, flushed as it finishes.

Each record is written with a single ``write`` of a complete line and flushed, so the file
parses line by line at any moment, even if the process is killed.
"""

from __future__ import annotations

import os
from typing import BinaryIO

import orjson

from batchbench.engine import TrajectoryRecord


class LifecycleWriter:
    """Appends records to a file that is created (with parents) and truncated at start."""

    def __init__(self, path: str, dp_ranks: int | None, trajectory_ids) -> None:
        parent = os.path.dirname(path)
        if parent:
            os.makedirs(parent, exist_ok=True)
        self.path = path
        self._dp_ranks = dp_ranks
        self._ids = trajectory_ids
        self._handle: BinaryIO | None = open(path, "wb")  # noqa: SIM115 - closed in close()

    def write(self, record: TrajectoryRecord, interrupted: bool = False) -> None:
        """Append one record in the COMPAT field order and flush it."""
        assert self._handle is not None
        slot = record.routing_slot
        event = {
            "agent_id": record.agent_id,
            "trajectory_id": self._ids[record.agent_id],
            "routing_slot": slot,
            "dp_rank": slot % self._dp_ranks if self._dp_ranks else None,
            "scheduled_at_seconds": record.scheduled_at,
            "admitted_at_seconds": record.admitted_at,
            "queue_wait_seconds": max(record.admitted_at - record.scheduled_at, 0.0),
            "finished_at_seconds": record.finished_at,
            "runtime_seconds": record.finished_at - record.admitted_at,
            "completed": record.completed,
        }
        if interrupted:
            event["interrupted"] = True
        self._handle.write(orjson.dumps(event, option=orjson.OPT_APPEND_NEWLINE))
        self._handle.flush()

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None
