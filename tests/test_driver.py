"""The HTTP driver end to end against a real aiohttp stub server on 127.0.0.1: bodies,
headers, retries, timeouts, parsing, streaming, outputs and interruption.

Most tests call ``batchbench.cli.agent.main`` in-process (it runs its own uvloop loop in this
thread; the stub runs on another thread's loop). The interruption tests run the console
entry point as a subprocess and signal it. Nothing talks to anything but loopback.
"""

from __future__ import annotations

import csv
import hashlib
import http
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest
from stubserver import (
    Drop,
    Recorded,
    Reply,
    Stream,
    StubServer,
    chat_completion,
    delta_chunk,
    sse,
    usage_chunk,
)

import batchbench
import batchbench.stages.execute as execute_stage
from batchbench.cli.agent import main
from batchbench.results.console import (
    CSV_COLUMNS,
    EXTRA_CSV_COLUMNS,
    FIDELITY_CSV_COLUMNS,
    LIVE_CSV_COLUMNS,
    LOSS_CSV_COLUMNS,
    OUTCOME_CSV_COLUMNS,
)
from batchbench.results.events import RequestEvent
from batchbench.text.tokenizer import load_tokenizer

REPO = Path(__file__).resolve().parents[1]
DEFAULT_MODEL = "Qwen/Qwen3-VL-235B-A22B-Instruct-FP8"  # the model named in the bodies
ENDPOINT_PATH = "/v1/chat/completions"
DONE = b"data: [DONE]\n\n"
UUID4_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")
LIFECYCLE_FIELDS = [
    "agent_id",
    "trajectory_id",
    "routing_slot",
    "dp_rank",
    "scheduled_at_seconds",
    "admitted_at_seconds",
    "queue_wait_seconds",
    "finished_at_seconds",
    "runtime_seconds",
    "completed",
]
LIFECYCLE_EXTRA_FIELDS = [
    "requests",
    "successful_requests",
    "failed_requests",
    "input_tokens",
    "output_tokens",
    "cached_tokens",
    "ttft_p50_seconds",
    "error",
    "prompt_exact_requests",
    "output_exact_requests",
    "cancelled_requests",
    "skipped_requests",
]
REQUEST_EVENT_FIELDS = [
    "agent_id",
    "trajectory_id",
    "invocation",
    "routing_slot",
    "dp_rank",
    "target_prompt_tokens",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "start_offset_seconds",
    "latency_seconds",
    "ttft_seconds",
    "attempts",
    "status",
    "error",
    "error_kind",
    "status_code",
    "errors",
    "prompt_drift",
    "prompt_correction_tokens",
    "correction_note",
    "planned_output_tokens",
    "output_drift",
    "reply_rendered_tokens",
    "oracle_seconds",
    "worker",
]
# The error messages, quoted verbatim.
NO_STREAM_USAGE = (
    "streamed response missing usage; the backend must honor stream_options.include_usage"
)
NO_CHUNKS = "streamed response contained no chunks"
TRUNCATED_STREAM = "streamed response ended before [DONE] and usage after {chunks} chunks"
INTERRUPTED_LINE = (
    "Interrupted by {}: admission stopped; results cover work finished before shutdown"
)


# ---------------------------------------------------------------------------------------
# Helpers


def auto_reply(recorded: Recorded):
    """The default answer: an SSE stream when the body asks for one, else JSON."""
    if recorded.json().get("stream"):
        return Stream([(0, sse(delta_chunk("ok"))), (0, sse(usage_chunk(10, 5))), (0, DONE)])
    return Reply(body=chat_completion())


@pytest.fixture
def stub():
    with StubServer(handler=auto_reply) as server:
        yield server


@pytest.fixture(autouse=True)
def _no_api_key_in_environment(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("deepseek-v3")


def req(prompt: int, output: int, **extra) -> dict:
    return {"prompt_tokens": prompt, "output_tokens": output, **extra}


def write_plans(path: Path, trajectories: dict[str, list[dict]]) -> Path:
    lines = [
        json.dumps({"schema_version": 1, "trajectory_id": ident, "requests": requests})
        for ident, requests in trajectories.items()
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def one_request_plans(tmp_path: Path, ident: str = "t") -> Path:
    return write_plans(tmp_path / "plans.jsonl", {ident: [req(24, 4)]})


def argv(stub: StubServer, plans: Path, *extra: str) -> list[str]:
    """The stub's usage figures are canned, so these protocol tests send the plan's sizes
    unchanged (prompt correction is tested against the simulator, whose counts are real)."""
    return [
        "--host",
        stub.url,
        "--agent-plans-jsonl",
        str(plans),
        "--tokenizer-model",
        "deepseek-v3",
        "--no-progress",
        "--no-prompt-correction",
        "--content-salt",
        "test",
        "--model",
        DEFAULT_MODEL,
        "--no-preflight",  # the stub's request counts are the tests' subject
        *extra,
    ]


def spawned_argv(stub: StubServer, plans: Path, *extra: str) -> list[str]:
    """``argv`` with the stub's defaults (``with_stub_defaults``), for a subprocess."""
    return with_stub_defaults(argv(stub, plans, *extra))


def with_stub_defaults(args: list[str]) -> list[str]:
    """The stub serves canned answers: name the model and skip the preflight request; and,
    unless the test says, replies as plain JSON (the stub's canned bodies are the tests'
    subject) and no calibration probes (the stub's canned usage cannot calibrate)."""
    extra = []
    if "--stream" not in args and "--no-stream" not in args:
        extra.append("--no-stream")
    if "--calibrate" not in args and "--no-calibrate" not in args:
        extra.append("--no-calibrate")
    if "--model" not in args:
        extra += ["--model", DEFAULT_MODEL]
    if "--no-preflight" not in args and "--sim" not in args:
        extra.append("--no-preflight")
    return [*args, *extra]


@dataclass
class Run:
    lines: list[str]
    out: str
    err: str

    def line(self, prefix: str) -> str:
        found = [line for line in self.lines if line.startswith(prefix)]
        assert len(found) == 1, (prefix, found)
        return found[0]

    def has(self, prefix: str) -> bool:
        return any(line.startswith(prefix) for line in self.lines)

    @property
    def failures(self) -> list[str]:
        return [line for line in self.lines if line.startswith("Failure: ")]

    @property
    def summary(self) -> list[str]:
        """The lines after the banner's closing rule and its blank line."""
        end = self.lines.index("==========================================")
        assert self.lines[end + 1] == ""
        return self.lines[end + 2 :]


def run_agent(capsys, args: list[str], status: int = 0) -> Run:
    """Run in-process against the stub; a model and no preflight unless the test says."""
    args = with_stub_defaults(args)
    code = main(args)
    captured = capsys.readouterr()
    # The exit status and the verdict line agree: 3 exactly when requests failed.
    failed = "Result: FAILED" in captured.out
    assert code == (3 if failed and status == 0 else status), captured.out[-500:]
    return Run(captured.out.splitlines(), captured.out, captured.err)


def read_csv(path: Path) -> tuple[list[str], dict[str, str]]:
    rows = list(csv.reader(path.read_text().splitlines()))
    assert len(rows) == 2
    return rows[0], dict(zip(rows[0], rows[1], strict=True))


def read_jsonl(path: Path) -> list[dict]:
    """Every line must be one complete JSON object."""
    data = path.read_bytes()
    assert data == b"" or data.endswith(b"\n")
    return [orjson.loads(line) for line in data.splitlines()]


def synthetic_call(agent: int, invocation: int) -> dict:
    return {
        "id": f"call_batchbench_{agent:08d}_{invocation:06d}",
        "type": "function",
        "function": {"name": "environment", "arguments": '{"request":"continue"}'},
    }


def messages_prefix(body: bytes) -> bytes:
    """The body's bytes up to the end of its messages array."""
    return body[: body.index(b'],"max')]


def gaps(requests: list[Recorded]) -> list[float]:
    return [b.arrived - a.arrived for a, b in itertools.pairwise(requests)]


def failure_line(ident: str, error: str, agent: int = 0, invocation: int = 1) -> str:
    return f'Failure: agent {agent} trajectory "{ident}" invocation {invocation}: {error}'


# ---------------------------------------------------------------------------------------
# The growing conversation


def test_growth_messages_bodies_and_retry_bytes(capsys, stub, tmp_path, tok):
    """Agent 2 of three (closed loop, one slot): exact messages of turns 1-4, text lengths
    from the manifest and the overhead flags, body key order, identical retry bytes."""
    prompts, outputs = [40, 70, 100, 130], [5, 6, 7, 8]
    initial_overhead, turn_overhead = 4, 3
    overheads = [initial_overhead + i * turn_overhead for i in range(4)]
    content = [p - o for p, o in zip(prompts, overheads, strict=True)]
    environment = [content[i + 1] - content[i] - outputs[i] for i in range(3)]
    assert (content, environment) == ([36, 63, 90, 117], [22, 21, 20])
    plans = write_plans(
        tmp_path / "plans.jsonl",
        {
            "first": [req(20, 3)],
            "second": [req(20, 3), req(40, 3)],
            "growth": [req(p, o) for p, o in zip(prompts, outputs, strict=True)],
        },
    )
    model_call = {"id": "call_model", "type": "function", "function": {"name": "x", "arguments": "{}"}}  # fmt: skip
    stub.script(
        Reply(body=chat_completion("a", 300)),
        Reply(body=chat_completion("b", 500)),
        Reply(body=chat_completion("b", 450)),
        Reply(
            body=chat_completion(
                message={
                    "role": "assistant",
                    "content": "first",
                    "reasoning_content": "why",
                    "tool_calls": [model_call],
                    "function_call": {"name": "x", "arguments": "{}"},
                },
                prompt_tokens=100,
            )
        ),
        Reply(503, "busy"),
        Reply(body=chat_completion("second", 180)),
        Reply(
            body=chat_completion(
                message={
                    "role": "assistant",
                    "reasoning_content": "r3",
                    "name": "bot",
                    "refusal": "no",
                },
                prompt_tokens=250,
            )
        ),
        Reply(body=chat_completion("fourth", 400)),
    )
    run = run_agent(
        capsys,
        argv(
            stub,
            plans,
            "--max-active-agents", "1",
            "--replay-initial-overhead-tokens", str(initial_overhead),
            "--replay-turn-overhead-tokens", str(turn_overhead),
            "--retry-delay-ms", "0",
            "--seed", "5",
        ),
    )  # fmt: skip
    assert len(stub.requests) == 8
    assert {(r.method, r.path) for r in stub.requests} == {("POST", ENDPOINT_PATH)}
    g1, g2_first, g2, g3, g4 = stub.requests[3:]

    # Retries resend the identical bytes and headers.
    assert g2_first.body == g2.body
    assert g2_first.headers == g2.headers

    bodies = [orjson.loads(r.body) for r in (g1, g2, g3, g4)]
    user = bodies[0]["user"]
    for body, output in zip(bodies, outputs, strict=True):
        assert list(body) == ["model", "messages", "max_tokens", "min_tokens", "user"]
        assert body["model"] == "Qwen/Qwen3-VL-235B-A22B-Instruct-FP8"
        assert body["max_tokens"] == body["min_tokens"] == output
        assert body["user"] == user

    m1, m2, m3, m4 = (body["messages"] for body in bodies)
    prompt = m1[0]["content"]
    assert m1 == [{"role": "user", "content": prompt}]
    assert tok.count(prompt) == content[0]
    tool1, tool2, tool3 = m2[2]["content"], m3[4]["content"], m4[6]["content"]
    assert [tok.count(t) for t in (tool1, tool2, tool3)] == environment
    assistant1 = {"role": "assistant", "content": "first", "reasoning_content": "why", "tool_calls": [synthetic_call(2, 1)]}  # fmt: skip
    assistant2 = {"role": "assistant", "content": "second", "tool_calls": [synthetic_call(2, 2)]}
    assistant3 = {
        "role": "assistant",
        "content": None,
        "reasoning_content": "r3",
        "name": "bot",
        "refusal": "no",
        "tool_calls": [synthetic_call(2, 3)],
    }
    turn1 = [{"role": "tool", "tool_call_id": "call_batchbench_00000002_000001", "content": tool1}]
    turn2 = [{"role": "tool", "tool_call_id": "call_batchbench_00000002_000002", "content": tool2}]
    turn3 = [{"role": "tool", "tool_call_id": "call_batchbench_00000002_000003", "content": tool3}]
    assert m2 == [*m1, assistant1, *turn1]
    assert m3 == [*m2, assistant2, *turn2]
    assert m4 == [*m3, assistant3, *turn3]
    # Fixed key order of the appended messages.
    assert list(m4[1]) == ["role", "content", "reasoning_content", "tool_calls"]
    assert list(m4[5]) == ["role", "content", "reasoning_content", "name", "refusal", "tool_calls"]
    assert list(m4[2]) == ["role", "tool_call_id", "content"]
    # Each turn's history is the previous turn's bytes, extended.
    for before, after in ((g1, g2), (g2, g3), (g3, g4)):
        assert after.body.startswith(messages_prefix(before.body))
    for raw in (g1.body, g4.body):
        assert b'"tools"' not in raw and b"tool_choice" not in raw and b"temperature" not in raw

    # The cache estimate uses only the agent's previous prompt: growth's 100, 180,
    # 250, 400 give 530 and second's 500, 450 give 450.
    assert run.line("Tool invocations: ") == "Tool invocations: 7 planned; requests 7 (success 7, failure 0)"  # fmt: skip
    assert run.line("Total input tokens sent: ") == "Total input tokens sent: 2180"
    assert run.line("Total output tokens generated: ") == "Total output tokens generated: 35"
    assert run.line("Estimated cached input tokens") == (
        "Estimated cached input tokens (perfect server-side caching): 980"
    )
    assert run.line("Agents: ") == "Agents: 3 completed / 3 total"
    assert run.failures == []


def test_agent_zero_tool_call_and_connection_reuse(capsys, stub, tmp_path):
    """Agent 0, invocation 1 gets call_batchbench_0_1; one agent's turns share one
    keep-alive connection."""
    plans = write_plans(tmp_path / "p.jsonl", {"t": [req(30, 4), req(50, 4), req(70, 4)]})
    run_agent(capsys, argv(stub, plans))
    bodies = [r.json() for r in stub.requests]
    assert bodies[1]["messages"][1]["tool_calls"] == [synthetic_call(0, 1)]
    assert bodies[1]["messages"][2]["tool_call_id"] == "call_batchbench_00000000_000001"
    assert bodies[2]["messages"][3]["tool_calls"] == [synthetic_call(0, 2)]
    assert len({r.peer for r in stub.requests}) == 1


def test_resolved_endpoint_paths(capsys, stub, tmp_path):
    """--host with a trailing slash plus a relative endpoint; a full-URL endpoint ignores
    --host."""
    plans = one_request_plans(tmp_path)
    base = ["--agent-plans-jsonl", str(plans), "--tokenizer-model", "deepseek-v3", "--no-progress"]
    run = run_agent(capsys, ["--host", stub.url + "//", "--endpoint", "//custom/chat", *base])
    assert run.line("Endpoint: ") == f"Endpoint: {stub.url}/custom/chat"
    run = run_agent(
        capsys, ["--host", "http://unused.invalid", "--endpoint", stub.url + "/v2/x", *base]
    )
    assert run.line("Endpoint: ") == f"Endpoint: {stub.url}/v2/x"
    assert [r.path for r in stub.requests] == ["/custom/chat", "/v2/x"]


# ---------------------------------------------------------------------------------------
# Headers, user tags and body options


def test_default_tag_is_uuid4_and_routing_key(capsys, stub, tmp_path):
    plans = write_plans(
        tmp_path / "p.jsonl", {"a": [req(24, 4), req(40, 4)], "b": [req(24, 4), req(40, 4)]}
    )
    run_agent(capsys, argv(stub, plans))
    assert len(stub.requests) == 4
    tags = set()
    for recorded in stub.requests:
        tag = recorded.user
        assert UUID4_RE.match(tag) and uuid.UUID(tag).version == 4
        assert recorded.headers["x-smg-routing-key"] == tag
        assert recorded.headers["content-type"] == "application/json"
        assert "authorization" not in recorded.headers
        assert "x-smg-target-worker" not in recorded.headers
        tags.add(tag)
    assert len(tags) == 2  # one per agent, kept across its turns


def test_user_prefix(capsys, stub, tmp_path):
    plans = write_plans(tmp_path / "p.jsonl", {"a": [req(24, 4)], "b": [req(24, 4), req(40, 4)]})
    run_agent(capsys, argv(stub, plans, "--user-prefix", "loadtest"))
    users = sorted(r.user for r in stub.requests)
    assert users == ["loadtest-0", "loadtest-1", "loadtest-1"]  # agent 1 has two requests
    assert all(r.headers["x-smg-routing-key"] == r.user for r in stub.requests)


def test_disabled_tagging_sends_no_user_and_no_routing_key(capsys, stub, tmp_path):
    plans = write_plans(tmp_path / "p.jsonl", {"a": [req(24, 4), req(40, 4)]})
    run = run_agent(capsys, argv(stub, plans, "--disable-user-tagging", "--user-prefix", "ignored"))
    assert run.line("Per-agent user tagging: ") == "Per-agent user tagging: disabled"
    for recorded in stub.requests:
        assert list(recorded.json()) == ["model", "messages", "max_tokens", "min_tokens"]
        assert "x-smg-routing-key" not in recorded.headers
        assert b"ignored" not in recorded.body


@pytest.mark.parametrize("tagging", [True, False], ids=["tagged", "untagged"])
def test_perfect_routing_target_worker_is_slot_mod_ranks(capsys, stub, tmp_path, tagging):
    plans = write_plans(tmp_path / "p.jsonl", {f"t{i}": [req(24, 4)] for i in range(10)})
    events = tmp_path / "events.jsonl"
    extra = ["--user-prefix", "r"] if tagging else ["--disable-user-tagging"]
    run = run_agent(
        capsys,
        argv(
            stub, plans, *extra, "--dp-rank-perfect-routing", "--dp-rank-perfect-routing-num", "8",
            "--agent-events-jsonl", str(events),
        ),
    )  # fmt: skip
    records = {r["agent_id"]: r for r in read_jsonl(events)}
    assert sorted(records) == list(range(10))
    assert [records[a]["routing_slot"] for a in range(10)] == list(range(10))
    assert [records[a]["dp_rank"] for a in range(10)] == [0, 1, 2, 3, 4, 5, 6, 7, 0, 1]
    if tagging:
        workers = {r.user: r.headers["x-smg-target-worker"] for r in stub.requests}
        assert workers == {f"r-{a}": str(records[a]["routing_slot"] % 8) for a in range(10)}
        assert workers["r-8"] == "0" and workers["r-9"] == "1"
    else:
        assert all("x-smg-routing-key" not in r.headers for r in stub.requests)
        workers = sorted(r.headers["x-smg-target-worker"] for r in stub.requests)
        assert workers == sorted(str(slot % 8) for slot in range(10))
    assert run.line("DP-rank perfect routing: ") == "DP-rank perfect routing: enabled (8 ranks)"
    assert run.line("Per-rank load (") == "Per-rank load (8 ranks, perfect routing):"


@pytest.mark.parametrize(
    ("choice", "names"),
    [
        ("vllm", ["x-data-parallel-rank"]),
        ("both", ["x-smg-target-worker", "x-data-parallel-rank"]),
    ],
)
def test_dp_rank_header_choice_names_the_rank(capsys, stub, tmp_path, choice, names):
    plans = write_plans(tmp_path / "p.jsonl", {f"t{i}": [req(24, 4)] for i in range(3)})
    run_agent(
        capsys,
        argv(
            stub, plans, "--user-prefix", "r", "--dp-rank-perfect-routing",
            "--dp-rank-perfect-routing-num", "2", "--dp-rank-header", choice,
        ),
    )  # fmt: skip
    sent = {r.user: [r.headers.get(name) for name in names] for r in stub.requests}
    assert sent == {"r-0": ["0"] * len(names), "r-1": ["1"] * len(names), "r-2": ["0"] * len(names)}
    if choice == "vllm":
        assert all("x-smg-target-worker" not in r.headers for r in stub.requests)


def test_invalid_user_tag_fails_without_sending(capsys, stub, tmp_path):
    plans = one_request_plans(tmp_path)
    run = run_agent(capsys, argv(stub, plans, "--user-prefix", "lödtest"))
    assert stub.requests == []
    assert run.failures == [
        failure_line("t", "failed to build X-SMG-Routing-Key header from user tag")
    ]
    assert run.line("Tool invocations: ") == "Tool invocations: 1 planned; requests 1 (success 0, failure 1)"  # fmt: skip


def test_api_key_header_never_leaks(capsys, stub, tmp_path):
    secret = "sk-SECRET-0123456789"
    plans = write_plans(tmp_path / "p.jsonl", {"a": [req(300, 4), req(400, 4)], "b": [req(24, 4)]})
    outputs = {
        "csv": tmp_path / "s.csv",
        "json": tmp_path / "s.json",
        "events": tmp_path / "e.jsonl",
        "requests": tmp_path / "r.jsonl",
    }
    stub.script(Reply(503, "busy"))
    stub.handler = lambda r: Reply(400, "no") if r.user == "u-1" else auto_reply(r)
    run = run_agent(
        capsys,
        argv(
            stub, plans, "--api-key", secret, "--verbose", "--user-prefix", "u",
            "--retry-delay-ms", "0", "--max-active-agents", "1",
            "--results-csv", str(outputs["csv"]), "--results-json", str(outputs["json"]),
            "--agent-events-jsonl", str(outputs["events"]),
            "--request-events-jsonl", str(outputs["requests"]),
        ),
    )  # fmt: skip
    assert len(stub.requests) == 4
    assert all(r.headers["authorization"] == f"Bearer {secret}" for r in stub.requests)
    assert secret not in run.out and secret not in run.err
    for path in outputs.values():
        assert secret.encode() not in path.read_bytes()
    # --verbose: one request line per attempt, one response line per success.
    verbose_requests = [line for line in run.lines if line.startswith("[AGENT REQUEST] ")]
    verbose_responses = [line for line in run.lines if line.startswith("[AGENT RESPONSE] ")]
    assert (len(verbose_requests), len(verbose_responses)) == (4, 2)
    sent = stub.requests[0].messages[0]["content"].strip()
    shown = orjson.loads(verbose_requests[0].removeprefix("[AGENT REQUEST] "))
    assert shown["messages"][0]["content"] == sent[:50] + "..."
    assert orjson.loads(verbose_responses[0].removeprefix("[AGENT RESPONSE] ")) == {
        "choices": [{"message": {"role": "assistant", "content": "ok"}}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5},
    }
    assert run.failures == [failure_line("b", "request failed (400 Bad Request) no", agent=1)]


@pytest.mark.parametrize(
    ("env", "flags", "expected"),
    [
        ({"OPENAI_API_KEY": "k-default"}, [], "Bearer k-default"),
        ({"BB_TEST_KEY": "k-named"}, ["--api-key-env", "BB_TEST_KEY"], "Bearer k-named"),
        ({"OPENAI_API_KEY": "k-env"}, ["--api-key", "k-flag"], "Bearer k-flag"),
        ({"OPENAI_API_KEY": ""}, [], None),
    ],
    ids=["default-env", "named-env", "flag-wins", "empty-env"],
)
def test_api_key_sources(capsys, stub, tmp_path, monkeypatch, env, flags, expected):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    run_agent(capsys, argv(stub, one_request_plans(tmp_path), *flags))
    assert stub.requests[0].headers.get("authorization") == expected


@pytest.mark.parametrize(
    ("flags", "keys"),
    [
        (["--ignore-eos"], ["max_tokens", "min_tokens", "ignore_eos", "user"]),
        (["--sglang"], ["max_new_tokens", "min_new_tokens", "user"]),
        (["--sglang", "--ignore-eos"], ["max_new_tokens", "min_new_tokens", "ignore_eos", "user"]),
        (
            ["--sglang", "--ignore-eos", "--stream", "--disable-user-tagging"],
            ["max_new_tokens", "min_new_tokens", "ignore_eos", "stream", "stream_options"],
        ),
    ],
    ids=["ignore-eos", "sglang", "sglang-ignore-eos", "sglang-stream-untagged"],
)
def test_body_options(capsys, stub, tmp_path, flags, keys):
    plans = write_plans(tmp_path / "p.jsonl", {"t": [req(24, 17)]})
    run = run_agent(capsys, argv(stub, plans, *flags))
    assert run.failures == []
    body = stub.requests[0].json()
    assert list(body) == ["model", "messages", *keys]
    cap, floor = keys[:2]
    assert body[cap] == body[floor] == 17
    if "ignore_eos" in keys:
        assert body["ignore_eos"] is True
    if "stream" in keys:
        assert body["stream"] is True and body["stream_options"] == {"include_usage": True}


def _seeded_traffic(stub: StubServer) -> list[tuple[str, bytes, dict]]:
    traffic = sorted((r.user, r.body, r.headers) for r in stub.requests)
    stub.clear()
    return traffic


def test_seeded_runs_send_identical_bytes(capsys, stub, tmp_path, monkeypatch):
    # One prompt above the inline limit, so its text comes from the worker pool.
    plans = write_plans(
        tmp_path / "p.jsonl",
        {"a": [req(5000, 4), req(5030, 4)], "b": [req(40, 4), req(60, 4)], "c": [req(24, 4)]},
    )
    args = argv(stub, plans, "--seed", "42")
    run_agent(capsys, args)
    first = _seeded_traffic(stub)
    monkeypatch.setattr(execute_stage, "generation_workers", lambda: 1)
    run_agent(capsys, args)
    second = _seeded_traffic(stub)
    assert len(first) == 5
    assert first == second  # tags, bodies and headers, byte for byte
    tags = sorted({user for user, _, _ in first})
    expected = []
    for agent in range(3):
        digest = bytearray(hashlib.sha256(f"batchbench-user-tag:42:{agent}".encode()).digest())
        digest[6] = (digest[6] & 0x0F) | 0x40
        digest[8] = (digest[8] & 0x3F) | 0x80
        expected.append(str(uuid.UUID(bytes=bytes(digest[:16]))))
    assert tags == sorted(expected)
    assert all(UUID4_RE.match(tag) for tag in tags)
    # Without --seed, two runs draw different tags.
    unseeded = argv(stub, plans)
    run_agent(capsys, unseeded)
    third = {user for user, _, _ in _seeded_traffic(stub)}
    run_agent(capsys, unseeded)
    fourth = {user for user, _, _ in _seeded_traffic(stub)}
    assert len(third) == len(fourth) == 3
    assert not third & fourth and not third & set(tags)


# ---------------------------------------------------------------------------------------
# Retries and backoff


def test_retry_then_success_includes_backoff_in_latency(capsys, stub, tmp_path):
    events = tmp_path / "r.jsonl"
    stub.script(Reply(503, "busy"))
    run = run_agent(
        capsys,
        argv(
            stub, one_request_plans(tmp_path), "--retry-delay-ms", "200",
            "--request-events-jsonl", str(events),
        ),
    )  # fmt: skip
    assert len(stub.requests) == 2
    assert 0.19 <= gaps(stub.requests)[0] < 1.0
    assert run.line("Tool invocations: ") == "Tool invocations: 1 planned; requests 1 (success 1, failure 0)"  # fmt: skip
    assert run.failures == []
    [event] = read_jsonl(events)
    assert (event["attempts"], event["status"], event["error"]) == (2, "ok", None)
    assert event["latency_seconds"] >= 0.19
    p50 = float(re.search(r"p50=([\d.]+)", run.line("Request latency (ms): ")).group(1))
    assert p50 >= 190.0


def test_backoff_doubles_per_attempt(capsys, stub, tmp_path):
    stub.handler = lambda r: Reply(503, "busy")
    run = run_agent(
        capsys,
        argv(stub, one_request_plans(tmp_path), "--retry-delay-ms", "100", "--max-retries", "2"),
    )
    assert len(stub.requests) == 3
    first, second = gaps(stub.requests)
    assert 0.095 <= first < 0.6
    assert 0.195 <= second < 0.7
    assert second > first + 0.05
    assert run.failures == [failure_line("t", "request failed (503 Service Unavailable) busy")]


def test_zero_delay_three_attempts_without_sleep(capsys, stub, tmp_path):
    results = tmp_path / "s.csv"
    stub.handler = lambda r: Reply(503, "  overloaded \n")
    run = run_agent(
        capsys,
        argv(
            stub, one_request_plans(tmp_path, "zero"), "--retry-delay-ms", "0",
            "--max-retries", "2", "--results-csv", str(results),
        ),
    )  # fmt: skip
    assert len(stub.requests) == 3
    assert stub.requests[-1].arrived - stub.requests[0].arrived < 0.2
    assert run.failures == [
        'Failure: agent 0 trajectory "zero" invocation 1: request failed (503 Service Unavailable) overloaded'
    ]
    assert run.line("Agents: ") == "Agents: 0 completed / 1 total"
    assert run.line("Request latency (ms): ") == "Request latency (ms): p50=n/a p90=n/a p99=n/a"
    _, values = read_csv(results)
    assert (values["total_requests"], values["successful_requests"], values["failed_requests"]) == (
        "1",
        "0",
        "1",
    )


@pytest.mark.parametrize("status", [400, 401, 403, 404, 413, 422])
def test_other_4xx_are_not_retried(capsys, stub, tmp_path, status):
    stub.handler = lambda r: Reply(status, "nope")
    run = run_agent(
        capsys,
        argv(stub, one_request_plans(tmp_path), "--retry-delay-ms", "0", "--max-retries", "2"),
    )
    assert len(stub.requests) == 1
    phrase = http.HTTPStatus(status).phrase
    assert run.failures == [failure_line("t", f"request failed ({status} {phrase}) nope")]


@pytest.mark.parametrize("status", [408, 409, 429, 500, 502, 503, 504, 599])
def test_retried_statuses(capsys, stub, tmp_path, status):
    stub.handler = lambda r: Reply(status, "again")
    run = run_agent(
        capsys,
        argv(stub, one_request_plans(tmp_path), "--retry-delay-ms", "0", "--max-retries", "1"),
    )
    assert len(stub.requests) == 2
    reason = "599" if status == 599 else f"{status} {http.HTTPStatus(status).phrase}"
    assert run.failures == [failure_line("t", f"request failed ({reason}) again")]


def test_error_body_is_cut_at_500_characters(capsys, stub, tmp_path):
    stub.handler = lambda r: Reply(400, "x" * 499 + "yz")
    run = run_agent(capsys, argv(stub, one_request_plans(tmp_path)))
    assert run.failures == [failure_line("t", "request failed (400 Bad Request) " + "x" * 499 + "y...")]  # fmt: skip


@pytest.mark.parametrize(
    ("spec", "stream"),
    [
        (Drop(), False),
        (Drop(raw=b'HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{"usage'), False),
        (Stream([(0, sse(delta_chunk("Hel")))], cut=True), True),
    ],
    ids=["before-response", "mid-body", "mid-stream"],
)
def test_dropped_connection_is_retried(capsys, stub, tmp_path, spec, stream):
    stub.handler = lambda r: spec
    flags = ["--stream"] if stream else []
    run = run_agent(
        capsys,
        argv(stub, one_request_plans(tmp_path), "--retry-delay-ms", "0", "--max-retries", "2", *flags),
    )  # fmt: skip
    assert len(stub.requests) == 3
    [failure] = run.failures
    assert failure.startswith(failure_line("t", "request failed: "))


def test_dropped_connection_then_success(capsys, stub, tmp_path):
    events = tmp_path / "r.jsonl"
    stub.script(Drop())
    run = run_agent(
        capsys,
        argv(stub, one_request_plans(tmp_path), "--retry-delay-ms", "0", "--request-events-jsonl", str(events)),
    )  # fmt: skip
    assert len(stub.requests) == 2 and run.failures == []
    assert [(e["attempts"], e["status"]) for e in read_jsonl(events)] == [(2, "ok")]


@pytest.mark.parametrize("status", [429, 503])
def test_retry_after_is_honoured(capsys, stub, tmp_path, status):
    stub.script(Reply(status, "slow down", headers={"Retry-After": "1"}))
    run = run_agent(capsys, argv(stub, one_request_plans(tmp_path), "--retry-delay-ms", "10"))
    assert len(stub.requests) == 2 and run.failures == []
    assert 0.95 <= gaps(stub.requests)[0] < 2.0


@pytest.mark.parametrize(
    ("status", "value"), [(500, "1"), (429, "soon")], ids=["not-429-or-503", "unparsable"]
)
def test_retry_after_ignored(capsys, stub, tmp_path, status, value):
    stub.script(Reply(status, "later", headers={"Retry-After": value}))
    run = run_agent(capsys, argv(stub, one_request_plans(tmp_path), "--retry-delay-ms", "10"))
    assert len(stub.requests) == 2 and run.failures == []
    assert gaps(stub.requests)[0] < 0.5


def test_failure_records_the_last_attempts_error(capsys, stub, tmp_path):
    stub.script(Reply(503, "first"), Reply(500, "second"))
    run = run_agent(
        capsys,
        argv(stub, one_request_plans(tmp_path), "--retry-delay-ms", "0", "--max-retries", "1"),
    )
    assert len(stub.requests) == 2
    assert run.failures == [failure_line("t", "request failed (500 Internal Server Error) second")]


def test_max_retries_zero_means_one_attempt(capsys, stub, tmp_path):
    stub.handler = lambda r: Reply(503, "busy")
    run = run_agent(capsys, argv(stub, one_request_plans(tmp_path), "--max-retries", "0"))
    assert len(stub.requests) == 1
    assert run.failures == [failure_line("t", "request failed (503 Service Unavailable) busy")]


def test_failed_agent_stops_and_its_slot_passes_on(capsys, stub, tmp_path):
    plans = write_plans(
        tmp_path / "p.jsonl",
        {"doomed": [req(24, 4), req(40, 4), req(60, 4)], "next": [req(24, 4)]},
    )
    events = tmp_path / "e.jsonl"
    stub.script(Reply(), Reply(400, "bad turn"))
    # run_agent asserts status 0: a failed request is not a failed run.
    run = run_agent(
        capsys, argv(stub, plans, "--max-active-agents", "1", "--agent-events-jsonl", str(events))
    )
    assert len(stub.requests) == 3  # doomed's third turn is never sent
    assert [len(r.messages) for r in stub.requests] == [1, 3, 1]
    assert run.failures == [failure_line("doomed", "request failed (400 Bad Request) bad turn", invocation=2)]  # fmt: skip
    assert run.line("Agents: ") == "Agents: 1 completed / 2 total"
    assert run.line("Tool invocations: ") == "Tool invocations: 4 planned; requests 3 (success 2, failure 1)"  # fmt: skip
    doomed, following = read_jsonl(events)
    assert (doomed["trajectory_id"], doomed["completed"]) == ("doomed", False)
    assert "interrupted" not in doomed
    assert (doomed["requests"], doomed["successful_requests"], doomed["failed_requests"]) == (
        2,
        1,
        1,
    )
    assert doomed["error"] == "request failed (400 Bad Request) bad turn"
    assert (following["trajectory_id"], following["completed"]) == ("next", True)
    assert following["routing_slot"] == doomed["routing_slot"] == 0
    assert following["admitted_at_seconds"] >= doomed["finished_at_seconds"]
    assert run.line("Agent end-to-end latency").startswith(
        "Agent end-to-end latency (ms, completed agents): p50="
    )


# ---------------------------------------------------------------------------------------
# Timeouts


@pytest.mark.serial
def test_timeout_fails_the_attempt(capsys, stub, tmp_path):
    stub.handler = lambda r: Reply(delay=3.0)
    began = time.perf_counter()
    run = run_agent(
        capsys,
        argv(stub, one_request_plans(tmp_path), "--request-timeout-secs", "1", "--max-retries", "0"),
    )  # fmt: skip
    assert 0.95 <= time.perf_counter() - began < 2.8
    assert run.failures == [failure_line("t", "request timed out after 1s")]


def test_timeout_covers_a_slow_stream_body(capsys, stub, tmp_path):
    stub.handler = lambda r: Stream([(0.3, sse(delta_chunk("x")))] * 10)
    run = run_agent(
        capsys,
        argv(
            stub, one_request_plans(tmp_path), "--stream", "--request-timeout-secs", "1",
            "--max-retries", "0",
        ),
    )  # fmt: skip
    assert run.failures == [failure_line("t", "request timed out after 1s")]


def test_timeout_is_retried(capsys, stub, tmp_path):
    events = tmp_path / "r.jsonl"
    stub.script(Reply(delay=3.0))
    run = run_agent(
        capsys,
        argv(
            stub, one_request_plans(tmp_path), "--request-timeout-secs", "1",
            "--retry-delay-ms", "0", "--request-events-jsonl", str(events),
        ),
    )  # fmt: skip
    assert len(stub.requests) == 2 and run.failures == []
    [event] = read_jsonl(events)
    assert event["attempts"] == 2 and event["latency_seconds"] >= 0.95


# ---------------------------------------------------------------------------------------
# Response parsing

BAD_RESPONSES = {
    "invalid-json": (Reply(body=b'{"choices": [}'), "invalid JSON in response body"),
    "not-an-object": (Reply(body=b"[1, 2]"), "response body is not a JSON object"),
    "no-usage": (Reply(body=chat_completion(usage=None)), "response missing usage field"),
    "null-usage": (
        Reply(body={**chat_completion(), "usage": None}),
        "response missing usage field",
    ),
    "message-string": (
        Reply(body=chat_completion(message="hello")),
        "choices[0].message is not an object",
    ),
    "prompt-tokens-missing": (
        Reply(body=chat_completion(usage={"completion_tokens": 3})),
        "usage.prompt_tokens missing or not an integer",
    ),
    "prompt-tokens-string": (
        Reply(body=chat_completion(prompt_tokens="12")),
        "usage.prompt_tokens missing or not an integer",
    ),
    "prompt-tokens-float": (
        Reply(body=chat_completion(prompt_tokens=12.0)),
        "usage.prompt_tokens missing or not an integer",
    ),
    "no-choices": (
        Reply(body={"usage": {"prompt_tokens": 1, "completion_tokens": 1}}),
        "response missing choices[0].message",
    ),
    "empty-choices": (
        Reply(body={"choices": [], "usage": {"prompt_tokens": 1}}),
        "response missing choices[0].message",
    ),
}


@pytest.mark.parametrize("case", list(BAD_RESPONSES))
def test_unusable_2xx_is_retried_then_a_request_failure(capsys, stub, tmp_path, case):
    spec, error = BAD_RESPONSES[case]
    plans = write_plans(tmp_path / "p.jsonl", {"bad": [req(24, 4)], "good": [req(24, 4)]})
    stub.script(spec, spec)  # both attempts of agent 0; agent 1 gets the default reply
    run = run_agent(
        capsys,
        argv(
            stub, plans, "--max-active-agents", "1", "--retry-delay-ms", "0",
            "--max-retries", "1",
        ),
    )  # fmt: skip
    assert len(stub.requests) == 3
    [failure] = run.failures
    assert failure.startswith(failure_line("bad", error))
    assert run.line("Agents: ") == "Agents: 1 completed / 2 total"  # the run goes on


def test_transient_bad_message_then_success(capsys, stub, tmp_path):
    stub.script(Reply(body=chat_completion(message="hello")))
    run = run_agent(capsys, argv(stub, one_request_plans(tmp_path), "--retry-delay-ms", "0"))
    assert len(stub.requests) == 2 and run.failures == []


def test_missing_completion_tokens_counts_zero(capsys, stub, tmp_path):
    stub.handler = lambda r: Reply(body=chat_completion(usage={"prompt_tokens": 33}))
    run = run_agent(capsys, argv(stub, one_request_plans(tmp_path)))
    assert run.failures == []
    assert run.line("Total input tokens sent: ") == "Total input tokens sent: 33"
    assert run.line("Total output tokens generated: ") == "Total output tokens generated: 0"


# ---------------------------------------------------------------------------------------
# Streaming


def test_stream_assembly_and_next_turn(capsys, stub, tmp_path):
    plans = write_plans(tmp_path / "p.jsonl", {"t": [req(30, 4), req(50, 4)]})
    crlf = b"\r\n"
    stub.script(
        Stream(
            [
                (0, b": keep-alive\r\n\r\n"),
                (0, sse({"choices": [{"index": 0, "delta": {"role": "assistant"}}]}, crlf)),
                (0, b'data: {"choices":[{"index":0,"delta":{"reasoning_content":"thi'),
                (0.05, b'nk"}}]}\r\n\r\n'),
                (0, b"event: message\r\n" + sse(delta_chunk("Hel"), crlf)),
                (0, b'data:{"choices":[{"index":0,"delta":{"content":"lo"}}]}\r\n\r\n'),
                (0, sse(delta_chunk(""), crlf) + b": ping\r\n\r\n"),
                (0, sse(usage_chunk(12, 2), crlf)),
                (0, b"data: [DONE]\r\n\r\n"),
            ]
        )
    )
    run = run_agent(capsys, argv(stub, plans, "--stream", "--seed", "1"))
    assert run.failures == []
    first, second = (r.json() for r in stub.requests)
    assert list(first) == [
        "model", "messages", "max_tokens", "min_tokens", "stream", "stream_options", "user",
    ]  # fmt: skip
    assert first["stream"] is True and first["stream_options"] == {"include_usage": True}
    assert second["messages"][1] == {
        "role": "assistant",
        "content": "Hello",
        "reasoning_content": "think",
        "tool_calls": [synthetic_call(0, 1)],
    }
    assert run.line("Total input tokens sent: ") == "Total input tokens sent: 22"  # 12 + 10
    assert run.line("Total output tokens generated: ") == "Total output tokens generated: 7"


STREAM_ERRORS = {
    "no-usage": (
        Stream([(0, sse(delta_chunk("Hello"))), (0, DONE)]),
        NO_STREAM_USAGE,
    ),
    "no-chunks": (
        Stream([(0, b": keep-alive\n\n"), (0, b"event: ping\n\n"), (0, DONE)]),
        NO_CHUNKS,
    ),
    "empty-body": (Stream([]), TRUNCATED_STREAM.format(chunks=0)),
    "invalid-chunk": (
        Stream([(0, b"data: {not json}\n\n"), (0, sse(usage_chunk(1, 1)))]),
        "invalid JSON in streamed response chunk",
    ),
    "http-500": (Reply(500, "boom"), "request failed (500 Internal Server Error) boom"),
}


@pytest.mark.parametrize("case", list(STREAM_ERRORS))
def test_stream_errors_are_retried(capsys, stub, tmp_path, case):
    spec, error = STREAM_ERRORS[case]
    stub.handler = lambda r: spec
    run = run_agent(
        capsys,
        argv(
            stub, one_request_plans(tmp_path), "--stream", "--retry-delay-ms", "0",
            "--max-retries", "1",
        ),
    )  # fmt: skip
    assert len(stub.requests) == 2
    assert run.failures == [failure_line("t", error)]


def _ms_values(line: str) -> tuple[float, float, float]:
    match = re.fullmatch(r".*: p50=(\d+\.\d\d) p90=(\d+\.\d\d) p99=(\d+\.\d\d)", line)
    assert match, line
    return tuple(float(v) for v in match.groups())


def test_stream_timing_ttft_itl_tpot(capsys, stub, tmp_path):
    """A role-only chunk at once, the first content after 200 ms, then 4 more 50 ms apart;
    completion_tokens 9, so TPOT = (last - first) / 8 ≈ 25 ms while ITL ≈ 50 ms."""
    results, requests, events = tmp_path / "s.csv", tmp_path / "r.jsonl", tmp_path / "e.jsonl"
    role = {"choices": [{"index": 0, "delta": {"role": "assistant"}}]}
    parts = [(0, sse(role)), (0.2, sse(delta_chunk(reasoning="a")))]
    parts += [(0.05, sse(delta_chunk("b")))] * 4
    parts += [(0, sse(usage_chunk(12, 9))), (0, DONE)]
    stub.script(Stream(parts))
    run = run_agent(
        capsys,
        argv(
            stub, one_request_plans(tmp_path), "--stream", "--results-csv", str(results),
            "--request-events-jsonl", str(requests), "--agent-events-jsonl", str(events),
        ),
    )  # fmt: skip
    assert run.failures == []
    [event] = read_jsonl(requests)
    assert 0.19 <= event["ttft_seconds"] < 0.35
    [record] = read_jsonl(events)
    assert record["ttft_p50_seconds"] == event["ttft_seconds"]

    summary = run.summary
    at = summary.index(run.line("Agent end-to-end latency"))
    ttft_line, itl_line, tpot_line = summary[at + 1 : at + 4]
    assert ttft_line.startswith("Time to first token (ms, streamed requests): p50=")
    assert itl_line.startswith("Inter-token latency (ms, streamed requests): p50=")
    assert tpot_line.startswith("Time per output token (ms, streamed requests): p50=")
    ttft, itl, tpot = _ms_values(ttft_line), _ms_values(itl_line), _ms_values(tpot_line)
    assert ttft[0] == ttft[1] == ttft[2] == pytest.approx(event["ttft_seconds"] * 1000, abs=0.006)
    assert 40.0 <= itl[0] <= 80.0 and itl[1] == itl[2] and itl[2] < 120.0
    assert tpot[0] == tpot[1] == tpot[2]
    assert 22.0 <= tpot[0] <= 35.0  # the 4 gaps over (9 - 1) tokens, not per chunk

    _, values = read_csv(results)
    columns = [f"{m}_{p}_ms" for m in ("ttft", "inter_token_latency", "tpot") for p in ("p50", "p90", "p99")]  # fmt: skip
    shown = [*ttft, *itl, *tpot]
    assert [round(float(values[c]), 2) for c in columns] == pytest.approx(shown, abs=0.0051)
    assert values["stream"] == "true"


def test_ttft_is_measured_on_the_successful_attempt(capsys, stub, tmp_path):
    requests = tmp_path / "r.jsonl"
    stub.script(
        Reply(503, "busy"),
        Stream([(0.1, sse(delta_chunk("Hi"))), (0, sse(usage_chunk(12, 1))), (0, DONE)]),
    )
    run = run_agent(
        capsys,
        argv(
            stub, one_request_plans(tmp_path), "--stream", "--retry-delay-ms", "300",
            "--verbose", "--request-events-jsonl", str(requests),
        ),
    )  # fmt: skip
    assert run.failures == []
    [event] = read_jsonl(requests)
    assert event["attempts"] == 2
    assert event["latency_seconds"] >= 0.39  # backoff included in the request latency
    assert 0.095 <= event["ttft_seconds"] < 0.3  # but not in the TTFT
    [response] = [line for line in run.lines if line.startswith("[AGENT RESPONSE] ")]
    assert orjson.loads(response.removeprefix("[AGENT RESPONSE] ")) == {
        "choices": [{"message": {"role": "assistant", "content": "Hi"}}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 1},
    }
    assert run.has("Time to first token (ms, streamed requests): p50=")
    assert run.line("Time per output token").endswith("p50=n/a p90=n/a p99=n/a")  # 1 token


def test_stream_without_content_chunks_has_no_timing_samples(capsys, stub, tmp_path):
    results = tmp_path / "s.csv"
    stub.script(Stream([(0, sse(usage_chunk(12, 0))), (0, DONE)]))
    run = run_agent(
        capsys, argv(stub, one_request_plans(tmp_path), "--stream", "--results-csv", str(results))
    )
    assert run.failures == []
    assert not run.has("Time to first token")
    _, values = read_csv(results)
    assert all(values[c] == "" for c in EXTRA_CSV_COLUMNS[:9])


def test_non_streaming_run_has_no_d5_lines_or_values(capsys, stub, tmp_path):
    results, requests, events = tmp_path / "s.csv", tmp_path / "r.jsonl", tmp_path / "e.jsonl"
    run = run_agent(
        capsys,
        argv(
            stub, one_request_plans(tmp_path), "--results-csv", str(results),
            "--request-events-jsonl", str(requests), "--agent-events-jsonl", str(events),
        ),
    )  # fmt: skip
    assert not any("streamed requests" in line for line in run.lines)
    _, values = read_csv(results)
    assert [values[c] for c in EXTRA_CSV_COLUMNS] == [""] * 9 + ["false"]
    assert values["stream"] == "false"
    assert read_jsonl(requests)[0]["ttft_seconds"] is None
    assert read_jsonl(events)[0]["ttft_p50_seconds"] is None
    assert "stream" not in stub.requests[0].json()


# ---------------------------------------------------------------------------------------
# Resets and tool latency


def test_reset_replaces_history_and_claims_no_cache(capsys, stub, tmp_path, tok):
    plans = write_plans(
        tmp_path / "p.jsonl",
        {
            "t": [
                req(40, 5),
                req(70, 6, delay_after_ms=150),
                req(30, 4, reset_before=True),
                req(50, 5, delay_after_ms=100),
            ]
        },
    )
    # Overheads 4, 7, 4 (reset), 7: contents 36, 63, 26, 43; environment 22, 0, 13.
    stub.script(
        Reply(body=chat_completion("r1", 100)),
        Reply(body=chat_completion("r2", 180)),
        Reply(body=chat_completion("r3", 50)),
        Reply(body=chat_completion("r4", 90)),
    )
    run = run_agent(
        capsys,
        argv(
            stub, plans, "--replay-initial-overhead-tokens", "4",
            "--replay-turn-overhead-tokens", "3", "--seed", "9",
        ),
    )  # fmt: skip
    assert run.failures == []
    r1, r2, r3, r4 = stub.requests
    prompt = r1.messages[0]["content"]
    assert tok.count(prompt) == 36
    assert [m["role"] for m in r2.messages] == ["user", "assistant", "tool"]
    assert tok.count(r2.messages[2]["content"]) == 22
    reset_prompt = r3.messages[0]["content"]
    assert r3.messages == [{"role": "user", "content": reset_prompt}]
    assert tok.count(reset_prompt) == 26 and reset_prompt != prompt
    assert r4.messages[:2] == [
        {"role": "user", "content": reset_prompt},
        {"role": "assistant", "content": "r3", "tool_calls": [synthetic_call(0, 3)]},
    ]
    assert r4.messages[2]["tool_call_id"] == "call_batchbench_00000000_000003"
    assert tok.count(r4.messages[2]["content"]) == 13 and len(r4.messages) == 3
    # The tag and routing key survive the reset.
    assert len({(r.user, r.headers["x-smg-routing-key"]) for r in stub.requests}) == 1
    assert 0.145 <= r3.arrived - r2.arrived < 1.0  # delay_after_ms of request 2
    assert run.line("Estimated cached input tokens") == (
        "Estimated cached input tokens (perfect server-side caching): 150"  # 0+100+0+50
    )
    slept = float(re.search(r"([\d.]+)s$", run.line("Total simulated tool-call latency")).group(1))  # fmt: skip
    assert 0.25 <= slept < 0.4  # the last request's delay counts too
    e2e = _ms_values(run.line("Agent end-to-end latency"))
    assert e2e[0] >= 250.0
    assert _ms_values(run.line("Request latency (ms): "))[2] < 140.0  # tool sleeps excluded


# ---------------------------------------------------------------------------------------
# Concurrency is not capped by the HTTP client


@pytest.mark.parametrize("admission", ["closed-loop", "open-loop"])
def test_no_connection_pool_cap_below_active_agents(capsys, stub, tmp_path, admission):
    plans = write_plans(tmp_path / "p.jsonl", {f"t{i}": [req(24, 4)] for i in range(120)})
    stub.handler = lambda r: Reply(delay=0.6)
    run = run_agent(capsys, argv(stub, plans, "--admission", admission))
    assert len(stub.requests) == 120 and run.failures == []
    arrivals = sorted(r.arrived for r in stub.requests)
    assert arrivals[-1] - arrivals[0] < 0.5  # all in flight together, none waited for a slot
    assert run.line("Client health: ").endswith("peak in-flight requests 120")


# ---------------------------------------------------------------------------------------
# Outputs


def test_outputs_csv_json_lifecycle_and_request_events(capsys, stub, tmp_path):
    plans = write_plans(tmp_path / "p.jsonl", {"ok": [req(24, 4), req(40, 4)], "bad": [req(24, 4)]})
    out = tmp_path / "out" / "nested"
    out.mkdir(parents=True)
    results, summary_json = out / "s.csv", out / "s.json"
    events, requests = out / "e.jsonl", out / "r.jsonl"
    stub.script(
        Reply(503, "busy"),
        Reply(body=chat_completion("one", 100, 3, cached_tokens=0)),
        Reply(body=chat_completion("two", 150, 7, cached_tokens=100)),
        Reply(400, "bad request body"),
    )
    run = run_agent(
        capsys,
        argv(
            stub, plans, "--max-active-agents", "1", "--retry-delay-ms", "0", "--seed", "3",
            "--results-csv", str(results), "--results-json", str(summary_json),
            "--agent-events-jsonl", str(events), "--request-events-jsonl", str(requests),
        ),
    )  # fmt: skip
    assert run.lines[-6:] == [
        f"Wrote agent lifecycle events to {events}",
        f"Wrote request events to {requests}",
        f"Wrote agent benchmark summary to {results}",
        f"Wrote agent benchmark JSON summary to {summary_json}",
        f"Wrote resolved options to {summary_json.with_name('s.config.toml')}",
        "Result: FAILED: 1 of 3 sent requests failed (33.3%; --max-failure-rate 0%); exit status 3",
    ]
    assert run.line("Server-reported cached input tokens") == (
        "Server-reported cached input tokens (usage.prompt_tokens_details): 100 "
        "(40.0% of input tokens)"
    )
    digest = hashlib.sha256(plans.read_bytes()).hexdigest()
    assert run.line("Trajectory manifest SHA-256: ") == f"Trajectory manifest SHA-256: {digest}"

    # CSV: header, one row, \n endings.
    text = results.read_text()
    assert text.count("\n") == 2 and text.endswith("\n") and "\r" not in text
    header, values = read_csv(results)
    assert header[:51] == list(CSV_COLUMNS)
    fixed = [
        *CSV_COLUMNS,
        *EXTRA_CSV_COLUMNS,
        *LIVE_CSV_COLUMNS,
        *FIDELITY_CSV_COLUMNS,
        *OUTCOME_CSV_COLUMNS,
        *LOSS_CSV_COLUMNS,
    ]
    assert header[: len(fixed)] == fixed
    # Then the measured window: 14 columns, and per metric mean/min/max/std + 5 percentiles.
    window = header[len(fixed) :]
    assert window[:14] == [
        "window_start_seconds", "window_end_seconds", "window_requests",
        "window_requests_per_second", "window_output_tokens_per_second", "cache_hit_percent",
        "good_requests", "good_requests_per_second", "goodput_ratio", "good_trajectories",
        "good_trajectories_per_minute", "slo_verdict", "client_verdict", "server_verdict",
    ]  # fmt: skip
    assert window[14:] == [
        f"window_{m}_{f}_ms"
        for m in ("ttft", "itl", "tpot", "e2e")
        for f in ("mean", "min", "max", "std", "p50", "p90", "p95", "p99", "p99_9")
    ]
    # The stub's canned usage is far from the plan: 24 -> 100 and 40 -> 150 prompt tokens,
    # 4 -> 3 and 4 -> 7 output tokens. Perfect caching explains min(100 + 3, 150) tokens of
    # the second request, and the whole 100 of the first one's retry (after a 503).
    assert run.line("Prompt fidelity: ") == (
        "Prompt fidelity: 0/2 exact (0.0%), mean |drift| 93.00 tokens, max 110"
    )
    assert run.line("Output fidelity: ") == (
        "Output fidelity: 0/2 exact (0.0%), mean |drift| 2.00 tokens, max 3"
    )
    assert not run.has("Warning: the server reported")
    expected = {
        "model": "Qwen/Qwen3-VL-235B-A22B-Instruct-FP8",
        "workload_mode": "trajectory_replay",
        "agent_plans_jsonl": str(plans),
        "agent_plans_sha256": digest,
        "trajectory_schema_version": "1",
        "admission_mode": "closed-loop",
        "agents": "2",
        "requested_max_active_agents": "1",
        "max_active_agents": "1",
        "late_admissions": "0",
        "completed_agents": "1",
        "planned_tool_invocations": "3",
        "total_requests": "3",
        "successful_requests": "2",
        "failed_requests": "1",
        "total_input_tokens": "250",
        "total_output_tokens": "10",
        "estimated_cached_input_tokens": "100",
        "host": stub.url,
        "endpoint": stub.url + ENDPOINT_PATH,
        "sglang": "false",
        "ignore_eos": "false",
        "user_tagging": "true",
        "dp_rank_perfect_routing": "false",
        "dp_rank_perfect_routing_num": "",
        "seed": "3",
        "replay_initial_overhead_tokens": "",
        "agent_events_jsonl": str(events),
        "interrupted": "false",
        "stream": "false",
        "server_cached_input_tokens": "100",
        "peak_in_flight_requests": "1",
        "batchbench_version": batchbench.__version__,
        "content_salt": "test",
        "prompt_correction": "false",
        "prompt_oracle": "none",
        "calibrated_initial_overhead_tokens": "",
        "prompt_fidelity_requests": "2",
        "prompt_exact_requests": "0",
        "prompt_exact_percent": "0.0",
        "prompt_drift_mean_abs_tokens": "93.0",
        "prompt_drift_max_abs_tokens": "110",
        "output_exact_requests": "0",
        "output_drift_mean_abs_tokens": "2.0",
        "output_drift_max_abs_tokens": "3",
        "corrected_requests": "0",
        "correction_limited_requests": "0",
        "explainable_cached_input_tokens": "203",
        "cancelled_requests": "0",
        "skipped_requests": "0",
        "attempts": "4",  # the stub's first answer is retried
        "retries": "1",
        "retry_waits_capped": "0",
        "failure_rate": repr(1 / 3),
        "max_failure_rate": "0.0",
        "verdict": "failed",
    }
    assert {k: values[k] for k in expected} == expected
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", values["timestamp"])
    assert values["latency_p50_ms"] != "" and values["ttft_p50_ms"] == ""

    # JSON summary.
    document = json.loads(summary_json.read_text())
    assert document["manifest"] == {
        "path": str(plans),
        "sha256": digest,
        "schema_version": 1,
        "sources": [],  # no trajectory of this manifest has provenance
    }
    assert list(document["metrics"]) == [
        *fixed,
        "errors_by_kind",
        "resent_requests",
    ]  # the window has its own
    assert document["metrics"]["errors_by_kind"] == {
        "http_status": {"count": 2, "example": "request failed (503 Service Unavailable) busy",
                        "statuses": {"400": 1, "503": 1}},
    }  # fmt: skip
    assert document["metrics"]["successful_requests"] == 2
    assert document["metrics"]["total_input_tokens"] == 250
    assert (document["interrupted"], document["interrupted_by"], document["dry_run"]) == (False, None, False)  # fmt: skip
    assert document["failures"] == [
        {"agent_id": 1, "trajectory_id": "bad", "invocation": 1, "error": "request failed (400 Bad Request) bad request body"}
    ]  # fmt: skip

    # Lifecycle records: the original tool's fields in order, then this package's figures.
    lines = events.read_bytes().splitlines()
    records = [orjson.loads(line) for line in lines]
    assert [orjson.dumps(r) for r in records] == lines  # compact, no spaces added
    ok, bad = records
    for record in records:
        assert list(record) == LIFECYCLE_FIELDS + LIFECYCLE_EXTRA_FIELDS
        assert record["dp_rank"] is None and record["scheduled_at_seconds"] == 0.0
        assert record["queue_wait_seconds"] == record["admitted_at_seconds"]
        assert record["runtime_seconds"] == pytest.approx(
            record["finished_at_seconds"] - record["admitted_at_seconds"]
        )
    assert {k: ok[k] for k in ["agent_id", "trajectory_id", "routing_slot", "completed", *LIFECYCLE_EXTRA_FIELDS]} == {
        "agent_id": 0, "trajectory_id": "ok", "routing_slot": 0, "completed": True,
        "requests": 2, "successful_requests": 2, "failed_requests": 0, "input_tokens": 250,
        "output_tokens": 10, "cached_tokens": 100, "ttft_p50_seconds": None, "error": None,
        "prompt_exact_requests": 0, "output_exact_requests": 0, "cancelled_requests": 0,
        "skipped_requests": 0,
    }  # fmt: skip
    assert {k: bad[k] for k in ["agent_id", "trajectory_id", "routing_slot", "completed", *LIFECYCLE_EXTRA_FIELDS]} == {
        "agent_id": 1, "trajectory_id": "bad", "routing_slot": 0, "completed": False,
        "requests": 1, "successful_requests": 0, "failed_requests": 1, "input_tokens": 0,
        "output_tokens": 0, "cached_tokens": None, "ttft_p50_seconds": None,
        "error": "request failed (400 Bad Request) bad request body",
        "prompt_exact_requests": 0, "output_exact_requests": 0, "cancelled_requests": 0,
        "skipped_requests": 0,
    }  # fmt: skip

    # Request events: one line per logical request.
    rows = read_jsonl(requests)
    assert all(list(row) == REQUEST_EVENT_FIELDS for row in rows)
    picked = [
        (r["agent_id"], r["trajectory_id"], r["invocation"], r["target_prompt_tokens"],
         r["prompt_tokens"], r["completion_tokens"], r["cached_tokens"], r["attempts"],
         r["status"], r["error"])
        for r in rows
    ]  # fmt: skip
    assert picked == [
        (0, "ok", 1, 24, 100, 3, 0, 2, "ok", None),
        (0, "ok", 2, 40, 150, 7, 100, 1, "ok", None),
        (1, "bad", 1, 24, None, None, None, 1, "failed", "request failed (400 Bad Request) bad request body"),
    ]  # fmt: skip
    assert [
        (r["prompt_drift"], r["prompt_correction_tokens"], r["correction_note"],
         r["planned_output_tokens"], r["output_drift"], r["reply_rendered_tokens"])
        for r in rows
    ] == [(76, 0, None, 4, -1, None), (110, 0, None, 4, 3, None), (None, 0, None, 4, None, None)]  # fmt: skip
    assert all(r["routing_slot"] == 0 and r["dp_rank"] is None for r in rows)
    assert rows[0]["start_offset_seconds"] <= rows[1]["start_offset_seconds"]
    assert all(r["latency_seconds"] >= 0 for r in rows)


def test_lifecycle_records_are_on_disk_as_each_trajectory_finishes(capsys, stub, tmp_path):
    """Two quick trajectories finish within milliseconds of each other; when the slow one's
    second turn arrives, both records must already be whole lines in the file."""
    events = tmp_path / "e.jsonl"
    plans = write_plans(
        tmp_path / "p.jsonl",
        {"q1": [req(24, 4)], "q2": [req(24, 4)], "slow": [req(24, 4), req(40, 4)]},
    )
    seen: list[bytes] = []

    def handler(recorded: Recorded):
        if recorded.user == "u-2":
            if len(recorded.messages) == 1:
                return Reply(delay=0.5)
            seen.append(events.read_bytes())  # the run is still going on
        return Reply()

    stub.handler = handler
    run_agent(capsys, argv(stub, plans, "--user-prefix", "u", "--agent-events-jsonl", str(events)))
    [snapshot] = seen
    assert snapshot.endswith(b"\n")
    assert sorted(orjson.loads(line)["trajectory_id"] for line in snapshot.splitlines()) == [
        "q1",
        "q2",
    ]
    assert [r["trajectory_id"] for r in read_jsonl(events)][-1] == "slow"


# ---------------------------------------------------------------------------------------
# Interruption and crash safety (subprocesses)


def spawn_agent(stub: StubServer, plans: Path, *extra: str) -> subprocess.Popen:
    env = os.environ.copy()
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    env.pop("OPENAI_API_KEY", None)
    command = [
        sys.executable,
        "-c",
        "from batchbench.cli.agent import console_main; console_main()",
        *spawned_argv(stub, plans, *extra),
    ]
    return subprocess.Popen(
        command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def finish(process: subprocess.Popen, timeout: float = 20.0) -> tuple[Run, int]:
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        pytest.fail(f"the agent did not exit in time:\n{out}\n{err}")
    return Run(out.splitlines(), out, err), process.returncode


def output_files(tmp_path: Path) -> dict[str, Path]:
    return {
        "csv": tmp_path / "s.csv",
        "json": tmp_path / "s.json",
        "events": tmp_path / "e.jsonl",
        "requests": tmp_path / "r.jsonl",
    }


def output_flags(files: dict[str, Path]) -> list[str]:
    return [
        "--results-csv", str(files["csv"]), "--results-json", str(files["json"]),
        "--agent-events-jsonl", str(files["events"]),
        "--request-events-jsonl", str(files["requests"]),
    ]  # fmt: skip


@pytest.mark.parametrize(("sig", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_cancels_requests_after_the_grace_period(stub, tmp_path, sig, status):
    stub.handler = lambda r: Reply(delay=3.0)
    plans = write_plans(tmp_path / "p.jsonl", {f"t{i}": [req(24, 4), req(40, 4)] for i in range(4)})
    files = output_files(tmp_path)
    process = spawn_agent(
        stub, plans, "--max-active-agents", "2", "--grace-seconds", "0.5", *output_flags(files)
    )
    assert stub.wait_for(2, timeout=20), "the agent sent no requests"
    signalled = time.perf_counter()
    process.send_signal(sig)
    run, code = finish(process)
    assert code == status, run.err
    assert time.perf_counter() - signalled < 2.5  # 0.5 s grace, not the 3 s replies
    assert "Traceback" not in run.err and "Error:" not in run.err
    assert len(stub.requests) == 2  # admission stopped: nothing new after the signal
    summary = run.summary
    assert summary[0] == INTERRUPTED_LINE.format(sig.name)
    assert summary[1] == "Agents: 0 completed / 4 total"
    assert run.line("Tool invocations: ") == "Tool invocations: 8 planned; requests 0 (success 0, failure 0)"  # fmt: skip
    assert run.failures == []
    _, values = read_csv(files["csv"])
    assert (values["interrupted"], values["completed_agents"], values["total_requests"]) == ("true", "0", "0")  # fmt: skip
    records = read_jsonl(files["events"])
    assert sorted(r["agent_id"] for r in records) == [0, 1]  # the others were never admitted
    for record in records:
        assert list(record)[:11] == [*LIFECYCLE_FIELDS, "interrupted"]
        assert (record["completed"], record["interrupted"]) == (False, True)
    cancelled = read_jsonl(files["requests"])
    assert sorted((r["agent_id"], r["status"]) for r in cancelled) == [(0, "cancelled"), (1, "cancelled")]  # fmt: skip
    document = json.loads(files["json"].read_text())
    assert (document["interrupted"], document["interrupted_by"]) == (True, sig.name)
    metrics = document["metrics"]
    # Every planned request in one bucket: 2 in flight were cancelled, the rest never sent.
    assert (metrics["cancelled_requests"], metrics["skipped_requests"]) == (2, 6)
    assert metrics["verdict"] == "interrupted" and metrics["errors_by_kind"]["cancelled"] == {
        "count": 2,
        "example": "cancelled in flight when the grace period ended",
    }
    assert run.line("Requests by outcome: ") == (
        "Requests by outcome: 8 planned = 0 succeeded + 0 failed + 2 cancelled + 6 skipped; "
        "2 attempts (0 retries)"
    )
    assert run.lines[-5:] == [
        f"Wrote agent lifecycle events to {files['events']}",
        f"Wrote request events to {files['requests']}",
        f"Wrote agent benchmark summary to {files['csv']}",
        f"Wrote agent benchmark JSON summary to {files['json']}",
        f"Wrote resolved options to {files['json'].with_suffix('.config.toml')}",
    ]


def test_requests_finishing_in_the_grace_period_count(stub, tmp_path):
    stub.handler = lambda r: Reply(delay=1.0, body=chat_completion("late", 20, 2))
    plans = write_plans(tmp_path / "p.jsonl", {"a": [req(24, 4), req(40, 4)], "b": [req(24, 4), req(40, 4)]})  # fmt: skip
    files = output_files(tmp_path)
    process = spawn_agent(stub, plans, "--grace-seconds", "5", *output_flags(files))
    assert stub.wait_for(2, timeout=20)
    process.send_signal(signal.SIGINT)
    run, code = finish(process)
    assert code == 130, run.err
    assert len(stub.requests) == 2
    assert run.summary[0] == INTERRUPTED_LINE.format("SIGINT")
    assert run.line("Tool invocations: ") == "Tool invocations: 4 planned; requests 2 (success 2, failure 0)"  # fmt: skip
    assert run.line("Total input tokens sent: ") == "Total input tokens sent: 40"
    records = read_jsonl(files["events"])
    assert [(r["completed"], r.get("interrupted"), r["successful_requests"]) for r in records] == [
        (False, True, 1),
        (False, True, 1),
    ]
    assert sorted(r["status"] for r in read_jsonl(files["requests"])) == ["ok", "ok"]
    assert run.line("Requests by outcome: ") == (
        "Requests by outcome: 4 planned = 2 succeeded + 0 failed + 0 cancelled + 2 skipped; "
        "2 attempts (0 retries)"
    )


@pytest.mark.parametrize("sleep", ["tool", "backoff"])
def test_signal_ends_pending_sleeps_at_once(stub, tmp_path, sleep):
    files = output_files(tmp_path)
    if sleep == "tool":
        plans = write_plans(tmp_path / "p.jsonl", {"t": [req(24, 4, delay_after_ms=20000), req(40, 4)]})  # fmt: skip
        extra = []
    else:
        stub.handler = lambda r: Reply(503, "busy")
        plans = one_request_plans(tmp_path)
        extra = ["--retry-delay-ms", "20000"]
    process = spawn_agent(stub, plans, "--grace-seconds", "10", *extra, *output_flags(files))
    assert stub.wait_for(1, timeout=20)
    time.sleep(0.3)
    signalled = time.perf_counter()
    process.send_signal(signal.SIGINT)
    run, code = finish(process)
    assert code == 130, run.err
    assert time.perf_counter() - signalled < 3.0
    assert len(stub.requests) == 1
    assert run.summary[0] == INTERRUPTED_LINE.format("SIGINT")
    assert run.failures == []
    success = 1 if sleep == "tool" else 0
    assert run.line("Tool invocations: ") == (
        f"Tool invocations: 2 planned; requests {success} (success {success}, failure 0)"
        if sleep == "tool"
        else "Tool invocations: 1 planned; requests 0 (success 0, failure 0)"
    )
    [record] = read_jsonl(files["events"])
    assert (record["completed"], record["interrupted"]) == (False, True)
    buckets = (1, 0, 0, 1) if sleep == "tool" else (0, 0, 1, 0)
    assert run.line("Requests by outcome: ").startswith(
        f"Requests by outcome: {sum(buckets)} planned = {buckets[0]} succeeded + {buckets[1]} "
        f"failed + {buckets[2]} cancelled + {buckets[3]} skipped; "
    )
    if sleep == "backoff":  # cancelled while waiting to retry: named, not null
        [event] = read_jsonl(files["requests"])
        assert (event["status"], event["error_kind"]) == ("cancelled", "cancelled")
        assert event["error"] == "cancelled by the shutdown while waiting to retry"
        assert [e["kind"] for e in event["errors"]] == ["http_status", "cancelled"]
    if sleep == "tool":
        slept = float(re.search(r"([\d.]+)s$", run.line("Total simulated tool-call latency")).group(1))  # fmt: skip
        assert 0.2 <= slept < 3.0  # the part of the 20 s sleep that happened


def test_second_signal_ends_the_grace_period(stub, tmp_path):
    stub.handler = lambda r: Reply(delay=10.0)
    files = output_files(tmp_path)
    process = spawn_agent(
        stub, one_request_plans(tmp_path), "--grace-seconds", "30", *output_flags(files)
    )
    assert stub.wait_for(1, timeout=20)
    signalled = time.perf_counter()
    process.send_signal(signal.SIGINT)
    time.sleep(0.3)
    process.send_signal(signal.SIGINT)
    run, code = finish(process)
    assert code == 130, run.err
    assert time.perf_counter() - signalled < 3.0
    assert run.summary[0] == INTERRUPTED_LINE.format("SIGINT")
    assert [r["status"] for r in read_jsonl(files["requests"])] == ["cancelled"]
    metrics = json.loads(files["json"].read_text())["metrics"]
    assert (metrics["cancelled_requests"], metrics["skipped_requests"]) == (1, 0)


def test_sigkill_leaves_whole_jsonl_lines(stub, tmp_path):
    stub.handler = lambda r: Reply(delay=0.05)
    plans = write_plans(tmp_path / "p.jsonl", {f"t{i}": [req(24, 4), req(40, 4)] for i in range(80)})  # fmt: skip
    files = output_files(tmp_path)
    process = spawn_agent(stub, plans, "--max-active-agents", "2", *output_flags(files))
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if files["events"].exists() and files["events"].read_bytes().count(b"\n") >= 4:
                break
            time.sleep(0.02)
        # Finished trajectories are on disk while the run goes on.
        assert process.poll() is None, "the run ended before it could be killed"
        records = read_jsonl(files["events"])
        assert len(records) >= 4 and all(r["completed"] for r in records)
        time.sleep(0.3)  # let request events flush at least once more
    finally:
        process.kill()
        process.communicate()
    assert process.returncode == -signal.SIGKILL
    records = read_jsonl(files["events"])
    assert all(list(r) == LIFECYCLE_FIELDS + LIFECYCLE_EXTRA_FIELDS for r in records)
    rows = read_jsonl(files["requests"])
    assert len(rows) >= 1 and all(list(r) == REQUEST_EVENT_FIELDS for r in rows)
    assert not files["csv"].exists()


REQUEST_EVENT_KEYS = REQUEST_EVENT_FIELDS  # the documented key order (docs/outputs.md)


@pytest.mark.parametrize(
    "values",
    [
        (3, "t-3", 2, 5, 1, 900, 901, 50, 640, 1.25, 0.5, 0.0625, 1, "ok", None, None, None,
         [], 1, -4, None, 50, 0, 48, None, "http://10.0.0.7:8000"),
        (0, "x", 1, 0, None, 10, None, None, None, None, None, None, 3, "failed",
         "HTTP 500", "http_status", 500,
         [{"attempt": 1, "kind": "http_status", "status": 500, "message": "HTTP 500"}],
         None, 0, "too short", 7, None, None, 0.003, None),
    ],
)  # fmt: skip
def test_a_request_event_is_the_same_line_as_the_dict_it_replaced(values):
    """The typed record serialises to the bytes of the 26-key dict the driver would
    build, keys in the documented order (docs/outputs.md)."""
    event = RequestEvent(*values)
    line = orjson.dumps(event, option=orjson.OPT_APPEND_NEWLINE)
    expected = orjson.dumps(dict(zip(REQUEST_EVENT_KEYS, values, strict=True)))
    assert line == expected + b"\n"
    assert list(orjson.loads(line)) == REQUEST_EVENT_KEYS
