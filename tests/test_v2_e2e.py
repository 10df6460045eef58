"""Block plans (schema v2) end to end: ``batchbench-agent`` on the shipped v2 example.

Dry runs in both admission modes, a live open-loop replay against the embedded simulator
(``--sim``: ChatML template, prefix caching in 16-token blocks, the DeepSeek-V3
tokenizer), the exact request bodies captured by a stub server, and a manifest that mixes
schema v1 and v2 lines replayed against the simulator. The agent runs in-process.
"""

from __future__ import annotations

import collections
import csv
import json
import re
from pathlib import Path

import orjson
import pytest
from stubserver import (
    Recorded,
    Reply,
    Stream,
    StubServer,
    chat_completion,
    delta_chunk,
    sse,
    usage_chunk,
)

from batchbench.cli.agent import main
from batchbench.text.blocks import (
    ROLE_ASSISTANT,
    ROLE_SYSTEM,
    ROLE_TOOL,
    ROLE_TOOL_CALL,
    ROLE_TOOL_DEFINITION,
    ROLE_USER,
    BlockTexts,
    call_id,
    function_name,
    tool_entry,
)
from batchbench.text.chat_templates import load_chat_template
from batchbench.text.promptcount import marked_tokenizer
from batchbench.text.synth import Synthesizer

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "trajectory-replay" / "plans-v2.jsonl"
MANIFEST = [orjson.loads(line) for line in EXAMPLE.read_bytes().splitlines() if line.strip()]
TIMED = re.compile(r"admitted_at_ms=\d+")
DONE = b"data: [DONE]\n\n"
SIM_BLOCK_TOKENS = 16  # the simulator's default KV block size

# The example's planned requests, as the dry run prints them (admission time masked).
DRY_RUN_LINES = [
    "[DRY-RUN] agent=0 invocation=1 input_content_tokens=1200 output_tokens=60 environment_tokens=0 tool_call_latency_ms={a1} trajectory_id=session-a routing_slot=0 admitted_at_ms=* target_prompt_tokens=1224 reset_before=false blocks=3 live_blocks=0",
    "[DRY-RUN] agent=0 invocation=2 input_content_tokens=1550 output_tokens=80 environment_tokens=0 tool_call_latency_ms={a2} trajectory_id=session-a routing_slot=0 admitted_at_ms=* target_prompt_tokens=1590 reset_before=false blocks=6 live_blocks=1 stream=true max_tokens=96",
    "[DRY-RUN] agent=0 invocation=3 input_content_tokens=1680 output_tokens=40 environment_tokens=0 tool_call_latency_ms=0 trajectory_id=session-a routing_slot=0 admitted_at_ms=* target_prompt_tokens=1728 reset_before=false blocks=8 live_blocks=2",
    "[DRY-RUN] agent=1 invocation=1 input_content_tokens=1170 output_tokens=50 environment_tokens=0 tool_call_latency_ms={b1} trajectory_id=session-b routing_slot={slot} admitted_at_ms=* target_prompt_tokens=1194 reset_before=false blocks=3 live_blocks=0",
    "[DRY-RUN] agent=1 invocation=2 input_content_tokens=1370 output_tokens=40 environment_tokens=0 tool_call_latency_ms=0 trajectory_id=session-b routing_slot={slot} admitted_at_ms=* target_prompt_tokens=1410 reset_before=false blocks=6 live_blocks=1",
]


def recorded_starts() -> dict[str, list[int]]:
    """Each trajectory's recorded_start_after_ms values, as the manifest writes them."""
    return {
        t["trajectory_id"]: [r["recorded_start_after_ms"] for r in t["requests"]] for t in MANIFEST
    }


def lines(path: Path) -> list[dict]:
    data = path.read_bytes()
    assert data == b"" or data.endswith(b"\n")
    return [orjson.loads(line) for line in data.splitlines()]


def csv_row(path: Path) -> dict[str, str]:
    with open(path, newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 1
    return rows[0]


def run(capsys, tmp_path: Path, *args: str, plans: Path = EXAMPLE) -> dict:
    """Run in-process with every output file; returns what the run printed and wrote."""
    files = {
        "summary": tmp_path / "summary.json",
        "csv": tmp_path / "results.csv",
        "events": tmp_path / "events.jsonl",
        "requests": tmp_path / "requests.jsonl",
    }
    argv = [
        "--agent-plans-jsonl", str(plans),
        "--no-progress",
        "--results-json", str(files["summary"]),
        "--results-csv", str(files["csv"]),
        "--agent-events-jsonl", str(files["events"]),
        *args,
    ]  # fmt: skip
    if "--dry-run" not in args:
        argv += ["--request-events-jsonl", str(files["requests"])]
    status = main(argv)
    captured = capsys.readouterr()
    assert status == 0, captured.out[-2000:] + captured.err[-2000:]
    return {
        "out": captured.out.splitlines(),
        "err": captured.err,
        "summary": json.loads(files["summary"].read_text()),
        "csv": csv_row(files["csv"]),
        "events": {e["trajectory_id"]: e for e in lines(files["events"])},
        "requests": lines(files["requests"]) if files["requests"].exists() else [],
    }


def line(out: list[str], prefix: str) -> str:
    found = [text for text in out if text.startswith(prefix)]
    assert len(found) == 1, (prefix, found)
    return found[0]


@pytest.fixture(scope="module")
def texts(deepseek) -> BlockTexts:
    return BlockTexts(Synthesizer.prepare(deepseek))


# ---------------------------------------------------------------------------------------
# Dry runs


def test_dry_run_closed_loop_one_slot(capsys, tmp_path):
    result = run(
        capsys, tmp_path, "--dry-run", "--tokenizer-model", "deepseek-v3",
        "--max-active-agents", "1", "--seed", "3",
    )  # fmt: skip
    out = result["out"]
    assert result["err"] == ""  # the example's prompts match their blocks: no warning
    dry = [TIMED.sub("admitted_at_ms=*", text) for text in out if text.startswith("[DRY-RUN]")]
    # Closed loop: unscaled delays, and session-b inherits slot 0 when session-a is done.
    assert dry == [text.format(a1=300, a2=200, b1=100, slot=0) for text in DRY_RUN_LINES]
    assert line(out, "Agents: ") == "Agents: 2 completed / 2 total"
    assert line(out, "Rolling admission: ").startswith("Rolling admission: 1 maximum active; ")
    assert not any(text.startswith("Open-loop admission: ") for text in out)  # closed loop
    assert line(out, "Tool invocations: ") == (
        "Tool invocations: 5 planned; requests 0 (success 0, failure 0)"
    )
    assert not any(text.startswith("Live block fallbacks") for text in out)
    events = result["events"]
    assert sorted(events) == ["session-a", "session-b"]
    for ident, event in events.items():
        assert event["completed"] is True and event["routing_slot"] == 0
        assert event["scheduled_at_seconds"] == 0.0  # closed loop ignores start_after_ms
        assert event["recorded_start_after_ms"] == recorded_starts()[ident]
    metrics = result["summary"]["metrics"]
    assert metrics["max_active_agents"] == 1 and metrics["completed_agents"] == 2
    assert metrics["live_block_fallbacks"] == 0  # a dry run resolves no live block
    assert metrics["trajectory_schema_version"] == 2
    assert result["csv"]["trajectory_schema_version"] == "2"
    assert result["csv"]["admission_mode"] == "closed-loop"


def test_dry_run_open_loop_scaled_offsets(capsys, tmp_path):
    result = run(
        capsys, tmp_path, "--dry-run", "--tokenizer-model", "deepseek-v3",
        "--admission", "open-loop", "--time-scale", "1000",
    )  # fmt: skip
    out = result["out"]
    events = result["events"]
    a, b = events["session-a"], events["session-b"]
    dry = [TIMED.sub("admitted_at_ms=*", text) for text in out if text.startswith("[DRY-RUN]")]
    # Delays divided by 1000, truncated to whole ms; session-b takes the lowest free slot.
    assert dry == [text.format(a1=0, a2=0, b1=0, slot=b["routing_slot"]) for text in DRY_RUN_LINES]
    assert (a["scheduled_at_seconds"], b["scheduled_at_seconds"]) == (0.0, 0.00075)
    assert b["admitted_at_seconds"] >= 0.00075
    assert a["completed"] and b["completed"]
    assert [a["recorded_start_after_ms"], b["recorded_start_after_ms"]] == [
        [0, 1420, 2950],
        [750, 2100],
    ]  # the recorded offsets are carried, not used: scheduling follows start_after_ms
    metrics = result["summary"]["metrics"]
    assert (metrics["completed_agents"], metrics["planned_tool_invocations"]) == (2, 5)
    assert (metrics["late_admissions"], metrics["live_block_fallbacks"]) == (0, 0)
    assert metrics["admission_mode"] == "open-loop" and metrics["time_scale"] == 1000.0
    lag = b["admitted_at_seconds"] - b["scheduled_at_seconds"]
    assert metrics["max_admission_lag_ms"] >= lag * 1000.0 - 1e-9
    assert metrics["total_duration_seconds"] >= 0.00075
    assert line(out, "Agents: ") == "Agents: 2 completed / 2 total"


# ---------------------------------------------------------------------------------------
# Live against the simulator


def shared_prefix_cache_hit(deepseek, texts) -> int:
    """The tokens session-b's first prompt shares with session-a's, as the simulator's
    ChatML renders them, floored to whole cache blocks."""
    template = load_chat_template("chatml", deepseek)
    tokenizer = marked_tokenizer(deepseek, template.markers)
    tools = [
        tool_entry(
            "tools/editor-shell-v1",
            texts.make("tools/editor-shell-v1", 600, ROLE_TOOL_DEFINITION).text,
        )
    ]
    system = {
        "role": "system",
        "content": texts.make("prompt/coding-agent-v1", 420, ROLE_SYSTEM).text,
    }

    def ids(seed: str, tokens: int) -> list[int]:
        user = {"role": "user", "content": texts.make(seed, tokens, ROLE_USER).text}
        rendered = template.render([system, user], True, tools)
        return tokenizer.encode(rendered, add_special_tokens=False).ids

    a, b = ids("session-a/task", 180), ids("session-b/task", 150)
    common = next(k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
    return common // SIM_BLOCK_TOKENS * SIM_BLOCK_TOKENS


@pytest.mark.slow
def test_live_open_loop_replay_against_the_simulator(capsys, tmp_path, deepseek, texts):
    # Modelled time runs 4x faster than the default serving model, so that session-a's
    # first request (about 0.7 s at the default speed) is surely done when session-b starts.
    result = run(
        capsys, tmp_path, "--sim", "--sim-args", "--speed 4", "--admission", "open-loop",
        "--seed", "5",
        # the manifest's own "stream": true is the one streamed request; nothing is sent
        # before the first request (no calibration probes)
        "--no-stream", "--no-calibrate",
    )  # fmt: skip
    out = result["out"]
    events = result["events"]
    a, b = events["session-a"], events["session-b"]
    assert a["completed"] and b["completed"]
    assert (a["requests"], a["successful_requests"], b["requests"], b["successful_requests"]) == (
        3, 3, 2, 2,
    )  # fmt: skip
    # Open loop at time scale 1: session-b is due 0.75 s after the clock starts.
    assert (a["scheduled_at_seconds"], b["scheduled_at_seconds"]) == (0.0, 0.75)
    assert b["admitted_at_seconds"] >= 0.75  # never before its due time
    assert a["recorded_start_after_ms"] == [0, 1420, 2950]
    assert b["recorded_start_after_ms"] == [750, 2100]

    requests = {(r["trajectory_id"], r["invocation"]): r for r in result["requests"]}
    assert sorted(requests) == [
        ("session-a", 1), ("session-a", 2), ("session-a", 3), ("session-b", 1), ("session-b", 2),
    ]  # fmt: skip
    assert all(r["status"] == "ok" for r in requests.values())
    a1, b1 = requests["session-a", 1], requests["session-b", 1]
    # Session-a's first request had finished when session-b's started (the precondition of
    # the cache hit below: everything session-a sent was in the simulator's cache).
    assert a1["start_offset_seconds"] + a1["latency_seconds"] <= b1["start_offset_seconds"]
    assert b1["start_offset_seconds"] >= 0.75
    assert a1["cached_tokens"] == 0  # nothing was sent before it
    # Session-b's first prompt starts like session-a's: the tools block (rendered by ChatML
    # as a first system message), the shared system prompt and the "<|im_start|>user\n"
    # marker: 1053 tokens before the two task texts differ. The simulator credits whole
    # 16-token blocks: 65 of them, 1040 tokens.
    assert b1["cached_tokens"] == 1040
    assert shared_prefix_cache_hit(deepseek, texts) == 1040

    # The manifest's output cap and streaming reach the server.
    a2 = requests["session-a", 2]
    assert a2["ttft_seconds"] is not None  # the one streamed request
    assert all(r["ttft_seconds"] is None for key, r in requests.items() if key != ("session-a", 2))
    assert 80 <= a2["completion_tokens"] <= 96  # min_tokens 80, max_tokens 96
    for key, r in requests.items():
        if key != ("session-a", 2):
            assert r["completion_tokens"] == r["planned_output_tokens"], key

    # Every live block had a reply to take: no fallback, and no fallback line.
    assert not any(text.startswith("Live block fallbacks") for text in out)
    metrics = result["summary"]["metrics"]
    assert metrics["live_block_fallbacks"] == 0
    assert result["csv"]["live_block_fallbacks"] == "0"
    assert metrics["trajectory_schema_version"] == 2

    # Prompt fidelity: every usage.prompt_tokens equals its manifest prompt_tokens.
    assert [(key, r["prompt_tokens"]) for key, r in sorted(requests.items())] == [
        (key, r["target_prompt_tokens"]) for key, r in sorted(requests.items())
    ]
    assert line(out, "Prompt fidelity: ") == (
        "Prompt fidelity: 5/5 exact (100.0%), mean |drift| 0.00 tokens, max 0"
    )
    assert line(out, "Agents: ") == "Agents: 2 completed / 2 total"
    assert line(out, "Tool invocations: ") == (
        "Tool invocations: 5 planned; requests 5 (success 5, failure 0)"
    )
    assert line(out, "Open-loop admission: ").startswith("Open-loop admission: 0 late admissions")


# ---------------------------------------------------------------------------------------
# The bodies sent, captured by a stub server


def replier():
    """A handler with fixed replies by trajectory (user tag) and turn: "<tag> reply <k>";
    the first reply of each trajectory also carries reasoning and a model tool call (which
    the replay drops). A trajectory's requests come one after another, so turns count."""
    turns: collections.Counter[str] = collections.Counter()

    def reply(recorded: Recorded):
        body = recorded.json()
        tag = body["user"]
        turns[tag] += 1
        turn = turns[tag]
        content = f"{tag} reply {turn}"
        if body.get("stream"):
            return Stream(
                [
                    (0, sse(delta_chunk(content[:4]))),
                    (0, sse(delta_chunk(content[4:]))),
                    (0, sse(usage_chunk(10, 3))),
                    (0, DONE),
                ]
            )
        message = {"role": "assistant", "content": content}
        if turn == 1:
            message["reasoning_content"] = f"thinking {tag}"
            message["tool_calls"] = [
                {"id": "model", "type": "function", "function": {"name": "x", "arguments": "{}"}}
            ]
        return Reply(body=chat_completion(message=message, prompt_tokens=10, completion_tokens=3))

    return reply


@pytest.fixture
def stub():
    with StubServer() as server:
        yield server


def capture(
    capsys, tmp_path: Path, stub: StubServer, seed: str, plans: Path = EXAMPLE
) -> tuple[dict[tuple[str, int], bytes], list[str]]:
    """One closed-loop run without prompt correction (the stub's counts are canned): the
    bodies by (user tag, turn), and the console lines."""
    stub.clear()
    stub.handler = replier()
    status = main(
        [
            "--host", stub.url, "--agent-plans-jsonl", str(plans),
            "--tokenizer-model", "deepseek-v3", "--model", "m", "--no-preflight",
            "--no-progress", "--no-prompt-correction", "--user-prefix", "t", "--seed", seed,
            "--results-csv", str(tmp_path / f"results-{seed}.csv"),
            "--no-stream", "--no-calibrate",  # the stub's canned bodies, the run's requests
        ]
    )  # fmt: skip
    captured = capsys.readouterr()
    assert status == 0, captured.out[-2000:]
    bodies: dict[tuple[str, int], bytes] = {}
    for recorded in stub.requests:
        tag = recorded.json()["user"]
        turn = 1 + sum(1 for key in bodies if key[0] == tag)
        bodies[tag, turn] = recorded.body
    return bodies, captured.out.splitlines()


def test_captured_bodies_of_the_example(capsys, tmp_path, stub, texts):
    bodies, _ = capture(capsys, tmp_path, stub, "1")
    assert sorted(bodies) == [("t-0", 1), ("t-0", 2), ("t-0", 3), ("t-1", 1), ("t-1", 2)]
    parsed = {key: orjson.loads(body) for key, body in bodies.items()}

    # The shared tool definition and system prompt: byte-identical in both trajectories.
    tool_text = texts.make("tools/editor-shell-v1", 600, ROLE_TOOL_DEFINITION).text
    tools = b'"tools":' + orjson.dumps([tool_entry("tools/editor-shell-v1", tool_text)])
    system = {
        "role": "system",
        "content": texts.make("prompt/coding-agent-v1", 420, ROLE_SYSTEM).text,
    }
    system_bytes = b'"messages":[' + orjson.dumps(system) + b","
    for key, body in bodies.items():
        assert tools in body, key
        assert system_bytes in body, key
    assert parsed["t-0", 1]["tools"] == parsed["t-1", 1]["tools"]
    assert parsed["t-0", 1]["tools"][0]["function"]["name"] == function_name(
        "tools/editor-shell-v1"
    )

    # Session-a, request 2: the first reply (normalized: its model tool call dropped) is the
    # live assistant message, and the planned tool call hangs on it.
    call = {
        "id": call_id("session-a/call-1"),
        "type": "function",
        "function": {
            "name": function_name("session-a/call-1"),
            "arguments": texts.make("session-a/call-1", 40, ROLE_TOOL_CALL).text,
        },
    }
    task_a = {"role": "user", "content": texts.make("session-a/task", 180, ROLE_USER).text}
    result_a = {
        "role": "tool",
        "tool_call_id": call["id"],
        "content": texts.make("session-a/result-1", 250, ROLE_TOOL).text,
    }
    reply_1 = {
        "role": "assistant",
        "content": "t-0 reply 1",
        "reasoning_content": "thinking t-0",
        "tool_calls": [call],
    }
    a2 = parsed["t-0", 2]
    assert a2["messages"] == [system, task_a, reply_1, result_a]
    assert list(a2["messages"][2]) == ["role", "content", "reasoning_content", "tool_calls"]
    # Request 3 resends every earlier block byte for byte, then the streamed second reply
    # in its live block and the follow-up question.
    a3 = parsed["t-0", 3]
    assert a3["messages"][:4] == a2["messages"]
    assert orjson.dumps(a3["messages"][:4]) == orjson.dumps(a2["messages"])
    assert a3["messages"][4:] == [
        {"role": "assistant", "content": "t-0 reply 2"},
        {"role": "user", "content": texts.make("session-a/follow-up", 50, ROLE_USER).text},
    ]
    # Session-b's own blocks.
    assert parsed["t-1", 1]["messages"] == [
        system,
        {"role": "user", "content": texts.make("session-b/task", 150, ROLE_USER).text},
    ]
    b2 = parsed["t-1", 2]["messages"]
    assert b2[2]["content"] == "t-1 reply 1" and b2[2]["tool_calls"][0]["id"] == call_id(
        "session-b/call-1"
    )
    assert b2[3]["tool_call_id"] == call_id("session-b/call-1")

    # Output fields and streaming, per request, as the manifest sets them.
    fields = {
        key: {k: v for k, v in body.items() if k not in ("model", "messages", "tools", "user")}
        for key, body in parsed.items()
    }
    assert fields == {
        ("t-0", 1): {"max_tokens": 60, "min_tokens": 60},
        ("t-0", 2): {
            "max_tokens": 96,
            "min_tokens": 80,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
        ("t-0", 3): {"max_tokens": 40, "min_tokens": 40},
        ("t-1", 1): {"max_tokens": 50, "min_tokens": 50},
        ("t-1", 2): {"max_tokens": 40, "min_tokens": 40},
    }
    assert list(parsed["t-0", 2]) == [
        "model", "messages", "tools", "max_tokens", "min_tokens", "stream", "stream_options", "user",
    ]  # fmt: skip
    assert {body["model"] for body in parsed.values()} == {"m"}

    # Another root seed changes no block: block text depends on its own seed alone.
    assert capture(capsys, tmp_path, stub, "2")[0] == bodies


def test_live_fallbacks_and_a_reset_against_a_stub(capsys, tmp_path, stub, texts):
    """A live block with no reply before it falls back to its seed's text and is counted;
    a reset forgets the cache and the kept reply, so live blocks after it fall back too."""
    system = {"seed": "fb/system", "tokens": 30, "role": "system"}
    r1 = [
        system,
        {"seed": "fb/task", "tokens": 12, "role": "user"},
        {"seed": "fb/reply-1", "tokens": 9, "role": "assistant", "live": True},
    ]
    r2 = [
        *r1,
        {"seed": "fb/question", "tokens": 7, "role": "user"},
        {"seed": "fb/reply-2", "tokens": 11, "role": "assistant", "live": True},
    ]
    r3 = [
        system,
        {"seed": "fb/reply-2", "tokens": 11, "role": "assistant", "live": True},
        {"seed": "fb/after", "tokens": 5, "role": "user"},
    ]
    requests = [
        {"prompt_tokens": 51, "output_tokens": 4, "blocks": r1},
        {"prompt_tokens": 69, "output_tokens": 4, "blocks": r2},
        {"prompt_tokens": 46, "output_tokens": 4, "blocks": r3, "reset_before": True},
    ]  # fmt: skip
    plans = tmp_path / "fallbacks.jsonl"
    plans.write_bytes(
        orjson.dumps({"schema_version": 2, "trajectory_id": "fb", "requests": requests}) + b"\n"
    )
    bodies, out = capture(capsys, tmp_path, stub, "4", plans)
    assert sorted(bodies) == [("t-0", 1), ("t-0", 2), ("t-0", 3)]
    messages = {turn: orjson.loads(bodies["t-0", turn])["messages"] for turn in (1, 2, 3)}
    reply_1 = {"role": "assistant", "content": texts.make("fb/reply-1", 9, ROLE_ASSISTANT).text}
    reply_2 = {"role": "assistant", "content": texts.make("fb/reply-2", 11, ROLE_ASSISTANT).text}
    assert messages[1][2] == reply_1  # request 1: nothing to take, the seed's own text
    # Request 2: reply-1 is resent as first sent; reply-2 takes the first reply.
    assert messages[2][:3] == messages[1]
    assert messages[2][4] == {
        "role": "assistant",
        "content": "t-0 reply 1",
        "reasoning_content": "thinking t-0",
    }
    # Request 3, after the reset: reply-2 is no longer cached and the second reply was
    # forgotten, so it falls back to its seed's text.
    assert messages[3][1] == reply_2
    assert line(out, "Live block fallbacks ") == (
        "Live block fallbacks (generated in place of a missing previous reply): 2"
    )
    assert csv_row(tmp_path / "results-4.csv")["live_block_fallbacks"] == "2"


def test_plan_warnings_reach_standard_error_once(capsys, tmp_path):
    """A prompt that is not its blocks plus overhead, and a seed reused with another size,
    are warned about on stderr (once per trajectory each), and the blocks are replayed as
    written."""
    r1 = [
        {"seed": "w/system", "tokens": 20, "role": "system"},
        {"seed": "w/task", "tokens": 4, "role": "user"},
    ]
    r2 = [
        {"seed": "w/system", "tokens": 20, "role": "system"},
        {"seed": "w/task", "tokens": 6, "role": "user"},
    ]
    trajectories = [
        {"schema_version": 2, "trajectory_id": "w", "requests": [
            {"prompt_tokens": 30, "output_tokens": 5, "blocks": r1},
            {"prompt_tokens": 99, "output_tokens": 5, "blocks": r2},
        ]},
        {"schema_version": 2, "trajectory_id": "fine", "requests": [
            {"prompt_tokens": 24, "output_tokens": 5, "blocks": r1},
        ]},
    ]  # fmt: skip
    plans = tmp_path / "warn.jsonl"
    plans.write_bytes(b"".join(orjson.dumps(t) + b"\n" for t in trajectories))
    assert main(
        ["--agent-plans-jsonl", str(plans), "--dry-run", "--tokenizer-model", "deepseek-v3",
         "--no-progress"]
    ) == 0  # fmt: skip
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [
        'warning: trajectory "w" request 1: prompt_tokens 30 != sum(blocks.tokens) 24 + '
        "overhead_tokens 0; replaying the blocks as written",
        'warning: trajectory "w" request 2: block seed "w/task" is redefined with different '
        "tokens or role; reusing its first content",
    ]
    dry = [text for text in captured.out.splitlines() if text.startswith("[DRY-RUN]")]
    assert [re.search(r"input_content_tokens=(\d+)", text)[1] for text in dry] == ["24", "26", "24"]


def test_with_the_prompt_correction_the_mismatches_are_one_note(capsys, tmp_path):
    """An imported trace's prompts hold their template's framing in their blocks: under the
    prompt correction (which aims every request at its prompt_tokens) the per-trajectory
    mismatch warnings become one note naming the first, and the prompts land exactly."""
    system = {"seed": "n/system", "tokens": 40, "role": "system"}
    trajectories = [
        {"schema_version": 2, "trajectory_id": f"t{k}", "requests": [
            {"prompt_tokens": 200, "output_tokens": 5,
             "blocks": [system, {"seed": f"n/task{k}", "tokens": 160, "role": "user"}]},
        ]}
        for k in range(3)
    ]  # fmt: skip
    plans = tmp_path / "framed.jsonl"
    plans.write_bytes(b"".join(orjson.dumps(t) + b"\n" for t in trajectories))
    results = tmp_path / "results.json"
    assert main(
        ["--agent-plans-jsonl", str(plans), "--sim", "--calibrate", "--tokenizer-model",
         "deepseek-v3", "--no-progress", "--results-json", str(results)]
    ) == 0  # fmt: skip
    notes = [text for text in capsys.readouterr().err.splitlines() if "blocks plus" in text]
    assert notes == [
        "note: 3 trajectories have block requests whose prompt_tokens differ from their "
        'blocks plus overhead (first: trajectory "t0" request 1: prompt_tokens 200 != '
        "sum(blocks.tokens) 200 + overhead_tokens 9; aiming at prompt_tokens with the prompt "
        "correction)"
    ]
    fidelity = orjson.loads(results.read_bytes())["fidelity"]["prompt"]
    assert (fidelity["requests"], fidelity["exact"]) == (3, 3)


# ---------------------------------------------------------------------------------------
# A manifest mixing schema v1 and v2 lines


def mixed_manifest(path: Path) -> Path:
    blocks_1 = [
        {"seed": "mixed/tools", "tokens": 120, "role": "tool_definition"},
        {"seed": "mixed/system", "tokens": 80, "role": "system"},
        {"seed": "mixed/task", "tokens": 60, "role": "user"},
    ]
    blocks_2 = [
        *blocks_1,
        {"seed": "mixed/reply-1", "tokens": 24, "role": "assistant", "live": True},
        {"seed": "mixed/call-1", "tokens": 20, "role": "tool_call"},
        {"seed": "mixed/result-1", "tokens": 90, "role": "tool"},
    ]
    trajectories = [
        {
            "schema_version": 1,
            "trajectory_id": "v1-growth",
            "requests": [
                {"prompt_tokens": 120, "output_tokens": 16, "delay_after_ms": 20},
                {"prompt_tokens": 260, "output_tokens": 16},
            ],
        },
        {
            "schema_version": 2,
            "trajectory_id": "v2-growth",
            "start_after_ms": 100,
            "requests": [
                {"prompt_tokens": 150, "output_tokens": 16, "stream": True},
                {"prompt_tokens": 300, "output_tokens": 16, "max_tokens": 24},
            ],
        },
        {
            "schema_version": 2,
            "trajectory_id": "v2-blocks",
            "start_after_ms": 200,
            "requests": [
                {"prompt_tokens": 290, "output_tokens": 24, "overhead_tokens": 30,
                 "blocks": blocks_1, "recorded_start_after_ms": 200},
                {"prompt_tokens": 434, "output_tokens": 16, "overhead_tokens": 40,
                 "blocks": blocks_2},
            ],
        },
    ]  # fmt: skip
    path.write_bytes(b"".join(orjson.dumps(t) + b"\n" for t in trajectories))
    return path


def test_dry_run_of_the_mixed_manifest(capsys, tmp_path):
    """Growth lines get environment tokens and no block suffix; the v2 fields show where a
    request sets them."""
    plans = mixed_manifest(tmp_path / "mixed.jsonl")
    result = run(capsys, tmp_path, "--dry-run", "--tokenizer-model", "deepseek-v3", plans=plans)
    dry = [TIMED.sub("admitted_at_ms=*", t) for t in result["out"] if t.startswith("[DRY-RUN]")]
    assert dry == [
        "[DRY-RUN] agent=0 invocation=1 input_content_tokens=120 output_tokens=16 environment_tokens=124 tool_call_latency_ms=20 trajectory_id=v1-growth routing_slot=0 admitted_at_ms=* target_prompt_tokens=120 reset_before=false",
        "[DRY-RUN] agent=0 invocation=2 input_content_tokens=260 output_tokens=16 environment_tokens=0 tool_call_latency_ms=0 trajectory_id=v1-growth routing_slot=0 admitted_at_ms=* target_prompt_tokens=260 reset_before=false",
        "[DRY-RUN] agent=1 invocation=1 input_content_tokens=150 output_tokens=16 environment_tokens=134 tool_call_latency_ms=0 trajectory_id=v2-growth routing_slot=1 admitted_at_ms=* target_prompt_tokens=150 reset_before=false stream=true",
        "[DRY-RUN] agent=1 invocation=2 input_content_tokens=300 output_tokens=16 environment_tokens=0 tool_call_latency_ms=0 trajectory_id=v2-growth routing_slot=1 admitted_at_ms=* target_prompt_tokens=300 reset_before=false max_tokens=24",
        "[DRY-RUN] agent=2 invocation=1 input_content_tokens=260 output_tokens=24 environment_tokens=0 tool_call_latency_ms=0 trajectory_id=v2-blocks routing_slot=2 admitted_at_ms=* target_prompt_tokens=290 reset_before=false blocks=3 live_blocks=0",
        "[DRY-RUN] agent=2 invocation=2 input_content_tokens=394 output_tokens=16 environment_tokens=0 tool_call_latency_ms=0 trajectory_id=v2-blocks routing_slot=2 admitted_at_ms=* target_prompt_tokens=434 reset_before=false blocks=6 live_blocks=1",
    ]
    assert result["csv"]["trajectory_schema_version"] == "2"
    assert result["summary"]["metrics"]["trajectory_schema_version"] == 2


@pytest.mark.slow
@pytest.mark.parametrize("admission", ["closed-loop", "open-loop"])
def test_mixed_v1_and_v2_manifest_against_the_simulator(capsys, tmp_path, admission):
    plans = mixed_manifest(tmp_path / "mixed.jsonl")
    result = run(
        capsys, tmp_path, "--sim", "--sim-args", "--speed 0", "--model", "batchbench-sim",
        "--admission", admission, "--seed", "9", plans=plans,
    )  # fmt: skip
    assert result["err"] == ""
    events = result["events"]
    assert sorted(events) == ["v1-growth", "v2-blocks", "v2-growth"]
    assert all(e["completed"] and e["successful_requests"] == 2 for e in events.values())
    scheduled = {ident: e["scheduled_at_seconds"] for ident, e in events.items()}
    if admission == "closed-loop":
        assert scheduled == {"v1-growth": 0.0, "v2-growth": 0.0, "v2-blocks": 0.0}
    else:
        assert scheduled == {"v1-growth": 0.0, "v2-growth": 0.1, "v2-blocks": 0.2}
        assert all(e["admitted_at_seconds"] >= e["scheduled_at_seconds"] for e in events.values())
    assert events["v2-blocks"]["recorded_start_after_ms"] == [200, None]
    assert "recorded_start_after_ms" not in events["v1-growth"]
    assert "recorded_start_after_ms" not in events["v2-growth"]
    assert result["summary"]["metrics"]["trajectory_schema_version"] == 2
    assert result["summary"]["manifest"]["schema_version"] == 2
    assert result["csv"]["trajectory_schema_version"] == "2"
    assert result["csv"]["admission_mode"] == admission
    assert result["csv"]["live_block_fallbacks"] == "0"
    requests = {(r["trajectory_id"], r["invocation"]): r for r in result["requests"]}
    assert len(requests) == 6 and all(r["status"] == "ok" for r in requests.values())
    assert requests["v2-growth", 1]["ttft_seconds"] is not None  # its stream: true
    assert 16 <= requests["v2-growth", 2]["completion_tokens"] <= 24  # floor 16, cap 24
    assert line(result["out"], "Agents: ") == "Agents: 3 completed / 3 total"
    # Block requests are sized in the simulator's own template: exact from the first one.
    # (The growth trajectories run without overhead flags or --calibrate, so their first
    # requests may pay the unknown framing; that is not what this test is about.)
    for n in (1, 2):
        block_request = requests["v2-blocks", n]
        assert block_request["prompt_tokens"] == block_request["target_prompt_tokens"], n


def test_corrected_block_bodies_do_not_depend_on_reply_timing(capsys, tmp_path, stub, deepseek):
    """With the prompt correction on, what a trajectory sends is learned from its own
    replies only: replies that arrive in another order (random delays) change no byte."""
    import random

    plans = tmp_path / "timing.jsonl"
    trajectories = []
    for t in range(4):
        blocks = [{"seed": "shared-system", "tokens": 40, "role": "system"}]
        requests = []
        for r in range(3):
            blocks = [
                *blocks,
                {"seed": f"t{t}/user-{r}", "tokens": 20 + 3 * t + r, "role": "user"},
                {"seed": f"t{t}/reply-{r}", "tokens": 5, "role": "assistant", "live": True},
            ]
            requests.append(
                {"prompt_tokens": 80 + 40 * r + t, "output_tokens": 5, "blocks": blocks}
            )
        trajectories.append({"schema_version": 2, "trajectory_id": f"x{t}", "requests": requests})
    plans.write_bytes(b"".join(orjson.dumps(t) + b"\n" for t in trajectories))
    tokenizer = deepseek.tokenizer

    def counted(recorded: Recorded):
        body = recorded.json()
        agent = int(body["user"].split("-")[1])
        content = sum(
            len(tokenizer.encode(m.get("content") or "", add_special_tokens=False).ids)
            for m in body["messages"]
        )  # the server's count: a fixed function of the request, framing differs by agent
        reply = chat_completion("fixed reply", content + 12 + 3 * agent, 5)
        return Reply(body=reply, delay=random.random() * 0.03)

    def bodies() -> dict[tuple[str, int], bytes]:
        stub.clear()
        stub.handler = counted
        status = main(
            [
                "--host", stub.url, "--agent-plans-jsonl", str(plans),
                "--tokenizer-model", "deepseek-v3", "--model", "m", "--no-preflight",
                "--no-progress", "--user-prefix", "t", "--seed", "1",
                "--no-stream", "--no-calibrate",  # the stub's bodies, the run's requests
            ]
        )  # fmt: skip
        capsys.readouterr()
        assert status in (0, 3)
        sent: dict[tuple[str, int], bytes] = {}
        for recorded in stub.requests:
            tag = recorded.json()["user"]
            sent[tag, 1 + sum(1 for key in sent if key[0] == tag)] = recorded.body
        return sent

    first = bodies()
    assert len(first) == 12
    for _ in range(2):
        assert bodies() == first


def test_prompt_oracle_sizes_block_requests_when_the_template_is_unknown(capsys, tmp_path):
    """Against a simulator rendering Gemma's template, which the client is not told about,
    the server's own counts (``--prompt-oracle server``) bring every block request to its
    target; without them, the first requests miss it."""
    from batchbench.drive.simlaunch import SimProcess, sim_command

    with SimProcess(sim_command("deepseek-v3", None, "--speed 0 --chat-template gemma")) as sim:

        def drifts(*extra: str) -> tuple[list[int], list]:
            events = tmp_path / "events.jsonl"
            status = main(
                [
                    "--host", sim.url, "--agent-plans-jsonl", str(EXAMPLE),
                    "--tokenizer-model", "deepseek-v3", "--seed", "3", "--no-progress",
                    "--content-salt", "oracle", "--request-events-jsonl", str(events), *extra,
                ]
            )  # fmt: skip
            capsys.readouterr()
            assert status == 0
            rows = lines(events)
            return [row["prompt_drift"] for row in rows], [row["oracle_seconds"] for row in rows]

        guessed, _ = drifts()
        assert any(guessed)
        exact, seconds = drifts("--prompt-oracle", "server")
        assert exact == [0, 0, 0, 0, 0]
        assert all(value is not None and value > 0 for value in seconds)
