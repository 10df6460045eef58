"""Time of an import: the window of trace time it keeps, and the delays it writes.

A trajectory's ``delay_after_ms`` is end-to-start wherever the trace records how long a
request took (an idle gap it states, an end time, a latency); otherwise the arrival gap
minus what the optional latency model says the request took on the recorded server.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from batchbench.errors import InputError
from batchbench.ingest.record import Record
from batchbench.ingest.window import parse_timestamp


def parse_time(flag: str, text: str) -> float:
    """A window bound: seconds on the trace's clock (a number), or an RFC 3339 time for
    traces with wall-clock times."""
    try:
        value = float(text)
    except ValueError:
        try:
            return parse_timestamp(text) / 1e6
        except ValueError:
            raise InputError(
                f"{flag} must be seconds on the trace's clock or an RFC 3339 time, got {text!r}"
            ) from None
    if not math.isfinite(value):
        raise InputError(f"{flag} must be finite, got {text!r}")
    return value


@dataclass(frozen=True)
class TraceWindow:
    """[start, end) in trace seconds, or the first ``first_seconds`` after the earliest
    kept request. Offsets are measured from ``start`` when given, else from the earliest
    kept request."""

    start_s: float | None = None
    end_s: float | None = None
    first_seconds: float | None = None

    @classmethod
    def parse(cls, start: str | None, end: str | None, first_seconds: float | None) -> TraceWindow:
        start_s = parse_time("--start", start) if start is not None else None
        end_s = parse_time("--end", end) if end is not None else None
        if start_s is not None and end_s is not None and end_s <= start_s:
            raise InputError("--end must be after --start")
        if first_seconds is not None:
            if end_s is not None:
                raise InputError("--first-seconds and --end cannot be used together")
            if not (math.isfinite(first_seconds) and first_seconds > 0):
                raise InputError("--first-seconds must be a positive number of seconds")
        return cls(start_s, end_s, first_seconds)

    def admits(self, time_s: float) -> bool:
        """Whether the fixed bounds keep a request at this time (``first_seconds`` is
        applied once the earliest time is known)."""
        if self.start_s is not None and time_s < self.start_s:
            return False
        return self.end_s is None or time_s < self.end_s


@dataclass(frozen=True)
class LatencyModel:
    """How long a request took on the recorded server, when the trace does not say:
    ``none`` (0), ``fixed:MS`` or ``linear:TTFT_MS,TPOT_MS`` (TTFT + TPOT per output
    token after the first)."""

    ttft_ms: float = 0.0
    tpot_ms: float = 0.0

    @classmethod
    def parse(cls, text: str) -> LatencyModel:
        kind, _, values = text.partition(":")
        try:
            numbers = [float(part) for part in values.split(",")] if values else []
        except ValueError:
            numbers = [math.nan]
        if kind == "none" and not values:
            return cls()
        if kind == "fixed" and len(numbers) == 1 and _valid(numbers):
            return cls(numbers[0], 0.0)
        if kind == "linear" and len(numbers) == 2 and _valid(numbers):
            return cls(numbers[0], numbers[1])
        raise InputError(
            f"--latency-model must be none, fixed:MS or linear:TTFT_MS,TPOT_MS, got {text!r}"
        )

    def seconds(self, record: Record) -> float:
        return (self.ttft_ms + self.tpot_ms * max(record.output_tokens - 1, 0)) / 1000


def _valid(numbers: list[float]) -> bool:
    return all(math.isfinite(n) and n >= 0 for n in numbers)


def end_time(record: Record, model: LatencyModel) -> float:
    """When the request ended: recorded, or arrival plus its latency (recorded or
    modelled)."""
    if record.end_s is not None:
        return record.end_s
    if record.latency_s is not None:
        return record.time_s + record.latency_s
    return record.time_s + model.seconds(record)


def gap_seconds(before: Record, after: Record, before_end: float) -> float:
    """The idle time between ``before`` ending and ``after`` starting, never negative."""
    if after.idle_before_s is not None:
        return max(after.idle_before_s, 0.0)
    return max(after.time_s - before_end, 0.0)
