"""A scriptable OpenAI-style stub server for driver tests: real aiohttp on 127.0.0.1.

The server runs in a background thread with its own event loop, so a test can call
``batchbench.cli.agent.main`` (which runs its own uvloop loop in the main thread) or start
the agent as a subprocess, and both talk to it over loopback. Every request is recorded
(method, path, headers, raw body bytes, arrival time on ``time.perf_counter``).

What the server answers, per request, in this order of precedence:
1. the next spec queued with ``script(...)``, if any;
2. otherwise ``handler(recorded)`` (sync or async), when one was given;
3. otherwise a plain 200 chat completion (``chat_completion()``).

A spec is one of ``Reply`` (a whole response, optionally late), ``Stream`` (timed writes
of a chunked body, e.g. SSE) or ``Drop`` (the connection is closed without a response,
optionally after some raw bytes). A handler may also return a plain ``dict`` (sent as
a 200 JSON body).

    with StubServer() as stub:
        stub.script(Reply(503, "busy"), Reply(body=chat_completion("hi")))
        main(["--host", stub.url, ...])
        assert len(stub.requests) == 2
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

HOST = "127.0.0.1"


@dataclass
class Recorded:
    """One request as the server received it."""

    index: int
    method: str
    path: str
    headers: dict[str, str]  # lowercase names
    raw_headers: list[tuple[str, str]]
    body: bytes
    arrived: float  # time.perf_counter() when the handler started
    peer: tuple | None = None  # the client's (address, port): one per connection

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def messages(self) -> list[dict]:
        return self.json()["messages"]

    @property
    def user(self) -> str | None:
        return self.json().get("user")


@dataclass
class Reply:
    """A complete response; ``body`` may be bytes, str or a JSON-able object."""

    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0  # seconds before the response is sent

    def payload(self) -> tuple[bytes, str]:
        if self.body is None:
            return json.dumps(chat_completion()).encode(), "application/json"
        if isinstance(self.body, bytes):
            return self.body, "application/json"
        if isinstance(self.body, str):
            return self.body.encode(), "text/plain"
        return json.dumps(self.body).encode(), "application/json"


@dataclass
class Stream:
    """Headers at once (after ``delay``), then each (sleep seconds, bytes) part as its own
    network write; ``cut`` aborts the connection after the last part instead of ending the
    chunked body properly."""

    parts: list[tuple[float, bytes]]
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    cut: bool = False
    content_type: str = "text/event-stream"


@dataclass
class Drop:
    """Close the connection without a (complete) response."""

    delay: float = 0.0
    raw: bytes = b""  # written to the socket before it is aborted


Spec = Reply | Stream | Drop | dict


def chat_completion(
    content: str | None = "ok",
    prompt_tokens: Any = 10,
    completion_tokens: Any = 5,
    *,
    message: Any = None,
    cached_tokens: int | None = None,
    usage: Any = ...,
) -> dict:
    """A non-streaming chat completion body; ``message`` replaces the whole message and
    ``usage`` the whole usage object (``...`` = build it from the counts)."""
    if message is None:
        message = {"role": "assistant", "content": content}
    document: dict[str, Any] = {
        "id": "chatcmpl-stub",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
    }
    if usage is ...:
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens}
        if cached_tokens is not None:
            usage["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    if usage is not None:
        document["usage"] = usage
    return document


def sse(obj: Any, ending: bytes = b"\n") -> bytes:
    """One SSE event ``data: <json>`` followed by a blank line."""
    payload = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
    return b"data: " + payload + ending + ending


def delta_chunk(content: str | None = None, reasoning: str | None = None) -> dict:
    delta: dict[str, Any] = {}
    if content is not None:
        delta["content"] = content
    if reasoning is not None:
        delta["reasoning_content"] = reasoning
    return {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta}]}


def usage_chunk(prompt_tokens: int, completion_tokens: int) -> dict:
    return {
        "object": "chat.completion.chunk",
        "choices": [],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens},
    }


class _Closing(Exception):
    """The server is stopping: abandon the response."""


class StubServer:
    """The stub server; use as a context manager or call ``start``/``stop``."""

    def __init__(self, handler: Callable[[Recorded], Any] | None = None) -> None:
        self.handler = handler
        self.requests: list[Recorded] = []
        self._queue: collections.deque[Spec] = collections.deque()
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._closing: asyncio.Event | None = None
        self.port = 0

    # -- lifecycle --------------------------------------------------------------------
    def start(self) -> StubServer:
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(target=loop.run_forever, name="stub-server", daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._serve(), loop).result(timeout=10)
        return self

    async def _serve(self) -> None:
        self._closing = asyncio.Event()
        app = web.Application(client_max_size=1 << 30)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, HOST, 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    def stop(self) -> None:
        loop = self._loop
        if loop is None:
            return

        async def shutdown() -> None:
            assert self._closing is not None and self._runner is not None
            self._closing.set()
            await self._runner.cleanup()

        try:
            asyncio.run_coroutine_threadsafe(shutdown(), loop).result(timeout=10)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            assert self._thread is not None
            self._thread.join(timeout=10)
            loop.close()
            self._loop = None

    def __enter__(self) -> StubServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    # -- scripting and inspection -----------------------------------------------------
    def script(self, *specs: Spec) -> None:
        """Queue responses for the next requests, in order."""
        with self._lock:
            self._queue.extend(specs)

    def clear(self) -> None:
        with self._lock:
            self.requests.clear()
            self._queue.clear()

    def wait_for(self, count: int, timeout: float = 10.0) -> bool:
        """Block until at least ``count`` requests have arrived."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while len(self.requests) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(left)
        return True

    # -- serving ----------------------------------------------------------------------
    async def _sleep(self, seconds: float) -> None:
        if seconds <= 0:
            return
        assert self._closing is not None
        try:
            await asyncio.wait_for(self._closing.wait(), seconds)
        except TimeoutError:
            return
        raise _Closing

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        arrived = time.perf_counter()
        transport = request.transport
        peer = transport.get_extra_info("peername") if transport is not None else None
        body = await request.read()
        with self._changed:
            recorded = Recorded(
                index=len(self.requests),
                method=request.method,
                path=request.path,
                headers={k.lower(): v for k, v in request.headers.items()},
                raw_headers=list(request.headers.items()),
                body=body,
                arrived=arrived,
                peer=tuple(peer) if peer else None,
            )
            self.requests.append(recorded)
            spec = self._queue.popleft() if self._queue else None
            self._changed.notify_all()
        if spec is None:
            if self.handler is not None:
                spec = self.handler(recorded)
                if inspect.isawaitable(spec):
                    spec = await spec
            else:
                spec = Reply()
        if isinstance(spec, dict):
            spec = Reply(body=spec)
        try:
            return await self._respond(request, spec)
        except _Closing:
            _abort(request)
            return web.Response(status=503)

    async def _respond(self, request: web.Request, spec: Spec) -> web.StreamResponse:
        if isinstance(spec, Reply):
            await self._sleep(spec.delay)
            payload, content_type = spec.payload()
            headers = {"Content-Type": content_type, **spec.headers}
            return web.Response(status=spec.status, body=payload, headers=headers)
        if isinstance(spec, Drop):
            await self._sleep(spec.delay)
            transport = request.transport
            if transport is not None:
                if spec.raw:
                    transport.write(spec.raw)
                transport.abort()
            raise asyncio.CancelledError  # nothing more to send on this connection
        if isinstance(spec, Stream):
            await self._sleep(spec.delay)
            response = web.StreamResponse(
                status=spec.status, headers={"Content-Type": spec.content_type, **spec.headers}
            )
            response.enable_chunked_encoding()
            await response.prepare(request)
            for pause, data in spec.parts:
                await self._sleep(pause)
                await response.write(data)
            if spec.cut:
                _abort(request)
                raise asyncio.CancelledError
            await response.write_eof()
            return response
        raise TypeError(f"unknown response spec {spec!r}")


def _abort(request: web.Request) -> None:
    transport = request.transport
    if transport is not None:
        transport.abort()
