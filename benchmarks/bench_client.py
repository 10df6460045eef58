"""Client overhead of ``batchbench agent``: CPU per 1000 requests, start-up, 10k agents.

Run from the repository root (after ``python setup.py build_ext --inplace``, or with the
package installed): ``python -m benchmarks.bench_client [--requests R] [--concurrency C]
[--repeat N] [--only CASE ...] [--quick]``.

A zero-latency server runs in its own process (``benchmarks/_fastserver.py``: a uvloop
``asyncio.Protocol`` that answers every request with a canned chat completion, or a canned
SSE stream of 50 content chunks, a usage chunk and ``[DONE]``; ``--server sim`` uses
``batchbench sim --speed 0`` instead, which costs more server CPU). The client under test
is the real ``batchbench agent`` in a subprocess with a sampled workload: C agents of R/C
requests each (64-token prompts, 50-token replies, 16-token tool results, so the history
grows every turn). Each run reports

* agent clock: ``client_health.cpu_seconds`` of ``--results-json`` (CPU of the client
  process over the benchmark clock, start-up excluded) per 1000 requests;
* whole process: ``getrusage(RUSAGE_CHILDREN)`` around the subprocess (start-up, tokenizer
  load and reports included) per 1000 requests;
* req/s: ``metrics.requests_per_second``; and the server's CPU use over the run (from
  /proc), which must stay well under one core for the server not to be the bottleneck.

Baselines, measured side by side in the same rounds against the same server at the same
R and C: the way typical Python load generators do it, each in its own subprocess of this
module (``--child``): the ``openai`` package's ``AsyncOpenAI`` (skipped when ``openai`` is
not installed) and a plain aiohttp loop that re-serializes the whole history with
``json.dumps`` every turn and parses with ``json.loads`` (per-line SSE decoding), both on
the default asyncio loop (``--baseline-loop uvloop`` to change that). Ratios are
batchbench / baseline: below 1 means batchbench is cheaper. ``AsyncOpenAI`` re-validates
the whole history on every call, so it is slow; it runs in ``--openai-repeat`` rounds
(default 1). A failed request ends the benchmark (except in the 10k case, which counts
failures and then fails the target).

Start-up: the agent replays the example manifest; the server reads the client's
/proc/<pid>/stat (user + system CPU, all threads) when the first request arrives, so the
figure is the CPU from process start to the first request sent. The whole-process CPU
minus the in-run CPU is printed too (an upper bound that also counts the reports).

10k agents: first one client core's capacity (a saturating run's req/s), then
``--agents 10000 --tool-invocations 3`` with small sizes, non-streamed, twice: the
lockstep start (``--tool-call-latency-ms 1000 --ramp-up 0``: about 10,000 req/s offered,
beyond one core, so the loop lags) and the default ramp-up with a tool delay that offers
a third of the measured capacity (about two thirds of a core at this shape's cost per
request); each reports event-loop lag (p50/p99/max), peak in-flight requests and req/s.

Every row is the median of N rounds; absolute times drift on this shared machine, ratios
hold. Targets (issue): <= 0.5 CPU-s per 1000 non-streamed requests and <= 2.0 per 1000
streamed requests (agent clock), 10,000 agents with lag p99 <= 10 ms, start-up <= 1.5 CPU-s.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MANIFEST = REPO / "examples" / "trajectory-replay" / "plans.jsonl"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
CASES = ("nonstream", "stream", "startup", "agents10k", "baselines")
CHUNKS = 50
INPUT_TOKENS = 64
OUTPUT_TOKENS = 50
ENVIRONMENT_TOKENS = 16

TARGET_NONSTREAM = 0.5  # client CPU-s per 1000 non-streamed requests
TARGET_STREAM = 2.0  # client CPU-s per 1000 streamed requests of 50 chunks
TARGET_LAG_P99_MS = 10.0  # 10,000 agents in one process
TARGET_STARTUP = 1.5  # CPU-s from process start to the first request sent


# ---------------------------------------------------------------------------------------
# Processes and measurements


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process, read from /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def raise_nofile() -> int:
    """Raise the soft open-files limit to the hard one (inherited by the children)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def child_env() -> dict[str, str]:
    """The environment of every child: the checkout first on PYTHONPATH when run from it."""
    env = dict(os.environ)
    if (REPO / "batchbench").is_dir():
        old = env.get("PYTHONPATH")
        env["PYTHONPATH"] = str(REPO) + (os.pathsep + old if old else "")
    env.pop("OPENAI_API_KEY", None)
    return env


class Server:
    """The zero-latency server (or ``batchbench sim --speed 0``) in its own process."""

    def __init__(self, kind: str, sse_writes: int) -> None:
        self.kind = kind
        if kind == "fast":
            command = [sys.executable, "-m", "benchmarks._fastserver", "--port", "0"]
            command += ["--chunks", str(CHUNKS), "--sse-writes", str(sse_writes)]
        else:
            command = [sys.executable, "-m", "batchbench", "sim", "--port", "0", "--speed", "0"]
            command += ["--tokenizer-model", "deepseek-v3"]
        self.process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=child_env(),
            cwd=REPO,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if "listening on" not in line:
            self.process.kill()
            raise SystemExit(f"the {kind} server did not start: {line!r}")
        self.url = line.split()[-1].rstrip("/")

    @property
    def can_watch(self) -> bool:
        return self.kind == "fast"

    def command(self, line: str) -> str:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()
        return self.process.stdout.readline().strip()

    def watch(self, pid: int) -> None:
        answer = self.command(f"watch {pid}")
        if answer != "ok":
            raise SystemExit(f"server did not accept watch: {answer!r}")

    def first_request_cpu(self) -> float | None:
        """After a watched client ended: its CPU at its first request (None if none came)."""
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write("count\n")
        self.process.stdin.flush()
        cpu = None
        while True:
            line = self.process.stdout.readline()
            if not line:
                raise SystemExit("the server stopped")
            words = line.split()
            if words and words[0] == "first":
                cpu = float(words[1])
            elif words and words[0] == "count":
                return cpu if cpu is None or cpu >= 0 else None

    def cpu(self) -> float:
        return process_cpu_seconds(self.process.pid)

    def stop(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            if self.process.stdin is not None:
                self.process.stdin.close()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@dataclass
class Run:
    """One client run: CPU in its own measurement window and of the whole process."""

    requests: int
    failed: int
    in_run_cpu: float
    whole_cpu: float
    rate: float
    server_busy: float  # server CPU seconds / wall seconds of the run
    extra: dict = field(default_factory=dict)

    @property
    def in_run_per_k(self) -> float:
        return self.in_run_cpu * 1000.0 / self.requests if self.requests else float("nan")

    @property
    def whole_per_k(self) -> float:
        return self.whole_cpu * 1000.0 / self.requests if self.requests else float("nan")


def run_child(
    command: list[str], server: Server, watch: bool = False
) -> tuple[float, float, float, float | None]:
    """Run a client to the end: (whole-process CPU, wall, server CPU, first-request CPU)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        cpu0, server0, wall0 = children_cpu(), server.cpu(), time.perf_counter()
        process = subprocess.Popen(command, stdout=out, stderr=err, env=child_env(), cwd=REPO)
        try:
            if watch:
                server.watch(process.pid)
            status = process.wait()
        except BaseException:  # Ctrl+C: leave no client behind
            process.kill()
            process.wait()
            raise
        wall = time.perf_counter() - wall0
        whole, server_cpu = children_cpu() - cpu0, server.cpu() - server0
        first = server.first_request_cpu() if watch else None
        if status not in (0, 3):  # 3: requests failed; judged from the results below
            out.seek(0)
            err.seek(0)
            tail = (out.read()[-2000:] + err.read()[-2000:]).decode(errors="replace")
            raise SystemExit(f"client failed with status {status}: {' '.join(command)}\n{tail}")
    return whole, wall, server_cpu, first


def agent_command(url: str, results: str, extra: list[str]) -> list[str]:
    return [
        sys.executable,
        "-m",
        "batchbench",
        "agent",
        "--tokenizer-model",
        "deepseek-v3",
        "--seed",
        "1",
        "--no-progress",
        "--max-retries",
        "0",
        "--host",
        url,
        "--model",
        "bench-model",
        "--no-preflight",  # the server's request count is the measurement
        "--results-json",
        results,
        *extra,
    ]


def sampled_flags(agents: int, per_agent: int, stream: bool) -> list[str]:
    flags = ["--agents", str(agents), "--tool-invocations", str(per_agent)]
    flags += ["--input-tokens", str(INPUT_TOKENS), "--output-tokens", str(OUTPUT_TOKENS)]
    flags += ["--environment-tokens", str(ENVIRONMENT_TOKENS)]
    return flags + (["--stream"] if stream else [])


def run_agent(
    server: Server, flags: list[str], watch: bool = False, allow_failures: bool = False
) -> Run:
    """One ``batchbench agent`` run; failed requests end the benchmark unless allowed."""
    with tempfile.TemporaryDirectory() as tmp:
        results = os.path.join(tmp, "results.json")
        whole, wall, server_cpu, first = run_child(
            agent_command(server.url, results, flags), server, watch
        )
        document = json.loads(Path(results).read_text())
    metrics, health = document["metrics"], document["client_health"]
    duration = metrics["total_duration_seconds"] or wall
    run = Run(
        requests=metrics["total_requests"],
        failed=metrics["failed_requests"],
        in_run_cpu=health["cpu_seconds"],
        whole_cpu=whole,
        rate=metrics["requests_per_second"] or 0.0,
        server_busy=server_cpu / duration if duration else float("nan"),
    )
    run.extra.update(health)
    run.extra["first_request_cpu"] = first
    run.extra["duration"] = duration
    if run.failed:
        first_failure = document["failures"][0]["error"] if document["failures"] else "?"
        message = f"{run.failed} failed requests, e.g. {first_failure}"
        if not allow_failures:
            raise SystemExit(f"batchbench agent: {message}")
        print(f"warning: {message}", file=sys.stderr)
    return run


def run_baseline(
    server: Server, kind: str, requests: int, concurrency: int, stream: bool, loop: str
) -> Run:
    command = [sys.executable, "-m", "benchmarks.bench_client", "--child", kind]
    command += ["--url", server.url, "--requests", str(requests)]
    command += ["--concurrency", str(concurrency), "--baseline-loop", loop]
    command += ["--stream"] if stream else []
    with tempfile.TemporaryDirectory() as tmp:
        results = os.path.join(tmp, "results.json")
        whole, _wall, server_cpu, _ = run_child([*command, "--child-out", results], server)
        document = json.loads(Path(results).read_text())
    elapsed = document["elapsed"]
    if document["failed"]:
        raise SystemExit(f"{kind} baseline: {document['failed']} failed, e.g. {document['error']}")
    return Run(
        requests=document["requests"],
        failed=document["failed"],
        in_run_cpu=document["cpu_seconds"],
        whole_cpu=whole,
        rate=document["requests"] / elapsed if elapsed else 0.0,
        server_busy=server_cpu / elapsed if elapsed else float("nan"),
    )


# ---------------------------------------------------------------------------------------
# Baseline load generators (run in a child: ``--child openai|aiohttp``)

PROMPT_WORDS = "the quick brown fox jumps over the lazy dog and keeps running "
TOOL_ARGUMENTS = '{"request":"continue"}'


def _prompt(worker: int) -> str:
    text = f"agent {worker} starts a task: " + PROMPT_WORDS * 30
    return text[: INPUT_TOKENS * 4]


def _environment(worker: int, turn: int) -> str:
    return (f"tool result {worker}.{turn}: " + PROMPT_WORDS * 2)[: ENVIRONMENT_TOKENS * 4]


def _assistant(content: str | None, call_id: str) -> dict:
    return {
        "role": "assistant",
        "content": content,
        "tool_calls": [
            {
                "id": call_id,
                "type": "function",
                "function": {"name": "environment", "arguments": TOOL_ARGUMENTS},
            }
        ],
    }


async def _openai_worker(client, worker: int, turns: int, stream: bool, tally: dict) -> None:
    messages: list[dict] = [{"role": "user", "content": _prompt(worker)}]
    for turn in range(turns):
        sent = time.perf_counter()
        try:
            if stream:
                response = await client.chat.completions.create(
                    model="bench",
                    messages=messages,
                    max_tokens=OUTPUT_TOKENS,
                    stream=True,
                    stream_options={"include_usage": True},
                    extra_body={"min_tokens": OUTPUT_TOKENS},
                    user=f"bench-{worker}",
                )
                parts, times, usage = [], [], None
                async for chunk in response:
                    if chunk.choices:
                        delta = chunk.choices[0].delta
                        if delta.content:
                            parts.append(delta.content)
                            times.append(time.perf_counter())
                    if chunk.usage is not None:
                        usage = chunk.usage
                content = "".join(parts)
                if usage is None or not times:
                    raise ValueError("stream without usage or content")
                tally["ttft"].append(times[0] - sent)
            else:
                response = await client.chat.completions.create(
                    model="bench",
                    messages=messages,
                    max_tokens=OUTPUT_TOKENS,
                    extra_body={"min_tokens": OUTPUT_TOKENS},
                    user=f"bench-{worker}",
                )
                content = response.choices[0].message.content
                usage = response.usage
            _count_success(tally, usage.prompt_tokens, sent)
        except Exception as exc:  # a baseline reports failures, it does not stop
            _count_failure(tally, exc)
            return
        _append_turn(messages, worker, turn, content)


def _count_success(tally: dict, prompt_tokens: int, sent: float) -> None:
    tally["prompt_tokens"] += prompt_tokens
    tally["latency"].append(time.perf_counter() - sent)
    tally["requests"] += 1


def _count_failure(tally: dict, exc: Exception) -> None:
    tally["requests"] += 1
    tally["failed"] += 1
    tally["error"] = repr(exc)


def _append_turn(messages: list[dict], worker: int, turn: int, content) -> None:
    """The reply with a tool call, then the tool result, as the baselines grow the history."""
    call = f"call_{worker}_{turn}"
    messages.append(_assistant(content, call))
    messages.append({"role": "tool", "tool_call_id": call, "content": _environment(worker, turn)})


async def _aiohttp_worker(session, url, worker: int, turns: int, stream: bool, tally) -> None:
    messages: list[dict] = [{"role": "user", "content": _prompt(worker)}]
    for turn in range(turns):
        body = {
            "model": "bench",
            "messages": messages,
            "max_tokens": OUTPUT_TOKENS,
            "min_tokens": OUTPUT_TOKENS,
            "user": f"bench-{worker}",
        }
        if stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        sent = time.perf_counter()
        try:
            data = json.dumps(body).encode()
            headers = {"Content-Type": "application/json"}
            async with session.post(url, data=data, headers=headers) as response:
                if response.status != 200:
                    raise ValueError(f"status {response.status}")
                if stream:
                    parts, times, usage = [], [], None
                    async for line in response.content:
                        line = line.strip()
                        if not line:
                            continue
                        chunk = line.decode("utf-8").removeprefix("data: ")
                        if chunk == "[DONE]":
                            continue
                        document = json.loads(chunk)
                        if document.get("usage"):
                            usage = document["usage"]
                        choices = document.get("choices")
                        if choices and choices[0]["delta"].get("content"):
                            parts.append(choices[0]["delta"]["content"])
                            times.append(time.perf_counter())
                    content = "".join(parts)
                    if usage is None or not times:
                        raise ValueError("stream without usage or content")
                    tally["ttft"].append(times[0] - sent)
                else:
                    document = json.loads(await response.text())
                    content = document["choices"][0]["message"]["content"]
                    usage = document["usage"]
            _count_success(tally, usage["prompt_tokens"], sent)
        except Exception as exc:  # a baseline reports failures, it does not stop
            _count_failure(tally, exc)
            return
        _append_turn(messages, worker, turn, content)


async def _baseline(kind: str, url: str, requests: int, concurrency: int, stream: bool) -> dict:
    import asyncio

    turns = max(1, requests // concurrency)
    tally = {"requests": 0, "failed": 0, "error": None, "prompt_tokens": 0}
    tally.update(latency=[], ttft=[])
    if kind == "openai":
        from openai import AsyncOpenAI

        client = AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=60.0)
        cpu0, wall0 = _self_cpu(), time.perf_counter()
        await asyncio.gather(
            *(_openai_worker(client, i, turns, stream, tally) for i in range(concurrency))
        )
        cpu, elapsed = _self_cpu() - cpu0, time.perf_counter() - wall0
        await client.close()
    else:
        import aiohttp

        connector = aiohttp.TCPConnector(limit=concurrency)
        async with aiohttp.ClientSession(connector=connector) as session:
            endpoint = url + "/v1/chat/completions"
            cpu0, wall0 = _self_cpu(), time.perf_counter()
            await asyncio.gather(
                *(
                    _aiohttp_worker(session, endpoint, i, turns, stream, tally)
                    for i in range(concurrency)
                )
            )
            cpu, elapsed = _self_cpu() - cpu0, time.perf_counter() - wall0
    latency = sorted(tally.pop("latency"))
    tally.pop("ttft")
    tally["latency_p50_ms"] = latency[len(latency) // 2] * 1000 if latency else None
    return {**tally, "cpu_seconds": cpu, "elapsed": elapsed}


def _self_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def child_main(args: argparse.Namespace) -> int:
    import asyncio

    loop_factory = None
    if args.baseline_loop == "uvloop":
        import uvloop

        loop_factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        document = runner.run(
            _baseline(args.child, args.url, args.requests, args.concurrency, args.stream)
        )
    Path(args.child_out).write_text(json.dumps(document))
    return 0


def openai_available() -> bool:
    probe = [sys.executable, "-c", "import openai"]
    return subprocess.run(probe, env=child_env(), capture_output=True).returncode == 0


# ---------------------------------------------------------------------------------------
# The table


def median(values) -> float:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else float("nan")


def verdict(value: float, target: float) -> str:
    if value != value:  # NaN
        return "n/a"
    return "PASS" if value <= target else "FAIL"


NAME_WIDTH = 47
HEADER = (
    f"{'case':<{NAME_WIDTH}} {'CPU-s/1000':>10} {'(whole proc)':>12} {'req/s':>8} "
    f"{'server CPU':>10} {'target':>8} {'':>4}"
)


def row(name: str, runs: list[Run], target: float | None) -> str:
    in_run = median(r.in_run_per_k for r in runs)
    whole = median(r.whole_per_k for r in runs)
    rate = median(r.rate for r in runs)
    busy = median(r.server_busy for r in runs)
    goal = f"<= {target:g}" if target is not None else ""
    mark = verdict(in_run, target) if target is not None else ""
    return (
        f"{name:<{NAME_WIDTH}} {in_run:>10.3f} {whole:>12.3f} {rate:>8,.0f} "
        f"{busy * 100:>9.0f}% {goal:>8} {mark:>4}"
    )


def ratio_line(label: str, ours: list[Run], theirs: list[Run]) -> str:
    a_in, b_in = median(r.in_run_per_k for r in ours), median(r.in_run_per_k for r in theirs)
    a_wh, b_wh = median(r.whole_per_k for r in ours), median(r.whole_per_k for r in theirs)
    a_rate, b_rate = median(r.rate for r in ours), median(r.rate for r in theirs)
    return (
        f"  {label:<45} CPU {a_in / b_in:>5.2f}x (whole proc {a_wh / b_wh:>5.2f}x), "
        f"req/s {a_rate / b_rate:>5.2f}x"
    )


# ---------------------------------------------------------------------------------------
# Cases


def measure_throughput(server: Server, args, cases: set[str], baselines: list[str]) -> None:
    per_agent = max(1, args.requests // args.concurrency)
    modes = [m for m in ("nonstream", "stream") if m in cases or baselines]
    if not modes:
        return
    clients = ["batchbench", *baselines]
    runs: dict[tuple[str, str], list[Run]] = {}
    run_agent(server, sampled_flags(8, 4, False))  # warm-up: page cache, server
    for round_index in range(args.repeat):
        for mode in modes:  # interleaved, so drift hits every client alike
            stream = mode == "stream"
            for client in clients:
                if client == "batchbench":
                    run = run_agent(server, sampled_flags(args.concurrency, per_agent, stream))
                elif client == "openai" and round_index >= args.openai_repeat:
                    continue
                else:
                    run = run_baseline(
                        server, client, args.requests, args.concurrency, stream, args.baseline_loop
                    )
                runs.setdefault((client, mode), []).append(run)
        print(f"  round {round_index + 1}/{args.repeat} done", file=sys.stderr, flush=True)

    names = {
        "batchbench": "batchbench agent",
        "openai": f"openai AsyncOpenAI ({args.baseline_loop})",
        "aiohttp": f"aiohttp + json ({args.baseline_loop})",
    }
    print()
    print(
        f"Throughput: {per_agent * args.concurrency} requests per run at concurrency "
        f"{args.concurrency} ({args.concurrency} agents x {per_agent} turns; the history grows "
        f"{OUTPUT_TOKENS}+{ENVIRONMENT_TOKENS} tokens a turn), {server.kind} server, "
        f"median of {args.repeat} rounds"
        + (f" ({args.openai_repeat} for openai)" if "openai" in baselines else "")
    )
    print(
        "CPU-s/1000: client CPU while it runs (batchbench: client_health.cpu_seconds on the "
        "benchmark clock; baselines: getrusage(SELF) around the run)"
    )
    print(
        "(whole proc): getrusage(RUSAGE_CHILDREN) of the whole subprocess, start-up included; "
        "server CPU: its share of one core during the run"
    )
    print(HEADER)
    for mode in modes:
        label = "non-stream" if mode == "nonstream" else f"stream {CHUNKS} chunks"
        target = TARGET_NONSTREAM if mode == "nonstream" else TARGET_STREAM
        for client in clients:
            if (client, mode) in runs:
                goal = target if client == "batchbench" else None
                print(row(f"{names[client]}, {label}", runs[client, mode], goal))
    if baselines:
        print("batchbench / baseline (CPU below 1: batchbench is cheaper; req/s above 1: faster)")
        for mode in modes:
            for client in baselines:
                if (client, mode) in runs:
                    label = f"vs {names[client]}, {mode}"
                    print(ratio_line(label, runs["batchbench", mode], runs[client, mode]))


def measure_startup(server: Server, args) -> None:
    flags = ["--agent-plans-jsonl", str(MANIFEST), "--max-active-agents", "2"]
    flags += ["--replay-initial-overhead-tokens", "9", "--replay-turn-overhead-tokens", "35"]
    flags += ["--time-scale", "1000"]
    run_agent(server, flags)  # warm-up
    firsts, remainders, wholes = [], [], []
    for _ in range(args.startup_runs):
        run = run_agent(server, flags, watch=server.can_watch)
        firsts.append(run.extra["first_request_cpu"])
        remainders.append(run.whole_cpu - run.in_run_cpu)
        wholes.append(run.whole_cpu)
    first = median(firsts)
    remainder = median(remainders)
    print()
    print(
        f"Start-up: {MANIFEST.relative_to(REPO)} replayed, median of {args.startup_runs} runs "
        f"(CPU-s, user + system, every thread)"
    )
    print(f"{'measure':<52} {'CPU-s':>8} {'target':>8} {'':>5}")
    if server.can_watch:
        print(
            f"{'process start -> first request (/proc at arrival)':<52} {first:>8.3f} "
            f"{'<= ' + format(TARGET_STARTUP, 'g'):>8} {verdict(first, TARGET_STARTUP):>5}"
        )
    else:
        print("process start -> first request: needs the fast server (--server fast)")
    mark = "" if server.can_watch else verdict(remainder, TARGET_STARTUP)
    goal = "" if server.can_watch else f"<= {TARGET_STARTUP:g}"
    print(f"{'whole process - in-run CPU (upper bound)':<52} {remainder:>8.3f} {goal:>8} {mark:>5}")
    print(f"{'whole process':<52} {median(wholes):>8.3f}")


def measure_agents(server: Server, args) -> None:
    """10,000 agents in one process: the lockstep start the issue measured, then the same
    fleet with ramp-up at an offered rate within what one client core sustains (measured
    first: a saturating run's req/s)."""
    agents = args.agents10k
    sizes = ["--input-tokens", "32", "--output-tokens", "8", "--environment-tokens", "8"]
    limit = raise_nofile()
    if limit < agents + 256:
        print(f"\nwarning: open-files limit {limit} is below {agents} connections", file=sys.stderr)
    saturating = ["--agents", "256", "--tool-invocations", "20", *sizes]
    capacity = median(run_agent(server, saturating).rate for _ in range(args.repeat))
    # Offer a third of what a saturating run sustains: 10,000 agents each on its own
    # connection, with 3 requests each, cost about twice as much per request (connection
    # set-up, a large heap), so this is about two thirds of a core.
    delay_ms = args.agents10k_delay_ms or max(1000, round(agents * 1000 / (capacity / 3)))
    cases = [
        ("lockstep, 1 s delay, --ramp-up 0", ["--tool-call-latency-ms", "1000", "--ramp-up", "0"]),
        (
            f"ramp-up (default), {delay_ms / 1000:g} s delay",
            ["--tool-call-latency-ms", str(delay_ms)],
        ),
    ]
    print()
    print(
        f"One client core's capacity (256 agents x 20 requests, no delay, non-streamed 32/8/8 "
        f"tokens, median of {args.repeat}): {capacity:,.0f} req/s"
    )
    print(
        f"{agents} concurrently active agents, 3 requests each, non-streamed (32/8/8 tokens), "
        f"median of {args.repeat}"
    )
    print(
        f"{'case':<36} {'offered/s':>9} {'lag p50':>8} {'p99 ms':>8} {'max ms':>8} "
        f"{'in-flight':>9} {'req/s':>7} {'dur s':>6} {'CPU/1000':>8} {'server':>6} {'':>5}"
    )
    for label, extra in cases:
        flags = ["--agents", str(agents), "--tool-invocations", "3", *sizes, *extra]
        runs = [run_agent(server, flags, allow_failures=True) for _ in range(args.repeat)]
        delay = float(extra[1]) / 1000.0
        offered = agents / delay
        lag99 = median(r.extra["lag_p99_ms"] for r in runs)
        failed = max(r.failed for r in runs)
        print(
            f"{label:<36} {offered:>9,.0f} {median(r.extra['lag_p50_ms'] for r in runs):>8.2f} "
            f"{lag99:>8.2f} {median(r.extra['lag_max_ms'] for r in runs):>8.1f} "
            f"{median(r.extra['peak_in_flight'] for r in runs):>9,.0f} "
            f"{median(r.rate for r in runs):>7,.0f} "
            f"{median(r.extra['duration'] for r in runs):>6.1f} "
            f"{median(r.in_run_per_k for r in runs):>8.3f} "
            f"{median(r.server_busy for r in runs) * 100:>5.0f}% "
            f"{verdict(lag99, TARGET_LAG_P99_MS) if not failed else 'FAIL':>5}"
        )
    print(
        "(offered/s: agents / tool delay once every agent runs; target: lag p99 <= 10 ms when "
        "the offered rate is within one core's capacity)"
    )


# ---------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=4000, help="requests per run (R)")
    parser.add_argument("--concurrency", type=int, default=64, help="agents in flight (C)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds; medians are reported")
    parser.add_argument(
        "--only", action="append", choices=CASES, help="run only these cases (repeatable)"
    )
    parser.add_argument("--quick", action="store_true", help="a fast smoke run")
    parser.add_argument(
        "--server",
        choices=("fast", "sim"),
        default="fast",
        help="zero-latency server: the canned one, or batchbench sim --speed 0",
    )
    parser.add_argument(
        "--sse-writes",
        type=int,
        default=1,
        help="fast server: writes per SSE reply (default 1; 52 = one event per write)",
    )
    parser.add_argument("--startup-runs", type=int, default=5)
    parser.add_argument("--agents10k", type=int, default=10000, help="agents of that case")
    parser.add_argument(
        "--agents10k-delay-ms",
        type=int,
        default=0,
        help="tool delay of the ramp-up case (default: offer a third of the measured capacity)",
    )
    parser.add_argument(
        "--baseline-loop",
        choices=("asyncio", "uvloop"),
        default="asyncio",
        help="event loop of the baseline clients (default: asyncio, as they ship)",
    )
    parser.add_argument("--no-openai", action="store_true", help="skip the openai baseline")
    parser.add_argument(
        "--openai-repeat",
        type=int,
        default=1,
        help="rounds with the openai baseline (default 1: it is slow; the others run every round)",
    )
    # The baseline client itself (internal).
    parser.add_argument("--child", choices=("openai", "aiohttp"), help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--stream", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--child-out", help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.child:
        return child_main(args)
    if args.quick:
        args.requests, args.concurrency, args.repeat = 1000, 32, 1
        args.startup_runs, args.agents10k = 2, 1000
    cases = set(args.only or CASES)
    raise_nofile()
    baselines: list[str] = []
    if "baselines" in cases:
        if args.no_openai:
            pass
        elif openai_available():
            baselines.append("openai")
        else:
            print("openai is not installed: skipping the AsyncOpenAI baseline", file=sys.stderr)
        baselines.append("aiohttp")
    server = Server(args.server, args.sse_writes)
    started = time.perf_counter()
    try:
        print(
            f"batchbench client benchmark: {server.kind} zero-latency server at {server.url}, "
            f"{os.cpu_count()} CPUs, python {sys.version.split()[0]}"
        )
        measure_throughput(server, args, cases, baselines)
        if "startup" in cases:
            measure_startup(server, args)
        if "agents10k" in cases:
            measure_agents(server, args)
    finally:
        server.stop()
    print(f"\n(benchmark took {time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
