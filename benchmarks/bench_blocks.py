"""Client cost of block requests (schema v2) against growth requests (schema v1).

Run from the repository root: ``python -m benchmarks.bench_blocks [--agents A]
[--turns T] [--repeat N]``.

Two manifests of the same shape are written: A trajectories of T requests whose prompts
grow by a reply and a tool result each turn. The v1 manifest is token counts only; the v2
manifest spells every request out in blocks (a tool definition and a system prompt shared
by every trajectory, the task, then per turn a live reply, a tool call and its result).
The real ``batchbench-agent`` replays each against the embedded simulator in
zero-latency mode (``--sim --sim-args "--speed 0"``), and the agent-clock CPU
(``client_health.cpu_seconds`` of ``--results-json``) per 1000 requests is compared:

* ``v1 growth``: the growth model (one serialized prefix per conversation);
* ``v2 blocks``: every request built from its blocks, and, since ``--sim`` tells the
  client the chat template, counted in it to size the absorbing block (ChatML renders
  each message on its own: only the messages a request adds are built and counted);
* ``v2 blocks, no correction``: blocks sent as written (``--no-prompt-correction``), the
  cost of assembly alone.

Every figure is the median of N rounds run side by side; ratios hold on a noisy machine,
absolute times drift. The last column is the median of each round's own ratio to the
round's growth run, the steadier figure when the load drifts between rounds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

SHARED_TOOLS = 600
SHARED_SYSTEM = 400
TASK = 200
REPLY = 40
CALL = 30
RESULT = 120
OVERHEAD = 20


def manifests(directory: Path, agents: int, turns: int) -> tuple[Path, Path]:
    """(v1, v2) manifests of the same prompt sizes."""
    v1_lines, v2_lines = [], []
    for agent in range(agents):
        blocks = [
            {"seed": "bench/tools", "tokens": SHARED_TOOLS, "role": "tool_definition"},
            {"seed": "bench/system", "tokens": SHARED_SYSTEM, "role": "system"},
            {"seed": f"bench/{agent}/task", "tokens": TASK, "role": "user"},
        ]
        v1_requests, v2_requests = [], []
        for turn in range(turns):
            if turn:
                blocks = [
                    *blocks,
                    {
                        "seed": f"bench/{agent}/reply-{turn}",
                        "tokens": REPLY,
                        "role": "assistant",
                        "live": True,
                    },
                    {"seed": f"bench/{agent}/call-{turn}", "tokens": CALL, "role": "tool_call"},
                    {"seed": f"bench/{agent}/result-{turn}", "tokens": RESULT, "role": "tool"},
                ]
            prompt = sum(block["tokens"] for block in blocks) + OVERHEAD
            v1_requests.append({"prompt_tokens": prompt, "output_tokens": REPLY})
            v2_requests.append(
                {
                    "prompt_tokens": prompt,
                    "output_tokens": REPLY,
                    "overhead_tokens": OVERHEAD,
                    "blocks": blocks,
                }
            )
        ident = f"agent-{agent}"
        v1_lines.append({"schema_version": 1, "trajectory_id": ident, "requests": v1_requests})
        v2_lines.append({"schema_version": 2, "trajectory_id": ident, "requests": v2_requests})
    paths = []
    for name, lines in (("v1.jsonl", v1_lines), ("v2.jsonl", v2_lines)):
        path = directory / name
        path.write_text("".join(json.dumps(line) + "\n" for line in lines))
        paths.append(path)
    return paths[0], paths[1]


def cpu_per_1000(manifest: Path, extra: list[str], concurrency: int, work: Path) -> float:
    """Agent-clock CPU seconds per 1000 requests of one run."""
    results = work / "results.json"
    command = [
        sys.executable, "-m", "batchbench", "agent", "--agent-plans-jsonl", str(manifest),
        "--sim", "--sim-args", "--speed 0", "--max-active-agents", str(concurrency),
        "--seed", "1", "--no-progress", "--results-json", str(results), *extra,
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"run failed ({done.returncode}): {done.stderr.strip()[-500:]}")
    document = json.loads(results.read_text())
    requests = document["metrics"]["successful_requests"]
    return document["client_health"]["cpu_seconds"] / requests * 1000.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=200)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    cases = {"v1 growth": [], "v2 blocks": [], "v2 blocks, no correction": []}
    with tempfile.TemporaryDirectory() as name:
        work = Path(name)
        v1, v2 = manifests(work, args.agents, args.turns)
        for _ in range(args.repeat):
            cases["v1 growth"].append(cpu_per_1000(v1, [], args.concurrency, work))
            cases["v2 blocks"].append(cpu_per_1000(v2, [], args.concurrency, work))
            cases["v2 blocks, no correction"].append(
                cpu_per_1000(v2, ["--no-prompt-correction"], args.concurrency, work)
            )
    base = statistics.median(cases["v1 growth"])
    print(
        f"{args.agents} trajectories x {args.turns} requests, {args.concurrency} active, "
        f"median of {args.repeat} (agent-clock CPU-s per 1000 requests)"
    )
    print(f"  {'':<26} {'CPU-s':>7}   {'ratio':>6}  {'per round':>9}")
    for label, values in cases.items():
        median = statistics.median(values)
        # Each round's cases ran back to back: the median of the rounds' own ratios holds
        # when the machine's load drifts between rounds.
        paired = statistics.median(v / b for v, b in zip(values, cases["v1 growth"], strict=True))
        print(f"  {label:<26} {median:7.3f}   x{median / base:5.2f}  x{paired:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
