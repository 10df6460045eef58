"""JSONL outputs: the lifecycle records and the per-request events (docs/outputs.md).

Lines reach the file only whole, through unbuffered ``os.write`` calls of complete lines,
so the file parses line by line at any moment, even after ``kill -9`` of the client.
Lifecycle records are written as each trajectory finishes; request events are batched and
written at least every ``REQUEST_FLUSH_SECONDS`` (and at the end).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, overload

import orjson

from batchbench.errors import BatchbenchError
from batchbench.results.lifecycle import TrajectoryRecord

_NEWLINE = orjson.OPT_APPEND_NEWLINE
REQUEST_FLUSH_SECONDS = 0.25
REQUEST_FLUSH_BYTES = 1 << 18


@dataclass(slots=True)
class RequestEvent:
    """One logical request's line of ``--request-events-jsonl`` (docs/outputs.md).

    orjson writes a dataclass's fields in their declared order, so this order is the
    file's key order: the line is the same bytes as the dict it replaced, without
    building that dict per request."""

    agent_id: int
    trajectory_id: str
    invocation: int
    routing_slot: int
    dp_rank: int | None
    target_prompt_tokens: int
    prompt_tokens: int | None
    completion_tokens: int | None
    cached_tokens: int | None
    start_offset_seconds: float | None
    latency_seconds: float | None
    ttft_seconds: float | None
    attempts: int
    status: str  # ok, failed or cancelled
    error: str | None
    error_kind: str | None
    status_code: int | None
    errors: list[dict[str, object]]
    prompt_drift: int | None
    prompt_correction_tokens: int
    correction_note: str | None
    planned_output_tokens: int
    output_drift: int | None
    reply_rendered_tokens: int | None
    oracle_seconds: float | None
    worker: str | None  # the worker that served it, as the reply named it (None: not named)


@dataclass(slots=True)
class SourcedRequestEvent(RequestEvent):
    """The line of a request whose trajectory has provenance: ``source_row`` (its row in
    its source file) comes last, so the other keys keep their order and bytes."""

    source_row: int


class JsonlFile:
    """A file created and truncated at start, receiving whole lines only."""

    def __init__(self, path: str) -> None:
        self.path = path
        try:
            self._fd: int | None = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        except OSError as exc:
            raise BatchbenchError(f"failed to create {path}: {exc.strerror or exc}") from None
        self._pending = bytearray()
        self._last_flush = time.monotonic()

    def write_now(self, obj: Any) -> None:
        """Write one record at once (with anything batched before it)."""
        self._pending += orjson.dumps(obj, option=_NEWLINE)
        self.flush()

    def write_batched(self, obj: Any) -> None:
        """Queue one record; whole lines go out when the batch is big or old enough."""
        self._pending += orjson.dumps(obj, option=_NEWLINE)
        if (
            len(self._pending) >= REQUEST_FLUSH_BYTES
            or time.monotonic() - self._last_flush >= REQUEST_FLUSH_SECONDS
        ):
            self.flush()

    def write_lines(self, data: bytes | bytearray) -> None:
        """Write whole JSON lines already encoded (each ending in a newline)."""
        self._pending += data
        self.flush()

    def flush(self) -> None:
        if self._fd is None or not self._pending:
            return
        data = bytes(self._pending)
        self._pending.clear()  # bytes handed to the kernel are never sent twice
        offset = 0
        try:
            while offset < len(data):
                offset += os.write(self._fd, memoryview(data)[offset:])
        except OSError as exc:
            raise BatchbenchError(f"failed to write {self.path}: {exc.strerror or exc}") from None
        self._last_flush = time.monotonic()

    def close(self) -> None:
        if self._fd is None:
            return
        try:
            self.flush()
        finally:
            os.close(self._fd)
            self._fd = None


class LifecycleWriter:
    """One compact record per admitted trajectory, in finish order: to a file when a path is
    given, and kept for ``log`` when ``collect`` is true. Live runs append their
    per-trajectory figures after the admission fields."""

    def __init__(
        self,
        path: str | None,
        dp_ranks: int | None,
        trajectory_ids,
        collect: bool = False,
        recorded_starts=None,
        request_offsets=None,
        source_rows=None,
    ) -> None:
        """``recorded_starts`` and ``source_rows`` (with ``request_offsets``): each request's
        recorded start offset from the manifest and its row in its source file, -1 where a
        request has none; carried into the records."""
        self._recorded = recorded_starts
        self._source_rows = source_rows
        self._offsets = request_offsets
        self._file = JsonlFile(path) if path else None
        self.path = path
        self._dp_ranks = dp_ranks
        self._ids = trajectory_ids
        self.log = LifecycleLog(self) if collect else None

    def write(self, record: TrajectoryRecord, extra: dict[str, Any] | None = None) -> None:
        """Append one record and flush it."""
        if self._file is not None:
            self._file.write_now(self.event(record, extra))
        if self.log is not None:
            self.log.append(record, extra)

    def event(self, record: TrajectoryRecord, extra: dict[str, Any] | None) -> dict[str, Any]:
        """The lifecycle record of one trajectory, as written."""
        slot = record.routing_slot
        event: dict[str, Any] = {
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
        if self._recorded is not None:
            agent = record.agent_id
            values = self._recorded[int(self._offsets[agent]) : int(self._offsets[agent + 1])]
            if bool((values >= 0).any()):
                event["recorded_start_after_ms"] = [int(v) if v >= 0 else None for v in values]
        if self._source_rows is not None:
            agent = record.agent_id
            rows = self._source_rows[int(self._offsets[agent]) : int(self._offsets[agent + 1])]
            if bool((rows >= 0).any()):
                event["source_rows"] = [int(v) if v >= 0 else None for v in rows]
        if record.interrupted:
            event["interrupted"] = True
        if extra:
            event.update(extra)
        return event

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


class LifecycleLog(Sequence[dict[str, Any]]):
    """The lifecycle records of a run, in finish order, each built when it is read from
    the trajectory's admission record and live figures: a dry run of a million
    trajectories kept a million dicts (300 MB) that nothing might read."""

    def __init__(self, writer: LifecycleWriter) -> None:
        self._writer = writer
        self._records: list[TrajectoryRecord] = []
        self._extras: list[dict[str, Any] | None] = []

    def append(self, record: TrajectoryRecord, extra: dict[str, Any] | None) -> None:
        self._records.append(record)  # the engine changes no record once it is collected
        self._extras.append(extra)

    def __len__(self) -> int:
        return len(self._records)

    @overload
    def __getitem__(self, index: int) -> dict[str, Any]: ...

    @overload
    def __getitem__(self, index: slice) -> list[dict[str, Any]]: ...

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        return self._writer.event(self._records[index], self._extras[index])

    def __iter__(self) -> Iterator[dict[str, Any]]:
        event = self._writer.event
        for record, extra in zip(self._records, self._extras, strict=True):
            yield event(record, extra)

    def __repr__(self) -> str:
        return f"LifecycleLog({len(self)} records)"
