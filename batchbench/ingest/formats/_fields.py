"""Typed reads of a trace row's JSON fields, so every format reports a bad value the same
way: one line naming where (``file:line``, or a path inside a one-document file), the
field and what was found, e.g. ``trace.jsonl:12: field "input_length" must be a
non-negative integer, got a string``."""

from __future__ import annotations

import math
from typing import Any

import orjson

from batchbench.errors import InputError
from batchbench.ingest.window import parse_timestamp


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


def parse_object(text: str | bytes, where: str) -> dict[str, Any]:
    """One JSON object (a JSONL line or a whole file), or InputError naming ``where``."""
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise InputError(f"{where}: invalid JSON ({exc.args[0]})") from None
    if type(value) is not dict:
        raise InputError(f"{where}: expected a JSON object, got {kind(value)}")
    return value


class Fields:
    """The fields of one JSON object; ``where`` locates it and ``prefix`` names its path
    inside the row (``"hash_ids."`` for a nested object)."""

    def __init__(self, obj: dict[str, Any], where: str, prefix: str = "") -> None:
        self.obj = obj
        self.where = where
        self.prefix = prefix

    def error(self, name: str, expected: str, value: Any) -> InputError:
        """The one-line error for a field whose value is not what the format needs."""
        return InputError(
            f'{self.where}: field "{self.prefix}{name}" must be {expected}, got {kind(value)}'
        )

    def _get(self, name: str, optional: bool) -> Any:
        if name not in self.obj and not optional:
            raise InputError(f'{self.where}: missing field "{self.prefix}{name}"')
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
        raise self.error(name, "a non-negative integer", value)

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
        raise self.error(name, "a non-negative number", value)

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
