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


# The Mooncake-style trace of tests/test_import_pipeline.py, whose plans it spells out.
MC = "traces/mc.jsonl"


def mooncake_records() -> list:
    """Block size 100; id 1 starts every prompt. Letters name the conversations."""
    return [
        hashed(MC, 1, 0.0, (1, 10, 11), 350, 50),  # A1: 50 tokens past its ids
        hashed(MC, 2, 5.0, (1, 20), 250, 20),  # B1
        hashed(MC, 3, 10.0, (1, 10, 11, 12, 13), 480, 40),  # A2 extends A1
        hashed(MC, 4, 15.0, (1, 20, 22), 350, 20),  # B2 extends B1
        hashed(MC, 5, 20.0, (1, 10, 11, 12, 14, 15, 16), 700, 30),  # A3 extends A2
        hashed(MC, 6, 25.0, (1, 20, 23), 340, 10),  # B1 regenerated: its second child
        hashed(MC, 7, 28.0, (1, 10, 11, 50, 51), 450, 10),  # A1 again, no longer A's tail
        hashed(MC, 8, 35.0, (1, 30), 150, 10),  # C1: id 30 a 50-token partial block, its tail
        hashed(MC, 9, 40.0, (1, 30, 31), 300, 10),  # C2: id 30 whole, 31 its tail
        hashed(MC, 10, 45.0, (1, 95), 350, 10),  # D: 150 tokens past its ids
        hashed(MC, 11, 50.0, (1, 80, 81), 300, 50),  # G1
        hashed(MC, 12, 55.0, (1, 80, 81, 82), 320, 20),  # G2: 20 more tokens (< 32): a root
        hashed(MC, 13, 60.0, (1, 90), 200, 40),  # H1
        hashed(MC, 14, 65.0, (1, 90, 91), 260, 10),  # H2: 60 more tokens, reply was 40
        hashed(MC, 15, 70.0, (1, 70), 250, 10),  # F1
        hashed(MC, 16, 130.0, (1, 70, 71), 300, 10),  # F2: 60 s idle after F1
        hashed(MC, 17, 140.0, (1, 60, 61), 350, 10),  # E1
        hashed(MC, 18, 150.0, (1, 33, 34, 35), 400, 10),  # K1
        hashed(MC, 19, 160.0, (1, 33, 36, 37), 400, 10),  # K2: 33 followed by 34, then 36
        hashed(MC, 20, 3800.0, (1, 60, 61, 62), 400, 10),  # E2: 3,660 s after E1
    ]


MOONCAKE_OPTIONS: dict[str, Any] = {
    "shared_prefix_followers": 3,
    "link_window_hours": 1.0,
    "split_idle_ms": 30000.0,
}
