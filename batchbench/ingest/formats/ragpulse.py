"""RAGPulse's RAG requests (flashserve/RAGPulse ``data/0_trace.jsonl`` and side tables).

A row has ``timestamp`` (seconds from the trace's start, written as a string),
``input_length``, ``output_length``, ``session_id`` and ``hash_ids``, an object of five
id lists: ``sys_prompt``, ``passages_ids``, ``history``, ``web_search``, ``user_input``.
The token size of every id is in a side table beside the trace, one JSON object a line:
``1_sys_prompt``, ``2_passages``, ``3_history``, ``4_user_input``, ``5_web_search``
(``{"<kind>_id": id, "token_length": n}``), with the trace file's extension (``.jsonl``,
or ``.jsonl.gz`` beside a gzipped trace). Only the sizes are kept in memory.

The prompt becomes ``segments`` in that order (RAGPulse's own replay concatenates them
so), each keyed ``<kind>:<id>`` so that content shared between requests (the system
prompt's chunks, a popular passage) is the same on replay:
- system prompt chunks: ``system``;
- passages: ``user`` (retrieved text the service puts into the prompt);
- history: ``user``. It is the previous turns re-chunked into fresh ids at every request
  (questions and answers together, growing by about the last question and answer), text
  inside the prompt rather than the earlier reply itself, so it is not an assistant turn;
- web search results: ``user``, like passages: the service fetched them, no model tool
  call asked for them, and a tool message without a call is not a valid chat;
- user input: ``user``.
``input_length`` is always a few tokens more than the parts (6 to 12 in the public trace:
the chat template's framing); that remainder is a keyless ``user`` segment at the end,
so segments sum to ``input_tokens``. Parts larger than ``input_length`` are an error.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import PurePath

from batchbench.errors import InputError
from batchbench.ingest.formats.fields import Fields, parse_object
from batchbench.ingest.inputs import text_lines
from batchbench.ingest.record import FormatOptions, Record, Segment

NAME = "ragpulse"
SUMMARY = "RAGPulse RAG requests (0_trace.jsonl + side tables): sessions, role-labelled segments"

# (field in hash_ids, segment key prefix, role, side table, id field in the side table)
_PARTS = (
    ("sys_prompt", "sys_prompt", "system", "1_sys_prompt", "sys_prompt_id"),
    ("passages_ids", "passage", "user", "2_passages", "passage_id"),
    ("history", "history", "user", "3_history", "history_id"),
    ("web_search", "web_search", "user", "5_web_search", "web_search_id"),
    ("user_input", "user_input", "user", "4_user_input", "user_input_id"),
)


def side_table_path(trace: str, table: str) -> str:
    """The side table beside ``trace``, with the trace file's extension."""
    path = PurePath(trace)
    extension = path.name[path.name.find(".") :] if "." in path.name else ""
    return str(path.with_name(table + extension))


def load_sizes(path: str, id_field: str) -> dict[int, int]:
    """id → token size of one side table, streamed; a missing table is an InputError."""
    if not os.path.isfile(path):
        raise InputError(f"{path}: RAGPulse side table not found (it must lie beside the trace)")
    sizes: dict[int, int] = {}
    for number, line in text_lines(path):
        if line.strip():
            fields = Fields(parse_object(line, f"{path}:{number}"), f"{path}:{number}")
            sizes[fields.count(id_field)] = fields.count("token_length")
    return sizes


class _Tables:
    """The five side tables' sizes, read once per trace."""

    def __init__(self, trace: str) -> None:
        self.sizes = {
            field: load_sizes(side_table_path(trace, table), id_field)
            for field, _, _, table, id_field in _PARTS
        }
        self.paths = {field: side_table_path(trace, table) for field, _, _, table, _ in _PARTS}


def _segments(fields: Fields, tables: _Tables, prompt: int) -> tuple[Segment, ...]:
    hash_ids = fields.nested("hash_ids")
    segments = []
    for field, prefix, role, _, _ in _PARTS:
        sizes = tables.sizes[field]
        for hash_id in hash_ids.ids(field, optional=True):
            size = sizes.get(hash_id)
            if size is None:
                raise InputError(
                    f'{fields.where}: field "hash_ids.{field}" names id {hash_id}, '
                    f"which {PurePath(tables.paths[field]).name} does not list"
                )
            segments.append(Segment(role, size, f"{prefix}:{hash_id}"))
    remainder = prompt - sum(segment.tokens for segment in segments)
    if remainder < 0:
        raise InputError(
            f'{fields.where}: field "input_length" is {prompt}, less than the '
            f"{prompt - remainder} tokens its hash_ids add up to"
        )
    if remainder:
        segments.append(Segment("user", remainder))
    return tuple(segments)


def read(path: str, options: FormatOptions) -> Iterator[Record]:
    """The requests in file order, streamed; the side tables are read first."""
    tables = _Tables(path)
    for number, line in text_lines(path):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        fields = Fields(parse_object(line, where), where)
        prompt = fields.count("input_length")
        yield Record(
            source=path,
            row=number,
            time_s=fields.seconds("timestamp"),
            input_tokens=prompt,
            output_tokens=fields.count("output_length"),
            session=fields.text("session_id"),
            segments=_segments(fields, tables, prompt),
        )
