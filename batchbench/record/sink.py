"""The rows file: one COMPAT §7.2 row appended per finished request, written at once so
that a recording stopped any way keeps every request that finished."""

from __future__ import annotations

import contextlib
import datetime as dt
import os
from dataclasses import dataclass
from io import FileIO

import orjson

from batchbench.errors import InputError


@dataclass(slots=True)
class Row:
    """What a finished request recorded; ``as_json`` gives the row's exact field order."""

    ts_us: int  # arrival, microseconds since the epoch (UTC)
    principal_id: str
    correlation_id: str
    model: str | None
    chain: list[str]
    block_roles: list[str]
    block_tokens: list[int]
    prompt_tokens: int | None
    completion_tokens: int | None
    stream: bool | None
    max_tokens: int | None
    duration_ms: float | None

    def as_json(self) -> bytes:
        return orjson.dumps(
            {
                "ts": timestamp(self.ts_us),
                "principal_id": self.principal_id,
                "correlation_id": self.correlation_id,
                "model": self.model,
                "chain": self.chain,
                "block_roles": self.block_roles,
                "block_tokens": self.block_tokens,
                "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens,
                "stream": self.stream,
                "max_tokens": self.max_tokens,
                "duration_ms": self.duration_ms,
            }
        )


def timestamp(ts_us: int) -> str:
    """RFC 3339 in UTC with microseconds: 2026-12-05T10:00:00.123456Z."""
    seconds, micros = divmod(ts_us, 1_000_000)
    moment = dt.datetime.fromtimestamp(seconds, dt.UTC).replace(microsecond=micros)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class RowSink:
    """The rows file opened for appending. Correlation ids continue past the largest one it
    already holds, so a recording resumed after a restart keeps them unique; a line cut
    short (a crash mid-write) is cut off, so every line of the file stays a whole row."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.written = 0
        self.lost = 0
        self.lost_reason = ""
        try:
            # Unbuffered: each row is one write() to the file, in it once write() returns.
            self.handle: FileIO = open(path, "ab+", buffering=0)  # noqa: SIM115 - open for the run
            self.handle.seek(0)
            held = self.handle.read()
            whole = held.rfind(b"\n") + 1
            if whole < len(held):
                os.ftruncate(self.handle.fileno(), whole)
        except OSError as exc:
            raise InputError(f"cannot open {path}: {exc.strerror or exc}") from None
        self.next_sequence = _next_sequence(held[:whole])

    def correlation_id(self) -> str:
        """The next request's sequence number in this recording, zero-padded."""
        number = self.next_sequence
        self.next_sequence += 1
        return f"{number:012d}"

    def write(self, row: Row) -> None:
        """Append the row. A row that cannot be written (a full disk) is counted and the
        first reason kept, and what part of it reached the file is cut off again: the proxy
        goes on serving its clients, and says so at the end."""
        try:
            line = row.as_json() + b"\n"
        except (TypeError, orjson.JSONEncodeError) as exc:
            self._lose(str(exc))
            return
        try:
            size = os.fstat(self.handle.fileno()).st_size
        except OSError as exc:
            self._lose(exc.strerror or str(exc))
            return
        try:
            done = self.handle.write(line)
        except OSError as exc:
            self._lose(exc.strerror or str(exc))
            self._cut(size)
            return
        if done != len(line):
            self._lose("a write was cut short")
            self._cut(size)
            return
        self.written += 1

    def _cut(self, size: int) -> None:
        """Take a partly written row out of the file again (best effort)."""
        with contextlib.suppress(OSError):
            os.ftruncate(self.handle.fileno(), size)

    def lose(self, reason: str) -> None:
        """A finished request whose row could not be made: counted like a lost write."""
        self._lose(reason)

    def _lose(self, reason: str) -> None:
        self.lost += 1
        self.lost_reason = self.lost_reason or reason

    def summary(self) -> str:
        """The line a stopped recording prints."""
        lost = f" ({self.lost} rows lost: {self.lost_reason})" if self.lost else ""
        return f"recorded {self.written} requests to {self.path}{lost}"

    def close(self) -> None:
        self.handle.close()


def _next_sequence(rows: bytes) -> int:
    """One past the largest correlation id among the rows (ids are taken at arrival and
    rows written when requests finish, so the last line need not hold the largest), and
    at least the number of rows."""
    largest = -1
    count = 0
    for line in rows.splitlines():
        count += 1
        try:
            ident = orjson.loads(line).get("correlation_id")
        except (orjson.JSONDecodeError, AttributeError):
            continue
        if isinstance(ident, str) and ident.isdigit():
            largest = max(largest, int(ident))
    return max(largest + 1, count)
