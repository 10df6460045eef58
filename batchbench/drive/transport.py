"""How a chat request travels: a lean keep-alive HTTP/1.1 client for plain ``http://``
targets, and aiohttp for everything else.

The run's hot path is one POST per turn. aiohttp spends about 120 µs of client CPU on
each (request object, header multidict, stream reader, timer context); on a plain
``http://`` target that is half of everything the client does per request. The
:class:`PlainHttpTransport` writes the request head and body to a pooled connection
and parses the response with llhttp (``httptools``, the parser uvicorn uses), handing
streamed bytes to the SSE scanner straight from the parser's callback. It keeps what
the run relies on from aiohttp: a total timeout that covers connecting, waiting and a
slow body; a connection limit; keep-alive reuse that drops connections the server
closed; gzip and deflate bodies; ``Retry-After``; redirects (the first hop's target is
handed to aiohttp, which follows the rest as before); connect failures told apart from
disconnects. TLS and proxies stay with aiohttp (:class:`AiohttpTransport`).

Inside it, a ``_Connection`` is the socket's lifetime (the idle check, the close) and an
``_Exchange``, made per request, is that request's response as it is parsed. One case is
sent twice: a request that went out on a kept-alive connection which the server closed
within a round trip, before any byte of an answer (``_resendable``), goes again once on a
new connection; the pool's ``resent`` counts those (``resent_requests`` in the results).

Both transports answer ``send(body, headers, sink)`` with ``(status, body, retry_after,
worker)``, ``worker`` being the value of the response header that names the worker which
served it (``worker_header``, smg's ``x-smg-routed-worker-id`` unless told otherwise; None
when absent);
with a ``sink``, the body of a 2xx response goes to ``sink(data, arrived)`` read by read
instead (``arrived`` is the ``perf_counter`` time of the read), and ``body`` is empty;
``on_type``, when given, hears that response's Content-Type first.

Whatever the server sends, ``send`` ends in a response or in one of this module's
exceptions (``ConnectError``, ``DisconnectError``, ``ResponseTooLargeError``,
``RedirectError``), ``TimeoutError``, or (from aiohttp: TLS targets, redirect hops)
``aiohttp.ClientError``. A response may hold at most ``max_response_bytes``
(after decoding gzip or deflate, a streamed one included): a server cannot make the client
hold more, whatever it sends (a huge Content-Length, a decompression bomb, an endless
chunked body). Redirects are followed here, hop by hop, so that a malformed Location, a
loop or another scheme is reported as such.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import select
import socket
import time
import zlib
from collections.abc import AsyncIterator, Callable, Iterator
from http import HTTPStatus
from typing import Protocol
from urllib.parse import urljoin, urlsplit

import aiohttp
import httptools

_DEFAULT_PORTS = {"http": 80, "https": 443}

Sink = Callable[[bytes, float], object]
TypeSink = Callable[[str | None], object]
Sent = tuple[int, bytes, str | None, str | None]
# The response header a gateway names the serving worker in (--routed-worker-header).
DEFAULT_WORKER_HEADER = "x-smg-routed-worker-id"

REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
MAX_REDIRECTS = 10
# The most a response may hold, decoded (--max-response-bytes): far beyond any reply, and
# a bound on what one connection can make the client allocate.
DEFAULT_MAX_RESPONSE_BYTES = 64 << 20
# Whole bodies being received, all connections together, may hold this many times the
# limit: a server that sends every agent a huge body cannot multiply the bound by the
# agents (replies arrive in a moment, so real traffic holds a small fraction of it).
IN_FLIGHT_FACTOR = 2
DECODE_STEP = 1 << 20  # gzip/deflate output is taken this much at a time
# A kept-alive connection that ends this soon after a request went out on it, with no byte
# of an answer, was closed by the server as the request crossed it (a loopback or LAN round
# trip): the request is sent again, once, and counted (``_resendable`` says exactly when).
# Later, the server may have worked on it.
RESEND_WINDOW_SECONDS = 0.05
# Readable or hung up while idle: the server closed it, or sent bytes nobody asked for.
_STALE_EVENTS = select.POLLIN | select.POLLERR | select.POLLHUP | getattr(select, "POLLRDHUP", 0)
# Header blocks kept per agent (one dict of headers each); cleared past this many.
_HEADER_CACHE_LIMIT = 4096


class ConnectError(OSError):
    """No connection could be made (refused, unreachable, unresolvable)."""


class DisconnectError(OSError):
    """The connection broke, or the response could not be read, during the exchange."""


class ResponseTooLargeError(Exception):
    """The response (decoded) grew past ``--max-response-bytes``."""


class RedirectError(Exception):
    """A redirect that cannot be followed: a malformed Location, a loop, too many hops, or
    a scheme other than http and https."""


def too_large_text(limit: int, detail: str = "") -> str:
    return f"response larger than --max-response-bytes ({limit} bytes){detail}"


def in_flight_text(limit: int) -> str:
    return (
        f"responses in flight larger than {IN_FLIGHT_FACTOR} × --max-response-bytes "
        f"({IN_FLIGHT_FACTOR * limit} bytes) in all"
    )


class Transport(Protocol):
    async def send(
        self,
        body: bytes,
        headers: dict[str, str],
        sink: Sink | None,
        on_type: TypeSink | None = None,
    ) -> Sent: ...

    async def close(self) -> None: ...


# ---------------------------------------------------------------------------------------
# aiohttp: TLS, proxies, redirects, and the reference behaviour


class AiohttpTransport:
    """Sends through an ``aiohttp.ClientSession`` (which it does not own)."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        url: str,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        worker_header: str = DEFAULT_WORKER_HEADER,
    ) -> None:
        self.session = session
        self.url = url
        self.max_response_bytes = max_response_bytes
        self.worker_header = worker_header
        self.buffered = 0  # bytes of whole bodies being received, all requests together

    async def send(
        self,
        body: bytes,
        headers: dict[str, str],
        sink: Sink | None,
        on_type: TypeSink | None = None,
    ) -> Sent:
        status, raw, retry_after, worker, location = await self.hop(
            "POST", self.url, body, headers, sink, on_type
        )
        if location is None:
            return status, raw, retry_after, worker
        return await follow_redirects(
            self, self.url, status, location, body, headers, sink, on_type
        )

    async def hop(
        self,
        method: str,
        url: str,
        body: bytes | None,
        headers: dict[str, str],
        sink: Sink | None,
        on_type: TypeSink | None = None,
    ) -> tuple[int, bytes, str | None, str | None, str | None]:
        """One request, redirects not followed: (status, body, Retry-After, the serving
        worker, the Location of a redirect)."""
        limit = self.max_response_bytes
        async with self.session.request(
            method, url, data=body, headers=headers, allow_redirects=False
        ) as response:
            status = response.status
            location = response.headers.get("Location") if status in REDIRECT_STATUSES else None
            reads = limited_reads(response, limit)
            parts: list[bytes] = []
            if sink is not None and 200 <= status < 300:
                if on_type is not None:
                    on_type(response.headers.get("Content-Type"))
                clock = time.perf_counter
                async for data in reads:
                    sink(data, clock())
            else:
                try:
                    async for data in reads:
                        parts.append(data)
                        self.buffered += len(data)
                        if self.buffered > IN_FLIGHT_FACTOR * limit:
                            raise ResponseTooLargeError(in_flight_text(limit))
                finally:
                    self.buffered -= sum(map(len, parts))
            return (
                status,
                b"".join(parts),
                response.headers.get("Retry-After"),
                response.headers.get(self.worker_header),
                location,
            )

    async def close(self) -> None:
        """The session belongs to the caller."""


async def limited_reads(
    response: aiohttp.ClientResponse, limit: int = DEFAULT_MAX_RESPONSE_BYTES
) -> AsyncIterator[bytes]:
    """An aiohttp response's reads (decoded), ending in ``ResponseTooLargeError`` past
    ``limit`` bytes (at once when its Content-Length says so)."""
    length = response.content_length
    if length is not None and length > limit and "Content-Encoding" not in response.headers:
        raise ResponseTooLargeError(too_large_text(limit, f": Content-Length {length}"))
    size = 0
    async for data in response.content.iter_any():
        size += len(data)
        if size > limit:
            raise ResponseTooLargeError(too_large_text(limit))
        yield data


async def read_limited(
    response: aiohttp.ClientResponse, limit: int = DEFAULT_MAX_RESPONSE_BYTES
) -> bytes:
    """An aiohttp response's whole body within ``limit``: probes and scrapes read through
    this, so no server can make them hold more."""
    return b"".join([data async for data in limited_reads(response, limit)])


def redirect_target(current: str, status: int, location: str) -> str:
    """The absolute URL a redirect from ``current`` leads to; ``RedirectError`` when its
    Location is not a URL, names no host, or leaves http and https."""
    try:
        target = urljoin(current, location.strip())
        parts = urlsplit(target)
        parts.port  # noqa: B018 - raises ValueError for a port that is not one
    except ValueError as exc:
        raise RedirectError(
            f"invalid redirect ({_status_text(status)}): Location {location!r} is not a "
            f"valid URL: {exc}"
        ) from None
    if parts.scheme not in ("http", "https"):
        raise RedirectError(f"redirect to {target} not followed: only http:// and https:// are")
    if not parts.hostname:
        raise RedirectError(
            f"invalid redirect ({_status_text(status)}): Location {location!r} names no host"
        )
    return target


def _status_text(status: int) -> str:
    try:
        return f"{status} {HTTPStatus(status).phrase}"
    except ValueError:
        return str(status)


def _origin(url: str) -> tuple[str, str | None, int | None]:
    parts = urlsplit(url)
    return parts.scheme, parts.hostname, parts.port or _DEFAULT_PORTS.get(parts.scheme)


async def follow_redirects(
    hops: AiohttpTransport,
    url: str,
    status: int,
    location: str,
    body: bytes,
    headers: dict[str, str],
    sink: Sink | None,
    on_type: TypeSink | None = None,
) -> Sent:
    """Follows a redirect of the POST to ``url`` hop by hop, as a browser would: 303, and
    301/302 after a POST, become a GET without a body; another origin never sees the key;
    a loop, more than ``MAX_REDIRECTS`` hops or an unusable Location is a ``RedirectError``
    that names the chain."""
    origin = _origin(url)
    chain = [url]
    method: str = "POST"
    payload: bytes | None = body
    current = url
    while True:
        target = redirect_target(current, status, location)
        if target in chain:
            chain.append(target)
            raise RedirectError(f"redirect loop after {len(chain) - 1} hops: {' → '.join(chain)}")
        if len(chain) > MAX_REDIRECTS:
            raise RedirectError(
                f"too many redirects (more than {MAX_REDIRECTS}): {chain[0]} → … → {target}"
            )
        chain.append(target)
        if _origin(target) != origin:
            headers = {k: v for k, v in headers.items() if k.lower() != "authorization"}
        if status == 303 or (status in (301, 302) and method == "POST"):
            method, payload = "GET", None
            headers = {k: v for k, v in headers.items() if k.lower() != "content-type"}
        status, raw, retry_after, worker, next_location = await hops.hop(
            method, target, payload, headers, sink, on_type
        )
        if next_location is None:
            return status, raw, retry_after, worker
        current, location = target, next_location


# ---------------------------------------------------------------------------------------
# The plain-HTTP client


class _Decoder:
    """A gzip or deflate body, decoded as it arrives (deflate with or without the zlib
    header: servers send both)."""

    __slots__ = ("_head", "_inner", "encoding")

    def __init__(self, encoding: str) -> None:
        self.encoding = encoding
        self._inner = zlib.decompressobj(16 + zlib.MAX_WBITS) if encoding == "gzip" else None
        self._head = b""  # deflate: the first byte, until the second tells the format

    def _choose(self, head: bytes) -> zlib._Decompress:
        """Deflate with a zlib header (two bytes, a multiple of 31) or raw: the decompressor."""
        wrapped = len(head) >= 2 and head[0] & 0x0F == 8 and (head[0] << 8 | head[1]) % 31 == 0
        self._inner = zlib.decompressobj(zlib.MAX_WBITS if wrapped else -zlib.MAX_WBITS)
        return self._inner

    def steps(self, data: bytes) -> Iterator[bytes]:
        """The decoded bytes of ``data`` in pieces of at most ``DECODE_STEP``: a bomb is
        inflated only as far as the caller takes it."""
        inner = self._inner
        if inner is None:
            data = self._head + data
            if len(data) < 2:
                self._head = data
                return
            self._head = b""
            inner = self._choose(data)
        while data:
            piece = inner.decompress(data, DECODE_STEP)
            data = inner.unconsumed_tail
            if piece:
                yield piece

    def flush(self) -> bytes:
        if self._inner is None:
            if not self._head:
                return b""
            inner = self._choose(self._head)
            return inner.decompress(self._head) + inner.flush()
        return self._inner.flush()


class _Connection(asyncio.Protocol):
    """One keep-alive connection: the socket's lifetime, the idle check, and the exchange
    (one request and its response) it carries at a time."""

    def __init__(self, pool: PlainHttpTransport) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.exchange: _Exchange | None = None  # the request in flight, if any
        self.served = 0  # responses completed on this connection
        self.poller: select.poll | None = None  # watches the idle socket for a close
        self.lost_at = 0.0  # when the connection ended (perf_counter)

    # -- asyncio.Protocol ------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # asyncio.Protocol says BaseTransport; a stream gets a Transport (uvloop's, no
        # subclass of asyncio.Transport, has the same methods).
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError, AttributeError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with contextlib.suppress(OSError, AttributeError, ValueError):
                poller = select.poll()
                poller.register(sock.fileno(), _STALE_EVENTS)
                self.poller = poller

    def data_received(self, data: bytes) -> None:
        exchange = self.exchange
        if exchange is None:  # bytes nobody asked for: the connection cannot be reused
            self.abort()
            return
        exchange.feed(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost_at = time.perf_counter()
        self.closed = True
        self.pool._closed(self)
        if self.exchange is not None:
            self.exchange.connection_ended()

    # -- lifetime --------------------------------------------------------------------------
    def stale(self) -> bool:
        """True when the idle connection can no longer carry a request: the server closed
        it (or wrote to it) and the loop has not read that yet. One poll, no waiting."""
        if self.closed:
            return True
        if self.poller is None:
            return False
        try:
            return bool(self.poller.poll(0))
        except OSError:
            return True

    def abort(self) -> None:
        if not self.closed:
            self.closed = True
            self.pool._closed(self)
            if self.transport is not None:
                self.transport.abort()

    def fail(self, exc: BaseException) -> None:
        """End the exchange in flight with ``exc`` (if any) and the connection with it."""
        if self.exchange is not None:
            self.exchange.fail(exc)
        else:
            self.abort()

    def open_exchange(self, sink: Sink | None, on_type: TypeSink | None) -> _Exchange:
        """A new exchange for the next request on this connection."""
        exchange = self.exchange = _Exchange(self, self.pool.loop.create_future(), sink, on_type)
        return exchange


class _Exchange:
    """One request on a connection and its response as it is parsed (llhttp calls this
    object back): the head, the body kept whole or handed to a sink read by read, and
    whether the connection may carry another request. Made per request, so no state of
    one response can leak into the next."""

    __slots__ = (
        "answered",
        "arrived",
        "chunks",
        "connection",
        "content_type",
        "decoder",
        "deduplicating",
        "failure",
        "framed",
        "head_reads",
        "headers_done",
        "held",
        "length",
        "limit",
        "location",
        "on_type",
        "parser",
        "received",
        "retry_after",
        "reusable",
        "sink",
        "size",
        "status",
        "stream_sink",
        "waiter",
        "worker",
        "worker_header",
        "written_at",
    )

    def __init__(
        self,
        connection: _Connection,
        waiter: asyncio.Future,
        stream_sink: Sink | None,
        on_type: TypeSink | None,
    ) -> None:
        self.connection = connection
        self.waiter = waiter
        self.stream_sink = stream_sink  # where a 2xx body goes (None: kept whole)
        self.on_type = on_type
        self.limit = connection.pool.max_response_bytes
        self.worker_header = connection.pool.worker_header
        self.parser = httptools.HttpResponseParser(self)
        self.written_at = 0.0  # when the request went out (perf_counter)
        self.received = False  # a byte of the response arrived
        self.arrived = 0.0  # when the last read arrived
        self.held = 0  # of its whole body, the bytes counted in the pool's ``buffered``
        self.head_reads: list[bytes] = []  # the reads until the head was parsed
        self.deduplicating = False  # a repeated Content-Length: the head is being gathered
        self.reset_response()

    def reset_response(self) -> None:
        """Ready for a response: the first, or the real one after an interim response."""
        self.chunks: list[bytes] = []
        self.size = 0  # bytes of this response: its head as received, its body decoded
        self.length = -1  # its Content-Length, if it said one
        self.content_type: str | None = None
        self.status = 0
        self.retry_after: str | None = None
        self.worker: str | None = None
        self.location: str | None = None
        self.decoder: _Decoder | None = None
        self.framed = False  # Content-Length or chunked: the body does not end at EOF
        self.headers_done = False
        self.reusable = False
        self.failure: BaseException | None = None
        self.sink: Sink | None = None  # where this response's body goes
        self.answered = False  # the final response is complete

    # -- reads -----------------------------------------------------------------------------
    def feed(self, data: bytes) -> None:
        """One read of the connection."""
        self.arrived = time.perf_counter()
        self.received = True
        if not self.headers_done:
            self.head_reads.append(data)
            self.size += len(data)
            if self.deduplicating:
                self._gather_head()
                return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError:
            if self.answered and self.failure is None:  # unasked bytes after the answer
                self._deliver()
                self.connection.abort()
                return
            failure = self.failure or DisconnectError("response handling failed")
            self.fail(failure)
            return
        except httptools.HttpParserError as exc:
            if str(exc) == "Duplicate Content-Length":
                self.deduplicating = True  # parsed again once the whole head is here
                self._gather_head()
                return
            self.fail(DisconnectError(f"invalid HTTP response: {exc}"))
            return
        except httptools.HttpParserUpgrade:
            self.fail(DisconnectError("invalid HTTP response: an unasked protocol upgrade"))
            return
        if not self.headers_done and self.size > self.limit:  # a head that never ends
            self.fail(ResponseTooLargeError(too_large_text(self.limit, " in its head")))
            return
        self._deliver()

    def _gather_head(self) -> None:
        """Reads of a head with a repeated Content-Length, until the head is complete."""
        if b"\r\n\r\n" in b"".join(self.head_reads):
            self.deduplicating = False
            if not self._refeed_deduplicated():
                self.fail(DisconnectError("invalid HTTP response: Duplicate Content-Length"))
        elif self.size > self.limit:
            self.fail(ResponseTooLargeError(too_large_text(self.limit, " in its head")))

    def _refeed_deduplicated(self) -> bool:
        """A head that repeats one Content-Length value (RFC 9110 allows it; llhttp does
        not) is parsed again with the copies removed; False when the values differ."""
        data = b"".join(self.head_reads)
        end = data.find(b"\r\n\r\n")
        if end < 0:
            return False
        lines = data[:end].split(b"\r\n")
        kept: list[bytes] = []
        lengths: set[bytes] = set()
        seen = 0
        for line in lines:
            name, colon, value = line.partition(b":")
            if colon and name.strip().lower() == b"content-length":
                lengths.update(part.strip() for part in value.split(b","))
                if len(lengths) > 1:
                    return False
                seen += 1
                if seen > 1:
                    continue
                line = name + b": " + next(iter(lengths))
            kept.append(line)
        if seen < 2:
            return False  # the duplicate was elsewhere (an interim response's head)
        self.reset_response()
        self.head_reads = []
        self.parser = httptools.HttpResponseParser(self)
        # The replayed head goes through the same path, the refeed counted once.
        self.feed(b"\r\n".join(kept) + data[end:])
        return True

    def _deliver(self) -> None:
        """Hand what this read brought to the sink in one piece (a read of 500 small
        chunks is one call, as one read was one piece from aiohttp); then answer the
        waiter if the response is complete."""
        sink = self.sink
        chunks = self.chunks
        if sink is not None and chunks:
            data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
            chunks.clear()
            try:
                sink(data, self.arrived)
            except BaseException as exc:
                self.fail(exc)
                return
            # What the sink holds as a line not ended yet counts in the pool's budget:
            # a stream of one endless line is held whole, like a body.
            end = data.rfind(b"\n")
            if end < 0:
                end = data.rfind(b"\r")
            # ``held`` counted the line waiting before this read, and this read.
            waiting = len(data) - end - 1 if end >= 0 else self.held
            self.connection.pool.buffered += waiting - self.held
            self.held = waiting
        if self.answered and not self.waiter.done():
            self.waiter.set_result(None)

    def connection_ended(self) -> None:
        """The connection closed under this exchange."""
        if self.waiter.done():
            return
        if self.headers_done and not self.framed:
            # A body that ends with the connection (no length, not chunked) is complete.
            self.reusable = False
            self.on_message_complete()
            self._deliver()
            return
        if self.headers_done:
            self.fail(DisconnectError("Response payload is not completed: connection closed"))
        else:
            self.fail(DisconnectError("Server disconnected"))

    # -- llhttp callbacks ------------------------------------------------------------------
    def on_message_begin(self) -> None:
        if self.answered:  # bytes beyond the answer, unasked: stop here, never reuse
            raise DisconnectError("unexpected bytes after the response")

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"content-type":
            self.content_type = value.decode("latin-1").strip()
        elif name == b"retry-after":
            self.retry_after = value.decode("latin-1")
        elif name == b"content-encoding":
            encoding = value.strip().lower()
            if encoding in (b"gzip", b"x-gzip"):
                self.decoder = _Decoder("gzip")
            elif encoding == b"deflate":
                self.decoder = _Decoder("deflate")
        elif name == b"location":
            self.location = value.decode("latin-1")
        elif name == b"content-length":
            self.framed = True
            value = value.strip()
            self.length = int(value) if value.isdigit() else -1
        elif name == b"transfer-encoding":  # chunked when it is the last coding
            self.framed = value.rsplit(b",", 1)[-1].strip().lower() == b"chunked"
        elif name == self.worker_header:
            self.worker = value.decode("latin-1").strip()

    def on_headers_complete(self) -> None:
        status = self.status = self.parser.get_status_code()
        self.headers_done = True
        self.head_reads.clear()
        self.size = 0
        if self.length > self.limit and self.decoder is None and status >= 200:
            self.failure = ResponseTooLargeError(
                too_large_text(self.limit, f": Content-Length {self.length}")
            )
            raise self.failure
        # An error body is read whole, whatever the request asked for.
        self.sink = self.stream_sink if 200 <= status < 300 else None
        if self.sink is not None and self.on_type is not None:
            self.on_type(self.content_type)

    def on_body(self, body: bytes) -> None:
        decoder = self.decoder
        if decoder is None:
            self._take(body)
            return
        try:
            for piece in decoder.steps(body):
                self._take(piece)
        except zlib.error as exc:
            self.failure = DisconnectError(
                f"Can not decode content-encoding: {decoder.encoding}: {exc}"
            )
            raise

    def _take(self, body: bytes) -> None:
        """One decoded piece of the body, within the response's limit and (kept whole) the
        pool's budget."""
        self.size += len(body)
        if self.size > self.limit:
            del body  # the traceback keeps this frame: not the oversized piece
            decoder = self.decoder
            detail = f" after {decoder.encoding} decoding" if decoder is not None else ""
            self.failure = ResponseTooLargeError(too_large_text(self.limit, detail))
            raise self.failure
        # Held until the response is complete (kept whole) or the read is delivered (a
        # sink, which then says what it still holds).
        pool = self.connection.pool
        self.held += len(body)
        pool.buffered += len(body)
        if pool.buffered > IN_FLIGHT_FACTOR * self.limit:
            del body
            self.failure = ResponseTooLargeError(in_flight_text(self.limit))
            raise self.failure
        self.chunks.append(body)  # a streamed body goes to the sink once the read is parsed

    def on_message_complete(self) -> None:
        status = self.status
        if 100 <= status < 200:  # an interim response: the real one follows
            self.reset_response()
            return
        if self.decoder is not None:
            try:
                tail = self.decoder.flush()
            except zlib.error as exc:
                self.fail(DisconnectError(f"Can not decode content-encoding: {exc}"))
                return
            if tail:
                self.size += len(tail)
                if self.size > self.limit:
                    detail = f" after {self.decoder.encoding} decoding"
                    self.fail(ResponseTooLargeError(too_large_text(self.limit, detail)))
                    return
                self.chunks.append(tail)
        if not self.connection.closed:
            self.reusable = self.parser.should_keep_alive()
        self.connection.served += 1
        self.answered = True  # the waiter is answered once the read is delivered

    # -- outcome ---------------------------------------------------------------------------
    def fail(self, exc: BaseException) -> None:
        """End the exchange with ``exc``; the connection cannot be trusted any more."""
        # What the response held goes now, not when a garbage collection finds the cycle
        # the error makes (its traceback holds this exchange, which held the error).
        self.chunks = []
        self.failure = None
        waiter = self.waiter
        if not waiter.done():
            waiter.set_exception(exc)
        self.connection.abort()

    def expire(self) -> None:
        self.fail(TimeoutError())

    async def run(self, head: bytes, body: bytes, deadline: float) -> None:
        """Writes the request and waits for the whole response; at ``deadline`` (loop
        time) the wait ends in TimeoutError and the connection is closed."""
        connection = self.connection
        pool = connection.pool
        expiry = pool.loop.call_at(deadline, self.expire)
        self.written_at = time.perf_counter()
        assert connection.transport is not None  # the pool hands out connected connections
        connection.transport.writelines((head, body))
        try:
            await self.waiter
        finally:
            expiry.cancel()
            connection.exchange = None
            # The body's share of the pool's budget is given back, the sinks let go.
            pool.buffered -= self.held
            self.held = 0
            self.stream_sink = self.sink = self.on_type = None
            # The parser calls this object back: dropping it breaks the cycle, so the
            # exchange goes by reference counting, not by a garbage collection per request.
            del self.parser

    def body(self) -> bytes:
        """The whole body of a response kept whole."""
        return b"".join(self.chunks) if self.chunks else b""


def _resendable(reused: bool, connection: _Connection, exchange: _Exchange) -> bool:
    """Whether a request whose connection broke goes again (once, on a new connection).

    Exactly when all of these hold: the connection had carried a response before (it was
    kept alive, not new), no byte of this response arrived, and the connection ended
    within ``RESEND_WINDOW_SECONDS`` of the request being written. That is a server
    closing an idle keep-alive connection as the request crossed it (llama.cpp's server
    closes every connection after a stream while its headers say keep-alive; the idle
    check catches the close when it arrived first). The window is a round trip: a server
    that read the request and closed within it without answering gets the POST twice (each
    such request is counted in ``resent``, the results' ``resent_requests``); a later
    close may follow work on the request, and fails it as a disconnect instead."""
    return (
        reused
        and not exchange.received
        and connection.lost_at - exchange.written_at <= RESEND_WINDOW_SECONDS
    )


class PlainHttpTransport:
    """Keep-alive HTTP/1.1 to one ``http://`` origin, at most ``limit`` connections
    (0: no limit)."""

    def __init__(
        self,
        url: str,
        timeout_seconds: float,
        limit: int,
        fallback: Callable[[], AiohttpTransport],
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        worker_header: str = DEFAULT_WORKER_HEADER,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"not a plain http:// URL: {url}")
        self.url = url
        self.host = parts.hostname
        self.port = parts.port or 80
        target = parts.path or "/"
        if parts.query:
            target += "?" + parts.query
        netloc = parts.netloc.rpartition("@")[2]  # credentials never travel in Host
        if parts.port == 80:
            netloc = netloc.rsplit(":", 1)[0]
        self._request_line = f"POST {target} HTTP/1.1\r\nHost: {netloc}\r\n".encode("latin-1")
        self._fixed = b"Accept: */*\r\nAccept-Encoding: gzip, deflate\r\n"
        self.timeout_seconds = timeout_seconds
        self.limit = limit
        self.max_response_bytes = max_response_bytes
        self.worker_header = worker_header.lower().encode("latin-1")  # as llhttp hands it
        self.buffered = 0  # bytes of whole bodies being received, all connections together
        self._fallback_factory = fallback
        self._fallback: AiohttpTransport | None = None
        self.loop = asyncio.get_running_loop()
        self._idle: list[_Connection] = []
        self._open = 0
        self._waiters: collections.deque[asyncio.Future] = collections.deque()
        self._addresses: list[tuple] | None = None
        self._header_blocks: dict[int, tuple[dict[str, str], bytes]] = {}
        self._live: set[_Connection] = set()
        self.resent = 0  # requests sent again after a kept-alive connection closed under them
        self._closing = False

    # -- request -----------------------------------------------------------------------------
    def _head(self, body: bytes, headers: dict[str, str]) -> bytes:
        cached = self._header_blocks.get(id(headers))
        if cached is None or cached[0] is not headers:
            block = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
            if len(self._header_blocks) >= _HEADER_CACHE_LIMIT:
                self._header_blocks.clear()
            cached = self._header_blocks[id(headers)] = (headers, block.encode("latin-1"))
        return b"".join(
            (
                self._request_line,
                self._fixed,
                cached[1],
                b"Content-Length: ",
                str(len(body)).encode(),
                b"\r\n\r\n",
            )
        )

    async def send(
        self,
        body: bytes,
        headers: dict[str, str],
        sink: Sink | None,
        on_type: TypeSink | None = None,
    ) -> Sent:
        """One request within the total timeout: a timer on the response wait (the common
        case: an idle connection is at hand), ``asyncio.timeout`` around a wait for a
        connection or a redirect's second hop."""
        deadline = self.loop.time() + self.timeout_seconds
        head = self._head(body, headers)
        first: DisconnectError | None = None
        while True:
            connection = None if first is not None else self._idle_connection()
            if connection is None:
                try:
                    async with asyncio.timeout_at(deadline):
                        connection = await self._acquire(first is not None)
                except OSError:
                    if first is not None:
                        raise first from None  # the resend's failure is not the request's
                    raise
            reused = connection.served > 0
            exchange = connection.open_exchange(sink, on_type)
            try:
                await exchange.run(head, body, deadline)
                break
            except DisconnectError as exc:
                connection.abort()
                if first is not None:
                    raise first from None  # the resend broke too: report the first break
                if not _resendable(reused, connection, exchange):
                    raise
                first = exc  # sent again, once, on a new connection
                self.resent += 1
            except BaseException:
                connection.abort()
                raise
        self._release(connection, exchange.reusable)
        status, location = exchange.status, exchange.location
        if status in REDIRECT_STATUSES and location:
            if self._fallback is None:
                self._fallback = self._fallback_factory()
            async with asyncio.timeout_at(deadline):
                return await follow_redirects(
                    self._fallback, self.url, status, location, body, headers, sink, on_type
                )
        return status, exchange.body(), exchange.retry_after, exchange.worker

    # -- the pool ----------------------------------------------------------------------------
    def _idle_connection(self) -> _Connection | None:
        """The most recently used idle connection that is still open, if any."""
        idle = self._idle
        while idle and not self._closing:
            connection = idle.pop()
            if not connection.stale():
                return connection
            connection.abort()
        return None

    async def _acquire(self, fresh: bool = False) -> _Connection:
        """An idle connection (the most recently used), else a new one within the limit;
        ``fresh``: a new one (an idle one is closed to make room at the limit)."""
        idle = self._idle
        while True:
            if self._closing:
                raise DisconnectError("transport closed")
            if not fresh:
                connection = self._idle_connection()
                if connection is not None:
                    return connection
            if not self.limit or self._open < self.limit:
                break
            if idle:
                idle.pop().abort()
                continue
            waiter = self.loop.create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except BaseException:
                if waiter.done() and not waiter.cancelled():
                    self._wake()  # pass the wake-up this waiter received on
                else:
                    # A cancelled waiter may have been skipped (and dropped) by _wake.
                    with contextlib.suppress(ValueError):
                        self._waiters.remove(waiter)
                raise
        self._open += 1
        try:
            return await self._connect()
        except BaseException:
            self._open -= 1
            self._wake()
            raise

    async def _connect(self) -> _Connection:
        loop = self.loop
        if self._addresses is None:
            try:
                infos = await loop.getaddrinfo(
                    self.host, self.port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
                )
            except OSError as exc:
                raise ConnectError(self._cannot_connect(exc)) from None
            self._addresses = [(family, address) for family, _, _, _, address in infos]
        error: OSError | None = None
        for family, address in self._addresses:
            try:
                _, connection = await loop.create_connection(
                    lambda: _Connection(self), address[0], address[1], family=family
                )
            except OSError as exc:
                error = exc
                continue
            if connection.closed:  # closed by the server before it could be used
                raise DisconnectError("Server disconnected")
            if self._closing:
                connection.abort()
                raise DisconnectError("transport closed")
            self._live.add(connection)
            return connection
        raise ConnectError(self._cannot_connect(error)) from None

    def _cannot_connect(self, exc: OSError | None) -> str:
        reason = (exc.strerror or str(exc)) if exc is not None else "no address"
        return f"Cannot connect to host {self.host}:{self.port} [{reason}]"

    def _release(self, connection: _Connection, reusable: bool) -> None:
        """Back to the idle list when its last response allows it, else closed."""
        if reusable and not connection.closed:
            self._idle.append(connection)
            self._wake()
        else:
            connection.abort()

    def _closed(self, connection: _Connection) -> None:
        """A connection ended (either side): it no longer counts against the limit."""
        if connection in self._live:
            self._live.discard(connection)
            self._open -= 1
            if connection in self._idle:
                self._idle.remove(connection)
            self._wake()

    def _wake(self) -> None:
        waiters = self._waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def close(self) -> None:
        """Ends every connection; requests still in flight or waiting fail."""
        self._closing = True
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(DisconnectError("transport closed"))
        for connection in list(self._live):
            connection.fail(DisconnectError("transport closed"))
        self._idle.clear()


def make_transport(
    url: str,
    timeout_seconds: float,
    limit: int,
    session: aiohttp.ClientSession,
    max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
    worker_header: str = DEFAULT_WORKER_HEADER,
) -> Transport:
    """The plain-HTTP client for ``http://`` targets; aiohttp (``session``) otherwise."""
    parts = urlsplit(url)
    if parts.scheme == "http" and parts.username is None:  # credentials: aiohttp sends them
        return PlainHttpTransport(
            url,
            timeout_seconds,
            limit,
            lambda: AiohttpTransport(session, url, max_response_bytes, worker_header),
            max_response_bytes,
            worker_header,
        )
    return AiohttpTransport(session, url, max_response_bytes, worker_header)
