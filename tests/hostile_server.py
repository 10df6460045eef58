"""A hostile HTTP server for client tests: raw sockets on 127.0.0.1, every byte scripted.

The server runs an asyncio loop in a background thread (so the test's own thread can run
the agent, in-process or as a subprocess, and wait for it). Each request it reads gets an
*action*: an ``async (peer, request) -> bool`` that writes whatever bytes it likes (or
none), stalls, resets the connection, or streams without end; it returns True to keep the
connection for the next request.

Which action answers a request: ``script`` is a list of actions (the n-th request gets the
n-th entry, the last one answers the rest; ``[action]`` answers every request) or a
function of the :class:`Request` (its method, path, headers, body, the agent that sent it
and that agent's attempt number) returning an action, or None for the default: a model
list for ``GET`` (so a preflight check can pass), a chat completion otherwise.

Everything is bounded: an endless body stops after ``MAX_ENDLESS_BYTES`` (or when the
client goes away), a stall ends when the client closes or after its own limit, every
connection ends after ``lifetime`` seconds, and leaving the ``with`` block cancels every
connection and stops the loop (its thread is a daemon besides).

    with HostileServer([endless_chunked()]) as server:
        run the client against server.url ...
        assert server.requests[0].agent == 0
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import socket
import struct
import threading
import zlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

HOST = "127.0.0.1"
CRLF = "\r\n"
MAX_ENDLESS_BYTES = 2 << 30  # what an "endless" body writes at most before giving up
PIECE = 1 << 16  # bytes per write of an endless body


# ---------------------------------------------------------------------------------------
# Requests and peers


@dataclass
class Request:
    """One request as the server read it."""

    number: int  # 1-based, over the server's life
    connection: int  # 1-based number of the connection it came on
    method: str
    target: str
    headers: dict[str, str]  # lowercase names (the last value of a repeated name)
    body: bytes
    agent: int | None = None  # from the routing key ``<prefix>-<agent>`` (x-smg-routing-key)
    attempt: int = 1  # this agent's (or, without an agent, this target's) 1-based request count
    sent: int = 0  # bytes the action wrote (the client may not have read them all)

    @property
    def path(self) -> str:
        return self.target.split("?", 1)[0]

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def streamed(self) -> bool:
        try:
            return bool(self.json().get("stream"))
        except (ValueError, AttributeError):
            return False


class Peer:
    """The server's side of one connection, as an action sees it."""

    def __init__(
        self, number: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.number = number
        self.reader = reader
        self.writer = writer
        self.written = 0

    async def write(self, data: bytes) -> None:
        if self.writer.is_closing():
            raise ConnectionResetError("the client went away")
        self.writer.write(data)
        self.written += len(data)
        await self.writer.drain()

    def reset(self) -> None:
        """End the connection with a TCP RST (SO_LINGER 0), not a FIN."""
        sock = self.writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.writer.transport.abort()

    async def until_closed(self, limit: float) -> None:
        """Wait (reading and dropping what arrives) until the client closes, at most
        ``limit`` seconds."""
        with contextlib.suppress(TimeoutError, ConnectionError, OSError):
            async with asyncio.timeout(limit):
                while await self.reader.read(PIECE):
                    pass


Action = Callable[[Peer, Request], Awaitable[bool]]
Script = Sequence[Action] | Callable[[Request], Action | None]


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, str, dict, bytes] | None:
    """(method, target, headers, body) of one request; None at the end of the connection."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        method, target, _ = lines[0].split(" ", 2)
        headers: dict[str, str] = {}
        for line in lines[1:]:
            if line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        body = await reader.readexactly(int(headers.get("content-length", "0")))
        return method, target, headers, body
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, ValueError):
        return None


# ---------------------------------------------------------------------------------------
# The server


class HostileServer:
    """The scripted server (see the module's docstring)."""

    def __init__(self, script: Script, *, lifetime: float = 60.0) -> None:
        self.script = script
        self.lifetime = lifetime
        self.requests: list[Request] = []
        self.connections = 0
        self.written = 0  # bytes written over every connection
        self.port = 0
        self._counts: dict[object, int] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task] = set()

    # -- lifecycle ------------------------------------------------------------------------
    def __enter__(self) -> HostileServer:
        loop = self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=loop.run_forever, name="hostile", daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), loop).result(timeout=10)
        return self

    def __exit__(self, *exc) -> None:
        loop = self._loop
        if loop is None:
            return
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self._stop(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        self._thread.join(timeout=10)  # type: ignore[union-attr]
        loop.close()
        self._loop = None

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._serve, HOST, 0, limit=1 << 20)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _stop(self) -> None:
        self._server.close()  # type: ignore[union-attr]
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def at(self, path: str) -> str:
        return self.url + path

    # -- connections ----------------------------------------------------------------------
    def _action(self, request: Request) -> Action | None:
        script = self.script
        if isinstance(script, Sequence):
            return script[min(request.number, len(script)) - 1]
        return script(request)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._tasks.add(task)  # type: ignore[arg-type]
        self.connections += 1
        sock = writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        peer = Peer(self.connections, reader, writer)
        try:
            async with asyncio.timeout(self.lifetime):
                while (read := await _read_request(reader)) is not None:
                    method, target, headers, body = read
                    request = Request(len(self.requests) + 1, peer.number, method, target,
                                      headers, body)  # fmt: skip
                    key = headers.get("x-smg-routing-key", "")
                    with contextlib.suppress(ValueError):
                        request.agent = int(key.rsplit("-", 1)[-1])
                    counted = (request.agent, request.path if request.agent is None else None)
                    request.attempt = self._counts[counted] = self._counts.get(counted, 0) + 1
                    self.requests.append(request)
                    action = self._action(request)
                    if action is None:
                        action = models if method == "GET" else reply(ok_json(completion()))
                    before = peer.written
                    try:
                        keep = await action(peer, request)
                    finally:
                        request.sent = peer.written - before
                    if not keep:
                        break
        except (TimeoutError, asyncio.CancelledError, ConnectionError, OSError):
            pass  # the lifetime is over, the server stops, or the client went away
        finally:
            self.written += peer.written
            self._tasks.discard(task)  # type: ignore[arg-type]
            writer.transport.abort()


# ---------------------------------------------------------------------------------------
# Building responses


def head(status: str = "200 OK", *headers: str, version: str = "HTTP/1.1") -> bytes:
    return CRLF.join([f"{version} {status}", *headers, "", ""]).encode("latin-1")


def ok(body: bytes, *headers: str, status: str = "200 OK") -> bytes:
    """A whole response with a Content-Length."""
    return head(status, f"Content-Length: {len(body)}", *headers) + body


def dumps(document: Any) -> bytes:
    """JSON as the stdlib writes it (integers of any size)."""
    return json.dumps(document, separators=(",", ":")).encode()


def ok_json(document: Any, *headers: str, status: str = "200 OK") -> bytes:
    return ok(dumps(document), "Content-Type: application/json", *headers, status=status)


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


CHUNKED = "Transfer-Encoding: chunked"
LAST_CHUNK = b"0\r\n\r\n"
EVENT_STREAM = "Content-Type: text/event-stream"


def chunked(*parts: bytes, status: str = "200 OK", headers: Sequence[str] = ()) -> bytes:
    return head(status, CHUNKED, *headers) + b"".join(chunk(p) for p in parts) + LAST_CHUNK


def usage(prompt: Any = 24, completion_tokens: Any = 4, cached: Any = None) -> dict:
    counts: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": completion_tokens}
    if cached is not None:
        counts["prompt_tokens_details"] = {"cached_tokens": cached}
    return counts


def completion(content: str = "ok", counts: Any = ..., **extra: Any) -> dict:
    """A chat completion; ``counts`` is its usage (``...``: 24 prompt, 4 completion)."""
    return {
        "id": "chatcmpl-hostile",
        "object": "chat.completion",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": "stop",
            }
        ],
        "usage": usage() if counts is ... else counts,
        **extra,
    }


def event(document: Any, ending: bytes = b"\n", name: str | None = None) -> bytes:
    """One SSE event: ``[event: name]`` then ``data: <json>``, then a blank line."""
    payload = document if isinstance(document, bytes) else dumps(document)
    line = b"data: " + payload + ending + ending
    if name is not None:
        line = b"event: " + name.encode() + ending + line
    return line


def delta(text: str) -> dict:
    return {
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": {"content": text}}],
    }


def usage_chunk(counts: Any = ...) -> dict:
    return {"object": "chat.completion.chunk", "choices": [],
            "usage": usage() if counts is ... else counts}  # fmt: skip


DONE = b"data: [DONE]\n\n"


def sse_stream(*events: bytes) -> bytes:
    """A whole chunked event stream, each event its own chunk."""
    return chunked(*events, headers=(EVENT_STREAM,))


def good_stream(text: str = "ok", counts: Any = ..., ending: bytes = b"\n") -> list[bytes]:
    """The events of a well-formed streamed reply."""
    return [
        event(delta(text), ending),
        event(usage_chunk(counts), ending),
        b"data: [DONE]" + ending * 2,
    ]


@cache
def gzip_bomb(mebibytes: int = 1024, wrapper: str = "gzip") -> bytes:
    """A valid gzip (or zlib ``deflate``) body of ``mebibytes`` MiB of zeros: about 1 KB
    per MiB. Built from one full-flushed deflate segment repeated (a full flush resets the
    window, so the segment is the same bytes each time)."""
    zeros = bytes(1 << 20)
    compressor = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    compressor.compress(zeros)
    compressor.flush(zlib.Z_FULL_FLUSH)  # the first segment may differ; take the second
    segment = compressor.compress(zeros) + compressor.flush(zlib.Z_FULL_FLUSH)
    tail = compressor.flush()
    size = mebibytes << 20
    if wrapper == "gzip":
        crc = 0
        for _ in range(mebibytes):
            crc = zlib.crc32(zeros, crc)
        return (b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff" + segment * mebibytes + tail
                + struct.pack("<II", crc, size & 0xFFFFFFFF))  # fmt: skip
    adler = 1
    for _ in range(mebibytes):
        adler = zlib.adler32(zeros, adler)
    return b"\x78\xda" + segment * mebibytes + tail + struct.pack(">I", adler)


# ---------------------------------------------------------------------------------------
# Actions


def reply(*parts: bytes, gap: float = 0.0, close: bool = False) -> Action:
    """Write the parts (``gap`` seconds apart: each its own read); ``close`` ends the
    connection afterwards (a FIN)."""

    async def act(peer: Peer, request: Request) -> bool:
        for index, part in enumerate(parts):
            if index and gap:
                await asyncio.sleep(gap)
            await peer.write(part)
        return not close

    return act


def split(data: bytes, cuts: Sequence[int], gap: float = 0.002, close: bool = True) -> Action:
    """``data`` written in pieces cut at the offsets ``cuts``."""
    edges = [0, *sorted({c for c in cuts if 0 < c < len(data)}), len(data)]
    return reply(*(data[a:b] for a, b in itertools.pairwise(edges)), gap=gap, close=close)


def stall(before: bytes = b"", limit: float = 30.0) -> Action:
    """Write ``before`` (maybe nothing), then say nothing more until the client gives up."""

    async def act(peer: Peer, request: Request) -> bool:
        if before:
            await peer.write(before)
        await peer.until_closed(limit)
        return False

    return act


def reset_after(data: bytes, offset: int) -> Action:
    """Write the first ``offset`` bytes of ``data``, then reset the connection."""

    async def act(peer: Peer, request: Request) -> bool:
        if offset:
            await peer.write(data[:offset])
            await asyncio.sleep(0.005)
        peer.reset()
        return False

    return act


def close_after(data: bytes, offset: int) -> Action:
    """Write the first ``offset`` bytes of ``data``, then close (FIN)."""
    return reply(data[:offset], close=True)


def endless(first: bytes, piece: bytes, limit: int = MAX_ENDLESS_BYTES) -> Action:
    """Write ``first``, then ``piece`` again and again until the client goes away (or
    ``limit`` bytes were written)."""

    async def act(peer: Peer, request: Request) -> bool:
        await peer.write(first)
        while peer.written < limit:
            await peer.write(piece)
        return False

    return act


def endless_chunked(headers: Sequence[str] = ()) -> Action:
    return endless(head("200 OK", CHUNKED, *headers), chunk(b"x" * PIECE))


def huge_content_length(size: int = 1 << 30) -> Action:
    """A ``size``-byte body announced by its Content-Length, written as long as the client
    reads."""
    return endless(head("200 OK", f"Content-Length: {size}", "Content-Type: application/json"),
                   b" " * PIECE, limit=size)  # fmt: skip


def bomb(wrapper: str = "gzip", framing: str = "length", mebibytes: int = 1024) -> Action:
    """A compression bomb (``gzip`` or ``deflate``), sent with a Content-Length or chunked."""
    data = gzip_bomb(mebibytes, wrapper)
    encoding = "Content-Encoding: " + ("gzip" if wrapper == "gzip" else "deflate")
    if framing == "length":
        return reply(ok(data, encoding, "Content-Type: application/json"))
    pieces = [chunk(data[i : i + PIECE]) for i in range(0, len(data), PIECE)]
    return reply(head("200 OK", CHUNKED, encoding), *pieces, LAST_CHUNK)


async def models(peer: Peer, request: Request) -> bool:
    """The model list of a preflight check: one model, ``m``."""
    await peer.write(ok_json({"object": "list", "data": [{"id": "m", "object": "model"}]}))
    return True
