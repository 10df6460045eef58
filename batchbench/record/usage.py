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


class StreamUsage:
    """Watches an SSE reply. ``feed`` returns the bytes to send the client now; ``finish``
    the rest at the end of the stream. ``usage`` is the last usage object seen."""

    def __init__(self, strip_usage_only: bool) -> None:
        self.strip = strip_usage_only
        self.usage: dict[str, Any] | None = None
        self.pending = bytearray()
        self.scanned = 0  # pending[:scanned] holds no event end

    def feed(self, chunk: bytes) -> bytes:
        self.pending += chunk
        kept = bytearray()
        while (end := self._event_end()) >= 0:
            event = bytes(self.pending[:end])
            del self.pending[:end]
            self.scanned = 0
            if not self._usage_only(event):
                kept += event
        return bytes(kept) if self.strip else chunk

    def finish(self) -> bytes:
        """What is left after the last event end (a stream cut short)."""
        rest = bytes(self.pending)
        self.pending.clear()
        if rest and self._usage_only(rest):
            rest = b""
        return rest if self.strip else b""

    def _event_end(self) -> int:
        """Index just past the first complete event in ``pending``, or -1."""
        ends = []
        for separator in _ENDS:
            at = self.pending.find(separator, max(0, self.scanned - len(separator) + 1))
            if at >= 0:
                ends.append(at + len(separator))
        if not ends:
            self.scanned = len(self.pending)
            return -1
        return min(ends)

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
