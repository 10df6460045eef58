"""Pure-Python twin of ``batchbench._native._sse``: the SSE scanner of streamed replies.

The readable reference; the compiled module implements the same algorithm and gives the
same results (see ``batchbench.drive.sse`` for the contract and why it is exact).
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from batchbench.drive.replyerror import BAD_CHUNK, ResponseError, server_error_text

_LOADS = orjson.loads
_DecodeError = orjson.JSONDecodeError

# Bytes that stop a string body from being taken as it stands: a quote ends the string, a
# backslash starts an escape, control characters are invalid JSON inside strings.
_NOT_PLAIN = re.compile(rb'[\x00-\x1f"\\]')

CONTENT = 0
REASONING = 1  # under ``reasoning_content``
REASONING_NAMED = 2  # under ``reasoning`` (vLLM since 0.17)
_KEYS = (b"content", b"reasoning_content", b"reasoning")
MAX_TEMPLATES = 3
HEAD_BYTES = 256  # the stream's first bytes, kept to describe a body that is not SSE
LEARN_BUDGET = 4  # learnings without a hit in between before learning stops


def _bare_cr(data: bytes) -> bool:
    """True when a CR is not followed by LF (or ends the read, where the LF may follow)."""
    return data.count(b"\r") != data.count(b"\r\n") or data[-1:] == b"\r"


def _error_text(payload: bytes) -> str:
    """The message of an error chunk."""
    return server_error_text(payload)


def _bad_chunk() -> Exception:
    """The error of an invalid JSON chunk."""
    return ResponseError(BAD_CHUNK)


def learn(payload: bytes, kind: int) -> tuple[bytes, bytes] | None:
    """``(prefix, suffix)`` around the value of the only ``content`` (or
    ``reasoning_content``, or ``reasoning``) key of a valid, backslash-free payload, else None.

    Without backslashes every quote opens or closes a string, so splitting at quotes
    yields the strings at odd positions; a string followed by ``:`` is a key."""
    if b"\\" in payload:
        return None
    parts = payload.split(b'"')
    key = _KEYS[kind]
    found = -1
    for index in range(1, len(parts) - 1, 2):
        if parts[index] == key and parts[index + 1].strip()[:1] == b":":
            if found >= 0:
                return None  # a duplicate key: the parse kept one of them, which is unknown
            found = index
    if found < 0 or parts[found + 1].strip() != b":" or found + 3 >= len(parts):
        return None  # the value is not a string
    start = sum(len(part) + 1 for part in parts[: found + 2])  # just after the opening quote
    end = start + len(parts[found + 2])  # the closing quote
    return payload[:start], payload[end:]


class SseScanner:
    """Splits SSE reads into ``data:`` payloads and tallies the chunks.

    A payload that fits a learned template (the stream's own chunk with only its text
    changed) is counted without a JSON parse; any other is parsed with orjson, and may
    become a template. Arrival times are those of the read that completed the line.
    """

    __slots__ = (
        "_budget",
        "_carry",
        "_error_event",
        "_last_read",
        "_pieces",
        "_skip_lf",
        "_templates",
        "chunks",
        "content",
        "done",
        "error",
        "head",
        "parsed",
        "reasoning",
        "reasoning_key",
        "times",
        "usage",
    )

    def __init__(self) -> None:
        self._carry = b""  # the start of a line that has not ended
        self._pieces: list[bytes] | None = None  # it and the reads after it, while none ended it
        self._skip_lf = False  # the last read ended in CR: a leading LF is that line's end
        self._error_event = False  # inside an ``event: error`` block
        self.error: str | None = None  # the server's error message, when it sent one
        self.head: bytes | None = None  # the stream's first bytes
        self._last_read = 0.0
        self._templates: list[tuple[bytes, bytes, int]] = []
        self._budget = LEARN_BUDGET
        self.done = False  # the [DONE] line arrived
        self.chunks = 0  # JSON payloads
        self.parsed = 0  # of which parsed in full (the others fit a template)
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.reasoning_key = "reasoning_content"  # the field the reasoning came under
        self.times: list[float] = []  # arrival of each chunk that carried text
        self.usage: Any = None  # the last non-null usage (parsed JSON)

    def feed(self, data: bytes, arrived: float) -> None:
        """Take one network read; complete lines are scanned now, a partial one waits."""
        self._last_read = arrived
        if self.head is None:
            self.head = data[:HEAD_BYTES]
        if self._skip_lf:
            self._skip_lf = False
            if data[:1] == b"\n":
                data = data[1:]
        if b"\r" in data and _bare_cr(data):
            # A CR alone ends a line too (the SSE grammar): every ending becomes LF. A
            # read that ends in CR ends a line there; an LF opening the next belongs to it.
            self._skip_lf = data[-1:] == b"\r"
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        end = data.rfind(b"\n")
        if end < 0:
            # Part of a line that goes on: kept as a piece, joined once when the line
            # ends (a carry copied on every read would cost the line's length squared).
            if data:
                if self._pieces is None:
                    self._pieces = [self._carry, data] if self._carry else [data]
                    self._carry = b""
                else:
                    self._pieces.append(data)
            return
        if self._pieces is not None:
            self._pieces.append(data)
            data = b"".join(self._pieces)
            self._pieces = None
            end = data.rfind(b"\n")
        elif self._carry:
            data = self._carry + data
            end = data.rfind(b"\n")
        self._carry = data[end + 1 :]
        for line in data[:end].split(b"\n"):
            self._line(line, arrived)

    def flush(self) -> None:
        """The stream ended: scan an unterminated last line (at the last read's time)."""
        line = self._carry if self._pieces is None else b"".join(self._pieces)
        self._carry = b""
        self._pieces = None
        self._line(line, self._last_read)

    def _line(self, line: bytes, arrived: float) -> None:
        if line[:5] == b"data:":
            payload = line[5:].strip()
            if self._error_event:
                self._server_error(payload)
            else:
                self._payload(payload, arrived)
        elif not line or line == b"\r":
            self._error_event = False  # a blank line ends the event
        elif line[:6] == b"event:":
            self._error_event = line[6:].strip() == b"error"
            if self._error_event and self.error is None:
                self.error = ""  # an error event, whatever its data says

    def _server_error(self, payload: bytes) -> None:
        """The first error the server reported in the stream (later ones are its echoes)."""
        if not self.error:
            self.error = _error_text(payload)

    def _payload(self, payload: bytes, arrived: float) -> None:
        if not payload:
            return
        for prefix, suffix, kind in self._templates:
            cut = len(payload) - len(suffix)
            if (
                cut >= len(prefix)
                and payload.startswith(prefix)
                and payload.endswith(suffix)
                and _NOT_PLAIN.search(payload, len(prefix), cut) is None
            ):
                try:
                    text = payload[len(prefix) : cut].decode()
                except UnicodeDecodeError:
                    break  # orjson rejects it too: the full parse raises
                self._budget = LEARN_BUDGET
                self.chunks += 1
                if text:
                    (self.content if kind == CONTENT else self.reasoning).append(text)
                    self.times.append(arrived)
                return
        if payload == b"[DONE]":
            self.done = True
            return
        self._parse(payload, arrived)

    def _parse(self, payload: bytes, arrived: float) -> None:
        try:
            chunk = _LOADS(payload)
        except _DecodeError:
            raise _bad_chunk() from None
        self.chunks += 1
        self.parsed += 1
        if type(chunk) is not dict:
            return
        if chunk.get("error") is not None:
            self._server_error(payload)
            return
        usage = chunk.get("usage")
        if usage is not None:
            self.usage = usage
        choices = chunk.get("choices")
        if not choices or type(choices) is not list:
            return
        choice = choices[0]
        delta = choice.get("delta") if type(choice) is dict else None
        if type(delta) is not dict:
            return
        content = delta.get("content")
        reasoning = delta.get("reasoning_content")
        kind = REASONING
        if reasoning is None:
            reasoning = delta.get("reasoning")
            if type(reasoning) is str:
                kind = REASONING_NAMED
                self.reasoning_key = "reasoning"
        has_content = type(content) is str
        has_reasoning = type(reasoning) is str
        if has_content and content:
            self.content.append(content)
        if has_reasoning and reasoning:
            self.reasoning.append(reasoning)
        if (has_content and content) or (has_reasoning and reasoning):
            self.times.append(arrived)
        if usage is not None or self._budget <= 0:
            return
        # A template replaces one text; the other must not carry text of its own.
        if has_content and not (has_reasoning and reasoning):
            self._learn(payload, CONTENT)
        elif has_reasoning and not (has_content and content):
            self._learn(payload, kind)

    def _learn(self, payload: bytes, kind: int) -> None:
        self._budget -= 1
        around = learn(payload, kind)
        if around is not None:
            self._templates.insert(0, (around[0], around[1], kind))
            del self._templates[MAX_TEMPLATES:]
