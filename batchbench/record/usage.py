"""The upstream's usage, read from a reply as it passes through the proxy.

A streamed reply is read event by event (SSE: events end at a blank line). When the proxy
asked for usage on the client's behalf, the one event that carries only usage
(``"choices": []``) is taken out of what the client sees: the client gets the stream it
asked for. Otherwise every byte goes to the client the moment it arrives, and events are
only inspected on a copy.
"""

from __future__ import annotations

from typing import Any

import orjson

_MARK = b'"usage"'  # events without it are never parsed
_ENDS = (b"\n\n", b"\r\n\r\n")


def usage_of(document: Any) -> dict[str, Any] | None:
    usage = document.get("usage") if isinstance(document, dict) else None
    return usage if isinstance(usage, dict) else None


def json_usage(body: bytes) -> dict[str, Any] | None:
    """The usage of a whole JSON reply (None when it has none or is not JSON)."""
    try:
        return usage_of(orjson.loads(body))
    except orjson.JSONDecodeError:
        return None


def _event_data(event: bytes) -> bytes:
    """An event's data: its ``data:`` lines' values joined by newlines (the SSE rule)."""
    values = []
    for line in event.splitlines():
        if line.startswith(b"data:"):
            value = line[5:]
            values.append(value[1:] if value.startswith(b" ") else value)
    return b"\n".join(values)


def _last_event_end(buffer: bytearray) -> int:
    """Index just past the last complete event in ``buffer`` (0: none)."""
    ends = [at + len(end) for end in _ENDS if (at := buffer.rfind(end)) >= 0]
    return max(ends, default=0)


class StreamUsage:
    """Watches an SSE reply. ``feed`` returns the bytes to send the client now; ``finish``
    the rest at the end of the stream. ``usage`` is the last usage object seen.

    Only what follows the last complete event is held; events are split and parsed only
    when the mark of usage is among them (most chunks of a stream are content)."""

    def __init__(self, strip_usage_only: bool) -> None:
        self.strip = strip_usage_only
        self.usage: dict[str, Any] | None = None
        self.pending = bytearray()

    def feed(self, chunk: bytes) -> bytes:
        self.pending += chunk
        if _MARK in self.pending:
            kept = self._events()
        else:
            end = _last_event_end(self.pending)
            kept = bytes(self.pending[:end]) if self.strip else b""
            del self.pending[:end]
        return kept if self.strip else chunk

    def finish(self) -> bytes:
        """What is left after the last event end (a stream cut short)."""
        rest = bytes(self.pending)
        self.pending.clear()
        if rest and self._usage_only(rest):
            rest = b""
        return rest if self.strip else b""

    def _events(self) -> bytes:
        """Take every complete event from ``pending``; the bytes to forward. Only the
        events around a usage mark are parsed; the others are kept as they are."""
        kept = bytearray()
        start = 0  # pending[:start] is done with
        while (mark := self.pending.find(_MARK, start)) >= 0:
            ends = [at + len(e) for e in _ENDS if (at := self.pending.find(e, mark)) >= 0]
            if not ends:
                break  # the marked event is not complete yet
            begins = [at + len(e) for e in _ENDS if (at := self.pending.rfind(e, start, mark)) >= 0]
            begin, end = max(begins, default=start), min(ends)
            kept += self.pending[start:begin]
            event = bytes(self.pending[begin:end])
            if not self._usage_only(event):
                kept += event
            start = end
        tail = [at + len(e) for e in _ENDS if (at := self.pending.rfind(e, start)) >= 0]
        end = max(tail, default=start)
        kept += self.pending[start:end]
        del self.pending[:end]
        return bytes(kept)

    def _usage_only(self, event: bytes) -> bool:
        """Reads usage from the event; True when usage is all it carries."""
        if _MARK not in event:
            return False
        try:
            document = orjson.loads(_event_data(event))
        except orjson.JSONDecodeError:
            return False
        usage = usage_of(document)
        if usage is None:
            return False
        self.usage = usage
        return document.get("choices") == []
