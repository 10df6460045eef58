"""A test-local trace format for the import pipeline: its reader yields hand-built
``Record`` values, so the shared pipeline is tested apart from every real format reader.

``install(monkeypatch)`` registers the module under ``batchbench.ingest.formats`` and the
name ``toy`` in the importer's format table, both undone after the test; the returned
``ToyTraces`` maps an input path (as given to the importer) to its records and keeps the
``FormatOptions`` each read received.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from typing import Any

import pytest

from batchbench.ingest import importer
from batchbench.ingest.record import FormatOptions, Record

NAME = "toy"
MODULE = "toy_trace"


class ToyTraces(dict[str, list[Record]]):
    """Input path -> the records its reader yields."""

    def __init__(self) -> None:
        super().__init__()
        self.options: list[FormatOptions] = []

    def read(self, path: str, options: FormatOptions) -> Iterator[Record]:
        self.options.append(options)
        yield from self[path]


def install(monkeypatch: pytest.MonkeyPatch) -> ToyTraces:
    traces = ToyTraces()
    module = types.ModuleType(f"batchbench.ingest.formats.{MODULE}")
    module.read = traces.read  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, f"batchbench.ingest.formats.{MODULE}", module)
    monkeypatch.setitem(importer.FORMATS, NAME, MODULE)
    return traces


def record(
    source: str, row: int, time_s: float, input_tokens: int, output_tokens: int, **fields: Any
) -> Record:
    return Record(
        source=source,
        row=row,
        time_s=time_s,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        **fields,
    )


def hashed(
    source: str,
    row: int,
    time_s: float,
    ids: tuple[int | str, ...],
    input_tokens: int,
    output_tokens: int,
    **fields: Any,
) -> Record:
    """A Mooncake-style record: hash ids of 100-token blocks."""
    return record(
        source, row, time_s, input_tokens, output_tokens, hash_ids=ids, block_size=100, **fields
    )


def block(seed: str, tokens: int, role: str = "user", live: bool = False) -> dict[str, Any]:
    """A manifest block as the plans spell it."""
    written: dict[str, Any] = {"seed": seed, "role": role, "tokens": tokens}
    if live:
        written["live"] = True
    return written
