"""The common record every trace format is parsed into, and nothing more.

A format module reads its rows into ``Record`` values; everything after that (windowing,
filters, sampling, sessions, blocks, delays, validation, writing, statistics) is shared.
A record states only what its trace recorded: a field the trace lacks stays ``None``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

ROLES = ("tool_definition", "system", "user", "assistant", "tool", "tool_call")


@dataclass(frozen=True, slots=True)
class Segment:
    """A role-labelled part of a prompt. Segments with the same ``key`` are the same
    content wherever they occur (the same bytes on replay); ``key=None`` is content of
    this request alone."""

    role: str  # one of ROLES
    tokens: int
    key: str | None = None


@dataclass(slots=True)  # not frozen: a frozen dataclass costs 3x to build, per row
class Record:
    """One request of a trace.

    Sizes: ``input_tokens`` is the whole prompt the trace recorded, ``output_tokens`` the
    reply. Time is in seconds on the trace's own clock (any origin; the importer measures
    offsets from the first kept request or from ``--start``).

    Content, the most precise the trace offers (the importer uses the first present):
    - ``hash_ids``: ids of consecutive ``block_size``-token blocks from the prompt's start
      (block k covers tokens [k·block_size, (k+1)·block_size), the last one may be partial;
      tokens past the last id are unhashed new content). ``hash_scope`` says where equal
      ids mean equal content: ``"global"`` across the input files, ``"file"`` only within
      one input file (the importer qualifies such ids with the file).
      ``prefix_roles`` labels the prompt's first tokens ((role, tokens) spans in order,
      e.g. WEKA's tool definitions then system prompt); other blocks are ``user``.
    - ``segments``: the whole prompt as role-labelled parts (sum = ``input_tokens``).
    - otherwise one block of new content per request (or growth: see ``new_segments``).

    ``new_segments``: roles of the content this request adds after its predecessor's
    prompt and reply (Claude Code's tool results, say), in order; the importer sizes the
    remainder, if any, as ``user`` content.
    """

    source: str  # the input file as given on the command line (provenance)
    row: int  # 1-based line (JSONL), data row (CSV) or request position (one-file traces)
    time_s: float  # arrival
    input_tokens: int
    output_tokens: int
    end_s: float | None = None  # completion, when recorded
    latency_s: float | None = None  # arrival to completion, when recorded (end_s wins)
    # The recorded idle gap before this request: its session's previous request ended,
    # this one started (WEKA think_time).
    idle_before_s: float | None = None
    session: str | None = None  # explicit session key
    key: str | None = None  # this request's own id within its file, when children name it
    parent: str | None = None  # the parent request's ``key`` (Bailian parent_chat_id)
    hash_ids: tuple[int | str, ...] | None = None
    block_size: int = 0
    hash_scope: Literal["global", "file"] = "global"
    prefix_roles: tuple[tuple[str, int], ...] = ()
    segments: tuple[Segment, ...] | None = None
    new_segments: tuple[Segment, ...] | None = None
    stream: bool | None = None
    model: str | None = None
    origin: str | None = None  # where in the source, beyond file and row (a sub-agent's path)


@dataclass(frozen=True, slots=True)
class FormatOptions:
    """What the command line passes to every format reader."""

    # Overrides the format's own hash block size (Mooncake-style files from other sources).
    block_size: int | None = None
