"""TraceLab's agent rounds (uw-syfi/TraceLab ``round_trace.jsonl``): one model round a line.

Fields used: ``session_id``, ``input_tokens_total``, ``output_tokens``, ``model`` and
``timing_events[]`` (``event_type``, ISO ``timestamp``, ``content_chars``), plus the
previous round's ``tools[].result_chars`` to size tool results. ``prefix_tokens`` and
``newly_append_tokens`` are cache statistics (Codex's cached tokens come in 128-token
steps, and ``prefix_tokens`` can drop below the previous prompt), not the prompt's
structure, so they are not used.

Time: the round starts at its last input event (``user_message`` or ``tool_result``):
the request goes out once the last tool result is in. Without input events, it starts
at its first event. It ends at its last model-output event (``reasoning``, ``text``,
``tool_call``). Tool execution (``tools[].result_at``) and Codex's ``usage_report``
bookkeeping are not output, so tool time falls into the delay before the next round.

``output_tokens`` is taken as is: it includes ``reasoning_output_tokens`` (always at most
``output_tokens``; within a Codex turn the next prompt grows by the whole output, and at
the next user message it shrinks by the turn's reasoning, which the API drops).

``new_segments``: the prompt growth over the previous round of the session
(``input_tokens_total`` minus the previous prompt and output), when positive, split in
event order between the round's tool results (``tool``, one segment per result, sized
by the previous round's ``result_chars`` in call order) and user messages (``user``,
``content_chars``), in proportion to characters.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from batchbench.errors import InputError
from batchbench.ingest.formats._growth import growth_segments
from batchbench.ingest.formats.fields import Fields, parse_object
from batchbench.ingest.inputs import text_lines
from batchbench.ingest.record import FormatOptions, Record

NAME = "tracelab"
SUMMARY = "TraceLab agent rounds (round_trace.jsonl): sessions, round timing, tool results"

_INPUT_EVENTS = {"user_message": "user", "tool_result": "tool"}
_OUTPUT_EVENTS = frozenset({"reasoning", "text", "tool_call"})


class _Session:
    """What the next round of a session needs from this one."""

    __slots__ = ("output", "prompt", "result_chars")

    def __init__(self, prompt: int, output: int, result_chars: list[int]) -> None:
        self.prompt = prompt
        self.output = output
        self.result_chars = result_chars


def _events(fields: Fields) -> list[tuple[str, float, int]]:
    """(kind, time, characters) of every timing event, in the order written."""
    events = []
    for index, entry in enumerate(fields.objects("timing_events")):
        event = Fields(entry, fields.where, f"timing_events[{index}].")
        events.append(
            (
                event.text("event_type"),
                event.instant("timestamp"),
                event.optional_count("content_chars") or 0,
            )
        )
    if not events:
        raise InputError(f'{fields.where}: field "timing_events" is empty')
    return events


def _result_chars(fields: Fields) -> list[int]:
    return [
        Fields(entry, fields.where, f"tools[{index}].").optional_count("result_chars") or 0
        for index, entry in enumerate(fields.objects("tools", optional=True))
    ]


def _record(path: str, number: int, obj: dict[str, Any], sessions: dict[str, _Session]) -> Record:
    fields = Fields(obj, f"{path}:{number}")
    session = fields.text("session_id")
    prompt = fields.count("input_tokens_total")
    output = fields.count("output_tokens")
    events = _events(fields)
    inputs = [time for kind, time, _ in events if kind in _INPUT_EVENTS]
    outputs = [time for kind, time, _ in events if kind in _OUTPUT_EVENTS]
    start = max(inputs) if inputs else min(time for _, time, _ in events)
    previous = sessions.get(session)
    new_segments = None
    if previous is not None:
        results = iter(previous.result_chars)
        items = []
        for kind, _, chars in events:
            role = _INPUT_EVENTS.get(kind)
            if role == "tool":
                items.append((role, next(results, 0)))
            elif role == "user":
                items.append((role, chars))
        new_segments = growth_segments(prompt - previous.prompt - previous.output, items)
    sessions[session] = _Session(prompt, output, _result_chars(fields))
    return Record(
        source=path,
        row=number,
        time_s=start,
        input_tokens=prompt,
        output_tokens=output,
        end_s=max(outputs) if outputs else None,
        session=session,
        new_segments=new_segments,
        model=fields.optional_text("model"),
    )


def read(path: str, options: FormatOptions) -> Iterator[Record]:
    """The rounds in file order, streamed; blank lines are skipped."""
    sessions: dict[str, _Session] = {}
    for number, line in text_lines(path):
        if line.strip():
            yield _record(path, number, parse_object(line, f"{path}:{number}"), sessions)
