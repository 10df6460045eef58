"""The rows file: one COMPAT §7.2 row appended per finished request, written at once so
that a recording stopped any way keeps every request that finished."""

from __future__ import annotations

import datetime as dt
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
    """The rows file opened for appending. Correlation ids continue from the lines it
    already holds, so a recording resumed after a restart keeps them unique."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.written = 0
        self.lost = 0
        self.lost_reason = ""
        self.next_sequence = 0
        last = b"\n"
        try:
            # Unbuffered: each row is one write() to the file, in it once write() returns.
            self.handle: FileIO = open(path, "ab+", buffering=0)  # noqa: SIM115 - open for the run
            self.handle.seek(0)
            while block := self.handle.read(1 << 20):
                self.next_sequence += block.count(b"\n")
                last = block[-1:]
        except OSError as exc:
            raise InputError(f"cannot open {path}: {exc.strerror or exc}") from None
        # A line cut short (a crash mid-write) counts, and is closed so the next row
        # starts its own.
        self.pending_newline = last != b"\n"
        self.next_sequence += self.pending_newline

    def correlation_id(self) -> str:
        """The next request's sequence number in this recording, zero-padded."""
        number = self.next_sequence
        self.next_sequence += 1
        return f"{number:012d}"

    def write(self, row: Row) -> None:
        """Append the row. A row that cannot be written (a full disk) is counted and the
        first reason kept: the proxy goes on serving its clients, and says so at the end."""
        line = row.as_json() + b"\n"
        if self.pending_newline:
            line = b"\n" + line
        try:
            done = self.handle.write(line)
        except OSError as exc:
            self._lose(exc.strerror or str(exc))
            return
        if done != len(line):  # part of the line is in the file: the next row starts anew
            self.pending_newline = True
            self._lose("a write was cut short")
            return
        self.pending_newline = False
        self.written += 1

    def _lose(self, reason: str) -> None:
        self.lost += 1
        self.lost_reason = self.lost_reason or reason

    def summary(self) -> str:
        """The line a stopped recording prints."""
        lost = f" ({self.lost} rows lost: {self.lost_reason})" if self.lost else ""
        return f"recorded {self.written} requests to {self.path}{lost}"

    def close(self) -> None:
        self.handle.close()
