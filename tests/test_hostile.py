"""Hostile servers: nothing a server does may end a run, leak the key or exhaust memory.

The real client (``batchbench-agent`` as a subprocess, so a crash, a hang or a runaway
heap cannot take the test run with it) is run against :mod:`hostile_server`, a raw-socket
server on 127.0.0.1 whose every byte is scripted: stalls at each phase, bad chunking,
length mismatches, resets and closes at random offsets, compression bombs, endless
bodies, bad redirects, out-of-range usage, SSE error events, bare-CR line endings, and
error texts that echo the API key. Each case asserts the failed attempt's kind (and its
message where the contract fixes it), the buckets, the exit status, that every output was
written, and, where it matters, the client's peak RSS. The scripted cases run as the
agents of a few runs (one agent per case), to keep the suite within its time budget.

Then hypothesis feeds the plain-HTTP client random response bytes split at random points
(every attempt ends in a response or one of the transport's own exceptions; aiohttp's
too, on a redirect's hops), and the driver's response parsing random bodies and streams
(a reply or a ResponseError).
"""

from __future__ import annotations

import asyncio
import csv
import gzip
import inspect
import itertools
import json
import os
import random
import re
import socket
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import orjson
import pytest
import uvloop
from conftest import implementations
from hostile_server import (
    CHUNKED,
    DONE,
    EVENT_STREAM,
    LAST_CHUNK,
    HostileServer,
    Peer,
    Request,
    _read_request,
    bomb,
    chunk,
    chunked,
    close_after,
    completion,
    delta,
    dumps,
    endless,
    endless_chunked,
    event,
    good_stream,
    head,
    huge_content_length,
    ok,
    ok_json,
    reply,
    reset_after,
    split,
    sse_stream,
    stall,
    usage,
    usage_chunk,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batchbench.drive.transport import (
    AiohttpTransport,
    ConnectError,
    DisconnectError,
    PlainHttpTransport,
    RedirectError,
    ResponseTooLargeError,
)
from batchbench.drive.wire import (
    Reply,
    ResponseError,
    StreamAssembler,
    http_error_text,
    parse_response,
)
from batchbench.results.failures import ErrorKind

REPO = Path(__file__).resolve().parents[1]
PATH = "/v1/chat/completions"
KEY = "sk-SECRET-hostile-7f3a9c2e41b04d5e8a6f"
KINDS = {str(kind) for kind in ErrorKind}
INT_LIMIT = 2**31 - 1
RANGE = f"out of range (an integer from 0 to {INT_LIMIT} expected)"
TOO_LARGE = "response larger than --max-response-bytes"
# The shared bound on whole bodies being received at once (a multiple of the limit).
TOO_MUCH_IN_FLIGHT = "responses in flight larger than "
MIB = 1 << 20
RSS_TARGET_MB = 400
STREAMED_RSS_TARGET_MB = 600
# batchbench-agent, writing its own peak RSS (VmHWM) where HOSTILE_HWM_FILE says when it
# exits. Not the rusage of wait4: a child started by vfork/exec inherits its parent's peak
# there (pytest's own, over a gigabyte late in a full run).
AGENT = """
import os
from batchbench.cli.agent import console_main
try:
    console_main()
finally:
    if os.environ.get("HOSTILE_HWM_FILE"):
        with open("/proc/self/status") as status, open(os.environ["HOSTILE_HWM_FILE"], "w") as out:
            out.write(next(line for line in status if line.startswith("VmHWM:")).split()[1])
"""


# ---------------------------------------------------------------------------------------
# Running the agent


@dataclass
class Outcome:
    """One finished ``batchbench-agent`` run and everything it wrote."""

    code: int
    out: str
    err: str
    seconds: float
    maxrss_mb: float  # the child's peak RSS (wait4's ru_maxrss)
    killed: str | None  # why the watchdog killed it, if it did
    files: dict[str, Path]
    results: dict = field(default_factory=dict)
    row: dict[str, str] = field(default_factory=dict)
    requests: list[dict] = field(default_factory=list)  # request events, by agent
    agents: list[dict] = field(default_factory=list)  # lifecycle events, by agent

    @property
    def console(self) -> str:
        return self.out + self.err

    @property
    def metrics(self) -> dict:
        return self.results["metrics"]

    @property
    def buckets(self) -> tuple[int, int, int, int]:
        """(succeeded, failed, cancelled, skipped)."""
        m = self.metrics
        return (m["successful_requests"], m["failed_requests"], m["cancelled_requests"],
                m["skipped_requests"])  # fmt: skip

    def event(self, agent: int) -> dict:
        found = [e for e in self.requests if e["agent_id"] == agent]
        assert len(found) == 1, (agent, found)
        return found[0]

    def tail(self) -> str:
        return f"exit {self.code}\n--- stdout\n{self.out[-3000:]}\n--- stderr\n{self.err[-3000:]}"


def write_plans(path: Path, agents: int = 1, streamed: tuple[int, ...] = ()) -> Path:
    """``agents`` one-request trajectories t0, t1, …; those in ``streamed`` ask for a stream
    (schema 2)."""
    lines = []
    for agent in range(agents):
        request: dict[str, Any] = {"prompt_tokens": 24, "output_tokens": 4}
        if agent in streamed:
            request["stream"] = True
        version = 2 if streamed else 1
        lines.append(json.dumps({"schema_version": version, "trajectory_id": f"t{agent}",
                                 "requests": [request]}))  # fmt: skip
    path.write_text("\n".join(lines) + "\n")
    return path


def _rss_mb(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def run_agent(
    tmp_path: Path,
    server: HostileServer,
    plans: Path,
    *extra: str,
    preflight: bool = False,
    env: dict[str, str] | None = None,
    timeout: float = 30.0,
    kill_above_mb: float = 1500.0,
) -> Outcome:
    """Run ``batchbench-agent`` against ``server`` with every output requested; a watchdog
    kills it past ``timeout`` seconds or ``kill_above_mb`` of RSS."""
    out_dir = tmp_path / "out"
    out_dir.mkdir(exist_ok=True)
    files = {
        "json": out_dir / "results.json",
        "csv": out_dir / "results.csv",
        "requests": out_dir / "requests.jsonl",
        "agents": out_dir / "agents.jsonl",
    }
    # defaults a case may set otherwise (a single-value flag is given once)
    defaults = {"--max-retries": "0", "--retry-delay-ms": "0", "--request-timeout-secs": "10"}
    overridable = [item for flag, value in defaults.items() if flag not in extra
                   for item in (flag, value)]  # fmt: skip
    argv = [
        "--host", server.url, "--agent-plans-jsonl", str(plans),
        "--tokenizer-model", "deepseek-v3", "--model", "m", "--no-progress",
        "--no-prompt-correction", "--content-salt", "hostile", "--user-prefix", "hb",
        *overridable,
        "--results-json", str(files["json"]), "--results-csv", str(files["csv"]),
        "--request-events-jsonl", str(files["requests"]),
        "--agent-events-jsonl", str(files["agents"]),
        *([] if preflight else ["--no-preflight"]),
        # the scripted answers are for the run's requests: plain JSON unless a case streams,
        # and no calibration probes
        *([] if "--stream" in extra or "--no-stream" in extra else ["--no-stream"]),
        *([] if "--calibrate" in extra else ["--no-calibrate"]),
        *extra,
    ]  # fmt: skip
    environment = os.environ.copy()
    environment.pop("OPENAI_API_KEY", None)
    environment["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO), environment.get("PYTHONPATH")) if p
    )
    environment.update(env or {})
    hwm = tmp_path / "hwm.txt"
    hwm.unlink(missing_ok=True)
    environment["HOSTILE_HWM_FILE"] = str(hwm)
    stdout, stderr = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    command = [sys.executable, "-c", AGENT]
    started = time.perf_counter()
    with open(stdout, "wb") as out, open(stderr, "wb") as err:
        process = subprocess.Popen([*command, *argv], cwd=tmp_path, env=environment,
                                   stdout=out, stderr=err)  # fmt: skip
    killed: list[str] = []
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.02):
            rss = _rss_mb(process.pid)
            late = time.perf_counter() - started > timeout
            if late or (rss is not None and rss > kill_above_mb):
                killed.append(f"timed out after {timeout}s" if late else f"RSS {rss:.0f} MB")
                process.kill()
                return

    watchdog = threading.Thread(target=watch, daemon=True)
    watchdog.start()
    _, status, usage_ = os.wait4(process.pid, 0)
    done.set()
    watchdog.join()
    process.returncode = os.waitstatus_to_exitcode(status)
    outcome = Outcome(
        code=process.returncode,
        out=stdout.read_text(errors="replace"),
        err=stderr.read_text(errors="replace"),
        seconds=time.perf_counter() - started,
        maxrss_mb=int(hwm.read_text()) / 1024 if hwm.exists() else usage_.ru_maxrss / 1024,
        killed=killed[0] if killed else None,
        files=files,
    )
    assert outcome.killed is None, f"the agent was killed: {outcome.killed}\n{outcome.tail()}"
    if files["json"].exists():
        outcome.results = json.loads(files["json"].read_text())
    if files["csv"].exists():
        rows = list(csv.reader(files["csv"].read_text().splitlines()))
        if len(rows) == 2:
            outcome.row = dict(zip(rows[0], rows[1], strict=True))
    for name in ("requests", "agents"):
        if files[name].exists():
            data = files[name].read_bytes()
            assert data == b"" or data.endswith(b"\n"), f"{name}: a torn last line"
            records = [orjson.loads(line) for line in data.splitlines()]
            records.sort(key=lambda r: (r["agent_id"], r.get("invocation", 0)))
            setattr(outcome, name, records)
    return outcome


def assert_buckets(o: Outcome, expected: tuple[int, int, int, int]) -> None:
    """(succeeded, failed, cancelled, skipped)."""
    assert o.buckets == expected, f"buckets {o.buckets}, expected {expected}\n{o.tail()}"


def _numbers(pattern: str, text: str) -> list[float]:
    return [float(n) for n in re.findall(pattern, text)]


def assert_contained(o: Outcome, planned: int) -> None:
    """The run ended as a run: exit 0 or 3 (3 exactly when a request failed), no
    traceback, every output written, every planned request in one bucket, every failed
    attempt of a known kind, no negative total and no percentage above 100."""
    assert o.code in (0, 3), o.tail()
    assert "Traceback" not in o.err and "Task exception was never retrieved" not in o.err, o.tail()
    for name, path in o.files.items():
        assert path.exists(), f"{name} output missing\n{o.tail()}"
    assert o.results and o.row, o.tail()
    succeeded, failed, cancelled, skipped = o.buckets
    assert succeeded + failed + cancelled + skipped == planned
    assert o.metrics["planned_tool_invocations"] == planned
    assert o.code == (3 if failed else 0), o.tail()
    assert o.metrics["verdict"] == ("failed" if failed else "ok")
    assert (o.row["successful_requests"], o.row["failed_requests"]) == (str(succeeded), str(failed))
    line = (f"Requests by outcome: {planned} planned = {succeeded} succeeded + {failed} failed"
            f" + {cancelled} cancelled + {skipped} skipped;")  # fmt: skip
    assert line in o.out, o.tail()
    assert len(o.requests) == succeeded + failed + cancelled
    assert len(o.agents) == len({e["agent_id"] for e in o.requests})
    for record in o.requests:
        if record["status"] == "ok":
            assert record["error_kind"] is None
            for name in ("prompt_tokens", "completion_tokens", "cached_tokens"):
                value = record[name]
                assert value is None or 0 <= value <= INT_LIMIT, record
        else:
            assert record["error_kind"] in KINDS, record
        for error in record["errors"]:
            assert error["kind"] in KINDS and error["message"], record
    # No negative total, no percentage above 100 (console, JSON, CSV).
    for total in _numbers(r"Total (?:input|output) tokens (?:sent|generated): (-?\d+)", o.out):
        assert total >= 0, o.tail()
    for percent in _numbers(r"(-?\d+(?:\.\d+)?) ?%", o.out):
        assert 0 <= percent <= 100, o.tail()
    for source in (o.metrics, o.row):
        for name, value in source.items():
            if value in (None, "") or not ("percent" in name or name.startswith("total_")):
                continue
            if "percent" in name:
                assert 0 <= float(value) <= 100, (name, value)
            elif name.endswith("_tokens"):
                assert float(value) >= 0, (name, value)


# ---------------------------------------------------------------------------------------
# Scripted cases: one trajectory of one request each, run together (one agent per case)
#
# A case's script is ``(server, agent) -> route`` (a route maps a request to an action).
# The cases of a group run as the agents of one run (a subprocess costs a second or two):
# each case asserts its own request's outcome, and the group's run asserts containment,
# the buckets and the exit status. Redirect targets carry ``/a<agent>/`` in their path, so
# a followed hop finds its case whatever headers it kept.


def redirect(status: str, location: str) -> bytes:
    return head(status, f"Location: {location}", "Content-Length: 0")


def url_error(location: str) -> str:
    """Python's ValueError text for a Location that is not a valid URL."""
    try:
        urlsplit(location).port  # noqa: B018 (the port is checked when read)
    except ValueError as exc:
        return str(exc)
    raise AssertionError(f"{location} is a valid URL")


def const(action):
    return lambda server, agent: lambda request: action


def bad_location(location: str):
    return const(reply(redirect("302 Found", location)))


def invalid_location(location: str) -> str:
    return (f"invalid redirect (302 Found): Location '{location}' is not a valid URL: "
            + url_error(location))  # fmt: skip


def redirect_loop(server: HostileServer, agent: int):
    def route(request: Request):
        if request.path == PATH:  # A → B (absolute), B → A (relative)
            return reply(redirect("307 Temporary Redirect", server.at(f"/a{agent}/b")))
        return reply(redirect("307 Temporary Redirect", PATH))

    return route


def endless_redirects(server: HostileServer, agent: int):
    def route(request: Request):
        step = 0 if request.path == PATH else int(request.path.rsplit("/", 1)[1])
        return reply(redirect("308 Permanent Redirect", f"/a{agent}/hop/{step + 1}"))

    return route


def redirects_then_answer(hops: int):
    """PATH → /a<agent>/hop/1 → … → /hop/<hops>, which answers: ``hops`` redirects."""

    def script(server: HostileServer, agent: int):
        def route(request: Request):
            step = 0 if request.path == PATH else int(request.path.rsplit("/", 1)[1])
            if step == hops:
                return reply(ok_json(completion()))
            return reply(redirect("307 Temporary Redirect", f"/a{agent}/hop/{step + 1}"))

        return route

    return script


def redirect_then(status: str):
    def script(server: HostileServer, agent: int):
        def route(request: Request):
            if request.path == PATH:
                return reply(redirect(status, f"/a{agent}/target"))
            return reply(ok_json(completion()))

        return route

    return script


def trickle(first: bytes, rest: bytes, gap: float):
    """``first`` at once, then ``rest`` a byte every ``gap`` seconds."""

    async def act(peer: Peer, request: Request) -> bool:
        await peer.write(first)
        for index in range(len(rest)):
            await asyncio.sleep(gap)
            await peer.write(rest[index : index + 1])
        return True

    return act


def first_then(first, then):
    """The agent's first request gets ``first``, every later one ``then``."""
    return lambda server, agent: lambda request: first if request.attempt == 1 else then


def delayed(data: bytes, seconds: float):
    async def act(peer: Peer, request: Request) -> bool:
        await asyncio.sleep(seconds)
        await peer.write(data)
        return True

    return act


def usage_reply(counts: dict, streamed: bool = False):
    if streamed:
        return const(reply(sse_stream(event(delta("ok")), event(usage_chunk(counts)), DONE)))
    return const(reply(ok_json(completion(counts=counts))))


def closed_port() -> int:
    """A port on 127.0.0.1 nobody listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


CLOSED_PORT = closed_port()
BODY = dumps(completion())
COMPLETION = ok_json(completion())
SSE_HEAD = head("200 OK", CHUNKED, EVENT_STREAM)
HTML = b"<html><body>502 Bad Gateway</body></html>"
TIMED_OUT = "request timed out after 0.5s"
OPEN = "any"  # a failure whose kind the contract leaves open
GROUP_ARGS = {
    "stalls": ("--request-timeout-secs", "0.5"),
    "main": (),
    "retries": ("--max-retries", "2", "--request-timeout-secs", "0.5"),
}


@dataclass
class Case:
    script: Callable[[HostileServer, int], Callable[[Request], Any]]
    kind: str | None  # None: the request succeeds; OPEN: it fails, kind not fixed
    message: Callable[[HostileServer, int], str] | str | None = None  # the exact message
    prefix: str = ""  # or how the message starts
    stream: bool = False
    latency: tuple[float, float] | None = None  # bounds of the request's latency, seconds
    group: str = "main"
    contains: str = ""  # a part of the message
    retried: tuple[str, ...] = ()  # a success: the kinds of the failed attempts before it


def stalled(before: bytes = b"", stream: bool = False) -> Case:
    return Case(const(stall(before)), "timeout", TIMED_OUT, stream=stream,
                latency=(0.45, 1.2), group="stalls")  # fmt: skip


CASES: dict[str, Case] = {
    # -- stalls at each phase, with a fractional --request-timeout-secs 0.5 ---------------
    "stall before the status line": stalled(),
    "stall inside the status line": stalled(b"HTTP/1.1 20"),
    "stall inside the headers": stalled(b"HTTP/1.1 200 OK\r\nContent-Length: 90\r\nContent-Ty"),
    "stall inside the body": stalled(head("200 OK", "Content-Length: 100") + b'{"id":"x",'),
    "stall after a chunk size": stalled(head("200 OK", CHUNKED) + b"40\r\n"),
    "stall inside a stream": stalled(SSE_HEAD + chunk(event(delta("he"))), stream=True),
    "stall after 100 Continue": stalled(head("100 Continue")),
    "a byte every 50 ms, never done": Case(
        const(trickle(head("200 OK", "Content-Length: 1000"), b" " * 1000, 0.05)),
        "timeout",
        TIMED_OUT,
        latency=(0.45, 1.2),
        group="stalls",
    ),
    "stall after a redirect": Case(
        lambda server, agent: (
            lambda request: (
                reply(redirect("307 Temporary Redirect", f"/a{agent}/stuck"))
                if request.path == PATH
                else stall()
            )
        ),
        "timeout",
        TIMED_OUT,
        latency=(0.45, 1.2),
        group="stalls",
    ),
    "slow but within a fractional timeout": Case(
        const(delayed(COMPLETION, 0.15)), None, latency=(0.1, 0.5), group="stalls"
    ),
    # -- framing --------------------------------------------------------------------------
    "chunk size not hexadecimal": Case(
        const(reply(head("200 OK", CHUNKED) + b"zz\r\nhello\r\n" + LAST_CHUNK)), "disconnect"
    ),
    "chunk longer than its size": Case(
        const(reply(head("200 OK", CHUNKED) + b"3\r\nhello world\r\n" + LAST_CHUNK)), "disconnect"
    ),
    "chunk size overflows": Case(
        const(reply(head("200 OK", CHUNKED) + b"fffffffffffffffffffff\r\nx\r\n")), "disconnect"
    ),
    "body shorter than its Content-Length": Case(
        const(reply(head("200 OK", "Content-Length: 500") + COMPLETION[-60:], close=True)),
        "disconnect",
    ),
    "body longer than its Content-Length": Case(
        const(reply(head("200 OK", "Content-Length: 20") + BODY)), "malformed_json"
    ),
    "two different Content-Lengths": Case(
        const(reply(head("200 OK", "Content-Length: 5", "Content-Length: 6") + b"{}{}{}")),
        "disconnect",
    ),
    "negative Content-Length": Case(
        const(reply(head("200 OK", "Content-Length: -1") + b"{}", close=True)), "disconnect"
    ),
    "not HTTP at all": Case(const(reply(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")), "disconnect"),
    "closed without a byte": Case(const(reply(close=True)), "disconnect"),
    "gzip that is not gzip": Case(
        const(reply(ok(b"definitely not gzip data", "Content-Encoding: gzip"))), "disconnect"
    ),
    "a valid body, then garbage": Case(const(reply(COMPLETION + b"\x00\xffGARBAGE" * 10)), None),
    # -- accepted edge cases --------------------------------------------------------------
    "identical duplicate Content-Length": Case(
        const(
            reply(
                head(
                    "200 OK",
                    f"Content-Length: {len(BODY)}",
                    f"Content-Length: {len(BODY)}",
                    "Content-Type: application/json",
                )
                + BODY
            )
        ),
        None,
    ),
    "identical duplicate Content-Length, head in pieces": Case(
        const(
            split(
                head(
                    "200 OK",
                    f"Content-Length: {len(BODY)}",
                    f"Content-Length: {len(BODY)}",
                    "Content-Type: application/json",
                )
                + BODY,
                [40, 60, 80],
                close=False,
            )
        ),
        None,
    ),
    "bare-CR SSE lines": Case(
        const(reply(sse_stream(*good_stream(ending=b"\r")))), None, stream=True
    ),
    "CRLF SSE lines": Case(
        const(reply(sse_stream(*good_stream(ending=b"\r\n")))), None, stream=True
    ),
    "SSE in one-byte chunks": Case(
        const(
            reply(
                SSE_HEAD,
                *(chunk(bytes([b])) for b in b"".join(good_stream())),
                LAST_CHUNK,
                gap=0.0005,
            )
        ),
        None,
        stream=True,
    ),
    # -- redirects ------------------------------------------------------------------------
    "Location with a broken IPv6 host": Case(
        bad_location("http://[::1"), "invalid_redirect", prefix=invalid_location("http://[::1")
    ),
    "Location with port 99999": Case(
        bad_location("http://127.0.0.1:99999/v1"),
        "invalid_redirect",
        prefix=invalid_location("http://127.0.0.1:99999/v1"),
    ),
    "Location with port abc": Case(
        bad_location("http://127.0.0.1:abc/v1"),
        "invalid_redirect",
        prefix=invalid_location("http://127.0.0.1:abc/v1"),
    ),
    "redirect loop": Case(
        redirect_loop,
        "invalid_redirect",
        lambda s, a: (
            f"redirect loop after 2 hops: {s.at(PATH)} → {s.at(f'/a{a}/b')} → {s.at(PATH)}"
        ),
    ),
    "endless redirects": Case(endless_redirects, "invalid_redirect", prefix="too many redirects"),
    "redirect to ftp": Case(
        bad_location("ftp://host/x"),
        "invalid_redirect",
        prefix="redirect to ftp://host/x not followed: only http:// and https:// are",
    ),
    "307 followed": Case(redirect_then("307 Temporary Redirect"), None),
    "303 followed": Case(redirect_then("303 See Other"), None),
    # -- usage ----------------------------------------------------------------------------
    "prompt_tokens 2^63": Case(
        usage_reply(usage(2**63, 4)),
        "malformed_usage",
        f"usage.prompt_tokens 9223372036854775808 {RANGE}",
    ),
    "both counts 2^62": Case(
        usage_reply(usage(2**62, 2**62)),
        "malformed_usage",
        f"usage.prompt_tokens 4611686018427387904 {RANGE}",
    ),
    "prompt_tokens -20": Case(
        usage_reply(usage(-20, 4)), "malformed_usage", f"usage.prompt_tokens -20 {RANGE}"
    ),
    "completion_tokens 2^31": Case(
        usage_reply(usage(24, 2**31)),
        "malformed_usage",
        f"usage.completion_tokens 2147483648 {RANGE}",
    ),
    "completion_tokens -1": Case(
        usage_reply(usage(24, -1)), "malformed_usage", f"usage.completion_tokens -1 {RANGE}"
    ),
    "prompt_tokens 2^31 - 1": Case(usage_reply(usage(INT_LIMIT, 4)), None),
    "cached_tokens above prompt_tokens": Case(
        usage_reply(usage(100, 4, cached=500)),
        "malformed_usage",
        "usage.prompt_tokens_details.cached_tokens 500 exceeds usage.prompt_tokens 100",
    ),
    "cached_tokens -100000": Case(
        usage_reply(usage(100, 4, cached=-100000)),
        "malformed_usage",
        f"usage.prompt_tokens_details.cached_tokens -100000 {RANGE}",
    ),
    "cached_tokens 10^12": Case(
        usage_reply(usage(100, 4, cached=10**12)),
        "malformed_usage",
        f"usage.prompt_tokens_details.cached_tokens 1000000000000 {RANGE}",
    ),
    "cached_tokens equal to prompt_tokens": Case(usage_reply(usage(100, 4, cached=100)), None),
    "streamed prompt_tokens 2^63": Case(
        usage_reply(usage(2**63, 4), streamed=True),
        "malformed_usage",
        f"usage.prompt_tokens 9223372036854775808 {RANGE}",
        stream=True,
    ),
    "streamed cached_tokens above prompt_tokens": Case(
        usage_reply(usage(100, 4, cached=101), streamed=True),
        "malformed_usage",
        "usage.prompt_tokens_details.cached_tokens 101 exceeds usage.prompt_tokens 100",
        stream=True,
    ),
    "prompt_tokens a float": Case(
        usage_reply(usage(24.5, 4)), "malformed_usage", prefix="usage.prompt_tokens "
    ),
    # -- server errors --------------------------------------------------------------------
    "SSE error event, then usage": Case(
        const(
            reply(
                sse_stream(
                    event(delta("partial")),
                    event({"error": {"message": "model overloaded", "code": 503}}, name="error"),
                    event(usage_chunk()),
                    DONE,
                )
            )
        ),
        "server_error",
        "server error in streamed response: model overloaded",
        stream=True,
    ),
    "SSE error chunk": Case(
        const(reply(sse_stream(event({"error": {"message": "boom"}}), DONE))),
        "server_error",
        "server error in streamed response: boom",
        stream=True,
    ),
    "200 body with an error": Case(
        const(reply(ok_json({"error": {"message": "boom", "type": "internal"}}))),
        "server_error",
        "server error in response: boom",
    ),
    "text/html to a streamed request": Case(
        const(reply(ok(HTML, "Content-Type: text/html"))),
        OPEN,
        stream=True,
        prefix="streamed request answered with text/html, not an event stream: ",
        contains="502 Bad Gateway",
    ),
    "error: null beside a completion": Case(const(reply(ok_json(completion(error=None)))), None),
    "error: null in stream chunks": Case(
        const(
            reply(
                sse_stream(
                    event({**delta("ok"), "error": None}),
                    event({**usage_chunk(), "error": None}),
                    DONE,
                )
            )
        ),
        None,
        stream=True,
    ),
    "event stream with a charset": Case(
        const(
            reply(
                chunked(*good_stream(), headers=("Content-Type: text/event-stream; charset=utf-8",))
            )
        ),
        None,
        stream=True,
    ),
    "stream without a Content-Type": Case(const(reply(chunked(*good_stream()))), None, stream=True),
    "SSE error event with text data": Case(
        const(reply(sse_stream(b"event: error\ndata: upstream timeout\n\n", DONE))),
        "server_error",
        stream=True,
        contains="upstream timeout",
    ),
    "ten redirects, then an answer": Case(redirects_then_answer(10), None),
    "redirect to a closed port": Case(
        bad_location(f"http://127.0.0.1:{CLOSED_PORT}/v1/chat/completions"), "connect"
    ),
    # -- more hostility -------------------------------------------------------------------
    "400 with an invalid UTF-8 body": Case(
        const(reply(ok(b"\xff\xfe\x00 bad \xc3", status="400 Bad Request"))),
        "http_status",
        prefix="request failed (400 Bad Request) ",
    ),
    "JSON nested 100000 deep": Case(
        const(reply(ok(b"[" * 100000 + b"]" * 100000, "Content-Type: application/json"))),
        "malformed_json",
    ),
    "stream chunk with invalid UTF-8": Case(
        const(
            reply(
                sse_stream(
                    b'data: {"choices":[{"delta":{"content":"\xff\xfe"}}]}\n\n',
                    event(usage_chunk()),
                    DONE,
                )
            )
        ),
        "malformed_json",
        stream=True,
    ),
    "204 to a chat request": Case(const(reply(head("204 No Content"))), "malformed_json"),
    "101 Switching Protocols": Case(
        const(reply(head("101 Switching Protocols", "Upgrade: websocket", "Connection: Upgrade"))),
        "disconnect",
    ),
    "HTTP/1.0, body until close": Case(
        const(reply(head("200 OK", version="HTTP/1.0") + BODY, close=True)), None
    ),
    # -- retried by the usual rules (--max-retries 2), then answered ------------------------
    "a reset, then an answer": Case(
        first_then(reset_after(COMPLETION, 0), reply(COMPLETION)),
        None,
        group="retries",
        retried=("disconnect",),
    ),
    "an SSE error event, then a stream": Case(
        first_then(
            reply(sse_stream(event({"error": {"message": "busy"}}, name="error"), DONE)),
            reply(sse_stream(*good_stream())),
        ),
        None,
        stream=True,
        group="retries",
        retried=("server_error",),
    ),
    "usage 2^63 twice, then good usage": Case(
        lambda server, agent: (
            lambda request: reply(
                ok_json(completion(counts=usage(2**63, 4))) if request.attempt < 3 else COMPLETION
            )
        ),
        None,
        group="retries",
        retried=("malformed_usage", "malformed_usage"),
    ),
    "a stall, then an answer": Case(
        first_then(stall(head("200 OK", "Content-Length: 100")), reply(COMPLETION)),
        None,
        group="retries",
        retried=("timeout",),
    ),
}
GROUPS = {case.group: None for case in CASES.values()}


def group_cases(group: str) -> list[tuple[str, Case]]:
    return [(name, case) for name, case in CASES.items() if case.group == group]


@dataclass
class GroupRun:
    outcome: Outcome
    server: HostileServer
    cases: list[tuple[str, Case]]

    def agent(self, name: str) -> int:
        return [n for n, _ in self.cases].index(name)


@pytest.fixture(scope="module")
def group_run(tmp_path_factory):
    """The run of a group of cases (made once, when a test first needs it)."""
    runs: dict[str, GroupRun] = {}

    def get(group: str) -> GroupRun:
        if group not in runs:
            cases = group_cases(group)
            tmp = tmp_path_factory.mktemp(group.replace(" ", "-"))
            streamed = tuple(i for i, (_, case) in enumerate(cases) if case.stream)
            with HostileServer([stall()]) as server:
                routes = [case.script(server, agent) for agent, (_, case) in enumerate(cases)]

                def route(request: Request):
                    agent = request.agent
                    if agent is None and (found := re.match(r"/a(\d+)/", request.path)):
                        agent = int(found[1])
                    return None if agent is None else routes[agent](request)

                server.script = route
                plans = write_plans(tmp / "plans.jsonl", len(cases), streamed)
                outcome = run_agent(tmp, server, plans, *GROUP_ARGS[group])
            runs[group] = GroupRun(outcome, server, cases)
        return runs[group]

    return get


@pytest.mark.native_pass_only
@pytest.mark.parametrize("name", list(CASES))
def test_scripted_case(group_run, name):
    """One case, one agent of its group's run: a success (after the failed attempts the
    case names), or a failure of the case's kind with its exact message (or its start),
    the same in the request event, the lifecycle event and the results JSON."""
    case = CASES[name]
    run = group_run(case.group)
    o, agent = run.outcome, run.agent(name)
    assert o.code in (0, 3) and o.requests, o.tail()
    record = o.event(agent)
    lifecycle = [r for r in o.agents if r["agent_id"] == agent]
    assert len(lifecycle) == 1
    if case.kind is None:
        assert record["status"] == "ok", record
        assert [e["kind"] for e in record["errors"]] == list(case.retried), record
        assert record["attempts"] == len(case.retried) + 1, record
        assert lifecycle[0]["completed"] is True and lifecycle[0]["error"] is None
        if case.stream:
            assert record["ttft_seconds"] is not None and record["completion_tokens"] == 4
        if name == "prompt_tokens 2^31 - 1":
            assert record["prompt_tokens"] == INT_LIMIT
    else:
        assert record["status"] == "failed", record
        text = record["error"]
        if case.kind != OPEN:
            assert record["error_kind"] == case.kind, record
            assert [e["kind"] for e in record["errors"]] == [case.kind]
        message = case.message(run.server, agent) if callable(case.message) else case.message
        if message is not None:
            assert text == message
        assert text.startswith(case.prefix), (text, case.prefix)
        assert case.contains in text, (text, case.contains)
        assert lifecycle[0]["error"] == text and lifecycle[0]["completed"] is False
        failures = [f for f in o.results["failures"] if f["agent_id"] == agent]
        assert [f["error"] for f in failures] == [text]
    if case.latency is not None:
        low, high = case.latency
        assert low <= record["latency_seconds"] <= high, record
    if name == "endless redirects":  # a bounded chase, not an endless one
        hops = [r for r in run.server.requests if f"/a{agent}/hop/" in r.path]
        assert 9 <= len(hops) <= 11, len(hops)


@pytest.mark.native_pass_only
@pytest.mark.parametrize("group", list(GROUPS))
def test_a_group_of_cases_is_one_contained_run(group_run, group):
    """Whatever each agent met, the run finished: every output written, every request in
    its bucket, failed attempts tallied by kind (JSON, console), the totals the sum of the
    successes, exit status 3 when a request failed (else 0)."""
    run = group_run(group)
    o, cases = run.outcome, run.cases
    planned = len(cases)
    assert_contained(o, planned)
    succeeded = sum(1 for _, case in cases if case.kind is None)
    assert_buckets(o, (succeeded, planned - succeeded, 0, 0))
    assert o.code == (3 if planned > succeeded else 0)
    tally: dict[str, int] = {}
    for record in o.requests:
        for error in record["errors"]:
            tally[error["kind"]] = tally.get(error["kind"], 0) + 1
    assert {k: v["count"] for k, v in o.metrics["errors_by_kind"].items()} == tally
    for kind, count in tally.items():  # the console's table of failed attempts by kind
        assert re.search(rf"^  {kind}(?: \([^)]*\))? +{count}  ", o.out, re.M), (kind, o.tail())
    served = sum(r["prompt_tokens"] for r in o.requests if r["status"] == "ok")
    assert o.metrics["total_input_tokens"] == served
    assert f"Total input tokens sent: {served}" in o.out
    shown = [line for line in o.out.splitlines() if line.startswith("Failure: agent ")]
    assert len(shown) == min(10, planned - succeeded)
    for line in shown:
        agent = int(line.split()[2])
        assert line.endswith(f"invocation 1: {o.event(agent)['error']}"), line


# ---------------------------------------------------------------------------------------
# Resets and closes at random offsets, several agents at once


@pytest.mark.native_pass_only
def test_resets_and_closes_at_random_offsets(tmp_path):
    """Sixteen agents, each answered by a complete response cut short at a random offset
    (seeded; the first two at offset 0): half with a TCP reset, half with a close (FIN),
    half of each streamed. Every one is a disconnect, nothing else."""
    rng = random.Random(22)
    agents = 16
    streamed = tuple(agent for agent in range(agents) if agent % 4 >= 2)
    stream = sse_stream(*good_stream("a longer reply"))
    cuts = {}
    for agent in range(agents):
        data = stream if agent in streamed else COMPLETION
        offset = 0 if agent < 2 else rng.randrange(1, len(data) - 1)
        cuts[agent] = (data, offset)

    def route(request: Request):
        data, offset = cuts[request.agent]
        return (reset_after if request.agent % 2 == 0 else close_after)(data, offset)

    with HostileServer(route) as server:
        plans = write_plans(tmp_path / "plans.jsonl", agents, streamed)
        o = run_agent(tmp_path, server, plans, "--max-active-agents", str(agents))
    assert_contained(o, agents)
    assert_buckets(o, (0, agents, 0, 0))
    for agent in range(agents):
        record = o.event(agent)
        assert record["error_kind"] == "disconnect", (agent, cuts[agent][1], record)
    assert {kind: v["count"] for kind, v in o.metrics["errors_by_kind"].items()} == {
        "disconnect": agents
    }


# ---------------------------------------------------------------------------------------
# The key never leaks


def echo_key(request: Request, secret: str) -> bytes:
    """The key as an echoing gateway shows it."""
    return f"Incorrect API key provided: {request.headers.get('authorization', '')} ({secret})".encode()


def leaking(secret: str):
    """Agent i gets the i-th way of echoing the key back."""

    def route(request: Request):
        said = echo_key(request, secret)
        error = dumps({"error": {"message": said.decode()}})
        ways = [
            lambda: reply(ok(error, "Content-Type: application/json", status="401 Unauthorized")),
            lambda: reply(ok(error, status="500 Internal Server Error")),
            lambda: reply(ok_json({"error": {"message": said.decode()}})),
            lambda: reply(sse_stream(event({"error": {"message": said.decode()}}, name="error"))),
            lambda: reply(redirect("302 Found", f"http://[::1/{secret}")),
            lambda: reply(ok(b"<html>" + said + b"</html>", "Content-Type: text/html")),
            lambda: reply(redirect("307 Temporary Redirect", f"ftp://{secret}@host/{secret}")),
            lambda: reply(ok(error, status="403 Forbidden")),
            # followed to a path holding the key, where the hop fails: error texts that
            # name the URL (aiohttp's, the redirect loop's) must not carry it
            lambda: reply(redirect("307 Temporary Redirect", f"/{secret}/br")),
            lambda: reply(redirect("307 Temporary Redirect", f"/{secret}/loop")),
        ]
        if request.path.endswith("/br"):
            return reply(ok(b"\x00not brotli", "Content-Encoding: br"))
        if request.path.endswith("/loop"):
            return reply(redirect("307 Temporary Redirect", request.path))
        return ways[request.agent]()

    return route


@pytest.mark.native_pass_only
@pytest.mark.parametrize("source", ["--api-key", "OPENAI_API_KEY", "--verbose", "--workers 2"])
def test_the_key_is_in_no_output(tmp_path, source):
    """Ten ways of echoing the key (error bodies of 401/403/500, a 200 error, an SSE error
    event, an HTML page, Locations holding it, URLs of followed hops holding it): it is in
    no output (console, results JSON and CSV, events, the options file), with the key
    given by flag or environment, with --verbose, and merged from two workers."""
    streamed = (3, 5)
    with HostileServer(leaking(KEY)) as server:
        plans = write_plans(tmp_path / "plans.jsonl", 10, streamed)
        args = ["--max-retries", "1"]
        env = None
        if source == "OPENAI_API_KEY":
            env = {"OPENAI_API_KEY": KEY}
        else:
            args += ["--api-key", KEY]
        if source in ("--verbose", "--workers 2"):
            args += source.split()  # the workers' outputs, merged
        o = run_agent(tmp_path, server, plans, *args, env=env)
    assert_contained(o, 10)
    assert_buckets(o, (0, 10, 0, 0))
    # The server did get the key (so it could echo it).
    assert all(r.headers.get("authorization") == f"Bearer {KEY}" for r in server.requests[:1])
    texts = {"stdout": o.out, "stderr": o.err}
    for path in sorted((tmp_path / "out").iterdir()):
        texts[path.name] = path.read_text(errors="replace")
    assert {"results.json", "results.csv", "requests.jsonl", "agents.jsonl"} <= set(texts)
    for name, text in texts.items():
        assert KEY not in text, f"the key leaked into {name}"
        assert KEY[8:] not in text, f"a part of the key leaked into {name}"
    # The messages kept their sense: the key's place is marked.
    for agent in (0, 2, 3, 4, 6, 8, 9):
        assert "***" in o.event(agent)["error"], o.event(agent)
    assert o.event(0)["error_kind"] == "http_status" and o.event(2)["error_kind"] == "server_error"
    assert o.event(4)["error_kind"] == "invalid_redirect"


@pytest.mark.native_pass_only
def test_the_key_is_not_in_the_preflight_error(tmp_path):
    """The check before the run gets a 401 that echoes the key: one ``Error:`` line
    (exit 1) that names the 401 and shows ``***`` where the key was."""

    def route(request: Request):
        said = echo_key(request, KEY).decode()
        return reply(ok_json({"error": {"message": said}}, status="401 Unauthorized"))

    with HostileServer(route) as server:
        plans = write_plans(tmp_path / "plans.jsonl")
        o = run_agent(tmp_path, server, plans, "--api-key", KEY, preflight=True)
    assert o.code == 1, o.tail()
    errors = [line for line in o.err.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "401" in errors[0] and "***" in errors[0], o.tail()
    assert KEY not in o.out + o.err
    assert "Traceback" not in o.err


# ---------------------------------------------------------------------------------------
# Bounded memory


@pytest.fixture(scope="module")
def warm(tmp_path_factory):
    """A dry run first: the synthesis table the runs share is built (and cached) here, so
    the RSS figures below measure responses, not the table's one-time build."""
    tmp = tmp_path_factory.mktemp("warm")
    plans = write_plans(tmp / "plans.jsonl")
    environment = os.environ.copy()
    environment["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO), environment.get("PYTHONPATH")) if p
    )
    command = [sys.executable, "-c", AGENT,
               "--agent-plans-jsonl", str(plans), "--tokenizer-model", "deepseek-v3",
               "--content-salt", "hostile", "--dry-run"]  # fmt: skip
    subprocess.run(command, cwd=tmp, env=environment, capture_output=True, timeout=60, check=True)


SSE_LINE = chunk(b'data: {"choices":[{"index":0,"delta":{"content":"')


def target_mix(requests: str) -> dict:
    """The issue's mix for 8 agents: (name, action) by agent (built when needed: a bomb
    takes a moment to make)."""
    return {
        "whole": {
            0: ("1 GiB Content-Length", huge_content_length()),
            1: ("gzip bomb, Content-Length", bomb("gzip", "length")),
            2: ("endless chunked body", endless_chunked()),
            3: ("1 GiB Content-Length", huge_content_length()),
            4: ("gzip bomb, chunked", bomb("gzip", "chunked")),
            5: ("endless chunked body", endless_chunked()),
            6: ("1 GiB Content-Length", huge_content_length()),
            7: ("deflate bomb, chunked", bomb("deflate", "chunked")),
        },
        "streamed": {
            0: ("1 GiB Content-Length", huge_content_length()),
            1: ("gzip bomb, Content-Length", bomb("gzip", "length")),
            2: ("endless SSE line", endless(SSE_HEAD + SSE_LINE, chunk(b"x" * 65536))),
            3: ("endless chunked body", endless_chunked()),
            4: ("gzip bomb, chunked", bomb("gzip", "chunked")),
            5: ("endless SSE line", endless(SSE_HEAD + SSE_LINE, chunk(b"x" * 65536))),
            6: ("1 GiB Content-Length", huge_content_length()),
            7: ("deflate bomb, chunked", bomb("deflate", "chunked")),
        },
    }[requests]


@pytest.mark.native_pass_only
@pytest.mark.parametrize("requests", ["whole", "streamed"])
def test_memory_stays_bounded_against_huge_bodies_and_bombs(tmp_path, warm, requests):
    """The issue's target: 8 active agents against a server sending 1 GiB bodies, gzip (and
    deflate) bombs and endless chunked bodies, at the default --max-response-bytes (64 MiB):
    every attempt fails as response_too_large, the client's peak RSS stays below 400 MB,
    and the run ends with exit status 3. Whole bodies, and the same to streamed requests
    (where an endless body is one endless SSE line). Endless *valid* SSE events are
    bounded per response, not by the shared budget (the text a live stream holds is
    the reply itself): see the test at an 8 MiB limit below."""
    behaviours = target_mix(requests)
    streamed = tuple(range(8)) if requests == "streamed" else ()
    with HostileServer(lambda r: behaviours[r.agent][1]) as server:
        plans = write_plans(tmp_path / "plans.jsonl", 8, streamed)
        o = run_agent(tmp_path, server, plans, "--max-active-agents", "8", "--max-retries", "1",
                      "--request-timeout-secs", "60", timeout=60, kill_above_mb=2000)  # fmt: skip
        sent = [(r.agent, r.sent) for r in server.requests]
    assert_contained(o, 8)
    assert_buckets(o, (0, 8, 0, 0))
    for agent, (name, _) in behaviours.items():
        record = o.event(agent)
        assert {e["kind"] for e in record["errors"]} == {"response_too_large"}, (name, record)
        for error in record["errors"]:
            assert error["message"].startswith((TOO_LARGE, TOO_MUCH_IN_FLIGHT)), record
    # A Content-Length above the limit fails at once: the body is not read.
    huge = [agent for agent, (name, _) in behaviours.items() if name.startswith("1 GiB")]
    assert all(size < 32 * MIB for agent, size in sent if agent in huge), sent
    options = (tmp_path / "out" / "results.config.toml").read_text()
    assert "\nmax-response-bytes = 67108864\n" in options  # the default: 64 MiB
    assert o.seconds < 45, o.seconds
    # Whole bodies: the target (measured 210-310 MB). Streams peak higher (measured
    # 420-490 MB: the transport's reads and the scanner's pieces of unended lines, freed
    # and taken again across retries): a looser bound, still far under the 8 x 64 MiB
    # that per-response limits alone would allow (over 1 GB before the shared budget).
    bound = RSS_TARGET_MB if requests == "whole" else STREAMED_RSS_TARGET_MB
    assert o.maxrss_mb < bound, f"peak RSS {o.maxrss_mb:.0f} MB"


@pytest.mark.native_pass_only
def test_memory_per_response_is_bounded_by_the_limit(tmp_path, warm):
    """Everything else that can grow without end, at --max-response-bytes 8 MiB: one
    endless SSE line, endless SSE events, a body that ends only with the connection, an
    error status with an endless body, a gzip bomb to a streamed request, endless header
    lines, one endless header value, endless interim (100) responses. Each attempt fails
    (as response_too_large where a size is what grows) and 8 such responses at once cost
    less than 320 MB of peak RSS (the client itself takes about 130 MB here)."""
    line = endless(
        SSE_HEAD + chunk(b'data: {"choices":[{"delta":{"content":"'), chunk(b"x" * 65536)
    )
    gzip_stream = bomb("gzip", "chunked")
    behaviours = {
        0: ("endless SSE line", line, "response_too_large"),
        1: ("endless SSE events", endless(SSE_HEAD, chunk(event(delta("y" * 4000)) * 16)),
            "response_too_large"),
        2: ("endless body until close", endless(head("200 OK"), b"z" * 65536),
            "response_too_large"),
        3: ("500 with an endless body",
            endless(head("500 Internal Server Error", CHUNKED), chunk(b"e" * 65536)),
            "response_too_large"),
        4: ("gzip bomb to a stream", gzip_stream, "response_too_large"),
        5: ("endless header lines",
            endless(b"HTTP/1.1 200 OK\r\n", b"X-Filler: " + b"f" * 1000 + b"\r\n"),
            "response_too_large"),
        6: ("one endless header value", endless(b"HTTP/1.1 200 OK\r\nX-Long: ", b"v" * 65536),
            "response_too_large"),
        7: ("endless 100 Continue", endless(b"", head("100 Continue") * 512), None),
    }  # fmt: skip
    streamed = (0, 1, 4)
    with HostileServer(lambda r: behaviours[r.agent][1]) as server:
        plans = write_plans(tmp_path / "plans.jsonl", 8, streamed)
        o = run_agent(tmp_path, server, plans, "--max-active-agents", "8",
                      "--max-response-bytes", str(8 * MIB), "--request-timeout-secs", "3",
                      timeout=40, kill_above_mb=2000)  # fmt: skip
    assert_contained(o, 8)
    assert_buckets(o, (0, 8, 0, 0))
    for agent, (name, _, kind) in behaviours.items():
        record = o.event(agent)
        if kind is not None:
            assert record["error_kind"] == kind, (name, record)
            assert record["error"].startswith((TOO_LARGE, TOO_MUCH_IN_FLIGHT)), (name, record)
    assert o.maxrss_mb < 320, f"peak RSS {o.maxrss_mb:.0f} MB"


def pad(size: int) -> bytes:
    """A chat completion padded with spaces to exactly ``size`` bytes."""
    body = dumps(completion())
    return body[:-1] + b" " * (size - len(body)) + b"}"


@pytest.mark.native_pass_only
def test_the_limit_is_exact_and_configurable(tmp_path):
    """--max-response-bytes 65536: a body of exactly 65536 bytes (after decompression) is
    fine, one more byte is too large, however it is framed or encoded; a stream is held to
    the limit too."""
    limit = 65536
    fits, over = pad(limit), pad(limit + 1)
    behaviours = {
        0: (None, reply(ok(fits, "Content-Type: application/json"))),
        1: (None, reply(ok(gzip.compress(fits), "Content-Encoding: gzip"))),
        2: (None, reply(sse_stream(*good_stream("s")))),
        3: ("response_too_large", reply(ok(over, "Content-Type: application/json"))),
        4: ("response_too_large", reply(chunked(over[:1000], over[1000:]))),
        5: ("response_too_large", reply(ok(gzip.compress(over), "Content-Encoding: gzip"))),
        6: ("response_too_large", reply(head("200 OK") + over, close=True)),
        7: ("response_too_large",
            reply(sse_stream(*[event(delta("w" * 1000)) for _ in range(100)], DONE))),
    }  # fmt: skip
    streamed = (2, 7)
    with HostileServer(lambda r: behaviours[r.agent][1]) as server:
        plans = write_plans(tmp_path / "plans.jsonl", 8, streamed)
        # One at a time: each response meets the limit on its own (not the shared bound).
        o = run_agent(tmp_path, server, plans, "--max-active-agents", "1",
                      "--max-response-bytes", str(limit))  # fmt: skip
    assert_contained(o, 8)
    assert_buckets(o, (3, 5, 0, 0))
    options = (tmp_path / "out" / "results.config.toml").read_text()
    assert f"\nmax-response-bytes = {limit}\n" in options
    for agent, (kind, _) in behaviours.items():
        record = o.event(agent)
        assert record["error_kind"] == kind, (agent, record)
        if kind:
            assert record["error"].startswith(TOO_LARGE), record


# ---------------------------------------------------------------------------------------
# The SSE carry is linear


@pytest.mark.serial
@pytest.mark.parametrize("mod", implementations("sse"))
def test_a_long_sse_line_in_small_reads_is_scanned_in_linear_time(mod):
    """A 16 MiB ``data:`` line arriving 1 KiB at a time (copying the carry on every read,
    as before, took ~6 s here; linear handling takes a fraction of a second)."""
    text = "x" * (16 * MIB)
    line = b"data: " + dumps({"choices": [{"index": 0, "delta": {"content": text}}]}) + b"\n\n"
    data = line + event(usage_chunk()) + DONE
    scanner = mod.SseScanner()
    started = time.perf_counter()
    for offset in range(0, len(data), 1024):
        scanner.feed(data[offset : offset + 1024], 1.0)
    scanner.flush()
    took = time.perf_counter() - started
    assert scanner.done and scanner.usage == usage()
    assert "".join(scanner.content) == text
    assert took < 1.5, f"{took:.2f}s for a 16 MiB line in 1 KiB reads"


# ---------------------------------------------------------------------------------------
# Hypothesis: random response bytes against the plain-HTTP client

TRANSPORT_ERRORS = (ConnectError, DisconnectError, TimeoutError, ResponseTooLargeError,
                    RedirectError)  # fmt: skip
FUZZ_LIMIT = 1 << 16  # --max-response-bytes of the fuzzed client, when it takes one

counts = st.one_of(
    st.integers(0, 1000),
    st.sampled_from([-1, 2**31 - 1, 2**31, 2**62, 2**63, 2**64, -(2**63), 10**30]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([None, True, "12", [], {}]),
)
usages = st.one_of(
    st.builds(usage, counts, counts, st.one_of(st.none(), counts)),
    st.sampled_from([None, [], "usage", 7]),
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)  # fmt: skip


@st.composite
def documents(draw) -> bytes:
    """A response body: a completion with random usage, an error, random JSON or bytes."""
    choice = draw(st.integers(0, 4))
    if choice == 0:
        document = completion(draw(st.text(max_size=10)), draw(usages))
        if draw(st.booleans()):
            document["choices"] = draw(json_values)
        return json.dumps(document).encode()
    if choice == 1:
        error = draw(st.one_of(json_values, st.builds(dict, message=st.text(max_size=20))))
        return json.dumps({"error": error}).encode()
    if choice == 2:
        return json.dumps(draw(json_values)).encode()
    if choice == 3:
        return b" " * draw(st.sampled_from([0, 10, FUZZ_LIMIT + 1]))
    return draw(st.binary(max_size=64))


@st.composite
def streams(draw) -> tuple[bytes, bool]:
    """An SSE body: random events (errors, usage, deltas, junk) with random line endings;
    and whether it carries a well-formed error event (with a message, after no junk and
    before any ``[DONE]``)."""
    ending = draw(st.sampled_from([b"\n", b"\r\n", b"\r"]))
    parts = []
    clean = True  # no junk and no [DONE] so far
    error = False
    for _ in range(draw(st.integers(0, 5))):
        kind = draw(st.integers(0, 5))
        if kind == 0:
            parts.append(event(delta(draw(st.text(max_size=6))), ending))
        elif kind == 1:
            parts.append(event(usage_chunk(draw(usages)), ending))
        elif kind == 2:
            message = draw(st.one_of(st.text(min_size=1, max_size=12), json_values))
            name = draw(st.sampled_from([None, "error"]))
            parts.append(event({"error": {"message": message}}, ending, name))
            error = error or (clean and isinstance(message, str) and message.strip() != "")
        elif kind == 3:
            parts.append(b"data: [DONE]" + ending + ending)
            clean = False
        elif kind == 4:
            parts.append(draw(st.binary(max_size=24)))
            clean = False
        else:
            parts.append(b": comment" + ending + b"event: x" + ending + b"id: 1" + ending)
    return b"".join(parts), error


STATUS_LINES = [b"HTTP/1.1 200 OK", b"HTTP/1.0 200 OK", b"HTTP/1.1 204 No Content",
                b"HTTP/1.1 301 Moved", b"HTTP/1.1 302 Found", b"HTTP/1.1 303 See Other",
                b"HTTP/1.1 307 Temporary Redirect", b"HTTP/1.1 308 Permanent Redirect",
                b"HTTP/1.1 401 Unauthorized", b"HTTP/1.1 429 Too Many", b"HTTP/1.1 503 Busy",
                b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK", b"HTTP/1.1 999 What",
                b"HTTP/2 200", b"ICY 200 OK", b"HTTP/1.1 200"]  # fmt: skip
LOCATIONS = ["/v1/chat/completions", "/elsewhere", "http://[::1", "http://127.0.0.1:99999/",
             "http://127.0.0.1:abc/", "ftp://host/x", "", "//", "http://", "\x00",
             "http://127.0.0.1:{port}/v1/chat/completions"]  # fmt: skip


STATUS_WEIGHTED = [b"HTTP/1.1 200 OK"] * 8 + STATUS_LINES


@st.composite
def responses(draw, port: int, redirects: bool) -> tuple[bytes, list[int], str]:
    """(the bytes of one response, where to split them, how the connection ends). Mostly
    well-formed (so the client gets past the head), with every kind of damage now and
    then."""
    status = draw(st.sampled_from(STATUS_WEIGHTED))
    lines = [status]
    if redirects and b" 30" in status and draw(st.integers(0, 4)):
        target = draw(st.sampled_from(["/next", f"http://127.0.0.1:{port}/next", *LOCATIONS]))
        lines.append(b"Location: " + target.format(port=port).encode("latin-1"))
    streamed_body = draw(st.booleans())
    body = draw(streams())[0] if streamed_body else draw(documents())
    encoding = draw(st.sampled_from([None, None, "gzip", "deflate", "br"]))
    if encoding in ("gzip", "deflate") and draw(st.integers(0, 5)):
        body = gzip.compress(body) if encoding == "gzip" else zlib.compress(body)
    if encoding:
        lines.append(b"Content-Encoding: " + encoding.encode())
    if streamed_body:
        lines.append(b"Content-Type: text/event-stream")
    framing = draw(st.sampled_from(["length", "chunked"] * 3 + ["close", "both", "wrong", "twice"]))
    if framing in ("chunked", "both"):
        lines.append(b"Transfer-Encoding: chunked")
        cuts = sorted(draw(st.lists(st.integers(0, len(body)), max_size=3)))
        edges = [0, *cuts, len(body)]
        body = b"".join(chunk(body[a:b]) for a, b in itertools.pairwise(edges) if b > a)
        body += LAST_CHUNK
    if framing in ("length", "both", "twice"):
        lines.append(b"Content-Length: %d" % len(body))
    if framing == "twice":
        lines.append(b"Content-Length: %d" % len(body))
    if framing == "wrong":
        lines.append(b"Content-Length: %d" % draw(st.sampled_from([0, len(body) + 7, 2**40, -3])))
    for _ in range(draw(st.integers(0, 2))):
        location = draw(st.sampled_from(LOCATIONS)).format(port=port) if redirects else ""
        fine = [
            b"Retry-After: " + draw(st.sampled_from([b"1", b"-1", b"99999999999", b"soon"])),
            b"Connection: close",
            b"X-Fine: yes",
            b"Location: " + location.encode("latin-1"),
        ]
        junk = [b"X-Junk: \xff\xfe", b"NoColonHere", b": empty name"]
        lines.append(draw(st.sampled_from(fine * 3 + junk)))
    data = b"\r\n".join(lines) + b"\r\n\r\n" + body
    if draw(st.integers(0, 14)) == 0:  # sometimes plain garbage
        data = draw(st.binary(min_size=1, max_size=80))
    if draw(st.integers(0, 6)) == 0:  # sometimes cut short
        data = data[: draw(st.integers(0, len(data)))]
    splits = draw(st.lists(st.integers(1, max(1, len(data) - 1)), max_size=4))
    return data, splits, draw(st.sampled_from(["close", "close", "close", "reset"]))


class FuzzServer:
    """A raw server on the test's own loop: a request for ``/next`` gets the ``next``
    answer, any other the ``first`` (each: bytes, where to split them, close or reset);
    the connection ends after each answer."""

    def __init__(self) -> None:
        self.first: tuple[bytes, list[int], str] = (b"", [], "close")
        self.next = self.first
        self.port = 0

    async def start(self) -> None:
        self.server = await asyncio.start_server(self.serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = Peer(0, reader, writer)
        end = "close"
        try:
            request = await _read_request(reader)
            if request is not None:
                data, splits, end = self.next if request[1].startswith("/next") else self.first
                edges = [0, *sorted(set(splits)), len(data)]
                for a, b in itertools.pairwise(edges):
                    if b > a:
                        await peer.write(data[a:b])
                        await asyncio.sleep(0.0005)
                await asyncio.sleep(0.002)
        except (ConnectionError, OSError):
            pass
        finally:
            if end == "reset":
                peer.reset()
            else:
                writer.close()


def make_plain(url: str, session: aiohttp.ClientSession) -> PlainHttpTransport:
    """The client as the run makes it; with a response limit when it takes one."""
    options: dict[str, Any] = {}
    for name in inspect.signature(PlainHttpTransport).parameters:
        if "max_response" in name or "limit_bytes" in name:
            options[name] = FUZZ_LIMIT
    return PlainHttpTransport(url, 1.0, 4, lambda: AiohttpTransport(session, url), **options)


def check_reply(reply: Reply) -> None:
    assert type(reply.prompt_tokens) is int and 0 <= reply.prompt_tokens <= INT_LIMIT
    assert type(reply.completion_tokens) is int and 0 <= reply.completion_tokens <= INT_LIMIT
    cached = reply.cached_tokens
    assert cached is None or (type(cached) is int and 0 <= cached <= reply.prompt_tokens)


@pytest.mark.native_pass_only
@pytest.mark.parametrize("redirects", [False, True], ids=["one hop", "redirects"])
def test_random_responses_end_in_a_response_or_a_known_exception(redirects):
    """Whatever bytes come back, split wherever, ``PlainHttpTransport.send`` returns a
    response or raises one of its own exceptions; the driver's parsing of a 2xx then gives
    a reply (with sane counts) or a ResponseError, and an error status gives its text.
    With ``redirects``, 3xx answers carry a Location (often to ``/next``, which answers
    with random bytes of its own); without, no answer has a Location."""
    # A redirect's hops go through aiohttp, whose own errors transport.py lets through (the
    # driver files them as disconnects); the plain client itself raises only its own.
    allowed = TRANSPORT_ERRORS + ((aiohttp.ClientError,) if redirects else ())
    runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    server = FuzzServer()
    runner.run(server.start())
    seen: dict[str, int] = {}

    @settings(max_examples=200, deadline=5000, derandomize=True,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(st.data())
    def one(data) -> None:
        server.first = data.draw(responses(server.port, redirects))
        server.next = data.draw(responses(server.port, redirects))
        streamed = data.draw(st.booleans())

        async def attempt():
            async with aiohttp.ClientSession() as session:
                t = make_plain(f"http://127.0.0.1:{server.port}{PATH}", session)
                assembler = StreamAssembler() if streamed else None
                try:
                    async with asyncio.timeout(5):
                        outcome = await t.send(b"{}", {"authorization": f"Bearer {KEY}"},
                                               assembler.feed if assembler else None)  # fmt: skip
                except allowed as exc:
                    return exc, assembler
                finally:
                    await t.close()
                return outcome, assembler

        outcome, assembler = runner.run(attempt())
        if isinstance(outcome, BaseException):
            seen[type(outcome).__name__] = seen.get(type(outcome).__name__, 0) + 1
            assert str(outcome) or isinstance(outcome, TimeoutError)
            return
        status, body, retry_after, _worker = outcome
        assert type(status) is int and 100 <= status <= 999
        assert type(body) is bytes and (retry_after is None or type(retry_after) is str)
        seen[str(status)] = seen.get(str(status), 0) + 1
        if not 200 <= status < 300:
            assert http_error_text(status, body).startswith(f"request failed ({status}")
            return
        try:
            check_reply(assembler.finish(0.0) if assembler else parse_response(body))
        except ResponseError as exc:
            assert str(ErrorKind(exc.kind)) in KINDS and str(exc)

    try:
        one()
    finally:
        runner.close()
    # The examples reached both ends: responses and transport errors.
    assert any(name.isdigit() for name in seen) and any(not n.isdigit() for n in seen), seen
    if redirects:
        assert "RedirectError" in seen, seen


# ---------------------------------------------------------------------------------------
# Hypothesis: random bodies and streams against the driver's parsing


@settings(max_examples=300, deadline=2000)
@given(st.one_of(documents(), st.binary(max_size=200)))
def test_random_bodies_parse_to_a_reply_or_a_response_error(body):
    try:
        document = json.loads(body)
    except ValueError:
        document = None
    error = (
        isinstance(document, dict)
        and list(document) == ["error"]
        and isinstance(document["error"], dict)
        and isinstance(document["error"].get("message"), str)
    )
    try:
        reply_ = parse_response(body)
    except ResponseError as exc:
        assert exc.kind in ErrorKind and str(exc)
        if error:  # a 200 that says it failed keeps the server's message
            assert exc.kind is ErrorKind.SERVER_ERROR
            said = document["error"]["message"]
            if said and said == said.strip() and len(said) <= 500:
                assert str(exc) == f"server error in response: {said}"
        return
    assert not error
    check_reply(reply_)


@settings(max_examples=300, deadline=2000)
@given(streams(), st.lists(st.integers(0, 400), max_size=6))
def test_random_streams_split_anywhere_assemble_or_fail_cleanly(stream, cuts):
    data, error = stream
    edges = [0, *sorted(c for c in cuts if c < len(data)), len(data)]
    assembler = StreamAssembler()
    try:
        for index, (a, b) in enumerate(itertools.pairwise(edges)):
            if b > a:
                assembler.feed(data[a:b], float(index))
        reply_ = assembler.finish(0.0)
    except (ResponseError, ResponseTooLargeError) as exc:
        assert str(exc)
        return
    assert not error, "a stream with an error event counted as a success"
    check_reply(reply_)
