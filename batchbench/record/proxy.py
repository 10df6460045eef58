"""The recording reverse proxy: every request goes to the upstream and its reply back to
the client as it arrives; POSTs to .../chat/completions and .../completions also leave a
row. aiohttp serves both sides: its server streams replies without buffering them, and
its client, with automatic decompression off, hands over the upstream's bytes as sent.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from multidict import CIMultiDict

from batchbench.record.blocks import Block, chat_blocks, completion_blocks
from batchbench.record.chain import chain, principal
from batchbench.record.counts import BlockCounter
from batchbench.record.sink import Row, RowSink
from batchbench.record.usage import StreamUsage, json_usage

MAX_REQUEST_BYTES = 256 * 1024 * 1024  # an agent's longest history fits many times over
# Headers of one connection, not of the message (RFC 9110 §7.6.1), and those the
# client library sets itself from the URL and the body.
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)
SESSION_KEY = web.AppKey("upstream_session", aiohttp.ClientSession)


@dataclass(frozen=True, slots=True)
class ProxyConfig:
    upstream: str  # scheme://host[:port][/prefix], without a trailing slash
    key: bytes
    principal_header: str | None


def _forwarded(headers: Any, keep_length: bool = False, unpacked: bool = False) -> CIMultiDict[str]:
    """A message's headers minus the hop-by-hop ones (and those the connection lists);
    ``unpacked``: a request body the server already decompressed, sent on as it is now."""
    listed = {
        name.strip().lower()
        for value in headers.getall("Connection", ())
        for name in value.split(",")
    }
    dropped = _HOP_BY_HOP | listed
    if keep_length:
        dropped -= {"content-length"}
    if unpacked:
        dropped |= {"content-encoding"}
    return CIMultiDict((k, v) for k, v in headers.items() if k.lower() not in dropped)


@dataclass(slots=True)
class _Request:
    """What the row needs from a request body, and the body to forward."""

    blocks: list[Block]
    model: str | None
    stream: bool | None
    max_tokens: int | None
    body: bytes
    asked_usage: bool  # the proxy added include_usage: strip its chunk from the stream


def _read_body(raw: bytes, chat: bool) -> _Request:
    """The body's row fields; a body that is not a JSON object (or nests deeper than JSON
    can be written back, 254 levels) is forwarded as it came, with an empty chain."""
    try:
        return _parse_body(raw, chat)
    except (orjson.JSONDecodeError, orjson.JSONEncodeError):
        return _Request([], None, None, None, raw, False)


def _parse_body(raw: bytes, chat: bool) -> _Request:
    document = orjson.loads(raw)
    if not isinstance(document, dict):
        return _Request([], None, None, None, raw, False)
    model = document.get("model")
    stream = document.get("stream") is True
    limit = document.get("max_tokens")
    if limit is None:
        limit = document.get("max_completion_tokens")
    options = document.get("stream_options")
    asked = False
    body = raw
    if stream and not (isinstance(options, dict) and options.get("include_usage") is True):
        merged = dict(options) if isinstance(options, dict) else {}
        merged["include_usage"] = True
        document["stream_options"] = merged
        body = orjson.dumps(document)
        asked = True
    return _Request(
        blocks=chat_blocks(document) if chat else completion_blocks(document),
        model=model if isinstance(model, str) else None,
        stream=stream,
        max_tokens=limit if type(limit) is int else None,
        body=body,
        asked_usage=asked,
    )


def _unreachable(exc: BaseException) -> web.Response:
    reason = type(exc).__name__
    os_error = getattr(exc, "os_error", None)
    if isinstance(os_error, OSError) and os_error.errno:
        reason = os.strerror(os_error.errno)
    message = f"batchbench record: the upstream server cannot be reached ({reason})"
    body = {"error": {"message": message, "type": "bad_gateway", "code": 502}}
    return web.Response(status=502, body=orjson.dumps(body), content_type="application/json")


class RecordingProxy:
    """The proxy's handlers over one upstream session, one counter and one rows file."""

    def __init__(self, config: ProxyConfig, counter: BlockCounter, sink: RowSink) -> None:
        self.config = config
        self.counter = counter
        self.sink = sink
        # Rows still being hashed and counted after their reply went out; a stop waits for
        # them (``drain``), a hung-up client does not cancel them.
        self._finishing: set[asyncio.Task[None]] = set()

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_REQUEST_BYTES)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        app.cleanup_ctx.append(self._session)
        return app

    def runner(self, grace_s: float) -> web.AppRunner:
        """Stopping waits up to ``grace_s`` for requests in flight, then cancels them."""
        return web.AppRunner(
            self.app(),
            access_log=None,
            handle_signals=False,
            shutdown_timeout=grace_s,
            # A client that hangs up cancels its handler, which closes the upstream request
            # at once (a model would otherwise go on generating for no one).
            handler_cancellation=True,
        )

    async def _session(self, app: web.Application) -> AsyncIterator[None]:
        # No pool limit and no timeouts: the clients bound both, as they would talking to
        # the upstream directly.
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=0)
        session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=None),
            auto_decompress=False,
            skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
        )
        app[SESSION_KEY] = session
        yield
        await session.close()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.method == "POST":
            path = request.path.rstrip("/")
            if path.endswith("/chat/completions"):
                return await self._record(request, chat=True)
            if path.endswith("/completions"):
                return await self._record(request, chat=False)
        return await self._forward(request)

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        """Anything not recorded: the same request upstream, the reply streamed back."""
        body = await request.read()
        session = request.app[SESSION_KEY]
        try:
            async with session.request(
                request.method,
                self.config.upstream + request.raw_path,
                data=body or None,
                headers=_forwarded(request.headers, unpacked=True),
                allow_redirects=False,
            ) as upstream:
                response, _ = await self._relay(request, upstream, read_usage=False)
        except aiohttp.ClientError as exc:  # before any reply: nothing reached the client
            response = _unreachable(exc)
        return response

    async def _record(self, request: web.Request, chat: bool) -> web.StreamResponse:
        named = (
            request.headers.get(self.config.principal_header)
            if self.config.principal_header
            else None
        )
        arrival = _Arrival(
            ts_us=time.time_ns() // 1000,
            started=time.perf_counter(),
            principal_id=principal(self.config.key, request.headers.get("Authorization"), named),
            correlation_id=self.sink.correlation_id(),
        )
        parsed = _read_body(await request.read(), chat)
        headers = _forwarded(request.headers, unpacked=True)
        # The reply is read for usage: ask for it as sent, not compressed.
        headers["Accept-Encoding"] = "identity"
        usage: dict[str, Any] | None = None
        session = request.app[SESSION_KEY]
        response: web.StreamResponse
        try:
            async with session.request(
                request.method,
                self.config.upstream + request.raw_path,
                data=parsed.body,
                headers=headers,
                allow_redirects=False,
            ) as upstream:
                response, usage = await self._relay(
                    request, upstream, read_usage=True, strip_usage=parsed.asked_usage
                )
        except aiohttp.ClientError as exc:  # before any reply: nothing reached the client
            response = _unreachable(exc)
        except asyncio.CancelledError:
            # The client hung up, or a stop's grace ran out: the request still gets its row
            # (without usage), written before the handler ends.
            duration_ms = arrival.elapsed_ms()
            try:
                hashes = chain(self.config.key, parsed.blocks)
                counts = self.counter.counts_now(parsed.blocks)
                self.sink.write(_row(arrival, parsed, None, hashes, counts, duration_ms))
            except Exception as exc:  # counted: never a lost row unsaid
                self.sink.lose(type(exc).__name__)
            raise
        # A client that hangs up now (the reply is out) must not cancel the row's work.
        task = asyncio.ensure_future(self._finish(arrival, parsed, usage))
        self._finishing.add(task)
        task.add_done_callback(self._finishing.discard)
        await asyncio.shield(task)
        return response

    async def drain(self, timeout_s: float) -> None:
        """Wait (up to ``timeout_s``) for rows still being made after their replies; the
        ones that do not finish are counted lost."""
        pending = set(self._finishing)
        if not pending:
            return
        _, late = await asyncio.wait(pending, timeout=timeout_s)
        for task in late:
            task.cancel()
            self.sink.lose("stopped before its row was counted")

    async def _finish(
        self, arrival: _Arrival, parsed: _Request, usage: dict[str, Any] | None
    ) -> None:
        """Hash and count the blocks once the reply is out (no latency added to it), then
        write the row; its duration ends with the reply."""
        duration_ms = arrival.elapsed_ms()
        try:
            size = sum(len(block.canonical) for block in parsed.blocks)
            hashes = await self.counter.off_loop(size, chain, self.config.key, parsed.blocks)
            counts = await self.counter.counts(parsed.blocks)
            row = _row(arrival, parsed, usage, hashes, counts, duration_ms)
        except Exception as exc:  # counted: never a lost row unsaid
            self.sink.lose(type(exc).__name__)
            return
        self.sink.write(row)

    async def _relay(
        self,
        request: web.Request,
        upstream: aiohttp.ClientResponse,
        read_usage: bool,
        strip_usage: bool = False,
    ) -> tuple[web.StreamResponse, dict[str, Any] | None]:
        """Stream the upstream's reply to the client as it comes; with ``read_usage``,
        the usage of a reply that succeeded (``strip_usage``: the proxy asked for it)."""
        ok = read_usage and upstream.status < 400
        sse = ok and upstream.content_type == "text/event-stream"
        strip = sse and strip_usage
        response = web.StreamResponse(
            status=upstream.status,
            reason=upstream.reason,
            headers=_forwarded(upstream.headers, keep_length=not strip),
        )
        watcher = StreamUsage(strip) if sse else None
        copy: list[bytes] = []
        try:
            await response.prepare(request)
            async for chunk in upstream.content.iter_any():
                if watcher is not None:
                    chunk = watcher.feed(chunk)
                elif ok:
                    copy.append(chunk)
                if chunk:
                    await response.write(chunk)
            if watcher is not None:
                rest = watcher.finish()
                if rest:
                    await response.write(rest)
            await response.write_eof()
        except ConnectionResetError:
            pass  # the client left: the upstream connection closes as the block ends
        except aiohttp.ClientError:
            # The upstream broke off mid-reply: the client must see a cut, not an end.
            if request.transport is not None:
                request.transport.close()
        if not ok:
            return response, None
        if watcher is not None:
            return response, watcher.usage
        return response, json_usage(b"".join(copy))


@dataclass(frozen=True, slots=True)
class _Arrival:
    """When a recorded request came, from whom, and its place in the recording."""

    ts_us: int
    started: float  # time.perf_counter() then
    principal_id: str
    correlation_id: str

    def elapsed_ms(self) -> float:
        return round((time.perf_counter() - self.started) * 1000.0, 3)


def _row(
    arrival: _Arrival,
    parsed: _Request,
    usage: dict[str, Any] | None,
    hashes: list[str],
    counts: list[int],
    duration_ms: float,
) -> Row:
    prompt = usage.get("prompt_tokens") if usage else None
    completion = usage.get("completion_tokens") if usage else None
    return Row(
        ts_us=arrival.ts_us,
        principal_id=arrival.principal_id,
        correlation_id=arrival.correlation_id,
        model=parsed.model,
        chain=hashes,
        block_roles=[block.role for block in parsed.blocks],
        block_tokens=counts,
        prompt_tokens=prompt if type(prompt) is int else None,
        completion_tokens=completion if type(completion) is int else None,
        stream=parsed.stream,
        max_tokens=parsed.max_tokens,
        duration_ms=duration_ms,
    )
