"""``batchbench record`` end to end (issue 26, item 4): a recorded run exports and replays.

The real simulator (zero latency) is the upstream; ``batchbench record`` runs as a child
process in front of it; ``batchbench agent`` drives a small v2 manifest through the proxy:
three trajectories sharing a tool definition and a system prompt, conversations that grow
with the server's live replies, tool calls and results, a compaction (``reset_before``
keeping the task) and tool delays of 50-140 ms, two requests streamed. The recording goes
through ``batchbench export-plans``, and the manifest it gives back must carry what the run
did: every request's prompt and output tokens as the server counted them, the delays
within 5 ms, the same sharing of blocks between trajectories, the same growth, live
replies and reset; replayed on the simulator with ``--calibrate`` it is prompt-exact.

The original run sends its blocks as written (``--no-prompt-correction``): a corrected
block's text is kept only until a reset, so after the compaction the task would come back
with other bytes, which a real agent re-sending its task would not do.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest

from batchbench.cli.agent import main as agent_main
from batchbench.cli.export_plans import run as export_main
from batchbench.drive.simlaunch import SimProcess, sim_command

# One recorded run serves every test here, and one of them bounds its delays to 5 ms:
# parallel workers on the same cores would stretch them, so the module runs in the serial pass.
pytestmark = [pytest.mark.serial, pytest.mark.native_pass_only]

ROOT = Path(__file__).resolve().parents[1]
LISTENING = "batchbench record listening on "
API_KEY = "sk-e2e-distinctive-secret-7f3a"
OVERHEAD = 40  # the original manifest's framing allowance; the export measures its own

Block = dict[str, Any]


def block(seed: str, tokens: int, role: str, live: bool = False) -> Block:
    found: Block = {"seed": seed, "tokens": tokens, "role": role}
    if live:
        found["live"] = True
    return found


def request(
    blocks: list[Block], output: int, delay: int = 0, reset: bool = False, stream: bool = False
) -> dict[str, Any]:
    found: dict[str, Any] = {
        "prompt_tokens": sum(b["tokens"] for b in blocks) + OVERHEAD,
        "output_tokens": output,
        "overhead_tokens": OVERHEAD,
        "blocks": blocks,
    }
    if delay:
        found["delay_after_ms"] = delay
    if reset:
        found["reset_before"] = True
    if stream:
        found["stream"] = True
    return found


def original_manifest() -> list[dict[str, Any]]:
    """Three trajectories of 3, 4 and 2 requests (their lengths tell them apart)."""
    shared = [block("e2e/tools", 300, "tool_definition"), block("e2e/system", 200, "system")]

    def turn(name: str, n: int, reply: int, call: int, result: int) -> list[Block]:
        return [
            block(f"{name}/reply-{n}", reply, "assistant", live=True),
            block(f"{name}/call-{n}", call, "tool_call"),
            block(f"{name}/result-{n}", result, "tool"),
        ]

    a1 = [*shared, block("a/task", 80, "user")]
    a2 = [*a1, *turn("a", 1, 20, 15, 100)]
    a3 = [*a2, block("a/reply-2", 24, "assistant", live=True), block("a/follow-up", 30, "user")]
    b1 = [*shared, block("b/task", 60, "user")]
    b2 = [*b1, *turn("b", 1, 20, 12, 150)]
    b3 = [*b1, block("b/summary", 40, "user")]  # the compaction: task and a summary
    b4 = [*b3, *turn("b", 3, 18, 10, 80)]
    c1 = [*shared, block("c/task", 50, "user")]
    c2 = [*c1, *turn("c", 1, 16, 14, 60)]
    requests = {
        "a": [request(a1, 20, 60), request(a2, 24, 120, stream=True), request(a3, 16)],
        "b": [
            request(b1, 20, 90),
            request(b2, 18, 50),
            request(b3, 18, 140, reset=True),
            request(b4, 12),
        ],
        "c": [request(c1, 16, 100, stream=True), request(c2, 20)],
    }
    return [
        {"schema_version": 2, "trajectory_id": name, "requests": plan}
        for name, plan in requests.items()
    ]


def lines(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def write_lines(path: Path, objects: list[dict[str, Any]]) -> None:
    path.write_bytes(b"".join(orjson.dumps(item) + b"\n" for item in objects))


def rfc3339(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Recorder:
    """``batchbench record`` in a child process, stopped with SIGINT like a terminal's
    Ctrl+C; ``out`` and ``err`` hold everything it printed once stopped."""

    def __init__(self, upstream: str, rows: Path) -> None:
        command = [
            sys.executable, "-m", "batchbench", "record", "--upstream", upstream,
            "--listen", "127.0.0.1:0", "--rows-jsonl", str(rows),
        ]  # fmt: skip
        self.process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        assert self.process.stdout is not None
        first = self.process.stdout.readline()
        if not first.startswith(LISTENING):
            self.process.kill()
            _, err = self.process.communicate(timeout=10)
            pytest.fail(f"batchbench record did not start: {first!r} {err[-2000:]}")
        self.url = first[len(LISTENING) :].strip()
        self.out = first
        self.err = ""

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
        out, self.err = self.process.communicate(timeout=30)
        self.out += out
        return self.process.returncode


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> dict[str, Any]:
    """The run through the proxy, its recording exported: what every test reads."""
    work = tmp_path_factory.mktemp("record-e2e")
    plans, rows, exported = work / "m1.jsonl", work / "rows.jsonl", work / "m2.jsonl"
    events, summary = work / "requests.jsonl", work / "summary.json"
    write_lines(plans, original_manifest())
    before = datetime.now(UTC) - timedelta(seconds=1)
    with SimProcess(sim_command("deepseek-v3", None, "--speed 0")) as sim:
        recorder = Recorder(sim.url, rows)
        try:
            status = agent_main(
                [
                    "--agent-plans-jsonl", str(plans), "--host", recorder.url,
                    "--api-key", API_KEY, "--model", "batchbench-sim",
                    "--tokenizer-model", "deepseek-v3", "--no-prompt-correction",
                    "--no-preflight", "--max-active-agents", "3", "--seed", "5",
                    "--no-progress", "--request-events-jsonl", str(events),
                    "--results-json", str(summary),
                    # the recording holds the run's requests only, streamed where the
                    # manifest says: no calibration probes, plain JSON otherwise
                    "--no-stream", "--no-calibrate",
                ]
            )  # fmt: skip
        finally:
            stopped = recorder.stop()
    after = datetime.now(UTC) + timedelta(seconds=1)
    assert status == 0
    assert (stopped, recorder.err) == (0, "")
    exit_status = export_main(
        [
            "--rows-jsonl", str(rows), "--start", rfc3339(before), "--end", rfc3339(after),
            "--output", str(exported),
        ]
    )  # fmt: skip
    assert exit_status == 0
    served: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for event in sorted(lines(events), key=lambda e: (e["trajectory_id"], e["invocation"])):
        served[event["trajectory_id"]].append(event)
    by_length = {len(plan["requests"]): plan for plan in lines(exported)}
    return {
        "work": work,
        "rows_path": rows,
        "rows": lines(rows),
        "recorder": recorder,
        "original": {plan["trajectory_id"]: plan for plan in original_manifest()},
        "served": dict(served),
        # Original trajectory -> its exported trajectory (the lengths 3, 4 and 2 differ).
        "exported": {"a": by_length.get(3), "b": by_length.get(4), "c": by_length.get(2)},
        "exported_path": exported,
    }


def test_one_row_per_request_and_the_closing_line(recorded):
    rows, recorder = recorded["rows"], recorded["recorder"]
    assert len(rows) == 9
    # Ids follow arrival; rows are written as requests finish, in whatever order they do.
    assert sorted(row["correlation_id"] for row in rows) == [f"{n:012d}" for n in range(9)]
    assert recorder.out.splitlines() == [
        f"{LISTENING}{recorder.url}",
        f"recorded 9 requests to {recorded['rows_path']}",
    ]
    assert {row["model"] for row in rows} == {"batchbench-sim"}
    principals = {row["principal_id"] for row in rows}
    assert len(principals) == 1
    (principal,) = principals
    assert principal.startswith("key-") and len(principal) == 20
    key_file = recorded["rows_path"].with_name("rows.jsonl.key")
    assert key_file.stat().st_mode & 0o777 == 0o600
    key = key_file.read_text().strip()
    assert len(key) == 64
    text = recorded["rows_path"].read_text()
    assert API_KEY not in text and key not in text


def test_the_export_has_the_server_counted_tokens_of_every_request(recorded):
    exported, served = recorded["exported"], recorded["served"]
    assert sorted(exported) == sorted(served) == ["a", "b", "c"]
    for name, plan in exported.items():
        assert plan is not None, name
        got = [(r["prompt_tokens"], r["output_tokens"]) for r in plan["requests"]]
        want = [(e["prompt_tokens"], e["completion_tokens"]) for e in served[name]]
        assert got == want, name
    # The original outputs are what the simulator generated: nothing was lost on the way.
    for name, plan in recorded["original"].items():
        assert [e["completion_tokens"] for e in served[name]] == [
            r["output_tokens"] for r in plan["requests"]
        ]


def test_delays_are_the_runs_tool_delays_within_5_ms(recorded):
    """Each exported delay is within 5 ms of the plan's ``delay_after_ms`` and of the gap
    the client actually left, from the end of a reply to the start of the next request
    (its request events): the proxy's clock adds nothing the run did not do."""
    for name, plan in recorded["original"].items():
        planned = [r.get("delay_after_ms", 0) for r in plan["requests"]]
        served = recorded["served"][name]
        gaps = [
            (after["start_offset_seconds"] - before["start_offset_seconds"]) * 1000
            - before["latency_seconds"] * 1000
            for before, after in itertools.pairwise(served)
        ] + [0.0]
        exported = [r.get("delay_after_ms", 0) for r in recorded["exported"][name]["requests"]]
        assert len(exported) == len(planned) == len(gaps)
        assert all(abs(e - p) <= 5 for e, p in zip(exported, planned, strict=True)), (
            name,
            exported,
            planned,
        )
        assert all(abs(e - g) <= 5 for e, g in zip(exported, gaps, strict=True)), (
            name,
            exported,
            gaps,
        )


def test_growth_live_replies_resets_and_streams_come_back(recorded):
    for name, plan in recorded["original"].items():
        exported = recorded["exported"][name]["requests"]
        original = plan["requests"]
        assert [[b["role"] for b in r["blocks"]] for r in exported] == [
            [b["role"] for b in r["blocks"]] for r in original
        ]
        assert [r.get("reset_before", False) for r in exported] == [
            r.get("reset_before", False) for r in original
        ]
        assert [r.get("stream") is True for r in exported] == [
            r.get("stream", False) for r in original
        ]
        # The reply a request grows by is live in both; earlier replies reuse its text.
        seen: set[str] = set()
        new_live = []
        for r in original:
            if r.get("reset_before"):
                seen.clear()
            new_live.append(
                [k for k, b in enumerate(r["blocks"]) if b.get("live") and b["seed"] not in seen]
            )
            seen.update(b["seed"] for b in r["blocks"])
        assert [[k for k, b in enumerate(r["blocks"]) if b.get("live")] for r in exported] == (
            new_live
        )
    assert recorded["exported"]["b"]["requests"][2]["reset_before"] is True


def test_exported_seeds_correspond_one_to_one_to_the_original_seeds(recorded):
    """A block's chain hash names its content and everything before it; in this manifest
    each seed always follows the same blocks, so seeds and hashes pair one to one, and the
    hashes shared by several trajectories are those of the shared tools and system prompt."""
    pairs = set()
    users: dict[str, set[str]] = defaultdict(set)
    for name, plan in recorded["original"].items():
        exported = recorded["exported"][name]["requests"]
        for mine, theirs in zip(plan["requests"], exported, strict=True):
            for a, b in zip(mine["blocks"], theirs["blocks"], strict=True):
                pairs.add((a["seed"], b["seed"]))
                users[b["seed"]].add(name)
    assert len({a for a, _ in pairs}) == len({b for _, b in pairs}) == len(pairs) == 20
    shared = {seed for seed, names in users.items() if len(names) > 1}
    assert {a for a, b in pairs if b in shared} == {"e2e/tools", "e2e/system"}
    assert all(users[seed] == {"a", "b", "c"} for seed in shared)
    assert all(len(seed) == 32 and int(seed, 16) >= 0 for seed in users)


def test_the_export_replays_prompt_exact_on_the_simulator(recorded, capsys):
    work = recorded["work"]
    events, summary = work / "replay-requests.jsonl", work / "replay-summary.json"
    status = agent_main(
        [
            "--agent-plans-jsonl", str(recorded["exported_path"]), "--sim",
            "--sim-args", "--speed 0", "--calibrate", "--max-active-agents", "3",
            "--seed", "9", "--no-progress", "--request-events-jsonl", str(events),
            "--results-json", str(summary),
        ]
    )  # fmt: skip
    assert status == 0
    replayed = lines(events)
    document = json.loads(summary.read_text())
    assert [e["status"] for e in replayed] == ["ok"] * 9
    assert [e["prompt_drift"] for e in replayed] == [0] * 9
    assert [e["output_drift"] for e in replayed] == [0] * 9
    assert document["fidelity"]["prompt"]["exact"] == 9
    assert "Prompt fidelity: 9/9 exact (100.0%)" in capsys.readouterr().out
