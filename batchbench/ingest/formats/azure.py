"""Azure LLM inference traces (Azure/AzurePublicDataset, 2023 and 2024 releases): CSV.

``TIMESTAMP,ContextTokens,GeneratedTokens``, one request a row, in arrival order. The
2023 files write ``2023-11-16 18:15:46.6805900`` (seven fraction digits, no zone), the
2024 ones ``2024-05-12 00:00:00.001163+00:00`` or ``2024-05-12 00:00:00+00:00``. A
timestamp is read here rather than by ``datetime``, which keeps only microseconds and is
slower: a time without an offset is UTC, and ``time_s`` is the float nearest to the exact
seconds since the Unix epoch. The 2024 files hold tens of millions of rows, so the date
and time of day are parsed once per second of trace (rows arrive in time order).

Headers are matched without regard to case, spaces or underscores; other columns are
ignored. ``row`` is the request's position among the data rows (the header is not a row
and blank lines are not counted), so row k is the file's k-th request whatever the line
endings; error messages name the physical line. The trace records arrivals and sizes only:
no session, content hashes, model or completion time.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime

from batchbench.ingest.formats.fields import cell_count, csv_table, describe_cell, invalid
from batchbench.ingest.record import FormatOptions, Record

NAME = "azure"
SUMMARY = "Azure LLM inference CSV: TIMESTAMP, ContextTokens, GeneratedTokens (arrivals only)"

COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
TIMESTAMP_SHAPE = "a date and time like 2023-11-16 18:15:46.6805900"

_EPOCH_ORDINAL = datetime(1970, 1, 1).toordinal()
_DIGITS = frozenset("0123456789")


class _Clock:
    """Timestamps to seconds since the epoch. Rows come in time order, many a second, so
    the date and time of day are parsed (and checked) once a second and the zone once a
    file; each row then costs a comparison and its fraction."""

    __slots__ = ("_head", "_shift", "_whole", "_zone")

    def __init__(self) -> None:
        self._head: str | None = None  # no text's head: the first one is always checked
        self._zone = ""
        self._whole = self._shift = 0

    def seconds(self, text: str) -> float:
        """``YYYY-MM-DD HH:MM:SS[.fraction][Z|±HH:MM]`` (``T`` may replace the space);
        ValueError for anything else, an impossible date included."""
        head = text[:19]
        if head != self._head:
            self._whole = _whole_seconds(head)
            self._head = head
        rest = text[19:]
        if not rest:
            return float(self._whole)
        whole = self._whole
        if rest[-1] == "Z":
            rest = rest[:-1]
        elif rest[-3:-2] == ":" and rest[-6:-5] in ("+", "-"):
            zone = rest[-6:]
            if zone != self._zone:
                self._shift = _zone_seconds(zone)
                self._zone = zone
            whole -= self._shift
            rest = rest[:-6]
        if not rest:
            return float(whole)
        digits = rest[1:]
        if rest[0] != "." or not digits or not _DIGITS.issuperset(digits):
            raise ValueError(text)
        scale = 10 ** len(digits)
        return (whole * scale + int(digits)) / scale  # exact, then rounded once


def _whole_seconds(head: str) -> int:
    """``YYYY-MM-DD HH:MM:SS`` as whole seconds since the epoch (checked by ``datetime``:
    no 30 February, no 24th hour, no leap second)."""
    if (
        len(head) != 19
        or head[4] != "-"
        or head[7] != "-"
        or head[10] not in " T"
        or head[13] != ":"
        or head[16] != ":"
        or not _DIGITS.issuperset(head[:4] + head[5:7] + head[8:10])
        or not _DIGITS.issuperset(head[11:13] + head[14:16] + head[17:])
    ):
        raise ValueError(head)
    moment = datetime(
        int(head[:4]),
        int(head[5:7]),
        int(head[8:10]),
        int(head[11:13]),
        int(head[14:16]),
        int(head[17:]),
    )
    days = moment.toordinal() - _EPOCH_ORDINAL
    return days * 86400 + moment.hour * 3600 + moment.minute * 60 + moment.second


def _zone_seconds(zone: str) -> int:
    """``±HH:MM`` as the zone's offset east of UTC in seconds."""
    hours, minutes = zone[1:3], zone[4:]
    if not _DIGITS.issuperset(hours + minutes) or int(hours) > 23 or int(minutes) > 59:
        raise ValueError(zone)
    shift = int(hours) * 3600 + int(minutes) * 60
    return shift if zone[0] == "+" else -shift


def read(path: str, options: FormatOptions) -> Iterator[Record]:
    """The file's requests in file order, one row at a time (``options`` has nothing for
    this format)."""
    table = csv_table(path, COLUMNS)
    if table is None:
        return
    t_name, c_name, g_name = table.names
    clock = _Clock()
    for row, line, (stamp, context, generated), _cells in table.rows():
        try:
            time_s = clock.seconds(stamp)
        except ValueError:
            where = f"{path}:{line}"
            raise invalid(where, t_name, TIMESTAMP_SHAPE, describe_cell(stamp)) from None
        yield Record(
            source=path,
            row=row,
            time_s=time_s,
            input_tokens=cell_count(context, c_name, path, line),
            output_tokens=cell_count(generated, g_name, path, line),
        )
