"""Typed reads of trace fields shared by the format readers.

Every failure is one ``InputError`` line naming the file, the line and the field, so a bad
row in a file of millions is found at once. The checks are written for the common case
first (a correct value costs a type test and a comparison); the wording of a message is
only built when a value is wrong.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterator
from typing import Any

import orjson

from batchbench.errors import InputError
from batchbench.ingest.inputs import lines, text_lines

MISSING: Any = object()  # a JSON field that is absent, told apart from null

COUNT = "a non-negative integer"
NUMBER = "a non-negative number"
_INT_ONLY = {int}
_LONGEST = 20  # digits of a count cell: 2**64 has 20, and int() refuses thousands


def describe(value: Any) -> str:
    """How a message names a JSON value: a number by itself, anything else by its kind."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def describe_cell(text: str) -> str:
    """How a message names a CSV cell: its text, quoted and cut short."""
    if not text.strip():
        return "an empty value"
    shown = text if len(text) <= 40 else text[:40] + "..."
    return f'"{shown}"'


def invalid(source: str, line: int, name: str, expected: str, got: str) -> InputError:
    return InputError(f'{source}:{line}: field "{name}" must be {expected}, got {got}')


def missing(source: str, line: int, name: str) -> InputError:
    return InputError(f'{source}:{line}: missing field "{name}"')


# JSON Lines ---------------------------------------------------------------------------


def json_rows(path: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for every non-blank line of a JSON Lines file, streamed."""
    for line, raw in _nonblank_lines(path):
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise InputError(f"{path}:{line}: invalid JSON ({exc.args[0]})") from None
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
        raise missing(source, line, name)
    raise invalid(source, line, name, COUNT, describe(value))


def number(obj: dict[str, Any], name: str, source: str, line: int) -> float:
    """A required non-negative finite number."""
    value = obj.get(name, MISSING)
    if (type(value) is int or type(value) is float) and 0 <= value < math.inf:
        return float(value)
    if value is MISSING:
        raise missing(source, line, name)
    raise invalid(source, line, name, NUMBER, describe(value))


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
        raise invalid(source, line, name, "an array of integers", got)
    raise invalid(source, line, name, "an array of integers", describe(value))


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
        return missing(self.path, line, self.names[absent])


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
    raise invalid(source, line, name, COUNT, describe_cell(text))


def cell_number(text: str, name: str, source: str, line: int) -> float:
    """A non-negative finite number cell."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if 0 <= value < math.inf and "_" not in text:
        return value
    raise invalid(source, line, name, NUMBER, describe_cell(text))


def cell_text(cells: list[str], index: int | None) -> str | None:
    """An optional text cell: None when the column is absent, the row short or the cell
    blank."""
    if index is None or index >= len(cells):
        return None
    return cells[index].strip() or None
