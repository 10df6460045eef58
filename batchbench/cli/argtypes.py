"""Argument parsing shared by every command: value types, and a parser that raises
``UsageError`` (exit status 2, one line) and suggests the closest option for a misspelled
one."""

from __future__ import annotations

import argparse
import difflib
import math
import re
import sys
from collections.abc import Sequence

from batchbench.errors import UsageError

_UNRECOGNIZED = re.compile(r"unrecognized arguments: (.*)")


def suggestion(parser: argparse.ArgumentParser, message: str) -> str:
    """``message`` with `` (did you mean --x?)`` for each unknown option close to a known one."""
    match = _UNRECOGNIZED.match(message)
    if match is None:
        return message
    known = [o for action in parser._actions for o in action.option_strings if o.startswith("--")]
    hints = []
    for word in match.group(1).split():
        if not word.startswith("--"):
            continue
        name = word.split("=", 1)[0]
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.75)
        if close:
            hints.append((name, close[0]))
    if not hints:
        return message
    if len(hints) == 1:
        return f"{message} (did you mean {hints[0][1]}?)"
    listed = ", ".join(f"{close} for {name}" for name, close in hints)
    return f"{message} (did you mean {listed}?)"


class CommandParser(argparse.ArgumentParser):
    """argparse that raises UsageError instead of printing usage and exiting."""

    def error(self, message: str):
        raise UsageError(suggestion(self, message))


def uint(text: str) -> int:
    try:
        value = int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f'"{text}" is not a valid non-negative integer') from None
    if value < 0:
        raise argparse.ArgumentTypeError(f'"{text}" is not a valid non-negative integer')
    return value


def u64(text: str) -> int:
    value = uint(text)
    if value >= 1 << 64:
        raise argparse.ArgumentTypeError(f'"{text}" does not fit in 64 bits')
    return value


def positive_uint(text: str) -> int:
    try:
        value = int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f'"{text}" is not a valid positive integer') from None
    if value == 0:
        raise argparse.ArgumentTypeError("value must be greater than zero")
    if value < 0:
        raise argparse.ArgumentTypeError(f'"{text}" is not a valid positive integer')
    return value


def number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f'"{text}" is not a valid number') from None


def non_negative_float(text: str) -> float:
    value = number(text)
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError("value must be a non-negative finite number")
    return value


def positive_finite(text: str) -> float:
    value = number(text)
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError("value must be a positive finite number")
    return value


def seconds(text: str) -> int | float:
    """A non-negative, finite number of seconds (``0.5``); whole numbers stay integers, so
    an options file says ``60``, not ``60.0``."""
    value = non_negative_float(text)
    return int(value) if value.is_integer() else value


_BYTE_UNITS = {"": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30}


def byte_size(text: str) -> int:
    """A positive number of bytes, plain or with a binary unit: ``65536``, ``64KiB``,
    ``64MiB``, ``1GiB``."""
    match = re.fullmatch(r"\s*(\d+)\s*([KMGkmg][iI][bB])?\s*", text)
    if match is None:
        raise argparse.ArgumentTypeError(
            f'"{text}" is not a size in bytes (a whole number, optionally with KiB, MiB or GiB)'
        )
    value = int(match[1]) * _BYTE_UNITS[(match[2] or "").lower()]
    if value == 0:
        raise argparse.ArgumentTypeError("value must be greater than zero")
    return value


def failure_rate(text: str) -> float:
    """A share in [0, 1], or a percentage with ``%``."""
    percent = text.endswith("%")
    value = number(text[:-1] if percent else text)
    if percent:
        value /= 100.0
    if not math.isfinite(value) or not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f'"{text}" is not a share between 0 and 1 (or 0%..100%)')
    return value


def rate(text: str) -> float:
    """A probability in [0, 1] (the simulator's fault rates)."""
    value = finite_at_least_zero(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"a rate must be between 0 and 1, got {text}")
    return value


def finite_at_least_zero(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return value


def finite_above_zero(text: str) -> float:
    value = finite_at_least_zero(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be greater than zero")
    return value


def int_at_least(low: int, high: int | None = None):
    """An integer type with bounds, for options whose range is not just "non-negative"."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
        if high is not None and value > high:
            raise argparse.ArgumentTypeError(f"must be at most {high}, got {value}")
        return value

    return parse


def status_codes(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated status codes: {text!r}"
        ) from None
    if not values or any(not 400 <= v <= 599 for v in values):
        raise argparse.ArgumentTypeError(f"status codes must be 400..599, got {text!r}")
    return values


def parse_or_status(parser: argparse.ArgumentParser, argv: Sequence[str]):
    """A small command's arguments, or the exit status to return instead: 0 after --help,
    2 after a usage error (its message printed as one ``Error:`` line)."""
    try:
        try:
            return parser.parse_args(list(argv))
        except SystemExit as exc:  # --help
            return 0 if exc.code in (0, None) else 2
    except UsageError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 2
