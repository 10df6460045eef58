"""Typed reads of trace fields, shared by the format readers: JSON fields (one by one, or
through ``Fields`` for the object-shaped formats) and CSV cells.

Every failure is one ``InputError`` line naming where (``file:line``, or a path inside a
one-document file), the field and what was found, e.g. ``trace.jsonl:12: field
"input_length" must be a non-negative integer, got a string``, so a bad row in a file of
millions is found at once. The row-by-row checks are written for the common case first (a
correct value costs a type test and a comparison); the wording of a message is only built
when a value is wrong.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterator, Sequence
from operator import itemgetter
from typing import Any

import orjson

from batchbench.errors import InputError
from batchbench.ingest.inputs import lines, text_lines
from batchbench.ingest.window import parse_timestamp

MISSING: Any = object()  # a JSON field that is absent, told apart from null

COUNT = "a non-negative integer"
NUMBER = "a non-negative number"
_INT_ONLY = {int}
_LONGEST = 20  # digits of a count cell: 2**64 has 20, and int() refuses thousands


def kind(value: Any) -> str:
    """The JSON type of a value, as an error message names it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def describe(value: Any) -> str:
    """How a row-by-row message names a JSON value: a number by itself (the bad count of a
    size field says more than its type), anything else by its kind."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return repr(value)
    return kind(value)


def describe_cell(text: str) -> str:
    """How a message names a CSV cell: its text, quoted and cut short."""
    if not text.strip():
        return "an empty value"
    shown = text if len(text) <= 40 else text[:40] + "..."
    return f'"{shown}"'


def invalid(where: str, name: str, expected: str, got: str) -> InputError:
    return InputError(f'{where}: field "{name}" must be {expected}, got {got}')


def missing(where: str, name: str) -> InputError:
    return InputError(f'{where}: missing field "{name}"')


# JSON ---------------------------------------------------------------------------------


def decode(text: str | bytes, where: str) -> Any:
    """Any JSON value, or the one-line error for text that is no JSON."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise InputError(f"{where}: invalid JSON ({exc.args[0]})") from None


def parse_object(text: str | bytes, where: str) -> dict[str, Any]:
    """One JSON object (a JSONL line or a whole file), or InputError naming ``where``."""
    value = decode(text, where)
    if type(value) is not dict:
        raise InputError(f"{where}: expected a JSON object, got {kind(value)}")
    return value


def json_rows(path: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for every non-blank line of a JSON Lines file, streamed."""
    for line, raw in _nonblank_lines(path):
        obj = decode(raw, f"{path}:{line}")
        if type(obj) is not dict:
            raise InputError(f"{path}:{line}: a row must be a JSON object, got {describe(obj)}")
        yield line, obj


def _nonblank_lines(path: str) -> Iterator[tuple[int, bytes]]:
    """The non-blank lines as bytes (orjson reads bytes: decoding them first is waste).
    A UTF-8 byte order mark on the first line is dropped."""
    for line, raw in lines(path):
        if line == 1 and raw.startswith(b"\xef\xbb\xbf"):
            raw = raw[3:]
        if raw.strip():
            yield line, raw


def count(obj: dict[str, Any], name: str, source: str, line: int) -> int:
    """A required non-negative integer (an integral float such as ``512.0`` counts)."""
    value = obj.get(name, MISSING)
    if type(value) is int and value >= 0:
        return value
    if type(value) is float and value >= 0 and value.is_integer():
        return int(value)
    if value is MISSING:
        raise missing(f"{source}:{line}", name)
    raise invalid(f"{source}:{line}", name, COUNT, describe(value))


def number(obj: dict[str, Any], name: str, source: str, line: int) -> float:
    """A required non-negative finite number."""
    value = obj.get(name, MISSING)
    if (type(value) is int or type(value) is float) and 0 <= value < math.inf:
        return float(value)
    if value is MISSING:
        raise missing(f"{source}:{line}", name)
    raise invalid(f"{source}:{line}", name, NUMBER, describe(value))


def integer_ids(obj: dict[str, Any], name: str, source: str, line: int) -> tuple[int, ...] | None:
    """An optional array of integers (block hash ids); None when absent or null."""
    value = obj.get(name)
    if value is None:
        return None
    if type(value) is list:
        if set(map(type, value)) <= _INT_ONLY:  # the whole check in C: ids are many
            return tuple(value)
        index, item = next((i, x) for i, x in enumerate(value) if type(x) is not int)
        got = f"{describe(item)} at index {index}"
        raise invalid(f"{source}:{line}", name, "an array of integers", got)
    raise invalid(f"{source}:{line}", name, "an array of integers", describe(value))


class Fields:
    """The fields of one JSON object, for formats whose rows are nested objects (a value
    is named by its kind); ``where`` locates it and ``prefix`` names its path inside the
    row (``"hash_ids."`` for a nested object)."""

    def __init__(self, obj: dict[str, Any], where: str, prefix: str = "") -> None:
        self.obj = obj
        self.where = where
        self.prefix = prefix

    def error(self, name: str, expected: str, value: Any) -> InputError:
        """The one-line error for a field whose value is not what the format needs."""
        return invalid(self.where, self.prefix + name, expected, kind(value))

    def _get(self, name: str, optional: bool) -> Any:
        if name not in self.obj and not optional:
            raise missing(self.where, self.prefix + name)
        return self.obj.get(name)

    def nested(self, name: str) -> Fields:
        """The fields of an object-valued field."""
        value = self._get(name, False)
        if type(value) is not dict:
            raise self.error(name, "an object", value)
        return Fields(value, self.where, f"{self.prefix}{name}.")

    def count(self, name: str) -> int:
        """A required non-negative integer (an integral float such as ``12.0`` is accepted)."""
        value = self._get(name, False)
        if type(value) is int and value >= 0:
            return value
        if type(value) is float and value.is_integer() and value >= 0:
            return int(value)
        raise self.error(name, COUNT, value)

    def optional_count(self, name: str) -> int | None:
        """A non-negative integer, or None when the field is absent or null."""
        if self.obj.get(name) is None:
            return None
        return self.count(name)

    def seconds(self, name: str) -> float:
        """A required finite number, or a string holding one (RAGPulse writes ``"82"``)."""
        value = self._get(name, False)
        if type(value) is str:
            try:
                number = float(value)
            except ValueError:
                raise self.error(name, "a number", value) from None
        elif type(value) in (int, float):
            number = float(value)
        else:
            raise self.error(name, "a number", value)
        if not math.isfinite(number):
            raise self.error(name, "a finite number", value)
        return number

    def optional_duration(self, name: str) -> float | None:
        """A non-negative finite number of seconds, or None when absent or null."""
        value = self.obj.get(name)
        if value is None:
            return None
        if type(value) in (int, float) and math.isfinite(value) and value >= 0:
            return float(value)
        raise self.error(name, NUMBER, value)

    def text(self, name: str) -> str:
        """A required non-empty string."""
        value = self._get(name, False)
        if type(value) is str and value:
            return value
        raise self.error(name, "a non-empty string", value)

    def optional_text(self, name: str) -> str | None:
        """A string, or None when absent or null."""
        value = self.obj.get(name)
        if value is None or type(value) is str:
            return value
        raise self.error(name, "a string", value)

    def ids(self, name: str, *, optional: bool = False) -> tuple[int, ...]:
        """An array of non-negative integer ids (an absent optional field is empty)."""
        value = self._get(name, optional)
        if value is None and optional:
            return ()
        if type(value) is list and all(type(item) is int and item >= 0 for item in value):
            return tuple(value)
        raise self.error(name, "an array of non-negative integers", value)

    def objects(self, name: str, *, optional: bool = False) -> list[dict[str, Any]]:
        """An array of objects (an absent optional field is empty)."""
        value = self._get(name, optional)
        if value is None and optional:
            return []
        if type(value) is list and all(type(item) is dict for item in value):
            return value
        raise self.error(name, "an array of objects", value)

    def instant(self, name: str) -> float:
        """A required RFC 3339 timestamp, as seconds since the epoch."""
        value = self.text(name)
        try:
            return parse_timestamp(value) / 1_000_000
        except ValueError:
            raise InputError(
                f'{self.where}: field "{self.prefix}{name}" is not an RFC 3339 timestamp: {value!r}'
            ) from None


# CSV ----------------------------------------------------------------------------------


def column_key(name: str) -> str:
    """A header name as matched: case, spaces and underscores do not count, so
    ``Session ID``, ``SessionID`` and ``session_id`` are one column."""
    return "".join(name.split()).replace("_", "").casefold()


class Header:
    """A CSV header: where each column is, and how the file spells its name."""

    def __init__(self, path: str, line: int, names: list[str]) -> None:
        self.path = path
        self.line = line
        self.names = [name.strip() for name in names]
        self._where: dict[str, int] = {}
        for index, name in enumerate(names):
            self._where.setdefault(column_key(name), index)

    def find(self, column: str) -> int | None:
        return self._where.get(column_key(column))

    def require(self, column: str) -> int:
        index = self.find(column)
        if index is None:
            raise InputError(f'{self.path}:{self.line}: missing column "{column}"')
        return index

    def short_row(self, line: int, cells: list[str], indexes: list[int]) -> InputError:
        """The error for a row that ends before one of the columns it needs."""
        absent = min(index for index in indexes if index >= len(cells))
        return missing(f"{self.path}:{line}", self.names[absent])


class Table:
    """A CSV file's header and its data rows, read for the columns a format requires (two
    or more: the picked cells come as a tuple)."""

    def __init__(
        self, header: Header, records: Iterator[tuple[int, list[str]]], required: Sequence[str]
    ) -> None:
        self.header = header
        self._records = records
        self._indexes = [header.require(column) for column in required]
        # The required columns as the file spells them (messages name them so).
        self.names = [header.names[index] for index in self._indexes]

    def rows(self) -> Iterator[tuple[int, int, tuple[str, ...], list[str]]]:
        """(row, line, the required cells, all cells) for every data row. ``row`` is the
        request's position among the data rows, ``line`` the physical line for messages;
        a row too short for a required column is an error."""
        pick = itemgetter(*self._indexes)  # one C call a row: some files have millions
        for row, (line, cells) in enumerate(self._records, 1):
            try:
                picked = pick(cells)
            except IndexError:
                raise self.header.short_row(line, cells, self._indexes) from None
            yield row, line, picked, cells


def csv_table(path: str, required: Sequence[str]) -> Table | None:
    """The CSV file as a Table, or None when it is empty (not even a header)."""
    records = csv_records(path)
    first = next(records, None)
    return None if first is None else Table(Header(path, *first), records, required)


def csv_records(path: str) -> Iterator[tuple[int, list[str]]]:
    """(line number, cells) for every non-blank record of a CSV file, the header first.
    The line is the record's last physical line (they differ only for quoted newlines)."""
    reader = csv.reader(text for _, text in text_lines(path))
    try:
        for cells in reader:
            if len(cells) > 1 or (cells and cells[0].strip()):
                yield reader.line_num, cells
    except csv.Error as exc:
        raise InputError(f"{path}:{reader.line_num}: malformed CSV ({exc})") from None


def cell_count(text: str, name: str, source: str, line: int) -> int:
    """A non-negative integer cell (``12``; `` 12`` or ``12.0`` as some CSV writers print
    it)."""
    if text.isdigit() and text.isascii() and len(text) <= _LONGEST:
        return int(text)
    whole, _, zeros = text.strip().partition(".")
    if whole.isdigit() and whole.isascii() and len(whole) <= _LONGEST and not zeros.strip("0"):
        return int(whole)
    raise invalid(f"{source}:{line}", name, COUNT, describe_cell(text))


def cell_number(text: str, name: str, source: str, line: int) -> float:
    """A non-negative finite number cell."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if 0 <= value < math.inf and "_" not in text:
        return value
    raise invalid(f"{source}:{line}", name, NUMBER, describe_cell(text))


def cell_text(cells: list[str], index: int | None) -> str | None:
    """An optional text cell: None when the column is absent, the row short or the cell
    blank."""
    if index is None or index >= len(cells):
        return None
    return cells[index].strip() or None
