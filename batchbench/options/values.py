"""Value checkers: the one family of argparse ``type`` functions every command uses. Each
turns the text of one option into its value or raises ``argparse.ArgumentTypeError`` with
the message the command line shows after ``argument --flag:``. The messages differ between
the benchmark's options and the simulator's because users' scripts and the compatibility
spec quote them; they are kept as they are."""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TypeVar

from batchbench.errors import UsageError

T = TypeVar("T")


def _invalid(text: str) -> argparse.ArgumentTypeError:
    return argparse.ArgumentTypeError(text)


# -- the benchmark's options (messages quoted by the compatibility spec) ---------------------
def uint(text: str) -> int:
    try:
        value = int(text, 10)
    except ValueError:
        raise _invalid(f'"{text}" is not a valid non-negative integer') from None
    if value < 0:
        raise _invalid(f'"{text}" is not a valid non-negative integer')
    return value


def u64(text: str) -> int:
    value = uint(text)
    if value >= 1 << 64:
        raise _invalid(f'"{text}" does not fit in 64 bits')
    return value


def positive_uint(text: str) -> int:
    try:
        value = int(text, 10)
    except ValueError:
        raise _invalid(f'"{text}" is not a valid positive integer') from None
    if value == 0:
        raise _invalid("value must be greater than zero")
    if value < 0:
        raise _invalid(f'"{text}" is not a valid positive integer')
    return value


def number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise _invalid(f'"{text}" is not a valid number') from None


def non_negative_float(text: str) -> float:
    value = number(text)
    if not math.isfinite(value) or value < 0:
        raise _invalid("value must be a non-negative finite number")
    return value


def positive_finite(text: str) -> float:
    value = number(text)
    if not math.isfinite(value) or value <= 0:
        raise _invalid("value must be a positive finite number")
    return value


def seconds(text: str) -> int | float:
    """A non-negative, finite number of seconds (``0.5``); whole numbers stay integers, so
    an options file says ``60``, not ``60.0``."""
    value = non_negative_float(text)
    return int(value) if value.is_integer() else value


_WALL_UNITS = {"h": 3600.0, "m": 60.0, "min": 60.0, "s": 1.0}
_WALL_PART = re.compile(r"([0-9]*\.?[0-9]+)\s*(h|min|m|s)")


def wall_duration(text: str) -> float:
    """A positive wall-clock duration in seconds: ``90`` or ``90s``, ``30m``, ``1.5h``,
    ``1h30m``, and as the search prints them (``1 h 30 min``, ``16 min``)."""
    compact = re.sub(r"\s+", "", text.lower())
    total = 0.0
    if re.fullmatch(r"[0-9]*\.?[0-9]+", compact):
        total = float(compact)
    else:
        position = 0
        for match in _WALL_PART.finditer(compact):
            if match.start() != position:
                break
            total += float(match[1]) * _WALL_UNITS[match[2]]
            position = match.end()
        if position != len(compact) or not compact:
            raise _invalid(
                f'"{text}" is not a duration (a number of seconds, or with units h, m, s: '
                "90s, 30m, 1h30m)"
            )
    if not math.isfinite(total) or total <= 0:
        raise _invalid("the duration must be greater than zero")
    return total


_BYTE_UNITS = {"": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30}


def byte_size(text: str) -> int:
    """A positive number of bytes, plain or with a binary unit: ``65536``, ``64KiB``,
    ``64MiB``, ``1GiB``."""
    match = re.fullmatch(r"\s*(\d+)\s*([KMGkmg][iI][bB])?\s*", text)
    if match is None:
        raise _invalid(
            f'"{text}" is not a size in bytes (a whole number, optionally with KiB, MiB or GiB)'
        )
    value = int(match[1]) * _BYTE_UNITS[(match[2] or "").lower()]
    if value == 0:
        raise _invalid("value must be greater than zero")
    return value


def failure_rate(text: str) -> float:
    """A share in [0, 1], or a percentage with ``%``."""
    percent = text.endswith("%")
    value = number(text[:-1] if percent else text)
    if percent:
        value /= 100.0
    if not math.isfinite(value) or not 0 <= value <= 1:
        raise _invalid(f'"{text}" is not a share between 0 and 1 (or 0%..100%)')
    return value


def admission(text: str) -> str:
    """--admission: closed-loop or open-loop (the message says "invalid value", as the
    compatibility spec asks)."""
    if text not in ("closed-loop", "open-loop"):
        raise _invalid(f'invalid value "{text}" (expected closed-loop or open-loop)')
    return text


def worker_count(text: str) -> int:
    """--workers: a positive count, or auto (0: one per core but one)."""
    if text.strip().lower() == "auto":
        return 0
    value = uint(text)
    if value < 1:
        raise _invalid(f'"{text}" is not a positive integer or auto')
    return value


def start_time(text: str) -> float:
    """--start-at: ISO 8601 (a time without a zone is UTC) or Unix seconds."""
    try:
        value = float(text)
    except ValueError:
        try:
            moment = datetime.fromisoformat(text.strip().replace("z", "Z"))
        except ValueError:
            raise _invalid(
                f'"{text}" is not a time: give ISO 8601 (2026-12-04T15:00:00Z) or Unix seconds'
            ) from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        return moment.timestamp()
    if not math.isfinite(value) or value <= 0:
        raise _invalid(f'"{text}" is not a time')
    return value


def from_usage_parser(parse: Callable[[str], T], flag: str) -> Callable[[str], T]:
    """A checker from a parser that raises UsageError naming ``--flag`` (``parse_slo`` and
    the like, which configs built in Python use too): argparse names the flag itself, so
    the message loses its "invalid --flag" prefix."""
    prefix = re.compile(rf"^invalid --{re.escape(flag)}:? ")

    def convert(text: str) -> T:
        try:
            return parse(text)
        except UsageError as exc:
            raise _invalid(prefix.sub("", str(exc))) from None

    convert.__name__ = getattr(parse, "__name__", "convert")
    return convert


# -- the simulator's options (messages its tests quote) ---------------------------------------
def finite_at_least_zero(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise _invalid(f"not a number: {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise _invalid(f"must be a finite number >= 0, got {text}")
    return value


def finite_above_zero(text: str) -> float:
    value = finite_at_least_zero(text)
    if value == 0:
        raise _invalid("must be greater than zero")
    return value


def rate(text: str) -> float:
    """A probability in [0, 1] (the simulator's fault rates)."""
    value = finite_at_least_zero(text)
    if value > 1:
        raise _invalid(f"a rate must be between 0 and 1, got {text}")
    return value


def share(text: str) -> float:
    """A fraction in [0, 1] (the simulator's --reasoning-share)."""
    try:
        value = float(text)
    except ValueError:
        raise _invalid(f"{text!r} is not a number") from None
    if not 0.0 <= value <= 1.0:
        raise _invalid(f"{text} is not between 0 and 1")
    return value


def int_at_least(low: int, high: int | None = None) -> Callable[[str], int]:
    """An integer type with bounds, for options whose range is not just "non-negative"."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise _invalid(f"not an integer: {text!r}") from None
        if value < low:
            raise _invalid(f"must be at least {low}, got {value}")
        if high is not None and value > high:
            raise _invalid(f"must be at most {high}, got {value}")
        return value

    return parse


def status_codes(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise _invalid(f"expected comma-separated status codes: {text!r}") from None
    if not values or any(not 400 <= v <= 599 for v in values):
        raise _invalid(f"status codes must be 400..599, got {text!r}")
    return values


# An HTTP field name (RFC 9110's token): what a header named on the command line must be.
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


def is_header_name(text: str) -> bool:
    return _HEADER_NAME.fullmatch(text) is not None


def header_name(text: str) -> str:
    """A response header's name, lowercased (HTTP names are case-insensitive)."""
    if not is_header_name(text):
        raise _invalid(f'"{text}" is not an HTTP header name')
    return text.lower()
