"""The lean plain-HTTP client (batchbench.drive.transport) against real servers on 127.0.0.1:
the request bytes it writes, keep-alive reuse, body framing, gzip and deflate, interim
responses, error bodies, redirects handed to aiohttp, connect and disconnect errors, the
total timeout, the connection limit, cancellation, stale connections (and the one resend
on a kept-alive connection closed under a request, counted up to the results), a failing
sink, and parity with the aiohttp transport.

Crafted responses come from raw ``asyncio.start_server`` servers that each test starts on its
own loop; every test runs on asyncio and on uvloop (``batchbench-agent`` runs uvloop).
Redirects and the parity checks use the aiohttp stub server (``stubserver``), shared by the
module.
"""

from __future__ import annotations

import asyncio
import functools
import gzip
import json
import math
import socket
import time
import zlib
from collections.abc import Awaitable, Callable

import aiohttp
import pytest
import uvloop
from stubserver import Recorded, Reply, Stream, StubServer, chat_completion, delta_chunk, sse

from batchbench import RunConfig, run_async
from batchbench.drive.driver import transport_kind
from batchbench.drive.transport import (
    AiohttpTransport,
    ConnectError,
    DisconnectError,
    PlainHttpTransport,
    RedirectError,
    ResponseTooLargeError,
    make_transport,
)
from batchbench.results.failures import ErrorKind

HOST = "127.0.0.1"
PATH = "/v1/chat/completions"
BODY = b'{"model":"m","messages":[{"role":"user","content":"hi"}]}'
HEADERS = {
    "Content-Type": "application/json",
    "Authorization": "Bearer sk-test",
    "X-Routing-Key": "agent-7",
}
TIMEOUT = 0.2  # the total timeout of the timeout tests
LOOPS = [pytest.param(asyncio.new_event_loop, id="asyncio"),
         pytest.param(uvloop.new_event_loop, id="uvloop")]  # fmt: skip


@pytest.fixture(params=LOOPS)
def run(request):
    """Runs a scenario coroutine on a new loop of the parametrized kind; a hang fails after
    5 s instead of blocking the suite."""

    def run_scenario(scenario):
        async def bounded():
            async with asyncio.timeout(5):
                return await scenario

        with asyncio.Runner(loop_factory=request.param) as runner:
            return runner.run(bounded())

    return run_scenario


# -- raw responses ----------------------------------------------------------------------
def head(status: str = "200 OK", *headers: str, version: str = "HTTP/1.1") -> bytes:
    lines = [f"{version} {status}", *headers, "", ""]
    return "\r\n".join(lines).encode("latin-1")


def ok(body: bytes, *headers: str, status: str = "200 OK", version: str = "HTTP/1.1") -> bytes:
    return head(status, f"Content-Length: {len(body)}", *headers, version=version) + body


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


CHUNKED = "Transfer-Encoding: chunked"
LAST_CHUNK = b"0\r\n\r\n"


def body_of(request: bytes) -> bytes:
    return request.split(b"\r\n\r\n", 1)[1]


# -- a raw server -----------------------------------------------------------------------
class Peer:
    """One accepted connection, as an action sees it."""

    def __init__(self, number: int, writer: asyncio.StreamWriter) -> None:
        self.number = number
        self.writer = writer

    async def write(self, data: bytes) -> None:
        if self.writer.is_closing():
            raise ConnectionResetError("the client went away")
        self.writer.write(data)
        await self.writer.drain()


# An action answers one request; it returns True to keep the connection for the next one.
Action = Callable[[Peer, bytes], Awaitable[bool]]


async def read_request(reader: asyncio.StreamReader) -> bytes | None:
    """One request's raw bytes (head and Content-Length body); None at the end."""
    try:
        request_head = await reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in request_head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.lower() == b"content-length":
                length = int(value)
        return request_head + await reader.readexactly(length)
    except (asyncio.IncompleteReadError, ConnectionError):
        return None


class RawServer:
    """``asyncio.start_server`` on 127.0.0.1. The n-th request read (on any connection)
    gets the n-th action of the script; the last action answers all later requests. It
    records each request as (connection number, raw bytes) and counts connections: all
    accepted, open at once, and requests being answered at once."""

    def __init__(self, *script: Action, port: int = 0) -> None:
        self.script = script
        self.port = port
        self.requests: list[tuple[int, bytes]] = []
        self.connections = 0
        self.active = 0
        self.max_active = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self._tasks: set[asyncio.Task] = set()

    async def __aenter__(self) -> RawServer:
        self._server = await asyncio.start_server(self._serve, HOST, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc) -> None:
        self._server.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    def url(self, path: str = PATH) -> str:
        return f"http://{HOST}:{self.port}{path}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._tasks.add(asyncio.current_task())  # type: ignore[arg-type]
        self.connections += 1
        peer = Peer(self.connections, writer)
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        try:
            while (request := await read_request(reader)) is not None:
                self.requests.append((peer.number, request))
                action = self.script[min(len(self.requests), len(self.script)) - 1]
                self.in_flight += 1
                self.max_in_flight = max(self.max_in_flight, self.in_flight)
                try:
                    keep = await action(peer, request)
                finally:
                    self.in_flight -= 1
                if not keep:
                    break
        except (asyncio.CancelledError, ConnectionError):
            pass  # the test is over, or the client went away
        finally:
            self.active -= 1
            writer.close()

    @property
    def connection_numbers(self) -> list[int]:
        return [number for number, _ in self.requests]

    @property
    def bodies(self) -> list[bytes]:
        return [body_of(request) for _, request in self.requests]


def send(*parts: bytes, gap: float = 0.0, close: bool = False) -> Action:
    """Write the parts, ``gap`` seconds apart (each its own read for the client); with
    ``close``, end the connection afterwards."""

    async def act(peer: Peer, request: bytes) -> bool:
        for index, part in enumerate(parts):
            if index and gap:
                await asyncio.sleep(gap)
            await peer.write(part)
        return not close

    return act


async def drop(peer: Peer, request: bytes) -> bool:
    """Close the connection without answering."""
    return False


async def hang(peer: Peer, request: bytes) -> bool:
    """Never answer."""
    await asyncio.Event().wait()
    return False


def echo(delay: float = 0.0) -> Action:
    """Answer with the request's own body, after ``delay``; a body of b"hang" is never
    answered."""

    async def act(peer: Peer, request: bytes) -> bool:
        body = body_of(request)
        if body == b"hang":
            return await hang(peer, request)
        if delay:
            await asyncio.sleep(delay)
        await peer.write(ok(body))
        return True

    return act


# -- the client side --------------------------------------------------------------------
def no_fallback() -> AiohttpTransport:
    raise AssertionError("the fallback transport was not expected to be needed")


def plain(
    url: str, *, timeout: float = 2.0, limit: int = 0, fallback=no_fallback
) -> PlainHttpTransport:
    return PlainHttpTransport(url, timeout, limit, fallback)


class Collect:
    """A sink that keeps every read and its arrival time."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.times: list[float] = []

    def __call__(self, data: bytes, arrived: float) -> None:
        assert type(data) is bytes and type(arrived) is float
        self.parts.append(data)
        self.times.append(arrived)

    @property
    def data(self) -> bytes:
        return b"".join(self.parts)


async def until(condition: Callable[[], bool], within: float = 2.0) -> None:
    deadline = time.perf_counter() + within
    while not condition():
        assert time.perf_counter() < deadline, "the condition never held"
        await asyncio.sleep(0.002)


def session() -> aiohttp.ClientSession:
    """Like the run's session (batchbench.drive.driver.make_session): no User-Agent."""
    return aiohttp.ClientSession(skip_auto_headers=("User-Agent",), auto_decompress=True)


async def two_sends(first: Action, following: bytes, streamed: bool):
    """Two sends on one transport: the first answered by ``first`` (whole, or through a
    sink), the second by a plain ``following`` body; (server, reply, sink, second reply)."""
    async with RawServer(first, send(ok(following))) as server:
        t = plain(server.url())
        sink = Collect() if streamed else None
        reply = await t.send(BODY, HEADERS, sink)
        after = await t.send(BODY, HEADERS, None)
        await t.close()
    return server, reply, sink, after


# -- the request ------------------------------------------------------------------------
def test_request_bytes_as_the_server_reads_them(run):
    other = {"X-Other": "2"}

    async def scenario():
        async with RawServer(send(ok(b"{}"))) as server:
            t = plain(server.url())
            replies = [
                await t.send(BODY, HEADERS, None),
                await t.send(b"", other, None),  # another dict: its own header lines
                await t.send(b"[1]", HEADERS, None),
            ]
            await t.close()
        return server, replies

    server, replies = run(scenario())
    assert replies == [(200, b"{}", None, None)] * 3
    host = b"Host: 127.0.0.1:%d\r\n" % server.port
    fixed = b"Accept: */*\r\nAccept-Encoding: gzip, deflate\r\n"
    given = b"Content-Type: application/json\r\nAuthorization: Bearer sk-test\r\nX-Routing-Key: agent-7\r\n"
    line = b"POST /v1/chat/completions HTTP/1.1\r\n"
    assert [request for _, request in server.requests] == [
        line + host + fixed + given + b"Content-Length: %d\r\n\r\n" % len(BODY) + BODY,
        line + host + fixed + b"X-Other: 2\r\nContent-Length: 0\r\n\r\n",
        line + host + fixed + given + b"Content-Length: 3\r\n\r\n[1]",
    ]
    for _, request in server.requests:
        names = [h.split(b":")[0].lower() for h in request.split(b"\r\n\r\n")[0].split(b"\r\n")[1:]]
        assert b"user-agent" not in names
        assert names.count(b"content-length") == 1


def test_the_target_keeps_its_query_and_host_drops_credentials(run):
    async def scenario():
        async with RawServer(send(ok(b"{}"))) as server:
            t = plain(f"http://user:secret@{HOST}:{server.port}/v1/chat/completions?api-version=2")
            reply = await t.send(BODY, {}, None)
            await t.close()
        return server, reply

    server, reply = run(scenario())
    assert reply == (200, b"{}", None, None)
    request = server.requests[0][1]
    assert request == (
        b"POST /v1/chat/completions?api-version=2 HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n"
        b"Accept: */*\r\nAccept-Encoding: gzip, deflate\r\nContent-Length: %d\r\n\r\n%s"
        % (server.port, len(BODY), BODY)
    )  # no credentials: not in Host, and no Authorization made of them


# -- keep-alive -------------------------------------------------------------------------
def test_sequential_sends_share_one_keep_alive_connection(run):
    async def scenario():
        async with RawServer(echo()) as server:
            t = plain(server.url(), limit=4)
            replies = [await t.send(b"request %d" % i, HEADERS, None) for i in range(5)]
            still_open = server.active
            await t.close()
            await until(lambda: server.active == 0)  # close() ends the idle connection
        return server, replies, still_open

    server, replies, still_open = run(scenario())
    assert replies == [(200, b"request %d" % i, None, None) for i in range(5)]
    assert server.connections == 1 and still_open == 1
    assert server.connection_numbers == [1, 1, 1, 1, 1]


def test_connection_close_and_http_1_0_responses_are_not_reused(run):
    script = (
        send(ok(b"one", "Connection: close")),  # the server itself leaves it open
        send(ok(b"two", version="HTTP/1.0")),
        send(ok(b"three")),
        send(ok(b"four")),
    )

    async def scenario():
        async with RawServer(*script) as server:
            t = plain(server.url())
            replies = [await t.send(BODY, HEADERS, None) for _ in range(4)]
            await t.close()
        return server, replies

    server, replies = run(scenario())
    assert replies == [(200, b, None, None) for b in (b"one", b"two", b"three", b"four")]
    assert server.connection_numbers == [1, 2, 3, 3]


def test_responses_without_a_body_are_complete_and_reused(run):
    script = (send(head("204 No Content")), send(ok(b"")), send(ok(b"x")))

    async def scenario():
        async with RawServer(*script) as server:
            t = plain(server.url())
            sink = Collect()
            replies = [
                await t.send(BODY, HEADERS, None),
                await t.send(BODY, HEADERS, sink),
                await t.send(BODY, HEADERS, None),
            ]
            await t.close()
        return server, replies, sink

    server, replies, sink = run(scenario())
    assert replies == [(204, b"", None, None), (200, b"", None, None), (200, b"x", None, None)]
    assert sink.parts == []
    assert server.connection_numbers == [1, 1, 1]


# -- framing ----------------------------------------------------------------------------
# name: (writes, the reads a sink should get, whether the connection is kept)
FRAMINGS = {
    "content-length": (
        (head("200 OK", "Content-Length: 11") + b"hello", b" world"),
        [b"hello", b" world"],
        True,
    ),
    "chunked": (
        (head("200 OK", CHUNKED) + chunk(b"alpha"), chunk(b"beta"), chunk(b"gamma") + LAST_CHUNK),
        [b"alpha", b"beta", b"gamma"],
        True,
    ),
    "until-close": ((head("200 OK") + b"first ", b"second"), [b"first ", b"second"], False),
}


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "sink"])
@pytest.mark.parametrize("framing", list(FRAMINGS))
def test_body_framing(run, framing, streamed):
    writes, reads, kept = FRAMINGS[framing]
    gap = 0.01

    async def scenario():
        async with RawServer(send(*writes, gap=gap, close=not kept)) as server:
            t = plain(server.url())
            results = []
            for _ in range(2):
                sink = Collect() if streamed else None
                before = time.perf_counter()
                reply = await t.send(BODY, HEADERS, sink)
                results.append((reply, sink, before, time.perf_counter()))
            await t.close()
        return server, results

    server, results = run(scenario())
    body = b"".join(reads)
    for reply, sink, before, after in results:
        if not streamed:
            assert reply == (200, body, None, None)
            continue
        assert reply == (200, b"", None, None)
        assert sink.parts == reads
        assert before <= sink.times[0] and sink.times[-1] <= after
        assert sink.times == sorted(sink.times)
        # the time of each read, not one stamp for all
        assert sink.times[-1] - sink.times[0] >= gap * (len(reads) - 1) / 2
    assert server.connection_numbers == ([1, 1] if kept else [1, 2])


# -- content encodings ------------------------------------------------------------------
PAYLOAD = b"".join(b'data: {"index": %d, "text": "token %d"}\n\n' % (i, i * i) for i in range(400))


def raw_deflate(data: bytes) -> bytes:
    compressor = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return compressor.compress(data) + compressor.flush()


ENCODINGS = {
    "gzip": ("gzip", gzip.compress(PAYLOAD)),
    "x-gzip": ("x-gzip", gzip.compress(PAYLOAD)),
    "deflate": ("deflate", zlib.compress(PAYLOAD)),
    "raw-deflate": ("deflate", raw_deflate(PAYLOAD)),
}


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "sink"])
@pytest.mark.parametrize("framing", ["content-length", "chunked"])
@pytest.mark.parametrize("encoding", list(ENCODINGS))
def test_compressed_bodies_are_decoded(run, encoding, framing, streamed):
    name, data = ENCODINGS[encoding]
    assert len(data) < len(PAYLOAD) // 3
    cut = len(data) // 3
    thirds = [data[:cut], data[cut : 2 * cut], data[2 * cut :]]
    header = f"Content-Encoding: {name}"
    if framing == "chunked":
        writes = (head("200 OK", header, CHUNKED) + chunk(thirds[0]), chunk(thirds[1]),
                  chunk(thirds[2]) + LAST_CHUNK)  # fmt: skip
    else:
        length = f"Content-Length: {len(data)}"
        writes = (head("200 OK", header, length) + thirds[0], thirds[1], thirds[2])

    # then a plain response on the same connection: nothing of the decoder is left
    server, reply, sink, after = run(two_sends(send(*writes, gap=0.005), b"plain", streamed))
    if streamed:
        assert reply == (200, b"", None, None)
        assert sink.data == PAYLOAD
        assert len(sink.parts) >= 2  # decoded read by read, not at the end
    else:
        assert reply == (200, PAYLOAD, None, None)
    assert after == (200, b"plain", None, None)
    assert server.connection_numbers == [1, 1]


def test_zlib_deflate_whose_first_chunk_is_one_byte(run):
    data = zlib.compress(PAYLOAD)
    response = head("200 OK", "Content-Encoding: deflate", CHUNKED) + chunk(data[:1])
    response += chunk(data[1:]) + LAST_CHUNK

    async def scenario():
        async with RawServer(send(response)) as server:
            t = plain(server.url())
            try:
                return await t.send(BODY, HEADERS, None)
            finally:
                await t.close()

    assert run(scenario()) == (200, PAYLOAD, None, None)


# -- interim responses ------------------------------------------------------------------
INTERIMS = {
    "one write": (head("100 Continue") + ok(b"hello"),),
    "reads of their own": (head("100 Continue"), ok(b"hello")),
    "two interims": (
        head("100 Continue"),
        head("103 Early Hints", "Link: </style.css>; rel=preload", "Retry-After: 9"),
        ok(b"hello"),
    ),
}


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "sink"])
@pytest.mark.parametrize("interim", list(INTERIMS))
def test_interim_responses_are_skipped(run, interim, streamed):
    server, reply, sink, after = run(
        two_sends(send(*INTERIMS[interim], gap=0.01), b"next", streamed)
    )
    if streamed:
        assert reply == (200, b"", None, None) and sink.parts == [b"hello"]
    else:
        assert reply == (200, b"hello", None, None)  # no Retry-After from the 103
    assert after == (200, b"next", None, None)
    assert server.connection_numbers == [1, 1]


# -- error statuses ---------------------------------------------------------------------
ERROR_BODY = b'{"error": {"message": "internal error", "type": "server_error"}}'
ERROR_GZ = gzip.compress(ERROR_BODY)
ERROR_STATUSES = {
    "503": (
        (
            ok(
                b'{"error":"busy"}',
                "Retry-After: 7",
                "X-SMG-Routed-Worker-Id:  http://10.0.0.2:8000 ",
                status="503 Service Unavailable",
            ),
        ),
        (503, b'{"error":"busy"}', "7", "http://10.0.0.2:8000"),
    ),
    "429 with a date": (
        (
            ok(
                b"slow down",
                "Retry-After: Wed, 21 Oct 2015 07:28:00 GMT",
                status="429 Too Many Requests",
            ),
        ),
        (429, b"slow down", "Wed, 21 Oct 2015 07:28:00 GMT", None),
    ),
    "500 chunked gzip": (
        (
            head("500 Internal Server Error", "Content-Encoding: gzip", CHUNKED)
            + chunk(ERROR_GZ[:10]),
            chunk(ERROR_GZ[10:]) + LAST_CHUNK,
        ),
        (500, ERROR_BODY, None, None),
    ),
}


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "sink"])
@pytest.mark.parametrize("case", list(ERROR_STATUSES))
def test_error_bodies_are_returned_whole(run, case, streamed):
    writes, expected = ERROR_STATUSES[case]

    async def scenario():
        async with RawServer(send(*writes, gap=0.01), send(ok(b"fine"))) as server:
            t = plain(server.url())
            sink = Collect() if streamed else None
            reply = await t.send(BODY, HEADERS, sink)
            later = Collect()
            after = await t.send(BODY, HEADERS, later)
            await t.close()
        return server, reply, sink, after, later

    server, reply, sink, after, later = run(scenario())
    assert reply == expected
    if streamed:
        assert sink.parts == []
    assert (after, later.parts) == ((200, b"", None, None), [b"fine"])
    assert server.connection_numbers == [1, 1]


# -- redirects (through the shared aiohttp stub server) ---------------------------------
def _stub_answer(server: StubServer, recorded: Recorded):
    """/redirect/<status>[/absolute], /target (echoes the method and body), /nolocation,
    /named (two headers naming a worker), and the parity cases by name."""
    parts = recorded.path.strip("/").split("/")
    if parts[0] == "redirect":
        location = f"{server.url}/target" if parts[2:] == ["absolute"] else "/target"
        return Reply(int(parts[1]), "moved", headers={"Location": location})
    if parts[0] == "target":
        return Reply(body={"method": recorded.method, "body": recorded.body.decode()})
    if parts[0] == "nolocation":
        return Reply(302, "nowhere to go")
    if parts[0] == "named":
        served = {"x-smg-routed-worker-id": "http://gateway-said", "X-Served-By": "pod-3"}
        return Reply(body=COMPLETION, headers=served)
    return PARITY[parts[0]][0]


@pytest.fixture(scope="module")
def stub():
    with StubServer() as server:
        server.handler = functools.partial(_stub_answer, server)
        yield server


def target_body(method: str, body: bytes) -> bytes:
    return json.dumps({"method": method, "body": body.decode()}).encode()


@pytest.mark.parametrize(
    ("status", "location", "method"),
    [(307, "relative", "POST"), (308, "absolute", "POST"), (303, "relative", "GET"),
     (302, "absolute", "GET"), (301, "relative", "GET")],
)  # fmt: skip
def test_redirects_are_followed_through_the_fallback(run, stub, status, location, method):
    path = f"/redirect/{status}" + ("/absolute" if location == "absolute" else "")

    async def scenario():
        made = []
        async with session() as client:

            def fallback() -> AiohttpTransport:
                made.append(True)
                return AiohttpTransport(client, stub.url + path)

            t = plain(stub.url + path, fallback=fallback)
            whole = await t.send(BODY, HEADERS, None)
            sink = Collect()
            streamed = await t.send(BODY, HEADERS, sink)
            await t.close()
        return made, whole, streamed, sink

    stub.clear()
    made, whole, streamed, sink = run(scenario())
    expected = target_body(method, BODY if method == "POST" else b"")
    assert whole == (200, expected, None, None)
    assert streamed == (200, b"", None, None) and sink.data == expected
    assert made == [True]  # made once, when first needed
    sent = BODY if method == "POST" else b""
    requests = stub.requests
    assert [(r.method, r.path, r.body) for r in requests] == [
        ("POST", path, BODY), (method, "/target", sent)
    ] * 2  # fmt: skip
    for followed in requests[1::2]:
        assert followed.headers.get("content-type") == (
            "application/json" if method == "POST" else None
        )
        assert followed.headers["x-routing-key"] == "agent-7"
        assert followed.headers["authorization"] == "Bearer sk-test"


def test_a_redirect_without_location_is_returned_as_is(run, stub):
    async def scenario():
        t = plain(f"{stub.url}/nolocation")  # the fallback must not be made
        try:
            return await t.send(BODY, HEADERS, Collect())
        finally:
            await t.close()

    assert run(scenario()) == (302, b"nowhere to go", None, None)


def test_make_transport_picks_by_scheme_and_hands_redirects_to_the_session(run, stub):
    async def scenario():
        async with session() as client:
            url = f"{stub.url}/redirect/307"
            lean = make_transport(url, 2.0, 1, client)
            reply = await lean.send(BODY, HEADERS, None)
            await lean.close()
            tls = make_transport("https://example.invalid/v1/chat/completions", 2.0, 1, client)
            with pytest.raises(ValueError, match="not a plain http:// URL"):
                PlainHttpTransport("https://example.invalid/", 2.0, 1, no_fallback)
        return client, lean, reply, tls

    client, lean, reply, tls = run(scenario())
    assert type(lean) is PlainHttpTransport
    assert (lean.timeout_seconds, lean.limit) == (2.0, 1)
    assert reply == (200, target_body("POST", BODY), None, None)
    assert type(tls) is AiohttpTransport and tls.session is client
    assert tls.url == "https://example.invalid/v1/chat/completions"


# -- errors -----------------------------------------------------------------------------
def test_connect_error_names_the_host_and_a_later_send_connects(run):
    async def scenario():
        with socket.socket() as probe:  # a port nobody listens on
            probe.bind((HOST, 0))
            port = probe.getsockname()[1]
        t = plain(f"http://{HOST}:{port}{PATH}", limit=1)
        with pytest.raises(ConnectError) as info:
            await t.send(BODY, HEADERS, None)
        async with RawServer(send(ok(b"up")), port=port) as server:
            after = await t.send(BODY, HEADERS, None)
            await t.close()
        return port, info.value, after, server

    port, error, after, server = run(scenario())
    prefix = f"Cannot connect to host 127.0.0.1:{port} ["
    text = str(error)
    assert text.startswith(prefix) and text.endswith("]") and len(text) > len(prefix) + 1
    assert isinstance(error, OSError) and not isinstance(error, DisconnectError)
    assert transport_kind(error) is ErrorKind.CONNECT
    assert after == (200, b"up", None, None) and server.connections == 1


# name: (action, the error's text or its start, what a sink got before it)
DISCONNECTS = {
    "no response": (drop, "Server disconnected", b""),
    "headers cut": (send(b"HTTP/1.1 200 OK\r\nContent-Le", close=True), "Server disconnected", b""),
    "short body": (
        send(head("200 OK", "Content-Length: 100") + b"0123456789", close=True),
        "Response payload is not completed",
        b"0123456789",
    ),
    "short chunked body": (
        send(head("200 OK", CHUNKED) + chunk(b"part"), close=True),
        "Response payload is not completed",
        b"part",
    ),
    "garbage": (send(b"SSH-2.0-OpenSSH_9.6\r\n\r\n"), "invalid HTTP response: ", b""),
}


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "sink"])
@pytest.mark.parametrize("case", list(DISCONNECTS))
def test_disconnects_and_the_next_send_succeeds(run, case, streamed):
    action, text, delivered = DISCONNECTS[case]

    async def scenario():
        async with RawServer(action, send(ok(b"fine"))) as server:
            t = plain(server.url(), limit=1)  # the broken connection's slot must come back
            sink = Collect() if streamed else None
            with pytest.raises(DisconnectError) as info:
                await t.send(BODY, HEADERS, sink)
            after = await t.send(BODY, HEADERS, None)
            await t.close()
        return server, info.value, sink, after

    server, error, sink, after = run(scenario())
    assert type(error) is DisconnectError
    if text == "Server disconnected":
        assert str(error) == text
    else:
        assert str(error).startswith(text) and len(str(error)) > len(text)
    assert transport_kind(error) is ErrorKind.DISCONNECT
    if streamed:
        assert sink.data == delivered
    assert after == (200, b"fine", None, None)
    assert server.connection_numbers == [1, 2]


# -- the total timeout ------------------------------------------------------------------
async def trickle(peer: Peer, request: bytes) -> bool:
    """Headers at once, then the body a byte per 50 ms: never done within TIMEOUT."""
    await peer.write(head("200 OK", "Content-Length: 100"))
    for _ in range(100):
        await asyncio.sleep(0.05)
        await peer.write(b"x")
    return True


@pytest.mark.serial
@pytest.mark.parametrize("case", ["no response", "trickled body"])
def test_timeout_covers_the_whole_exchange_and_frees_the_slot(run, case):
    action = hang if case == "no response" else trickle

    async def scenario():
        async with RawServer(action, send(ok(b"after"))) as server:
            t = plain(server.url(), timeout=TIMEOUT, limit=1)
            sink = Collect()
            started = time.perf_counter()
            with pytest.raises(TimeoutError):
                await t.send(BODY, HEADERS, sink)
            took = time.perf_counter() - started
            started = time.perf_counter()
            after = await t.send(BODY, HEADERS, None)
            took_after = time.perf_counter() - started
            await t.close()
        return server, sink, took, after, took_after

    server, sink, took, after, took_after = run(scenario())
    assert TIMEOUT - 0.02 <= took < TIMEOUT + 0.2
    if case == "trickled body":
        assert set(sink.data) == {ord("x")} and 2 <= len(sink.data) <= 6
    else:
        assert sink.parts == []
    assert after == (200, b"after", None, None) and took_after < 0.2
    assert server.connection_numbers == [1, 2]


@pytest.mark.serial
def test_timeout_includes_the_wait_for_a_connection(run):
    async def scenario():
        async with RawServer(echo()) as server:
            t = plain(server.url(), timeout=TIMEOUT, limit=1)
            first = asyncio.create_task(t.send(b"hang", HEADERS, None))
            await until(lambda: len(server.requests) == 1)
            await asyncio.sleep(0.05)  # the first send has 0.15 s left
            started = time.perf_counter()
            # waits for the slot until the first send times out, then its own request hangs
            with pytest.raises(TimeoutError):
                await t.send(b"hang", HEADERS, None)
            took = time.perf_counter() - started
            with pytest.raises(TimeoutError):
                await first
            after = await t.send(b"last", HEADERS, None)
            await t.close()
        return server, took, after

    server, took, after = run(scenario())
    assert TIMEOUT - 0.02 <= took < TIMEOUT + 0.1  # not the wait (0.15 s) plus a TIMEOUT
    assert after == (200, b"last", None, None)
    # (the second send's own request may or may not have reached the server in time)
    assert server.bodies[0] == b"hang" and server.bodies[-1] == b"last"


# -- the connection limit and cancellation ----------------------------------------------
@pytest.mark.parametrize(("limit", "connections"), [(2, 2), (0, 6)])
def test_connection_limit(run, limit, connections):
    hold = 0.05

    async def scenario():
        async with RawServer(echo(hold)) as server:
            t = plain(server.url(), limit=limit)
            started = time.perf_counter()
            replies = await asyncio.gather(
                *(t.send(b"request %d" % i, HEADERS, None) for i in range(6))
            )
            took = time.perf_counter() - started
            await t.close()
        return server, replies, took

    server, replies, took = run(scenario())
    assert replies == [(200, b"request %d" % i, None, None) for i in range(6)]
    assert server.connections == connections  # kept-alive connections are reused
    assert server.max_active == connections and server.max_in_flight == connections
    assert took >= 0.9 * hold * math.ceil(6 / connections)


@pytest.mark.serial
def test_a_cancelled_send_frees_its_slot(run):
    async def scenario():
        async with RawServer(echo()) as server:
            t = plain(server.url(), limit=1)
            stuck = asyncio.create_task(t.send(b"hang", HEADERS, None))
            await until(lambda: len(server.requests) == 1)
            stuck.cancel()
            with pytest.raises(asyncio.CancelledError):
                await stuck
            started = time.perf_counter()
            after = await t.send(b"next", HEADERS, None)
            took = time.perf_counter() - started
            await t.close()
        return server, after, took

    server, after, took = run(scenario())
    assert after == (200, b"next", None, None) and took < 0.2
    assert server.connection_numbers == [1, 2]


@pytest.mark.serial
def test_a_wake_up_given_to_a_cancelled_waiter_passes_on(run):
    """B waits for the one slot, then C. A finishes and hands its connection to B, and B is
    cancelled before it runs: C must get the connection (not wait for its timeout)."""
    gate = asyncio.Event()

    async def gated(peer: Peer, request: bytes) -> bool:
        await gate.wait()
        await peer.write(ok(b"answer to " + body_of(request)))
        return True

    async def scenario():
        async with RawServer(gated) as server:
            t = plain(server.url(), timeout=2.0, limit=1)
            waiting: dict[str, asyncio.Task] = {}

            async def a_then_cancel_b():
                reply = await t.send(b"a", HEADERS, None)
                waiting["b"].cancel()  # B was woken by A's release, and has not run yet
                return reply

            a = asyncio.create_task(a_then_cancel_b())
            await until(lambda: len(server.requests) == 1)
            waiting["b"] = asyncio.create_task(t.send(b"b", HEADERS, None))
            c = asyncio.create_task(t.send(b"c", HEADERS, None))
            await asyncio.sleep(0.01)  # B, then C, wait for the slot
            started = time.perf_counter()
            gate.set()
            replies = [await a]
            with pytest.raises(asyncio.CancelledError):
                await waiting["b"]
            replies.append(await c)
            took = time.perf_counter() - started
            await t.close()
        return server, replies, took

    server, replies, took = run(scenario())
    assert replies == [(200, b"answer to a", None, None), (200, b"answer to c", None, None)]
    assert took < 0.3
    assert server.bodies == [b"a", b"c"] and server.connection_numbers == [1, 1]


# -- stale keep-alive connections -------------------------------------------------------
def answer_then(after: bytes | None) -> Action:
    """Answer, then 20 ms later either close the idle connection (``after`` None) or write
    ``after`` on it unasked."""

    async def act(peer: Peer, request: bytes) -> bool:
        await peer.write(ok(b"first"))
        await asyncio.sleep(0.02)
        if after is None:
            return False
        await peer.write(after)
        return True

    return act


@pytest.mark.parametrize(
    "after",
    [None, head("408 Request Timeout", "Content-Length: 0", "Connection: close")],
    ids=["closed by the server", "unasked bytes"],
)
def test_an_idle_connection_the_server_ended_is_not_reused(run, after):
    async def scenario():
        async with RawServer(answer_then(after), send(ok(b"second"))) as server:
            t = plain(server.url(), limit=1)  # a dead connection must give its slot back
            first = await t.send(BODY, HEADERS, None)
            await until(lambda: server.active == 0)  # (the client aborts on unasked bytes)
            await asyncio.sleep(0.02)
            second = await t.send(BODY, HEADERS, None)
            await t.close()
        return server, first, second, t.resent

    server, first, second, resent = run(scenario())
    assert (first, second) == ((200, b"first", None, None), (200, b"second", None, None))
    assert server.connection_numbers == [1, 2]
    assert resent == 0  # dropped from the pool, not found dead when the request went out


# name: (what the server does with the request on the kept-alive connection (and with the
# request sent again); the error of the send, or None; whether it was sent again; the
# connection of each request)
CLOSED_UNDER = {
    "closed unanswered, then answered": (
        (drop, send(ok(b"second"))), None, 1, [1, 1, 2]
    ),
    "closed unanswered twice": (
        (drop, drop), "Server disconnected", 1, [1, 1, 2]
    ),
    "headers cut": (
        (send(b"HTTP/1.1 200 OK\r\nContent-Le", close=True),),
        "Server disconnected", 0, [1, 1],
    ),
    "short body": (
        (send(head("200 OK", "Content-Length: 100") + b"0123456789", close=True),),
        "Response payload is not completed", 0, [1, 1],
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CLOSED_UNDER))
def test_a_kept_alive_connection_closed_under_the_request(run, case):
    """The server closes a kept-alive connection as the request goes out: a request that got
    no byte of an answer goes again, once, on a new connection; one that got a part of an
    answer fails."""
    actions, error, resent, numbers = CLOSED_UNDER[case]

    async def scenario():
        async with RawServer(send(ok(b"first")), *actions, send(ok(b"last"))) as server:
            t = plain(server.url(), limit=1)
            first = await t.send(BODY, HEADERS, None)
            try:
                second = await t.send(b"again", HEADERS, None)
            except DisconnectError as exc:
                second = exc
            seen = list(server.requests)
            last = await t.send(BODY, HEADERS, None)
            await t.close()
        return first, second, seen, t.resent, last

    first, second, seen, sent_again, last = run(scenario())
    assert first == (200, b"first", None, None)
    if error is None:
        assert second == (200, b"second", None, None)
    else:
        assert type(second) is DisconnectError and str(second).startswith(error)
    assert sent_again == resent
    assert [number for number, _ in seen] == numbers
    assert [body_of(request) for _, request in seen] == [BODY] + [b"again"] * (len(seen) - 1)
    assert last == (200, b"last", None, None)


def test_stray_bytes_after_a_response_are_not_parsed_into_it(run):
    stray = ok(b"boom", status="500 Internal Server Error")

    async def scenario():
        async with RawServer(send(ok(b"ok") + stray)) as server:
            t = plain(server.url())
            try:
                return await t.send(BODY, HEADERS, None)
            finally:
                await t.close()

    assert run(scenario()) == (200, b"ok", None, None)


# -- a failing sink ---------------------------------------------------------------------
class SinkBroke(Exception):
    pass


def test_a_failing_sink_ends_the_send_with_its_exception(run):
    boom = SinkBroke("sink broke")
    got: list[bytes] = []

    def sink(data: bytes, arrived: float) -> None:
        got.append(data)
        if len(got) == 2:
            raise boom

    stream = (head("200 OK", CHUNKED) + chunk(b"alpha"), chunk(b"beta"),
              chunk(b"gamma") + LAST_CHUNK)  # fmt: skip

    async def scenario():
        async with RawServer(send(*stream, gap=0.01), send(ok(b"after"))) as server:
            t = plain(server.url(), limit=1)
            with pytest.raises(SinkBroke) as info:
                await t.send(BODY, HEADERS, sink)
            after = await t.send(BODY, HEADERS, None)
            await t.close()
        return server, info.value, after

    server, error, after = run(scenario())
    assert error is boom and str(error) == "sink broke"
    assert got == [b"alpha", b"beta"]
    assert after == (200, b"after", None, None)
    assert server.connection_numbers == [1, 2]  # the interrupted response is not reused


# -- parity with aiohttp ----------------------------------------------------------------
COMPLETION = chat_completion("hi")
ZIPPED = chat_completion("zipped")
SSE_PARTS = [sse(delta_chunk("Hel")), sse(delta_chunk("lo")), b"data: [DONE]\n\n"]
BUSY = {"error": {"message": "slow down"}}
# name: (what the stub answers, body)
PARITY = {
    "json": (Reply(body=COMPLETION), json.dumps(COMPLETION).encode()),
    "sse": (
        Stream([(0.0, SSE_PARTS[0]), (0.01, SSE_PARTS[1]), (0.01, SSE_PARTS[2])]),
        b"".join(SSE_PARTS),
    ),
    "gzip": (
        Reply(
            body=gzip.compress(json.dumps(ZIPPED).encode()), headers={"Content-Encoding": "gzip"}
        ),
        json.dumps(ZIPPED).encode(),
    ),
    "busy": (Reply(429, BUSY, headers={"Retry-After": "3"}), json.dumps(BUSY).encode()),
    "routed": (
        Reply(body=COMPLETION, headers={"X-SMG-Routed-Worker-Id": "http://10.0.0.1:8000"}),
        json.dumps(COMPLETION).encode(),
    ),
}


@pytest.mark.parametrize("case", list(PARITY))
def test_parity_with_the_aiohttp_transport(run, stub, case):
    async def scenario():
        results = []
        async with session() as client:
            url = f"{stub.url}/{case}"
            for t in (plain(url), AiohttpTransport(client, url)):
                whole = await t.send(BODY, HEADERS, None)
                sink = Collect()
                streamed = await t.send(BODY, HEADERS, sink)
                results.append((whole, streamed, sink.data))
                await t.close()
        return results

    lean, reference = run(scenario())
    body = PARITY[case][1]
    if case == "busy":
        expected = ((429, body, "3", None), (429, body, "3", None), b"")
    elif case == "routed":
        worker = "http://10.0.0.1:8000"
        expected = ((200, body, None, worker), (200, b"", None, worker), body)
    else:
        expected = ((200, body, None, None), (200, b"", None, None), body)
    assert lean == reference == expected


# -- found in review ----------------------------------------------------------------------
def test_a_connection_the_server_closes_after_its_answer_is_not_used_again(run):
    """llama.cpp's server ends the connection right after a streamed answer, though HTTP/1.1
    keeps it alive. The close arrives before the next request goes out (loopback): the idle
    check finds it, and the next request takes a new connection without a resend."""

    async def scenario():
        async with RawServer(send(ok(b"first"), close=True), send(ok(b"second"))) as server:
            t = plain(server.url(), limit=1)
            first = await t.send(BODY, HEADERS, None)
            second = await t.send(b"again", HEADERS, None)
            await t.close()
        return first, second, server.connection_numbers, t.resent

    first, second, numbers, resent = run(scenario())
    assert (first, second) == ((200, b"first", None, None), (200, b"second", None, None))
    assert (numbers, resent) == ([1, 2], 0)


def test_a_request_the_server_worked_on_before_closing_is_not_sent_again(run):
    """A close that comes long after the request went out (a crash while generating) may
    follow work on it: the send fails as a disconnect, and nothing is sent twice."""

    async def work_then_close(peer: Peer, request: bytes) -> bool:
        await asyncio.sleep(0.2)
        return False

    async def scenario():
        async with RawServer(send(ok(b"first")), work_then_close, send(ok(b"x"))) as server:
            t = plain(server.url(), limit=1)
            await t.send(BODY, HEADERS, None)
            try:
                await t.send(b"again", HEADERS, None)
                outcome = None
            except DisconnectError as exc:
                outcome = str(exc)
            await t.close()
        return outcome, server.connection_numbers, t.resent

    assert run(scenario()) == ("Server disconnected", [1, 1], 0)


def test_a_failed_resend_reports_the_first_disconnect(run):
    """The server went away as the request went out on a kept-alive connection: the resend
    cannot connect, and the request fails as the disconnect it met, not a connect error."""

    async def scenario():
        server = RawServer(send(ok(b"first")), drop)
        async with server:
            t = plain(server.url(), limit=1)
            await t.send(BODY, HEADERS, None)
            connection = t._idle[-1]
            # No new connections from here on: close() stops listening at once. No
            # wait_closed() here: since Python 3.12.1 it waits until every accepted
            # connection has ended too, the kept-alive one the client holds included, so it
            # would wait for the end of this test.
            server._server.close()
            connection.served = 1
            try:
                await t.send(b"again", HEADERS, None)
                outcome = None
            except OSError as exc:
                outcome = exc
            await t.close()
        return outcome, t.resent, server.connections

    outcome, resent, connections = run(scenario())
    assert type(outcome) is DisconnectError and str(outcome) == "Server disconnected"
    assert resent == 1
    assert connections == 1  # the resend could not connect


def test_waiters_cancelled_together_end_cancelled(run):
    """A shutdown cancels every task at once, those waiting at the limit too: each ends
    with CancelledError (never a ValueError from the waiting line), and the limit's slot
    is free afterwards."""

    async def scenario():
        async with RawServer(hang, send(ok(b"after"))) as server:
            t = plain(server.url(), limit=1)
            tasks = [asyncio.ensure_future(t.send(BODY, HEADERS, None)) for _ in range(4)]
            await asyncio.sleep(0.1)  # one holds the connection, three wait for it
            for task in tasks:
                task.cancel()
            outcomes = await asyncio.gather(*tasks, return_exceptions=True)
            after = await t.send(BODY, HEADERS, None)
            await t.close()
        return [type(outcome).__name__ for outcome in outcomes], after

    assert run(scenario()) == (["CancelledError"] * 4, (200, b"after", None, None))


def test_a_redirect_to_another_origin_drops_the_key(run):
    """The API key goes only to the target's own origin (aiohttp drops it past the first hop
    too); the same origin keeps it."""

    async def scenario():
        async with RawServer(send(ok(b"elsewhere"))) as other:
            moved = head("307 Temporary Redirect", f"Location: {other.url('/there')}", "Content-Length: 0")  # fmt: skip
            same = head("307 Temporary Redirect", "Location: /here", "Content-Length: 0")
            script = (send(moved), send(same), send(ok(b"here")))
            async with RawServer(*script) as server, session() as client:
                t = plain(server.url(), fallback=lambda: AiohttpTransport(client, server.url()))
                away = await t.send(BODY, HEADERS, None)
                home = await t.send(BODY, HEADERS, None)
                await t.close()
        return away, home, other.requests[0][1], server.requests[-1][1]

    away, home, at_other, at_home = run(scenario())
    assert (away, home) == ((200, b"elsewhere", None, None), (200, b"here", None, None))
    assert b"authorization" not in at_other.lower() and body_of(at_other) == BODY
    assert b"Authorization: Bearer sk-test\r\n" in at_home and body_of(at_home) == BODY


def test_a_body_that_is_neither_sized_nor_chunked_ends_with_the_connection(run):
    async def scenario():
        answer = head("200 OK", "Transfer-Encoding: identity") + b"hello"
        async with RawServer(send(answer, close=True)) as server:
            t = plain(server.url())
            reply = await t.send(BODY, HEADERS, None)
            await t.close()
        return reply

    assert run(scenario()) == (200, b"hello", None, None)


def test_close_fails_what_is_in_flight_and_leaves_nothing_open(run):
    async def scenario():
        async with RawServer(hang) as server:
            t = plain(server.url(), limit=1)
            tasks = [asyncio.ensure_future(t.send(BODY, HEADERS, None)) for _ in range(2)]
            await asyncio.sleep(0.1)
            await t.close()
            outcomes = await asyncio.gather(*tasks, return_exceptions=True)
            try:
                await t.send(BODY, HEADERS, None)
                later = None
            except DisconnectError as exc:
                later = str(exc)
        return [str(outcome) for outcome in outcomes], later, t._open, len(t._live)

    assert run(scenario()) == (["transport closed"] * 2, "transport closed", 0, 0)


def test_credentials_in_the_url_go_to_aiohttp():
    async def scenario():
        async with session() as client:
            return type(make_transport("http://user:pw@127.0.0.1:9/v1", 1.0, 0, client))

    assert asyncio.run(scenario()) is AiohttpTransport


# -- hostile responses: bounded memory, unusable redirects, tolerated duplicates ----------
LIMIT = 4096  # --max-response-bytes of these tests


def bounded(url: str, *, fallback=no_fallback) -> PlainHttpTransport:
    return PlainHttpTransport(url, 2.0, 0, fallback, max_response_bytes=LIMIT)


def gzipped(data: bytes) -> bytes:
    return gzip.compress(data, compresslevel=9)


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "sink"])
@pytest.mark.parametrize(
    ("writes", "detail"),
    [
        ((ok(b"x" * (LIMIT + 1)),), ": Content-Length 4097"),
        ((head("200 OK", "Content-Length: 999999999999"),), ": Content-Length 999999999999"),
        ((head("200 OK", CHUNKED), *[chunk(b"y" * 1000)] * 5), ""),
        ((head("200 OK", "Connection: close") + b"z" * (LIMIT + 10),), ""),
        ((ok(gzipped(b"\0" * (1 << 24)), "Content-Encoding: gzip"),), " after gzip decoding"),
        ((b"HTTP/1.1 200 OK\r\nX-Pad: ", *[b"p" * 1000] * 5), " in its head"),
    ],
    ids=["length", "huge-length", "chunked", "until-close", "gzip-bomb", "head"],
)
def test_a_response_past_the_limit_fails_without_holding_it(run, writes, detail, streamed):
    async def scenario():
        async with RawServer(send(*writes, gap=0.01), send(ok(b"next"))) as server:
            t = bounded(server.url())
            sink = Collect() if streamed else None
            with pytest.raises(ResponseTooLargeError) as info:
                await t.send(BODY, HEADERS, sink)
            after = await t.send(BODY, HEADERS, None)
            await t.close()
        return info.value, sink, after, server

    error, sink, after, server = run(scenario())
    assert str(error) == f"response larger than --max-response-bytes (4096 bytes){detail}"
    assert sink is None or len(sink.data) <= LIMIT
    assert after == (200, b"next", None, None) and server.connections == 2  # never reused


def test_a_response_of_exactly_the_limit_is_whole(run):
    body = b"q" * LIMIT
    zipped = gzipped(body)

    async def scenario():
        async with RawServer(send(ok(body)), send(ok(zipped, "Content-Encoding: gzip"))) as server:
            t = bounded(server.url())
            replies = [await t.send(BODY, HEADERS, None) for _ in range(2)]
            await t.close()
        return replies

    assert run(scenario()) == [(200, body, None, None)] * 2


def test_the_content_type_of_a_streamed_answer_is_told_before_its_body(run):
    heard: list = []

    async def scenario():
        async with RawServer(
            send(ok(b"data: x\n\n", "Content-Type: text/event-stream")),
            send(ok(b"<html>", "Content-Type: text/html; charset=utf-8")),
            send(ok(b"plain")),
        ) as server:
            t = plain(server.url())
            for _ in range(3):
                sink = Collect()
                await t.send(BODY, HEADERS, sink, lambda kind, sink=sink: heard.append(
                    (kind, list(sink.parts))))  # fmt: skip
            await t.close()

    run(scenario())
    assert heard == [("text/event-stream", []), ("text/html; charset=utf-8", []), (None, [])]


def test_identical_duplicate_content_lengths_are_accepted_and_different_ones_refused(run):
    async def scenario():
        async with RawServer(
            send(head("200 OK", "Content-Length: 5", "Content-Length: 5") + b"hello"),
            send(head("200 OK", "Content-Length: 5", "X-A: b", "content-length:5") + b"he", b"llo"),
            send(head("200 OK", "Content-Length: 5", "Content-Length: 6") + b"hello!"),
            send(ok(b"next")),
        ) as server:
            t = plain(server.url())
            first = await t.send(BODY, HEADERS, None)
            sink = Collect()
            second = await t.send(BODY, HEADERS, sink)
            with pytest.raises(DisconnectError) as info:
                await t.send(BODY, HEADERS, None)
            after = await t.send(BODY, HEADERS, None)
            await t.close()
        return first, second, sink, info.value, after, server

    first, second, sink, error, after, server = run(scenario())
    assert first == (200, b"hello", None, None)
    assert second == (200, b"", None, None) and sink.data == b"hello"
    assert str(error) == "invalid HTTP response: Duplicate Content-Length"
    assert after == (200, b"next", None, None)
    assert server.connection_numbers == [1, 1, 1, 2]  # a deduplicated response keeps it


@pytest.mark.parametrize(
    ("location", "message"),
    [
        ("http://[::1", "invalid redirect (302 Found): Location 'http://[::1' is not a valid "
         "URL: Invalid IPv6 URL"),
        ("http://127.0.0.1:99999/x", "invalid redirect (302 Found): Location "
         "'http://127.0.0.1:99999/x' is not a valid URL: Port out of range 0-65535"),
        ("http://127.0.0.1:abc/x", "invalid redirect (302 Found): Location "
         "'http://127.0.0.1:abc/x' is not a valid URL: Port could not be cast to integer "
         "value as 'abc'"),
        ("ftp://files.example/x", "redirect to ftp://files.example/x not followed: only "
         "http:// and https:// are"),
        ("https:///nohost", "invalid redirect (302 Found): Location 'https:///nohost' names "
         "no host"),
    ],
    ids=["ipv6", "port-range", "port-text", "scheme", "no-host"],
)  # fmt: skip
def test_an_unusable_location_is_an_invalid_redirect(run, location, message):
    async def scenario():
        async with (
            RawServer(
                send(ok(b"moved", f"Location: {location}", status="302 Found")), send(ok(b"next"))
            ) as server,
            session() as client,
        ):
            t = plain(server.url(), fallback=lambda: AiohttpTransport(client, server.url()))
            with pytest.raises(RedirectError) as info:
                await t.send(BODY, HEADERS, None)
            after = await t.send(BODY, HEADERS, None)
            await t.close()
        return info.value, after

    error, after = run(scenario())
    assert str(error) == message
    assert after == (200, b"next", None, None)


def test_redirect_loops_and_long_chains_name_their_hops(run):
    async def scenario():
        async with (
            RawServer(
                send(ok(b"", "Location: /a", status="307 Temporary Redirect")),
                send(ok(b"", f"Location: {PATH}", status="307 Temporary Redirect")),
            ) as loop_server,
            session() as client,
        ):
            url = loop_server.url()
            t = plain(url, fallback=lambda: AiohttpTransport(client, url))
            with pytest.raises(RedirectError) as loop:
                await t.send(BODY, HEADERS, None)
            await t.close()

        async def onwards(peer, request: bytes) -> bool:
            hop = int(request.split(b" ")[1].rsplit(b"/", 1)[1] or b"0")
            await peer.write(ok(b"", f"Location: /hop/{hop + 1}", status="308 Permanent Redirect"))
            return True

        async with RawServer(onwards) as chain_server, session() as client:
            url = chain_server.url("/hop/0")
            t = plain(url, fallback=lambda: AiohttpTransport(client, url))
            with pytest.raises(RedirectError) as chain:
                await t.send(BODY, HEADERS, None)
            await t.close()
        return loop.value, url, chain.value, chain_server, loop_server

    loop, url, chain, chain_server, loop_server = run(scenario())
    base = f"http://{HOST}:{loop_server.port}"
    assert str(loop) == f"redirect loop after 2 hops: {base}{PATH} → {base}/a → {base}{PATH}"
    origin = url.rsplit("/hop/", 1)[0]
    assert str(chain) == f"too many redirects (more than 10): {url} → … → {origin}/hop/11"
    assert len(chain_server.requests) == 11  # the first request and ten hops


def test_requests_the_server_closed_under_reach_the_results_as_resent(run, tmp_path):
    """A whole run against a server that reads the 2nd and the 4th request it gets on a
    kept-alive connection and closes without answering: each is sent again at once on a new
    connection (no failed attempt, no retry), and the results say exactly 2 resent."""
    answer = send(ok(json.dumps(chat_completion(prompt_tokens=40, completion_tokens=5)).encode()))
    plans = tmp_path / "plans.jsonl"
    turns = [{"prompt_tokens": 24 + 16 * n, "output_tokens": 5} for n in range(4)]
    plans.write_text(json.dumps({"schema_version": 1, "trajectory_id": "t", "requests": turns}))

    async def scenario():
        async with RawServer(answer, drop, answer, drop, answer) as server:
            config = RunConfig(
                host=f"http://{HOST}:{server.port}", agent_plans_jsonl=str(plans), seed=7,
                tokenizer_model="deepseek-v3", prompt_correction=False, content_salt="test",
                model="m", preflight=False, results_json=str(tmp_path / "r.json"),
                stream=False, calibrate=False,  # the scripted answers are for the run's requests
            )  # fmt: skip
            result = await run_async(config)
        return result, server.connection_numbers

    result, numbers = run(scenario())
    metrics = json.loads((tmp_path / "r.json").read_text())["metrics"]
    assert (metrics["successful_requests"], metrics["attempts"], metrics["retries"]) == (4, 4, 0)
    assert metrics["resent_requests"] == 2 and metrics["errors_by_kind"] == {}
    assert numbers == [1, 1, 2, 2, 3, 3]  # each resend on a new connection, kept alive after
    assert result.exit_status == 0


def test_a_named_worker_header_replaces_smgs(run, stub):
    """--routed-worker-header: both transports read the header named (in any case) instead
    of x-smg-routed-worker-id, which then goes unread."""

    async def scenario():
        url = f"{stub.url}/named"
        async with session() as client:
            lean = PlainHttpTransport(url, 2.0, 1, no_fallback, worker_header="X-Served-By")
            reference = AiohttpTransport(client, url, worker_header="x-served-by")
            replies = [await t.send(BODY, HEADERS, None) for t in (lean, reference)]
            await lean.close()
        return replies

    body = json.dumps(COMPLETION).encode()
    assert run(scenario()) == [(200, body, None, "pod-3")] * 2
