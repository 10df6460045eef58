"""Mooncake traces (kvcache-ai/Mooncake, FAST'25 release): one request a JSON line.

``{"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47]}``:
``timestamp`` is the arrival in milliseconds (an integer or a float), ``hash_ids`` the
remapped hashes of the prompt's consecutive 512-token blocks, the last (partial) block
included; a prefix shared by two prompts shows as equal leading ids. The ids are cumulative
(the hash of a block covers every block before it), so equal ids mean equal content from
the prompt's start, and the importer takes them as one namespace (``hash_scope`` global):
the parts of one trace may be imported together, but each released trace numbers its ids
from 0, so two different traces in one import would seem to share blocks. Files in this
layout from other sources may use another block size: ``--block-size``
(``FormatOptions.block_size``) overrides 512. ``hash_ids`` may be absent (no content
hashes). The trace names no session, stream or model.

``row`` is the line number; blank lines are skipped but keep their numbers.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal

from batchbench.ingest.formats.fields import count, integer_ids, json_rows, number
from batchbench.ingest.record import FormatOptions, Record

NAME = "mooncake"
SUMMARY = "Mooncake JSONL: timestamp (ms), input/output_length, hash_ids of 512-token blocks"

BLOCK_SIZE = 512


def read(path: str, options: FormatOptions) -> Iterator[Record]:
    """The file's requests in file order, one line at a time."""
    block_size = options.block_size or BLOCK_SIZE
    for line, obj in json_rows(path):
        yield sized_record(obj, path, line, 1000, block_size, "global")


def sized_record(
    obj: dict[str, Any],
    path: str,
    line: int,
    time_per_second: int,
    block_size: int,
    hash_scope: Literal["global", "file"],
    key: str | None = None,
    parent: str | None = None,
) -> Record:
    """The record of a row in this layout (``timestamp`` in units of ``1 /
    time_per_second`` seconds, ``input_length``, ``output_length``, optional ``hash_ids``),
    checked in that order; Bailian rows are this layout plus chat links (``key``,
    ``parent``)."""
    time_s = number(obj, "timestamp", path, line) / time_per_second
    input_tokens = count(obj, "input_length", path, line)
    output_tokens = count(obj, "output_length", path, line)
    hash_ids = integer_ids(obj, "hash_ids", path, line)
    return Record(
        source=path,
        row=line,
        time_s=time_s,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        key=key,
        parent=parent,
        hash_ids=hash_ids,
        block_size=0 if hash_ids is None else block_size,
        hash_scope=hash_scope,
    )
