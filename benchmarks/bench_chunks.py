"""Client cost of streamed chunks and of requests: the client paths side by side.

Run from the repository root (after ``python setup.py build_ext --inplace``):
``python -m benchmarks.bench_chunks [--repeat N] [--requests R] [--concurrency C]
[--shapes nonstream stream50 stream500] [--paths aiohttp new] [--no-capacity] [--quick]``.

Two zero-latency servers (``benchmarks/_fastserver.py``, one with 50-chunk streams, one
with 500) answer the real ``batchbench agent`` (in a child process of this module, so
each run starts clean). The client paths run side by side, interleaved in every round;
``--paths`` picks two or three of them (the first is the baseline of the ratios):

* ``new``: the product as it is (the lean plain-HTTP transport of
  ``batchbench.drive.transport``, ``StreamAssembler`` on the ``SseScanner``, compiled when
  built, ``BATCHBENCH_NO_EXTENSIONS=1`` measures the twin; replies counted by the fast
  ASCII counter of ``batchbench.text.fastcount``);
* ``aiohttp``: the same client sending through aiohttp (``AiohttpTransport``);
* ``previous``: aiohttp, and every reply counted by the tokenizer itself: the client
  before the lean transport and the fast counter;
* ``legacy``: ``previous`` with, in place of the scanner, the assembler from before it
  (``LegacyAssembler`` below: every ``data:`` payload parsed with orjson).

The swaps happen inside the child process only.

What it measures, for three shapes (non-streamed; streamed 50 chunks; streamed 500):

1. CPU-s per 1,000 requests: ``client_health.cpu_seconds`` of ``--results-json`` (client
   process CPU on the benchmark clock, start-up excluded), closed loop, C agents of R/C
   requests (64-token prompts, 16-token tool results, replies of 50 or 500 chunks).
2. Sustained req/s on one client core with event-loop lag p99 <= 10 ms: open loop,
   constant arrivals of 4-request agents (100 ms tool delay), the offered rate stepped up
   by 30 % from a start rate until lag p99 exceeds 10 ms, a request fails or fewer than
   90 % of the offered requests per second complete; the last rate that held is reported.

Every figure is the median over N rounds (this machine is shared and noisy: absolute
numbers drift, the old/new ratios measured in the same rounds hold).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHAPES = {"nonstream": 0, "stream50": 50, "stream500": 500}
PATHS = ("legacy", "previous", "aiohttp", "new")
LAG_TARGET_MS = 10.0
CAPACITY_TURNS = 4
CAPACITY_DELAY_MS = 100
STEP = 1.3  # the offered rate grows by 30 % a step


# ---------------------------------------------------------------------------------------
# The old path (benchmark only): the assembler as it was before the SSE scanner


def legacy_assembler():
    """The pre-scanner ``StreamAssembler``: each ``data:`` payload parsed with orjson."""
    import itertools as _it

    import orjson

    from batchbench.drive import wire

    loads = orjson.loads

    class LegacyAssembler:
        __slots__ = ("_carry", "_chunks", "_content", "_done", "_last", "_reasoning", "_times")
        __slots__ += ("_usage",)

        def __init__(self) -> None:
            self._carry = b""
            self._last = 0.0
            self._done = False
            self._chunks = 0
            self._content: list[str] = []
            self._reasoning: list[str] = []
            self._times: list[float] = []
            self._usage = None

        def feed(self, data: bytes, arrived: float) -> None:
            self._last = arrived
            if self._carry:
                data = self._carry + data
            end = data.rfind(b"\n")
            if end < 0:
                self._carry = data
                return
            self._carry = data[end + 1 :]
            for line in data[:end].split(b"\n"):
                if line[:5] == b"data:":
                    self._payload(line[5:].strip(), arrived)

        def _payload(self, payload: bytes, arrived: float) -> None:
            if not payload:
                return
            if payload == b"[DONE]":
                self._done = True
                return
            try:
                chunk = loads(payload)
            except orjson.JSONDecodeError:
                raise wire.ResponseError(wire.BAD_CHUNK) from None
            self._chunks += 1
            if type(chunk) is not dict:
                return
            usage = chunk.get("usage")
            if usage is not None:
                self._usage = usage
            choices = chunk.get("choices")
            if not choices or type(choices) is not list:
                return
            choice = choices[0]
            delta = choice.get("delta") if type(choice) is dict else None
            if type(delta) is not dict:
                return
            carried = False
            content = delta.get("content")
            if type(content) is str and content:
                self._content.append(content)
                carried = True
            reasoning = delta.get("reasoning_content")
            if type(reasoning) is str and reasoning:
                self._reasoning.append(reasoning)
                carried = True
            if carried:
                self._times.append(arrived)

        def finish(self, sent: float) -> wire.Reply:
            if self._carry:
                line, self._carry = self._carry, b""
                if line[:5] == b"data:":
                    self._payload(line[5:].strip(), self._last)
            if self._chunks == 0 or self._usage is None:
                raise wire.ResponseError(wire.NO_STREAM_USAGE)
            prompt, completion, cached = wire._usage_counts(self._usage)
            message: dict = {"role": "assistant", "content": "".join(self._content)}
            if self._reasoning:
                message["reasoning_content"] = "".join(self._reasoning)
            reply = wire.Reply(message, prompt, completion, cached, self._usage)
            times = self._times
            if times:
                reply.ttft = times[0] - sent
                reply.gaps = [b - a for a, b in _it.pairwise(times)]
                if completion >= 2:
                    reply.tpot = (times[-1] - times[0]) / (completion - 1)
            return reply

    return LegacyAssembler


def child_main(path: str, argv: list[str]) -> int:
    """``--child legacy|previous|aiohttp|new AGENT ARGS``: run ``batchbench agent`` here."""
    from batchbench.drive import driver, transport
    from batchbench.text import framing

    if path in ("legacy", "previous"):
        framing.ascii_counter = lambda tokenizer: None  # every reply through the tokenizer
    if path != "new":

        def through_aiohttp(url, timeout_seconds, limit, session):
            return transport.AiohttpTransport(session, url)

        driver.make_transport = through_aiohttp
    if path == "legacy":
        driver.StreamAssembler = legacy_assembler()
    from batchbench.cli.main import run

    return run(["agent", *argv])


# ---------------------------------------------------------------------------------------
# Servers and runs


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    old = env.get("PYTHONPATH")
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + old if old else "")
    return env


class Server:
    """``benchmarks._fastserver`` with a given stream length, in its own process."""

    def __init__(self, chunks: int) -> None:
        command = [sys.executable, "-m", "benchmarks._fastserver", "--port", "0"]
        command += ["--chunks", str(max(chunks, 1)), "--completion-tokens", "50"]
        self.process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=child_env()
        )
        line = self.process.stdout.readline()
        if "listening on" not in line:
            self.process.kill()
            raise SystemExit(f"the fast server did not start: {line!r}")
        self.url = line.split()[-1]

    def stop(self) -> None:
        self.process.stdin.close()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def agent(path: str, url: str, stream: bool, flags: list[str]) -> dict:
    """One ``batchbench agent`` run on ``path``; its results JSON."""
    with tempfile.TemporaryDirectory() as tmp:
        results = os.path.join(tmp, "results.json")
        command = [sys.executable, "-m", "benchmarks.bench_chunks", "--child", path]
        command += ["--tokenizer-model", "deepseek-v3", "--seed", "1", "--no-progress"]
        command += ["--max-retries", "0", "--host", url, "--model", "bench"]
        command += ["--no-preflight", "--results-json", results, "--input-tokens", "64"]
        command += ["--output-tokens", "50", "--environment-tokens", "16", *flags]
        command += ["--stream"] if stream else []
        done = subprocess.run(command, capture_output=True, env=child_env(), cwd=REPO)
        if done.returncode not in (0, 3):
            tail = (done.stdout[-1500:] + done.stderr[-1500:]).decode(errors="replace")
            raise SystemExit(f"client failed ({done.returncode}): {' '.join(command)}\n{tail}")
        return json.loads(Path(results).read_text())


def cpu_per_k(path: str, url: str, stream: bool, requests: int, concurrency: int) -> float:
    per_agent = max(1, requests // concurrency)
    flags = ["--agents", str(concurrency), "--tool-invocations", str(per_agent)]
    document = agent(path, url, stream, flags)
    if document["metrics"]["failed_requests"]:
        raise SystemExit(f"{path}: failed requests: {document['failures'][:1]}")
    return document["client_health"]["cpu_seconds"] * 1000.0 / document["metrics"]["total_requests"]


def holds(path: str, url: str, stream: bool, rate: float, seconds: float) -> tuple[bool, dict]:
    """Open loop at ``rate`` requests/s: (lag p99 <= 10 ms and the rate is served, figures)."""
    agents_per_s = rate / CAPACITY_TURNS
    agents = max(8, round(agents_per_s * seconds))
    flags = ["--agents", str(agents), "--tool-invocations", str(CAPACITY_TURNS)]
    flags += ["--admission", "open-loop", "--arrival-rate", f"{agents_per_s:g}"]
    flags += ["--arrival-process", "constant", "--tool-call-latency-ms", str(CAPACITY_DELAY_MS)]
    document = agent(path, url, stream, flags)
    metrics, health = document["metrics"], document["client_health"]
    served = metrics["requests_per_second"] or 0.0
    lag = health["lag_p99_ms"] if health["lag_p99_ms"] is not None else float("inf")
    span = seconds + CAPACITY_TURNS * CAPACITY_DELAY_MS / 1000.0  # the last agent's turns
    expected = metrics["total_requests"] / span
    ok = not metrics["failed_requests"] and lag <= LAG_TARGET_MS and served >= 0.9 * expected
    return ok, {"lag_p99_ms": lag, "served": served}


def capacity(path: str, url: str, stream: bool, start: float, seconds: float) -> float:
    """The highest stepped rate that held (0 when even the start rate did not)."""
    held, rate = 0.0, start
    while True:
        ok, _ = holds(path, url, stream, rate, seconds)
        if not ok:
            return held
        held, rate = rate, rate * STEP


# ---------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="rounds; medians are reported")
    parser.add_argument("--requests", type=int, default=4000, help="requests per CPU run")
    parser.add_argument("--concurrency", type=int, default=64, help="agents in flight")
    parser.add_argument("--shapes", nargs="+", choices=tuple(SHAPES), default=list(SHAPES))
    parser.add_argument(
        "--paths", nargs="+", choices=PATHS, default=["previous", "new"], help="client paths"
    )
    parser.add_argument("--no-capacity", action="store_true", help="skip the lag-bound rates")
    parser.add_argument("--step-seconds", type=float, default=4.0, help="arrivals per step")
    parser.add_argument("--quick", action="store_true", help="1 round, 1000 requests")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        return child_main(argv[1], argv[2:])
    args = build_parser().parse_args(argv)
    if args.quick:
        args.repeat, args.requests, args.step_seconds = 1, 1000, 2.0
    servers = {
        chunks: Server(chunks) for chunks in sorted({max(SHAPES[s], 50) for s in args.shapes})
    }
    started = time.perf_counter()
    cpu: dict[tuple[str, str], list[float]] = {}
    rates: dict[tuple[str, str], list[float]] = {}
    try:
        first = servers[min(servers)]
        agent("new", first.url, False, ["--agents", "4", "--tool-invocations", "2"])  # warm-up
        for round_index in range(args.repeat):
            for shape, path in itertools.product(args.shapes, args.paths):
                url = servers[max(SHAPES[shape], 50)].url
                stream = SHAPES[shape] > 0
                value = cpu_per_k(path, url, stream, args.requests, args.concurrency)
                cpu.setdefault((shape, path), []).append(value)
            if not args.no_capacity:
                for shape, path in itertools.product(args.shapes, args.paths):
                    url = servers[max(SHAPES[shape], 50)].url
                    start = {"nonstream": 400.0, "stream50": 300.0, "stream500": 80.0}[shape]
                    held = capacity(path, url, SHAPES[shape] > 0, start, args.step_seconds)
                    rates.setdefault((shape, path), []).append(held)
            print(f"  round {round_index + 1}/{args.repeat} done", file=sys.stderr, flush=True)
    finally:
        for server in servers.values():
            server.stop()

    from batchbench.drive import sse

    print(
        f"\nclient CPU per 1,000 requests and lag-bound req/s on one core, scanner "
        f"{sse.IMPLEMENTATION}; median of {args.repeat} rounds; {args.requests} requests at "
        f"concurrency {args.concurrency} per CPU run"
    )
    base = args.paths[0]
    header = f"{'shape':<12}" + "".join(f"{'CPU-s/1000 ' + p:>20}" for p in args.paths)
    header += "".join(f"{p + '/' + base:>16}" for p in args.paths[1:])
    if rates:
        header += "".join(f"{'req/s ' + p:>14}" for p in args.paths)
    print(header)
    for shape in args.shapes:
        cpus = [statistics.median(cpu[shape, p]) for p in args.paths]
        line = f"{shape:<12}" + "".join(f"{c:>20.3f}" for c in cpus)
        line += "".join(f"{c / cpus[0]:>16.2f}" for c in cpus[1:])
        if rates:
            line += "".join(f"{statistics.median(rates[shape, p]):>14.0f}" for p in args.paths)
        print(line)
    print(f"(rounds: {json.dumps({f'{k[0]}/{k[1]}': v for k, v in cpu.items()})})")
    if rates:
        print(f"(rates: {json.dumps({f'{k[0]}/{k[1]}': v for k, v in rates.items()})})")
    print(f"(benchmark took {time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
