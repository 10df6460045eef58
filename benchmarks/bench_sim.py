"""Requests/s of ``batchbench sim`` in zero-latency mode, driven by a closed-loop client.

Run: ``python -m benchmarks.bench_sim [--requests R] [--concurrency C] [--repeat K]
[--reply-text model|exact] [--chat-template NAME]``.
The simulator runs in its own process (``--speed 0``, one event loop, so one core); the
client, in this process, keeps C requests in flight on one aiohttp session and sends R
requests per round. Each round reports the achieved requests/s (bound by this Python
client when it saturates its core) and the simulator's CPU seconds per 1000 requests
(from /proc, so the client's cost is excluded); the simulator's one-core capacity is
1000 / that. The table gives the median of K rounds. Workloads: a one-message prompt
(non-streamed and streamed) and growing conversations of ``--turns`` turns (the history
is re-sent each turn, as agents do).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import orjson

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process, read from /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def start_sim(extra: list[str]) -> tuple[subprocess.Popen, str]:
    command = [
        sys.executable,
        "-c",
        "import sys; from batchbench.cli.main import run; sys.exit(run(sys.argv[1:]))",
    ]
    process = subprocess.Popen(
        [*command, "sim", "--port", "0", "--speed", "0", *extra],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    if "listening on" not in line:
        process.kill()
        raise SystemExit(f"simulator did not start: {line!r}")
    return process, line.split()[-1]


def single_prompt_body(index: int, stream: bool) -> bytes:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": f"request {index} says hello to the simulator"}],
        "max_tokens": 16,
        "min_tokens": 16,
        "user": f"bench-{index % 64}",
    }
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return orjson.dumps(body)


async def drive(url: str, requests: int, concurrency: int, stream: bool, turns: int) -> None:
    """Closed loop: each worker sends its share; with turns > 1 it grows a conversation."""
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        endpoint = url + "/v1/chat/completions"
        headers = {"Content-Type": "application/json"}

        async def worker(worker_id: int, count: int) -> None:
            messages = [{"role": "user", "content": f"agent {worker_id} starts a task now"}]
            for k in range(count):
                if turns > 1:
                    if k % turns == 0:
                        messages = messages[:1]
                    body = {"model": "m", "messages": messages, "max_tokens": 32, "min_tokens": 32}
                    if stream:
                        body["stream"] = True
                        body["stream_options"] = {"include_usage": True}
                    data = orjson.dumps(body)
                else:
                    data = single_prompt_body(worker_id * count + k, stream)
                async with session.post(endpoint, data=data, headers=headers) as response:
                    payload = await response.read()
                    if response.status != 200:
                        raise SystemExit(f"simulator answered {response.status}: {payload[:200]!r}")
                if turns > 1 and not stream:
                    reply = orjson.loads(payload)["choices"][0]["message"]
                    messages.append({"role": "assistant", "content": reply["content"]})
                    messages.append({"role": "tool", "content": "ok " * 40})

        share, extra = divmod(requests, concurrency)
        await asyncio.gather(
            *(worker(i, share + (1 if i < extra else 0)) for i in range(concurrency))
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=6000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--turns", type=int, default=8, help="turns per grown conversation")
    parser.add_argument(
        "--reply-text",
        choices=("model", "exact"),
        default="model",
        help="the simulator's reply text (its --reply-text; default %(default)s)",
    )
    parser.add_argument(
        "--chat-template", default="chatml", help="the simulator's --chat-template (chatml)"
    )
    args = parser.parse_args(argv)
    try:
        import uvloop

        loop_factory = uvloop.new_event_loop
    except ImportError:
        loop_factory = None

    cases = [
        ("single prompt, JSON", False, 1),
        ("single prompt, SSE (16 chunks)", True, 1),
        (f"{args.turns}-turn conversations, JSON", False, args.turns),
    ]
    process, url = start_sim(
        ["--reply-text", args.reply_text, "--chat-template", args.chat_template]
    )
    try:
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            runner.run(drive(url, 200, args.concurrency, False, 1))  # warm up
            print(
                f"batchbench sim --speed 0 --reply-text {args.reply_text} --chat-template "
                f"{args.chat_template}, {args.requests} requests per round at concurrency "
                f"{args.concurrency}, median of {args.repeat} rounds"
            )
            print("achieved req/s is bound by this Python client; capacity = 1000 / sim CPU-s")
            print(f"{'workload':<36} {'req/s':>9} {'sim CPU-s/1000 req':>19} {'capacity':>9}")
            for name, stream, turns in cases:
                rates, costs = [], []
                for _ in range(args.repeat):
                    cpu0, t0 = process_cpu_seconds(process.pid), time.perf_counter()
                    runner.run(drive(url, args.requests, args.concurrency, stream, turns))
                    elapsed = time.perf_counter() - t0
                    cpu = process_cpu_seconds(process.pid) - cpu0
                    rates.append(args.requests / elapsed)
                    costs.append(cpu / args.requests * 1000)
                rate, cost = statistics.median(rates), statistics.median(costs)
                capacity = 1000 / cost if cost else float("inf")
                print(f"{name:<36} {rate:>9,.0f} {cost:>19.3f} {capacity:>9,.0f}")
    finally:
        process.terminate()
        process.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
