"""Alibaba Bailian traces (alibaba-edu/qwen-bailian-usagetraces-anon): one request a JSON
line, from a Qwen serving instance of Alibaba Cloud Model Studio.

``{"chat_id": 159, "parent_chat_id": 55, "timestamp": 61.114, "input_length": 521,
"output_length": 132, "type": "text", "turn": 2, "hash_ids": [1089, 1090, 6326]}``:
``timestamp`` is the arrival in seconds from the start of the file, ``parent_chat_id`` the
previous turn's ``chat_id`` (``-1`` for a conversation's first request), ``hash_ids`` the
remapped SipHash ids of the prompt's consecutive 16-token blocks (the files say so in their
names, ``..._blksz_16.jsonl``; ``--block-size`` overrides 16). A follow-up's prompt is the
whole conversation so far, and its ids cover all of it.

Chat ids and hash ids are renumbered per file, so the ids mean equal content only within
one file (``hash_scope`` file); ``key`` is the chat id and ``parent`` the parent's, both as
text. A missing or null ``parent_chat_id`` is a root too, and ``hash_ids`` may be absent.
``type`` (text, search, image, file) and ``turn`` (implied by the parent links) are not
read. ``row`` is the line number; blank lines are skipped but keep their numbers.

The offline batch traces of alibaba/ServeGen (``request_id`` without arrival times) are a
different format and are not read here.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from batchbench.ingest.formats.fields import MISSING, describe, invalid, json_rows, missing
from batchbench.ingest.formats.mooncake import sized_record
from batchbench.ingest.record import FormatOptions, Record

NAME = "bailian"
SUMMARY = "Alibaba Bailian JSONL: chat_id/parent_chat_id turns, timestamp (s), 16-token hash_ids"

BLOCK_SIZE = 16
ROOT = -1  # the parent_chat_id of a conversation's first request
ID = "a non-negative integer or a string"


def _key(obj: dict[str, Any], source: str, line: int) -> str:
    """The request's own chat id, as text."""
    value = obj.get("chat_id", MISSING)
    if (type(value) is int and value >= 0) or (type(value) is str and value):
        return str(value)
    if value is MISSING:
        raise missing(f"{source}:{line}", "chat_id")
    raise invalid(f"{source}:{line}", "chat_id", ID, describe(value))


def _parent(obj: dict[str, Any], source: str, line: int) -> str | None:
    """The parent's chat id, as text; None for a root (-1, null or absent)."""
    value = obj.get("parent_chat_id")
    if value is None or (type(value) is int and value == ROOT):
        return None
    if (type(value) is int and value >= 0) or (type(value) is str and value):
        return str(value)
    raise invalid(f"{source}:{line}", "parent_chat_id", f"{ROOT} or {ID}", describe(value))


def read(path: str, options: FormatOptions) -> Iterator[Record]:
    """The file's requests in file order, one line at a time."""
    block_size = options.block_size or BLOCK_SIZE
    for line, obj in json_rows(path):
        key = _key(obj, path, line)
        parent = _parent(obj, path, line)
        yield sized_record(obj, path, line, 1, block_size, "file", key, parent)
