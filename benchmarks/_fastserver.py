"""A zero-latency /v1/chat/completions server for client benchmarks (not part of batchbench).

Run: ``python -m benchmarks._fastserver [--port 0] [--chunks 50]``; it prints
``listening on http://127.0.0.1:PORT`` and serves until stdin closes or it is terminated.

An ``asyncio.Protocol`` on uvloop (when installed) that parses just enough HTTP/1.1 for
keep-alive clients: the request line, ``Content-Length`` and ``Expect``; the body is only
searched for ``"stream":true``. Every reply is canned and written in one ``write``: a
chat completion with usage, or an SSE stream of ``--chunks`` content chunks, a usage
chunk and ``[DONE]`` (sent with a Content-Length, which every client accepts; with
``--sse-writes K`` the stream goes out in K writes on successive loop iterations). The reply
tokens do not match the request: the client under test only needs valid usage.

Control lines on stdin (each answered with one line on stdout):

``usage.prompt_tokens`` is the number of spaces in the request body: synthetic text has
about one space per token and compact JSON none, so the count follows the prompt the
way a real server's does (a constant would make a client that corrects its prompts
towards ``usage`` chase a server that never moves).

``watch PID``   -> ``ok``; at the next request that arrives, read /proc/PID/stat and print
                 ``first CPU_SECONDS`` (user + system CPU of that process so far) before
                 answering the request: the client's CPU from its start to its first request.
``count``       -> ``count N``: requests answered so far.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import socket
import sys
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
MAX_HEADER_BYTES = 64 * 1024


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (all its threads), from /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def _response(status: str, content_type: bytes, body: bytes) -> bytes:
    head = (
        f"HTTP/1.1 {status}\r\n".encode()
        + b"content-type: "
        + content_type
        + b"\r\ncontent-length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
    )
    return head + body


PROMPT_MARK = b"987654321"  # placeholder for usage.prompt_tokens in the canned replies


def split_at_mark(reply: bytes) -> tuple[bytes, bytes]:
    """The canned bytes around the placeholder; a count padded to its width with spaces
    (valid JSON whitespace) keeps every content-length right."""
    before, after = reply.split(PROMPT_MARK, 1)
    return before, after


def fill(parts: tuple[bytes, bytes], prompt_tokens: int) -> bytes:
    return parts[0] + str(prompt_tokens).encode().rjust(len(PROMPT_MARK)) + parts[1]


def canned_json(completion_tokens: int) -> bytes:
    document = {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "bench",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "word " * completion_tokens},
                "finish_reason": "stop",
            }
        ],
        "usage": {
            "prompt_tokens": int(PROMPT_MARK),
            "completion_tokens": completion_tokens,
        },
    }
    body = json.dumps(document, separators=(",", ":")).encode()
    return _response("200 OK", b"application/json", body)


def canned_sse(chunks: int, writes: int = 1) -> list[bytes]:
    """The SSE reply as ``writes`` pieces cut at event boundaries (head in the first)."""

    def event(document: dict) -> bytes:
        return b"data: " + json.dumps(document, separators=(",", ":")).encode() + b"\n\n"

    base = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 1700000000}
    base["model"] = "bench"
    parts = []
    for index in range(chunks):
        delta = {"content": f"w{index} "}
        if index == 0:
            delta = {"role": "assistant", "content": "w0 "}
        finish = "stop" if index == chunks - 1 else None
        parts.append(
            event({**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
        )
    usage = {"prompt_tokens": int(PROMPT_MARK), "completion_tokens": chunks}
    parts.append(event({**base, "choices": [], "usage": usage}))
    parts.append(b"data: [DONE]\n\n")
    whole = _response("200 OK", b"text/event-stream", b"".join(parts))
    if writes <= 1:
        return [whole]
    head_length = len(whole) - sum(len(part) for part in parts)
    pieces, start = [], 0
    per = -(-len(parts) // writes)
    for first in range(0, len(parts), per):
        stop = head_length + sum(len(part) for part in parts[: first + per])
        pieces.append(whole[start:stop])
        start = stop
    return pieces


BAD_REQUEST = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


class State:
    def __init__(self, json_reply: bytes, sse_reply: list[bytes]) -> None:
        self.json_reply = split_at_mark(json_reply)
        self.sse_first = sse_reply[:-1]  # the usage event is in the last piece
        self.sse_last = split_at_mark(sse_reply[-1])
        self.count = 0
        self.watch_pid: int | None = None
        self.out = sys.stdout


class HttpProtocol(asyncio.Protocol):
    """One keep-alive connection: requests are answered in order as soon as they are whole."""

    __slots__ = ("buffer", "need", "state", "transport")

    def __init__(self, state: State) -> None:
        self.state = state
        self.buffer = bytearray()
        self.need = -1  # body bytes still expected; -1 = reading headers
        self.transport = None

    def connection_made(self, transport) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        buffer = self.buffer
        buffer += data
        state = self.state
        while True:
            if self.need < 0:
                end = buffer.find(b"\r\n\r\n")
                if end < 0:
                    if len(buffer) > MAX_HEADER_BYTES:
                        self.transport.write(BAD_REQUEST)
                        self.transport.close()
                    return
                if state.watch_pid is not None:
                    pid, state.watch_pid = state.watch_pid, None
                    try:
                        cpu = process_cpu_seconds(pid)
                    except OSError:
                        cpu = -1.0
                    state.out.write(f"first {cpu:.6f}\n")
                    state.out.flush()
                head = bytes(buffer[:end]).lower()
                del buffer[: end + 4]
                length = 0
                at = head.find(b"\r\ncontent-length:")
                if at >= 0:
                    stop = head.find(b"\r\n", at + 2)
                    try:
                        length = int(head[at + 17 : stop if stop >= 0 else len(head)])
                    except ValueError:
                        self.transport.write(BAD_REQUEST)
                        self.transport.close()
                        return
                elif b"\r\ntransfer-encoding:" in head:
                    self.transport.write(BAD_REQUEST)  # chunked uploads are not needed here
                    self.transport.close()
                    return
                if b"\r\nexpect: 100-continue" in head:
                    self.transport.write(CONTINUE)
                self.need = length
            if len(buffer) < self.need:
                return
            body = bytes(buffer[: self.need])
            del buffer[: self.need]
            self.need = -1
            stream = b'"stream":true' in body or b'"stream": true' in body
            prompt_tokens = body.count(b" ")
            state.count += 1
            if not stream:
                self.transport.write(fill(state.json_reply, prompt_tokens))
                continue
            last = fill(state.sse_last, prompt_tokens)
            if not state.sse_first:
                self.transport.write(last)
                continue
            # One piece per loop iteration, so the client sees separate reads.
            self.transport.write(state.sse_first[0])
            asyncio.get_running_loop().call_soon(self._write_rest, 1, last)

    def _write_rest(self, index: int, last: bytes) -> None:
        if self.transport.is_closing():
            return
        first = self.state.sse_first
        if index < len(first):
            self.transport.write(first[index])
            asyncio.get_running_loop().call_soon(self._write_rest, index + 1, last)
        else:
            self.transport.write(last)


def _raise_nofile() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


async def serve(port: int, chunks: int, completion_tokens: int, writes: int) -> None:
    loop = asyncio.get_running_loop()
    state = State(canned_json(completion_tokens), canned_sse(chunks, writes))
    server = await loop.create_server(
        lambda: HttpProtocol(state), "127.0.0.1", port, backlog=16384, reuse_address=True
    )
    bound = server.sockets[0].getsockname()[1]
    print(f"listening on http://127.0.0.1:{bound}", flush=True)

    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while True:
        line = await reader.readline()
        if not line:
            break
        words = line.decode().split()
        if not words:
            continue
        if words[0] == "watch" and len(words) == 2:
            state.watch_pid = int(words[1])
            print("ok", flush=True)
        elif words[0] == "count":
            print(f"count {state.count}", flush=True)
        else:
            print(f"error unknown command {line!r}", flush=True)
    server.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--chunks", type=int, default=50, help="content chunks per SSE reply")
    parser.add_argument(
        "--completion-tokens", type=int, default=50, help="usage.completion_tokens of JSON replies"
    )
    parser.add_argument(
        "--sse-writes",
        type=int,
        default=1,
        help="writes per SSE reply, one per loop iteration (default 1: the whole reply at once)",
    )
    args = parser.parse_args(argv)
    _raise_nofile()
    try:
        import uvloop

        loop_factory = uvloop.new_event_loop
    except ImportError:
        loop_factory = None
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(serve(args.port, args.chunks, args.completion_tokens, args.sse_writes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
