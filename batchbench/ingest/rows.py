"""The request-log row of COMPAT §7.2, streamed from JSONL into a compact record.

Each line is checked field by field: a bad value stops the export with one line naming
the file, the line and the field. Fields the exporter does not use are ignored.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from batchbench.errors import InputError
from batchbench.ingest.formats.fields import decode, kind
from batchbench.ingest.window import parse_timestamp


@dataclass(slots=True)
class Row:
    """One logged request. ``line`` is its 1-based line in the input (the last tie-break)."""

    ts_us: int
    principal_id: str
    correlation_id: str
    model: str | None
    chain: tuple[str, ...]
    block_roles: tuple[str, ...]
    block_tokens: tuple[int, ...]
    prompt_tokens: int | None
    completion_tokens: int | None
    stream: bool | None
    max_tokens: int | None
    duration_ms: float  # a missing value counts as 0 (D19)
    line: int

    @property
    def leaf(self) -> str | None:
        """The last chain hash: identifies the whole prompt's blocks."""
        return self.chain[-1] if self.chain else None

    def sort_key(self) -> tuple[int, str, int]:
        return (self.ts_us, self.correlation_id, self.line)


class _Fields:
    """Typed reads of one row's fields; errors name the file, line and field."""

    def __init__(self, obj: dict[str, Any], where: str) -> None:
        self.obj = obj
        self.where = where

    def fail(self, name: str, expected: str, value: Any) -> InputError:
        return InputError(f"{self.where}: field {name!r} must be {expected}, found {kind(value)}")

    def string(self, name: str, *, optional: bool = False) -> str | None:
        value = self.obj.get(name)
        if isinstance(value, str) or (value is None and optional):
            return value
        if value is None and name not in self.obj:
            raise InputError(f"{self.where}: missing field {name!r}")
        raise self.fail(name, "a string", value)

    def count(self, name: str) -> int | None:
        value = self.obj.get(name)
        if value is None:
            return None
        if type(value) is int:
            return value
        if type(value) is float and value.is_integer():
            return int(value)
        raise self.fail(name, "an integer or null", value)

    def flag(self, name: str) -> bool | None:
        value = self.obj.get(name)
        if value is None or type(value) is bool:
            return value
        raise self.fail(name, "a boolean or null", value)

    def number(self, name: str) -> float:
        value = self.obj.get(name)
        if value is None:
            return 0.0
        if type(value) in (int, float) and value == value and abs(value) != float("inf"):
            return float(value)
        raise self.fail(name, "a number or null", value)

    def strings(self, name: str) -> tuple[str, ...]:
        value = self.obj.get(name)
        if value is None:
            return ()
        if type(value) is list and all(type(item) is str for item in value):
            return tuple(value)
        raise self.fail(name, "an array of strings", value)

    def counts(self, name: str) -> tuple[int, ...]:
        value = self.obj.get(name)
        if value is None:
            return ()
        if type(value) is list and all(type(item) is int and item >= 0 for item in value):
            return tuple(value)
        raise self.fail(name, "an array of non-negative integers", value)


def parse_row(line: bytes, number: int, source: str) -> Row:
    """One JSONL line as a Row, or InputError naming ``source:number`` and the field."""
    where = f"{source}:{number}"
    obj = decode(line, where)
    if type(obj) is not dict:
        raise InputError(f"{where}: a row must be a JSON object, found {kind(obj)}")
    fields = _Fields(obj, where)
    ts = fields.string("ts")
    assert ts is not None
    try:
        ts_us = parse_timestamp(ts)
    except ValueError:
        raise InputError(f"{where}: field 'ts' is not an RFC 3339 timestamp: {ts!r}") from None
    principal = fields.string("principal_id")
    correlation = fields.string("correlation_id")
    assert principal is not None and correlation is not None
    return Row(
        ts_us=ts_us,
        principal_id=principal,
        correlation_id=correlation,
        model=fields.string("model", optional=True),
        chain=fields.strings("chain"),
        block_roles=fields.strings("block_roles"),
        block_tokens=fields.counts("block_tokens"),
        prompt_tokens=fields.count("prompt_tokens"),
        completion_tokens=fields.count("completion_tokens"),
        stream=fields.flag("stream"),
        max_tokens=fields.count("max_tokens"),
        duration_ms=fields.number("duration_ms"),
        line=number,
    )


def read_rows(path: str) -> Iterator[Row]:
    """Stream the rows of a JSONL file; blank lines are skipped."""
    try:
        handle = open(path, "rb")  # noqa: SIM115 - the open and the reads fail differently
    except OSError as exc:
        raise InputError(f"cannot open {path}: {exc.strerror or exc}") from None
    with handle:
        number = 0
        try:
            for number, line in enumerate(handle, 1):
                if line.strip():
                    yield parse_row(line, number, path)
        except OSError as exc:
            raise InputError(f"{path}:{number + 1}: cannot read: {exc.strerror or exc}") from None
