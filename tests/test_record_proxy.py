"""``batchbench record``'s proxy between a real client and a real aiohttp upstream on
loopback: replies pass through byte for byte, usage is read (and asked for on streams),
one whole row per recorded request, other paths forwarded without rows, failures."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import hashlib
import hmac
import re
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from batchbench.record.blocks import chat_blocks, completion_blocks
from batchbench.record.chain import chain
from batchbench.record.counts import BlockCounter
from batchbench.record.proxy import ProxyConfig, RecordingProxy
from batchbench.record.sink import RowSink

# No compiled module serves this code, and the simulator's are covered elsewhere: the
# pure-twin pass would repeat it as is.
pytestmark = pytest.mark.native_pass_only

KEY = bytes(range(32))
SYSTEM = {"role": "system", "content": "You are terse."}  # 5 tokens (deepseek-v3)
ASK = {"role": "user", "content": "Say hello."}  # 3 tokens
JSON_REPLY = (
    b'{"id":"c0","object":"chat.completion","choices":[{"index":0,"message":{"role":'
    b'"assistant","content":"Hello"},"finish_reason":"stop"}],"usage":{"prompt_tokens":17,'
    b'"completion_tokens":1,"total_tokens":18}}'
)
EVENTS = [
    b'data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":'
    b'{"role":"assistant","content":"Hel"}}]}\n\n',
    b'data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":'
    b'{"content":"lo"},"finish_reason":"stop"}]}\n\n',
]
USAGE_EVENT = (
    b'data: {"id":"c1","object":"chat.completion.chunk","choices":[],"usage":'
    b'{"prompt_tokens":17,"completion_tokens":2,"total_tokens":19}}\n\n'
)
DONE = b"data: [DONE]\n\n"
ERROR_REPLY = b'{"error":{"message":"engine fell over","code":500}}'
MODELS_REPLY = b'{"object":"list","data":[{"id":"m","object":"model"}]}'
TS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")


@dataclass
class Upstream:
    """An OpenAI-like server whose answers the tests wrote; it keeps what it received."""

    bodies: list[bytes] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    cancelled: list[bool] = field(default_factory=list)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/completions", self.chat)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        return app

    async def chat(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        self.bodies.append(raw)
        self.headers.append(dict(request.headers))
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return web.Response(status=400, body=b'{"error":"not JSON"}')
        messages = body.get("messages") or [{"content": body.get("prompt")}]
        if messages[-1]["content"] == "fail":
            return web.Response(status=500, body=ERROR_REPLY, content_type="application/json")
        if not body.get("stream"):
            return web.Response(body=JSON_REPLY, content_type="application/json")
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        if messages[-1]["content"] in ("cut", "slow"):
            await response.write(EVENTS[0])
            if messages[-1]["content"] == "cut":  # the upstream dies mid-reply
                assert request.transport is not None
                request.transport.close()
                return response
            try:
                await asyncio.sleep(5)  # until the proxy hangs up on behalf of its client
            except asyncio.CancelledError:
                self.cancelled.append(True)
                raise
        for event in EVENTS:
            await response.write(event)
        if (body.get("stream_options") or {}).get("include_usage"):
            # The usage event in two writes: the proxy must find its end across them.
            await response.write(USAGE_EVENT[:40])
            await asyncio.sleep(0.01)
            await response.write(USAGE_EVENT[40:])
        await response.write(DONE)
        await response.write_eof()
        return response

    async def models(self, request: web.Request) -> web.Response:
        self.headers.append(dict(request.headers))
        return web.Response(body=MODELS_REPLY, content_type="application/json")

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok", headers={"X-Upstream": "yes"})


async def serve(app_or_runner: web.Application | web.AppRunner) -> tuple[web.AppRunner, str]:
    runner = (
        app_or_runner
        if isinstance(app_or_runner, web.AppRunner)
        else web.AppRunner(app_or_runner, access_log=None, handler_cancellation=True)
    )
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


@dataclass
class Recording:
    url: str
    upstream: Upstream
    sink: RowSink
    path: Any

    def rows(self) -> list[dict[str, Any]]:
        return [orjson.loads(line) for line in self.path.read_bytes().splitlines()]


@contextlib.asynccontextmanager
async def recording(
    tmp_path, tokenizer, upstream_url: str | None = None, principal_header: str | None = None
) -> AsyncIterator[Recording]:
    upstream = Upstream()
    upstream_runner, url = await serve(upstream.app())
    path = tmp_path / "rows.jsonl"
    sink = RowSink(str(path))
    proxy = RecordingProxy(
        ProxyConfig(upstream_url or url, KEY, principal_header), BlockCounter(tokenizer), sink
    )
    proxy_runner, proxy_url = await serve(proxy.runner(5.0))
    try:
        yield Recording(proxy_url, upstream, sink, path)
    finally:
        await proxy_runner.cleanup()
        await upstream_runner.cleanup()
        sink.close()


async def post(url: str, body: dict[str, Any], headers: dict[str, str] | None = None):
    async with (
        aiohttp.ClientSession(auto_decompress=False) as session,
        session.post(url, data=orjson.dumps(body), headers=headers or {}) as response,
    ):
        return response.status, await response.read(), response.headers


def expected_row(body: dict[str, Any], tokens: list[int], **fields: Any) -> dict[str, Any]:
    blocks = chat_blocks(body) if "messages" in body else completion_blocks(body)
    return {
        "principal_id": "anonymous",
        "model": body.get("model"),
        "chain": chain(KEY, blocks),
        "block_roles": [block.role for block in blocks],
        "block_tokens": tokens,
        "stream": bool(body.get("stream")),
        "max_tokens": body.get("max_tokens"),
        **fields,
    }


def timeless(row: dict[str, Any], before_us: float, after_us: float, elapsed_ms: float):
    """The row without ts and duration_ms, once those are checked for shape and range."""
    row = dict(row)
    ts = row.pop("ts")
    duration = row.pop("duration_ms")
    assert TS.match(ts), ts
    moment = datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp() * 1e6
    assert before_us - 1 <= moment <= after_us + 1
    assert isinstance(duration, float) and 0 < duration <= elapsed_ms
    return row


def run(coro):
    return asyncio.run(coro)


def test_json_reply_passes_through_and_the_row_is_whole(tmp_path, deepseek):
    body = {"model": "m", "messages": [SYSTEM, ASK], "max_tokens": 8}

    async def main():
        async with recording(tmp_path, deepseek) as rec:
            before = time.time() * 1e6
            started = time.perf_counter()
            status, reply, headers = await post(rec.url + "/v1/chat/completions", body)
            elapsed = (time.perf_counter() - started) * 1000
            after = time.time() * 1e6
            assert (status, reply) == (200, JSON_REPLY)
            assert headers["Content-Type"] == "application/json"
            assert rec.upstream.bodies == [orjson.dumps(body)]
            assert rec.upstream.headers[0]["Accept-Encoding"] == "identity"
        [row] = rec.rows()
        assert timeless(row, before, after, elapsed) == {
            **expected_row(body, [5, 3]),
            "correlation_id": "000000000000",
            "prompt_tokens": 17,
            "completion_tokens": 1,
        }
        assert list(row) == [
            "ts", "principal_id", "correlation_id", "model", "chain", "block_roles",
            "block_tokens", "prompt_tokens", "completion_tokens", "stream", "max_tokens",
            "duration_ms",
        ]  # fmt: skip

    run(main())


def test_stream_that_asked_for_usage_passes_through_unchanged(tmp_path, deepseek):
    body = {
        "model": "m",
        "messages": [SYSTEM, ASK],
        "stream": True,
        "stream_options": {"include_usage": True},
    }

    async def main():
        async with recording(tmp_path, deepseek) as rec:
            status, reply, headers = await post(rec.url + "/v1/chat/completions", body)
            assert (status, reply) == (200, EVENTS[0] + EVENTS[1] + USAGE_EVENT + DONE)
            assert headers["Content-Type"] == "text/event-stream"
            assert rec.upstream.bodies == [orjson.dumps(body)]
        [row] = rec.rows()
        assert timeless(row, 0, time.time() * 1e6, 60_000) == {
            **expected_row(body, [5, 3]),
            "correlation_id": "000000000000",
            "prompt_tokens": 17,
            "completion_tokens": 2,
        }

    run(main())


def test_stream_without_usage_is_asked_for_it_and_the_usage_chunk_is_stripped(tmp_path, deepseek):
    body = {
        "model": "m",
        "messages": [SYSTEM, ASK],
        "stream": True,
        "stream_options": {"continuous_usage_stats": False},
        "max_tokens": 4,
    }

    async def main():
        async with recording(tmp_path, deepseek) as rec:
            status, reply, _ = await post(rec.url + "/v1/chat/completions", body)
            assert (status, reply) == (200, EVENTS[0] + EVENTS[1] + DONE)
            forwarded = orjson.loads(rec.upstream.bodies[0])
            assert forwarded == {
                **body,
                "stream_options": {"continuous_usage_stats": False, "include_usage": True},
            }
        [row] = rec.rows()
        assert timeless(row, 0, time.time() * 1e6, 60_000) == {
            **expected_row(body, [5, 3]),
            "correlation_id": "000000000000",
            "prompt_tokens": 17,
            "completion_tokens": 2,
        }

    run(main())


def test_completions_endpoint_is_recorded_with_its_prompt(tmp_path, deepseek):
    body = {"model": "m", "prompt": "Once upon a time", "max_tokens": 2}

    async def main():
        async with recording(tmp_path, deepseek) as rec:
            status, reply, _ = await post(rec.url + "/v1/completions", body)
            assert (status, reply) == (200, JSON_REPLY)
        [row] = rec.rows()
        assert timeless(row, 0, time.time() * 1e6, 60_000) == {
            **expected_row(body, [4]),
            "block_roles": ["user"],
            "correlation_id": "000000000000",
            "prompt_tokens": 17,
            "completion_tokens": 1,
        }

    run(main())


def test_other_paths_are_forwarded_without_rows(tmp_path, deepseek):
    async def main():
        async with recording(tmp_path, deepseek) as rec, aiohttp.ClientSession() as session:
            async with session.get(
                rec.url + "/v1/models", headers={"Authorization": "Bearer sk-x", "X-Trace": "t1"}
            ) as response:
                assert (response.status, await response.read()) == (200, MODELS_REPLY)
            async with session.get(rec.url + "/health") as response:
                assert (response.status, await response.text()) == (200, "ok")
                assert response.headers["X-Upstream"] == "yes"
            async with session.get(rec.url + "/nowhere") as response:
                assert response.status == 404
            assert rec.upstream.headers[0]["Authorization"] == "Bearer sk-x"
            assert rec.upstream.headers[0]["X-Trace"] == "t1"
            assert rec.sink.written == 0
        assert rec.path.read_bytes() == b""

    run(main())


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_upstream_down_gives_502_and_a_row_without_usage(tmp_path, deepseek):
    body = {"model": "m", "messages": [ASK]}

    async def main():
        down = f"http://127.0.0.1:{closed_port()}"
        async with recording(tmp_path, deepseek, upstream_url=down) as rec:
            status, reply, headers = await post(rec.url + "/v1/chat/completions", body)
            assert status == 502
            assert headers["Content-Type"] == "application/json"
            assert orjson.loads(reply) == {
                "error": {
                    "message": "batchbench record: the upstream server cannot be reached "
                    "(Connection refused)",
                    "type": "bad_gateway",
                    "code": 502,
                }
            }
            status, _, _ = await post(rec.url + "/v1/models", {})
            assert status == 502
        [row] = rec.rows()
        assert timeless(row, 0, time.time() * 1e6, 60_000) == {
            **expected_row(body, [3]),
            "correlation_id": "000000000000",
            "prompt_tokens": None,
            "completion_tokens": None,
        }

    run(main())


def test_upstream_error_passes_through_with_a_row_without_usage(tmp_path, deepseek):
    body = {"model": "m", "messages": [SYSTEM, {"role": "user", "content": "fail"}], "stream": True}

    async def main():
        async with recording(tmp_path, deepseek) as rec:
            status, reply, _ = await post(rec.url + "/v1/chat/completions", body)
            assert (status, reply) == (500, ERROR_REPLY)
        [row] = rec.rows()
        assert timeless(row, 0, time.time() * 1e6, 60_000) == {
            **expected_row(body, [5, 1]),
            "correlation_id": "000000000000",
            "prompt_tokens": None,
            "completion_tokens": None,
        }

    run(main())


def test_principal_from_header_key_hash_or_anonymous_and_ids_in_arrival_order(tmp_path, deepseek):
    body = {"model": "m", "messages": [ASK]}

    async def main():
        async with recording(tmp_path, deepseek, principal_header="X-Team") as rec:
            url = rec.url + "/v1/chat/completions"
            await post(url, body, {"X-Team": "search", "Authorization": "Bearer sk-a"})
            await post(url, body, {"Authorization": "Bearer sk-a"})
            await post(url, body, {"Authorization": "Bearer sk-b"})
            await post(url, body)
        return rec.rows()

    rows = run(main())
    assert [(r["correlation_id"], r["principal_id"]) for r in rows] == [
        ("000000000000", "search"),
        ("000000000001", "key-" + hmac.new(KEY, b"sk-a", hashlib.sha256).hexdigest()[:16]),
        ("000000000002", "key-" + hmac.new(KEY, b"sk-b", hashlib.sha256).hexdigest()[:16]),
        ("000000000003", "anonymous"),
    ]
    assert len({tuple(r["chain"]) for r in rows}) == 1


def test_upstream_cut_mid_stream_cuts_the_client_and_leaves_a_row(tmp_path, deepseek):
    body = {"model": "m", "messages": [{"role": "user", "content": "cut"}], "stream": True}

    async def main():
        async with recording(tmp_path, deepseek) as rec, aiohttp.ClientSession() as session:
            url = rec.url + "/v1/chat/completions"
            async with session.post(url, data=orjson.dumps(body)) as response:
                assert response.status == 200
                assert await response.content.readany() == EVENTS[0]
                with pytest.raises(aiohttp.ClientPayloadError):
                    await response.read()
        [row] = rec.rows()
        assert timeless(row, 0, time.time() * 1e6, 60_000) == {
            **expected_row(body, [1]),
            "correlation_id": "000000000000",
            "prompt_tokens": None,
            "completion_tokens": None,
        }

    run(main())


def test_a_client_that_leaves_mid_stream_ends_the_upstream_request(tmp_path, deepseek):
    body = {"model": "m", "messages": [{"role": "user", "content": "slow"}], "stream": True}

    async def main():
        async with recording(tmp_path, deepseek) as rec:
            async with (
                aiohttp.ClientSession() as session,
                session.post(rec.url + "/v1/chat/completions", data=orjson.dumps(body)) as response,
            ):
                assert await response.content.readany() == EVENTS[0]
                response.close()  # hang up
            for _ in range(100):
                if rec.sink.written and rec.upstream.cancelled:
                    break
                await asyncio.sleep(0.02)
            assert rec.upstream.cancelled == [True]
        [row] = rec.rows()
        assert timeless(row, 0, time.time() * 1e6, 5_000) == {
            **expected_row(body, [1]),
            "correlation_id": "000000000000",
            "prompt_tokens": None,
            "completion_tokens": None,
        }

    run(main())


def test_a_body_that_is_not_json_is_forwarded_as_is_with_an_empty_row(tmp_path, deepseek):
    async def main():
        async with recording(tmp_path, deepseek) as rec, aiohttp.ClientSession() as session:
            async with session.post(rec.url + "/v1/chat/completions", data=b"{oops") as response:
                assert (response.status, await response.read()) == (400, b'{"error":"not JSON"}')
            assert rec.upstream.bodies == [b"{oops"]
        [row] = rec.rows()
        assert timeless(row, 0, time.time() * 1e6, 60_000) == {
            "principal_id": "anonymous",
            "correlation_id": "000000000000",
            "model": None,
            "chain": [],
            "block_roles": [],
            "block_tokens": [],
            "prompt_tokens": None,
            "completion_tokens": None,
            "stream": None,
            "max_tokens": None,
        }

    run(main())


def test_a_client_that_hangs_up_right_after_its_reply_still_gets_its_row(tmp_path, deepseek):
    """A long history is hashed and counted on the worker thread after the reply; the
    client closing its connection meanwhile must not cancel that."""
    long = {"role": "user", "content": "lorem ipsum dolor " * 400}  # 7,200 characters
    body = {"model": "m", "messages": [SYSTEM, long]}

    async def main():
        async with recording(tmp_path, deepseek) as rec:
            for _ in range(3):
                async with (
                    aiohttp.ClientSession() as session,
                    session.post(
                        rec.url + "/v1/chat/completions", data=orjson.dumps(body)
                    ) as response,
                ):
                    assert await response.read() == JSON_REPLY
                    # leaving the block closes the connection while the proxy still works
            for _ in range(100):
                if rec.sink.written == 3:
                    break
                await asyncio.sleep(0.02)
        rows = rec.rows()
        assert [r["correlation_id"] for r in rows] == [
            "000000000000",
            "000000000001",
            "000000000002",
        ]
        assert [r["block_tokens"] for r in rows] == [[5, 1601]] * 3

    run(main())


def test_a_gzip_request_body_reaches_the_upstream_unpacked(tmp_path, deepseek):
    """The server unpacks a compressed request body; the proxy sends it on unpacked,
    without the Content-Encoding that no longer describes it."""
    body = {"model": "m", "messages": [SYSTEM, ASK]}

    async def main():
        async with recording(tmp_path, deepseek) as rec:
            async with (
                aiohttp.ClientSession(auto_decompress=False) as session,
                session.post(
                    rec.url + "/v1/chat/completions",
                    data=gzip.compress(orjson.dumps(body)),
                    headers={"Content-Encoding": "gzip", "Content-Type": "application/json"},
                ) as response,
            ):
                assert (response.status, await response.read()) == (200, JSON_REPLY)
            assert rec.upstream.bodies == [orjson.dumps(body)]
            assert "Content-Encoding" not in rec.upstream.headers[0]
        [row] = rec.rows()
        assert (row["block_tokens"], row["prompt_tokens"]) == ([5, 3], 17)

    run(main())


def test_header_bytes_that_are_not_utf8_still_give_a_row(tmp_path, deepseek):
    """A bearer key and a principal header of raw non-UTF-8 bytes: the key is hashed as
    its bytes, the header's value kept as text with replacement characters."""
    body = {"model": "m", "messages": [SYSTEM, ASK]}

    async def main():
        async with recording(tmp_path, deepseek, principal_header="X-User") as rec:
            host, port = rec.url.removeprefix("http://").split(":")
            payload = orjson.dumps(body)
            for extra in (b"Authorization: Bearer sk-\xff\xfe\r\n", b"X-User: caf\xe9\r\n"):
                reader, writer = await asyncio.open_connection(host, int(port))
                writer.write(
                    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                    b"Content-Type: application/json\r\nConnection: close\r\n" + extra
                    + b"Content-Length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload
                )  # fmt: skip
                await writer.drain()
                reply = await reader.read()
                writer.close()
                assert reply.startswith(b"HTTP/1.1 200"), reply[:80]
        rows = rec.rows()
        digest = hmac.new(KEY, b"sk-\xff\xfe", hashlib.sha256).hexdigest()
        assert [row["principal_id"] for row in rows] == ["key-" + digest[:16], "caf\ufffd"]
        assert rec.sink.lost == 0

    run(main())


def test_a_body_nested_deeper_than_json_can_be_rewritten_is_forwarded_as_is(tmp_path, deepseek):
    # 300 levels: orjson reads up to 1,024 but writes at most 254.
    raw = (
        b'{"model":"m","stream":true,"messages":[{"role":"user","content":'
        + b"[" * 300 + b'"x"' + b"]" * 300 + b"}]}"
    )  # fmt: skip

    async def main():
        async with recording(tmp_path, deepseek) as rec:
            async with (
                aiohttp.ClientSession() as session,
                session.post(rec.url + "/v1/chat/completions", data=raw) as response,
            ):
                assert response.status == 200
                await response.read()
            assert rec.upstream.bodies == [raw]  # not rewritten: include_usage not added
        [row] = rec.rows()
        assert (row["chain"], row["model"], row["stream"]) == ([], None, None)

    run(main())


def test_max_tokens_falls_back_to_max_completion_tokens_when_null(tmp_path, deepseek):
    body = {"model": "m", "messages": [ASK], "max_tokens": None, "max_completion_tokens": 9}

    async def main():
        async with recording(tmp_path, deepseek) as rec:
            status, _, _ = await post(rec.url + "/v1/chat/completions", body)
            assert status == 200
        [row] = rec.rows()
        assert row["max_tokens"] == 9

    run(main())
