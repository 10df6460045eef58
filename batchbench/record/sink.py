"""The rows file: one COMPAT §7.2 row appended per finished request, flushed at once so
that a recording stopped any way keeps every request that finished."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import IO

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
        self.next_sequence = 0
        last = b"\n"
        try:
            self.handle: IO[bytes] = open(path, "ab+")  # noqa: SIM115 - open for the run
            self.handle.seek(0)
            for line in self.handle:
                self.next_sequence += bool(line.strip())
                last = line[-1:]
        except OSError as exc:
            raise InputError(f"cannot open {path}: {exc.strerror or exc}") from None
        # A line cut short (a crash mid-write) is closed so the next row starts its own.
        self.pending_newline = last != b"\n"

    def correlation_id(self) -> str:
        """The next request's sequence number in this recording, zero-padded."""
        number = self.next_sequence
        self.next_sequence += 1
        return f"{number:012d}"

    def write(self, row: Row) -> None:
        line = row.as_json() + b"\n"
        if self.pending_newline:
            line = b"\n" + line
            self.pending_newline = False
        self.handle.write(line)
        self.handle.flush()
        self.written += 1

    def close(self) -> None:
        self.handle.close()
