"""The export window: RFC 3339 bounds, and which rows a window reads (COMPAT §7.3, §7.4)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime

from batchbench.errors import InputError

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US_PER_HOUR = 3_600_000_000


def parse_timestamp(text: str) -> int:
    """Microseconds since the epoch of an RFC 3339 time. A ``Z`` suffix and a space instead
    of ``T`` are accepted; a value without an offset is taken as UTC. ValueError if bad."""
    value = text.strip()
    if not value or len(value) < 10:
        raise ValueError(f"not an RFC 3339 timestamp: {text!r}")
    parsed = datetime.fromisoformat(value)  # Python 3.11+: Z, a space, fractions
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    delta = parsed - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


@dataclass(frozen=True)
class Window:
    """[start, end) in epoch microseconds, and the look-back before it where a parent of an
    in-window request may lie (the link window)."""

    start_us: int
    end_us: int
    link_window_us: float

    @classmethod
    def parse(cls, start: str, end: str, link_window_hours: float) -> Window:
        bounds = []
        for flag, text in (("--start", start), ("--end", end)):
            try:
                bounds.append(parse_timestamp(text))
            except ValueError:
                raise InputError(f"{flag} must be an RFC 3339 timestamp, got {text!r}") from None
        if bounds[1] <= bounds[0]:
            raise InputError("--end must be after --start")
        if not math.isfinite(link_window_hours) or link_window_hours < 0:
            raise InputError("--link-window-hours must be non-negative")
        return cls(bounds[0], bounds[1], link_window_hours * _US_PER_HOUR)

    def reads(self, ts_us: int) -> bool:
        """Whether a row at this time is read at all: [start − link window, end)."""
        return self.start_us - self.link_window_us <= ts_us < self.end_us

    def holds(self, ts_us: int) -> bool:
        """Whether a row at this time is in the window proper: [start, end)."""
        return self.start_us <= ts_us < self.end_us

    def offset_ms(self, ts_us: int, time_scale: float) -> int:
        """round(max(ts − start, 0) ÷ time scale) in whole milliseconds (half to even)."""
        return round(max(ts_us - self.start_us, 0) / 1000 / time_scale)
