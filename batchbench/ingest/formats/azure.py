"""Azure LLM inference traces (Azure/AzurePublicDataset, 2023 and 2024 releases): CSV.

``TIMESTAMP,ContextTokens,GeneratedTokens``, one request a row, in arrival order. The
2023 files write ``2023-11-16 18:15:46.6805900`` (seven fraction digits, no zone), the
2024 ones ``2024-05-12 00:00:00.001163+00:00`` or ``2024-05-12 00:00:00+00:00``. A
timestamp is read here rather than by ``datetime``, which keeps only microseconds and is
slower: a time without an offset is UTC, and ``time_s`` is the float nearest to the exact
seconds since the Unix epoch. The 2024 files hold tens of millions of rows, so the
date-and-minute part is parsed once per minute of trace (rows arrive in time order).

Headers are matched without regard to case, spaces or underscores; other columns are
ignored. ``row`` is the request's position among the data rows (the header is not a row
and blank lines are not counted), so row k is the file's k-th request whatever the line
endings; error messages name the physical line. The trace records arrivals and sizes only:
no session, content hashes, model or completion time.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime

from batchbench.ingest.formats._fields import (
    Header,
    cell_count,
    csv_records,
    describe_cell,
    invalid,
)
from batchbench.ingest.record import FormatOptions, Record

NAME = "azure"
SUMMARY = "Azure LLM inference CSV: TIMESTAMP, ContextTokens, GeneratedTokens (arrivals only)"

COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
TIMESTAMP_SHAPE = "a date and time like 2023-11-16 18:15:46.6805900"

_EPOCH_ORDINAL = datetime(1970, 1, 1).toordinal()
_DIGITS = frozenset("0123456789")


class _Clock:
    """Timestamps to seconds since the epoch, remembering the last minute seen."""

    __slots__ = ("_base", "_minute")

    def __init__(self) -> None:
        self._minute = ""
        self._base = 0

    def seconds(self, text: str) -> float:
        """``YYYY-MM-DD HH:MM:SS[.fraction][Z|±HH:MM]`` (``T`` may replace the space);
        ValueError for anything else, an impossible date included."""
        minute = text[:16]
        if minute != self._minute:
            self._base = _minute_seconds(minute)
            self._minute = minute
        second = text[17:19]
        if text[16:17] != ":" or len(second) != 2 or not _DIGITS.issuperset(second):
            raise ValueError(text)
        if second > "59":  # no leap seconds: they have no place on the epoch's scale
            raise ValueError(text)
        whole = self._base + int(second)
        rest = text[19:]
        if rest:
            rest, shift = _offset(rest)
            whole -= shift
            if rest:
                digits = rest[1:]
                if rest[0] != "." or not digits or not _DIGITS.issuperset(digits):
                    raise ValueError(text)
                scale = 10 ** len(digits)
                return (whole * scale + int(digits)) / scale  # exact, then rounded once
        return float(whole)


def _minute_seconds(minute: str) -> int:
    """``YYYY-MM-DD HH:MM`` as whole seconds since the epoch (checked by ``datetime``)."""
    if (
        len(minute) != 16
        or minute[4] != "-"
        or minute[7] != "-"
        or minute[10] not in " T"
        or minute[13] != ":"
        or not _DIGITS.issuperset(minute[:4] + minute[5:7] + minute[8:10] + minute[11:13])
        or not _DIGITS.issuperset(minute[14:])
    ):
        raise ValueError(minute)
    moment = datetime(
        int(minute[:4]), int(minute[5:7]), int(minute[8:10]), int(minute[11:13]), int(minute[14:])
    )
    return (moment.toordinal() - _EPOCH_ORDINAL) * 86400 + moment.hour * 3600 + moment.minute * 60


def _offset(rest: str) -> tuple[str, int]:
    """The text before a trailing zone and the zone's offset east of UTC in seconds."""
    if rest[-1] == "Z":
        return rest[:-1], 0
    if len(rest) >= 6 and rest[-6] in "+-" and rest[-3] == ":":
        hours, minutes = rest[-5:-3], rest[-2:]
        if not _DIGITS.issuperset(hours + minutes) or int(hours) > 23 or int(minutes) > 59:
            raise ValueError(rest)
        shift = int(hours) * 3600 + int(minutes) * 60
        return rest[:-6], shift if rest[-6] == "+" else -shift
    return rest, 0


def read(path: str, options: FormatOptions) -> Iterator[Record]:
    """The file's requests in file order, one row at a time (``options`` has nothing for
    this format)."""
    records = csv_records(path)
    first = next(records, None)
    if first is None:
        return
    header = Header(path, *first)
    indexes = [header.require(column) for column in COLUMNS]
    t, c, g = indexes
    t_name, c_name, g_name = (header.names[index] for index in indexes)
    clock = _Clock()
    for row, (line, cells) in enumerate(records, 1):
        try:
            stamp, context, generated = cells[t], cells[c], cells[g]
        except IndexError:
            raise header.short_row(line, cells, indexes) from None
        try:
            time_s = clock.seconds(stamp)
        except ValueError:
            raise invalid(path, line, t_name, TIMESTAMP_SHAPE, describe_cell(stamp)) from None
        yield Record(
            source=path,
            row=row,
            time_s=time_s,
            input_tokens=cell_count(context, c_name, path, line),
            output_tokens=cell_count(generated, g_name, path, line),
        )
