"""Claude Code's session logs (``~/.claude/projects/<project>/<session>.jsonl``, and a
sub-agent's ``agent-<id>.jsonl``): one JSON entry a line.

Only ``user`` and ``assistant`` entries are read (``summary``, ``system`` and the other
bookkeeping entries are skipped); fields used: ``sessionId``, ``isSidechain``,
``agentId``, ``uuid``, ``parentUuid``, ``timestamp`` and ``message`` (``id``, ``model``,
``content``, ``usage``).

One Record per API response. Claude Code writes a response as several entries (one per
content block: thinking, text, tool_use), each with the response's ``message.id`` and
usage; the entries of one id are one response, the last one's usage and time win (the
earlier ones can be partial snapshots), and an id seen again later in the file (a resumed
session copies history) is skipped. ``<synthetic>`` assistant entries (errors Claude Code
writes itself) are not responses. ``row`` is the line of the response's first entry, and
records come out in that order. Missing cache counts are 0 (gateways omit them).

Sizes: ``input_tokens`` = ``input_tokens`` + ``cache_creation_input_tokens`` +
``cache_read_input_tokens``; ``output_tokens`` as written.
Time: ``end_s`` is the response's last entry; ``time_s`` the entry before its first one in
the same session (the user message or tool result that was sent, or the previous
response), or its first entry when nothing precedes it.
Sessions: the main chain is ``sessionId``; a sub-agent's entries (``isSidechain``) are the
session ``<sessionId>/sidechain/<agentId>``, or, in logs written before ``agentId``
existed, ``<sessionId>/sidechain/<uuid of the chain's first entry>`` (followed through
``parentUuid``). ``origin`` is the response's ``message.id``.
``new_segments``: the user entries since the session's previous response, one segment per
content part in order (``tool_result`` → ``tool``, text → ``user``), sizing the prompt's
growth (this prompt minus the previous prompt and reply, when positive) in proportion to
characters. The growth is measured on whole prompts rather than as cache creation minus
the previous reply, which would count a whole prompt as new after the prompt cache expired.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from batchbench.ingest.formats._growth import growth_segments
from batchbench.ingest.formats.fields import Fields, parse_object
from batchbench.ingest.inputs import text_lines
from batchbench.ingest.record import FormatOptions, Record

NAME = "claude-code"
SUMMARY = "Claude Code session logs (~/.claude/projects/*/*.jsonl): one request per API response"

_SYNTHETIC_MODEL = "<synthetic>"


@dataclass(slots=True)
class _Response:
    """A response whose entries are still being read."""

    message_id: str
    row: int
    time_s: float
    end_s: float
    usage: Fields
    model: str | None


@dataclass(slots=True)
class _Chain:
    """One session's state between entries."""

    last_s: float | None = None  # the latest entry's time
    pending: _Response | None = None
    items: list[tuple[str, int]] = field(default_factory=list)  # user parts since the reply
    prompt: int | None = None  # the previous response's prompt and reply
    output: int = 0


def _characters(content: Any) -> int:
    """The characters of a tool result's content: a string, or text parts."""
    if type(content) is str:
        return len(content)
    if type(content) is list:
        return sum(
            len(part["text"])
            for part in content
            if type(part) is dict and type(part.get("text")) is str
        )
    return 0


def _user_parts(message: Fields) -> list[tuple[str, int]]:
    """(role, characters) of a user message's parts: text is ``user``, results ``tool``."""
    content = message.obj.get("content")
    if type(content) is str:
        return [("user", len(content))]
    parts = []
    for index, part in enumerate(message.objects("content")):
        kind = Fields(part, message.where, f"{message.prefix}content[{index}].").optional_text(
            "type"
        )
        if kind == "text":
            parts.append(("user", _characters([part])))
        elif kind == "tool_result":
            parts.append(("tool", _characters(part.get("content"))))
    return parts


class _Reader:
    """The walk over one log: the chains, and the finished records waiting for an earlier
    open response so that records come out in the order of their first lines."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.chains: dict[str, _Chain] = {}
        self.open: dict[str, int] = {}  # session -> first line of its open response
        self.finished: list[tuple[int, Record]] = []  # a heap by first line
        self.roots: dict[str, str] = {}  # sidechain entry uuid -> its chain's first uuid
        self.done: set[str] = set()  # message ids already recorded

    def session(self, fields: Fields) -> str:
        """The entry's session key; a sidechain entry also extends its chain's roots."""
        session_id = fields.text("sessionId")
        if not self.sidechain(fields):
            return session_id
        fields.text("uuid")
        root = self.link(fields.obj)
        return f"{session_id}/sidechain/{fields.optional_text('agentId') or root}"

    @staticmethod
    def sidechain(fields: Fields) -> bool:
        value = fields.obj.get("isSidechain")
        if value is None or type(value) is bool:
            return bool(value)
        raise fields.error("isSidechain", "a boolean", value)

    def link(self, obj: dict[str, Any]) -> str:
        """The first uuid of the entry's chain (its own when its parent is not a sidechain
        entry seen before), remembered for the entries that follow it."""
        uuid, parent = obj.get("uuid"), obj.get("parentUuid")
        root = self.roots.get(parent, uuid) if type(parent) is str else uuid
        if type(uuid) is str and type(root) is str:
            self.roots[uuid] = root
        return str(root)

    def entry(self, number: int, obj: dict[str, Any]) -> None:
        kind = obj.get("type")
        if kind not in ("user", "assistant"):
            if obj.get("isSidechain") is True:  # a hook or progress entry links the chain
                self.link(obj)
            return
        fields = Fields(obj, f"{self.path}:{number}")
        session = self.session(fields)
        chain = self.chains.setdefault(session, _Chain())
        time_s = fields.instant("timestamp")
        message = fields.nested("message")
        if kind == "user":
            self.finish(session, chain)
            chain.items.extend(_user_parts(message))
            chain.last_s = time_s
            return
        message_id = message.text("id")
        model = message.optional_text("model")
        if model == _SYNTHETIC_MODEL or message_id in self.done:
            return
        usage = message.nested("usage")
        pending = chain.pending
        if pending is not None and pending.message_id == message_id:
            pending.end_s, pending.usage = time_s, usage
        else:
            self.finish(session, chain)
            start = chain.last_s if chain.last_s is not None else time_s
            chain.pending = _Response(message_id, number, start, time_s, usage, model)
            self.open[session] = number
        chain.last_s = time_s

    def finish(self, session: str, chain: _Chain) -> None:
        """The chain's open response, if any, becomes a finished record."""
        response = chain.pending
        if response is None:
            return
        usage = response.usage
        prompt = (
            usage.count("input_tokens")
            + (usage.optional_count("cache_creation_input_tokens") or 0)
            + (usage.optional_count("cache_read_input_tokens") or 0)
        )
        output = usage.count("output_tokens")
        new_segments = None
        if chain.prompt is not None:
            new_segments = growth_segments(prompt - chain.prompt - chain.output, chain.items)
        chain.pending, chain.items, chain.prompt, chain.output = None, [], prompt, output
        del self.open[session]
        self.done.add(response.message_id)
        record = Record(
            source=self.path,
            row=response.row,
            time_s=response.time_s,
            input_tokens=prompt,
            output_tokens=output,
            end_s=response.end_s,
            session=session,
            new_segments=new_segments,
            model=response.model,
            origin=response.message_id,
        )
        heapq.heappush(self.finished, (response.row, record))

    def ready(self) -> Iterator[Record]:
        """The finished records no open response precedes."""
        first_open = min(self.open.values(), default=None)
        while self.finished and (first_open is None or self.finished[0][0] < first_open):
            yield heapq.heappop(self.finished)[1]

    def close(self) -> Iterator[Record]:
        """Every remaining record: the responses still open at the end are complete."""
        for session, chain in list(self.chains.items()):
            self.finish(session, chain)
        yield from self.ready()


def read(path: str, options: FormatOptions) -> Iterator[Record]:
    """The log's API responses in the order of their first lines, streamed (only open
    responses and the records after them are held)."""
    reader = _Reader(path)
    for number, line in text_lines(path):
        if line.strip():
            reader.entry(number, parse_object(line, f"{path}:{number}"))
            yield from reader.ready()
    yield from reader.close()
