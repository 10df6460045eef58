"""End to end: ``batchbench-agent`` against the real simulator on loopback (issue: simulator).

Fidelity (every prompt count equals the manifest's), cache hits under each routing mode,
per-rank balance with slot inheritance, and each injected fault seen by the client as the
right retry or failure.
"""

from __future__ import annotations

import csv
import itertools
import json
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import orjson
import pytest

from batchbench.cli.agent import main
from batchbench.drive.simlaunch import SimProcess, sim_command
from batchbench.drive.wire import NO_STREAM_USAGE
from batchbench.sim.overheads import measure_overheads
from batchbench.text.tokenizer import load_tokenizer

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "trajectory-replay" / "plans.jsonl"
BLOCK = 16


def lines(path: Path) -> list[dict]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def metric(url: str, name: str) -> dict[str, float]:
    """label text -> value of one family of the simulator's /metrics."""
    with urllib.request.urlopen(url + "/metrics", timeout=5) as response:
        text = response.read().decode()
    values = {}
    for match in re.finditer(rf"^{name}(\{{[^}}]*\}})? (\S+)$", text, re.MULTILINE):
        values[match.group(1) or ""] = float(match.group(2))
    return values


@pytest.fixture(scope="module")
def overheads() -> tuple[int, int]:
    """The simulator's ChatML overheads on DeepSeek-V3, measured by its own probe."""
    return measure_overheads(load_tokenizer("deepseek-v3"), "chatml")


def run_agent(tmp_path: Path, *args: str) -> tuple[int, dict, list[dict], list[dict]]:
    """Run in-process; returns (status, JSON summary, lifecycle records, request events).
    Plain JSON replies unless the test passes --stream, and no calibration probes unless
    --calibrate (the tests count the simulator's requests and inject its faults)."""
    summary, events, requests = tmp_path / "s.json", tmp_path / "e.jsonl", tmp_path / "r.jsonl"
    status = main(
        [
            *args,
            *([] if "--stream" in args else ["--no-stream"]),
            *([] if "--calibrate" in args else ["--no-calibrate"]),
            "--tokenizer-model",
            "deepseek-v3",
            "--no-progress",
            "--results-json",
            str(summary),
            "--agent-events-jsonl",
            str(events),
            "--request-events-jsonl",
            str(requests),
            "--no-preflight",  # the simulator's counters are compared with the run's
            "--model",
            "batchbench-sim",
        ]
    )
    return status, json.loads(summary.read_text()), lines(events), lines(requests)


def test_overheads_are_the_documented_ones(overheads):
    assert overheads == (9, 35)


@pytest.mark.parametrize("stream", [False, True])
def test_sim_flag_replays_the_example_with_exact_prompt_counts(tmp_path, capsys, overheads, stream):
    initial, turn = overheads
    args = [
        "--agent-plans-jsonl", str(EXAMPLE), "--max-active-agents", "2",
        "--replay-initial-overhead-tokens", str(initial),
        "--replay-turn-overhead-tokens", str(turn),
        "--sim", "--sim-args", "--speed 0", "--seed", "7",
        "--results-csv", str(tmp_path / "r.csv"),
    ] + (["--stream"] if stream else [])  # fmt: skip
    status, summary, events, requests = run_agent(tmp_path, *args)
    assert status == 0
    out = capsys.readouterr().out
    assert "Agents: 3 completed / 3 total" in out
    assert "Tool invocations: 7 planned; requests 7 (success 7, failure 0)" in out
    manifest = [orjson.loads(line) for line in EXAMPLE.read_bytes().splitlines() if line.strip()]
    planned = {
        (t["trajectory_id"], n): r["prompt_tokens"]
        for t in manifest
        for n, r in enumerate(t["requests"], start=1)
    }
    sent = {(r["trajectory_id"], r["invocation"]): r["prompt_tokens"] for r in requests}
    assert sent == planned  # every usage.prompt_tokens equals the manifest's prompt_tokens
    assert all(r["target_prompt_tokens"] == r["prompt_tokens"] for r in requests)
    outputs = {
        (t["trajectory_id"], n): r["output_tokens"]
        for t in manifest
        for n, r in enumerate(t["requests"], start=1)
    }
    assert {(r["trajectory_id"], r["invocation"]): r["completion_tokens"] for r in requests} == (
        outputs
    )
    assert summary["metrics"]["total_input_tokens"] == sum(planned.values())
    assert [e["completed"] for e in events] == [True, True, True]
    assert ("Time to first token (ms, streamed requests): p50=" in out) is stream
    with open(tmp_path / "r.csv", newline="") as handle:
        row = next(csv.DictReader(handle))
    assert (row["ttft_p50_ms"] != "") is stream
    assert row["stream"] == ("true" if stream else "false")
    assert row["host"].startswith("http://127.0.0.1:")


@pytest.mark.native_pass_only  # the transport is pure Python: the pure pass adds nothing here
def test_a_server_that_closes_after_each_stream_costs_no_retries(tmp_path, capsys):
    """llama.cpp's server ends the connection after every streamed response although it
    stays kept alive by HTTP/1.1; the simulator's --close-after-stream does the same. A
    request that goes out on such a connection as it closes was never answered: it is sent
    again on a new connection at once, not counted as a failed attempt with a backoff (the
    aiohttp client this replaced counted 40 disconnects and 40 retries for this run)."""
    args = [
        "--agents", "8", "--tool-invocations", "6", "--input-tokens", "64",
        "--output-tokens", "16", "--seed", "3", "--stream", "--sim", "--sim-args", "--speed 0 --close-after-stream",
    ]  # fmt: skip
    status, summary, _, requests = run_agent(tmp_path, *args)
    out = capsys.readouterr().out
    metrics = summary["metrics"]
    assert status == 0 and metrics["verdict"] == "ok"
    assert (metrics["successful_requests"], metrics["attempts"], metrics["retries"]) == (48, 48, 0)
    assert metrics["errors_by_kind"] == {}
    assert [r["attempts"] for r in requests] == [1] * 48
    # Every request after an agent's first finds its connection closing or closed; how many
    # were already sent when the close arrived depends on timing, never more than those 40.
    assert 0 <= metrics["resent_requests"] <= 40
    if metrics["resent_requests"]:
        assert f"Requests resent on a new connection: {metrics['resent_requests']} " in out
    assert all(r["completion_tokens"] == 16 for r in requests)


def growing_manifest(path: Path, trajectories: int, turns: int) -> list[list[int]]:
    """Identical shapes: prompts 200, 400, …; outputs 40; returns the prompt lists."""
    prompts = [200 * (k + 1) for k in range(turns)]
    with open(path, "w") as handle:
        for t in range(trajectories):
            requests = [{"prompt_tokens": p, "output_tokens": 40} for p in prompts]
            handle.write(
                json.dumps({"schema_version": 1, "trajectory_id": f"t{t}", "requests": requests})
                + "\n"
            )
    return [prompts] * trajectories


@pytest.fixture(scope="module")
def four_ranks():
    with SimProcess(
        sim_command("deepseek-v3", 4, f"--speed 0 --block-size {BLOCK} --kv-cache-tokens 1000000")
    ) as sim:
        yield sim.url


def test_cache_hits_with_and_without_routing(tmp_path, capsys, overheads, four_ranks):
    initial, turn = overheads
    manifest = tmp_path / "m.jsonl"
    prompts = growing_manifest(manifest, trajectories=4, turns=4)
    common = [
        "--agent-plans-jsonl", str(manifest), "--host", four_ranks,
        "--replay-initial-overhead-tokens", str(initial),
        "--replay-turn-overhead-tokens", str(turn),
    ]  # fmt: skip
    # Per-trajectory prefix reuse, in whole blocks: each turn can reuse its previous prompt.
    floor_bound = sum((p // BLOCK) * BLOCK for plan in prompts for p in plan[:-1])

    perfect = tmp_path / "perfect"
    perfect.mkdir()
    status, summary, _events, _requests = run_agent(
        perfect,
        *common, "--seed", "11",
        "--max-active-agents", "4",
        "--dp-rank-perfect-routing", "--dp-rank-perfect-routing-num", "4",
    )  # fmt: skip
    assert status == 0
    perfect_cached = summary["metrics"]["server_cached_input_tokens"]
    assert perfect_cached >= floor_bound

    sticky = tmp_path / "sticky"  # routing key only: a consistent hash keeps each agent on a rank
    sticky.mkdir()
    # Other seeds give other texts and tags, so nothing is shared with the earlier runs.
    status, summary, _events, _requests = run_agent(
        sticky, *common, "--seed", "12", "--max-active-agents", "4"
    )
    assert status == 0
    assert summary["metrics"]["server_cached_input_tokens"] == perfect_cached

    scattered = tmp_path / "scattered"  # no headers: idle ranks are taken in round-robin order
    scattered.mkdir()
    status, summary, _events, requests = run_agent(
        scattered, *common, "--seed", "13", "--max-active-agents", "1", "--disable-user-tagging"
    )
    assert status == 0
    assert summary["metrics"]["server_cached_input_tokens"] == 0
    assert len(requests) == 16
    capsys.readouterr()


def test_rank_balance_with_slot_inheritance(tmp_path, capsys, overheads, four_ranks):
    initial, turn = overheads
    manifest = tmp_path / "m.jsonl"
    growing_manifest(manifest, trajectories=12, turns=3)
    before = metric(four_ranks, "batchbench_sim_requests_total")
    before_prompt = metric(four_ranks, "batchbench_sim_prompt_tokens_total")
    status, summary, events, _requests = run_agent(
        tmp_path,
        "--agent-plans-jsonl", str(manifest), "--host", four_ranks, "--seed", "3",
        "--replay-initial-overhead-tokens", str(initial),
        "--replay-turn-overhead-tokens", str(turn),
        "--max-active-agents", "4",
        "--dp-rank-perfect-routing", "--dp-rank-perfect-routing-num", "4",
    )  # fmt: skip
    assert status == 0
    out = capsys.readouterr().out
    assert "Per-rank load (4 ranks, perfect routing):" in out
    ranks = summary["ranks"]
    by_rank = [[e for e in events if e["dp_rank"] == rank] for rank in range(4)]
    # Which trajectory inherits which slot depends on who finishes first; what must hold is
    # that a trajectory keeps its slot's rank for all its turns and that each slot (so each
    # rank) serves one trajectory at a time.
    assert [r["trajectories"] for r in ranks] == [len(group) for group in by_rank]
    assert sum(r["trajectories"] for r in ranks) == 12
    assert [r["requests"] for r in ranks] == [3 * len(group) for group in by_rank]
    assert [r["input_tokens"] for r in ranks] == [1200 * len(group) for group in by_rank]
    assert all(e["dp_rank"] == e["routing_slot"] % 4 and e["completed"] for e in events)
    for group in by_rank:
        spans = sorted((e["admitted_at_seconds"], e["finished_at_seconds"]) for e in group)
        assert spans and all(end <= start for (_, end), (start, _) in itertools.pairwise(spans))
    requests = [r["requests"] for r in ranks]
    tokens = [r["input_tokens"] for r in ranks]
    assert (
        f"Rank imbalance (max/mean): requests {max(requests) / (sum(requests) / 4):.2f}, "
        f"input tokens {max(tokens) / (sum(tokens) / 4):.2f}"
    ) in out
    after = metric(four_ranks, "batchbench_sim_requests_total")
    after_prompt = metric(four_ranks, "batchbench_sim_prompt_tokens_total")
    for rank in range(4):
        label = f'{{rank="{rank}"}}'
        assert after[label] - before[label] == ranks[rank]["requests"]
        assert after_prompt[label] - before_prompt[label] == ranks[rank]["input_tokens"]


def one_request_manifest(path: Path) -> Path:
    path.write_text(
        '{"schema_version":1,"trajectory_id":"f","requests":'
        '[{"prompt_tokens":120,"output_tokens":16}]}\n'
    )
    return path


FAULTS = [
    # (sim flags, agent flags, fault kind in /metrics, attempts, error prefix or None, kind)
    ("--fault-error-rate 1 --fault-error-statuses 503", [], "error", 3,
     "request failed (503 Service Unavailable)", "http_status"),
    ("--fault-error-rate 1 --fault-error-statuses 503", ["--stream"], "error", 3,
     "request failed (503 Service Unavailable)", "http_status"),
    ("--fault-error-rate 1 --fault-error-statuses 400", [], "error", 1,
     "request failed (400 Bad Request)", "http_status"),
    ("--fault-429-rate 1 --fault-retry-after-s 1", ["--max-retries", "1"], "rate_limit", 2,
     "request failed (429 Too Many Requests)", "http_status"),
    ("--fault-429-rate 1 --fault-retry-after-s 1", ["--max-retries", "1", "--stream"],
     "rate_limit", 2, "request failed (429 Too Many Requests)", "http_status"),
    ("--fault-drop-rate 1", [], "drop", 3, "request failed: ", "disconnect"),
    ("--fault-drop-rate 1", ["--stream"], "drop", 3, "request failed: ", "disconnect"),
    ("--fault-truncate-rate 1", ["--stream"], "truncate", 3,
     "streamed response ended before [DONE] and usage after", "truncated_stream"),
    ("--fault-truncate-rate 1", [], "truncate", 0, None, None),  # only streams are cut
    ("--fault-malformed-rate 1", [], "malformed", 3, "invalid JSON in response body",
     "malformed_json"),
    ("--fault-malformed-rate 1", ["--stream"], "malformed", 3,
     "invalid JSON in streamed response chunk", "malformed_json"),
    ("--fault-missing-usage-rate 1", [], "missing_usage", 3, "response missing usage field",
     "missing_usage"),
    ("--fault-missing-usage-rate 1", ["--stream"], "missing_usage", 3, NO_STREAM_USAGE,
     "missing_usage"),
    ("--fault-spike-rate 1 --fault-spike-ms 300", [], "latency_spike", 1, None, None),
    ("--fault-spike-rate 1 --fault-spike-ms 300", ["--stream"], "latency_spike", 1, None, None),
]  # fmt: skip


@pytest.mark.parametrize(
    ("sim_flags", "agent_flags", "kind", "attempts", "error", "error_kind"), FAULTS
)
def test_each_fault_is_seen_as_the_right_retry_or_failure(
    tmp_path, capsys, sim_flags, agent_flags, kind, attempts, error, error_kind
):
    manifest = one_request_manifest(tmp_path / "m.jsonl")
    with SimProcess(sim_command("deepseek-v3", None, f"--speed 0 {sim_flags}")) as sim:
        status, summary, events, requests = run_agent(
            tmp_path,
            "--agent-plans-jsonl", str(manifest), "--host", sim.url,
            "--retry-delay-ms", "0", *agent_flags,
        )  # fmt: skip
        faults = metric(sim.url, "batchbench_sim_faults_total")
    out = capsys.readouterr().out
    metrics = summary["metrics"]
    buckets = ("successful", "failed", "cancelled", "skipped")
    assert metrics["planned_tool_invocations"] == sum(metrics[f"{b}_requests"] for b in buckets)
    [request] = requests
    assert request["attempts"] == max(attempts, 1)
    assert faults.get(f'{{kind="{kind}"}}', 0) == attempts
    if error is None:
        assert status == 0 and metrics["verdict"] == "ok"
        assert request["status"] == "ok" and request["errors"] == []
        assert metrics["failed_requests"] == 0 and metrics["errors_by_kind"] == {}
        if kind == "latency_spike":
            assert request["latency_seconds"] >= 0.3
        return
    assert status == 3  # the run finished, but a request failed
    assert request["status"] == "failed" and request["error"].startswith(error)
    assert request["error_kind"] == error_kind
    assert [e["kind"] for e in request["errors"]] == [error_kind] * attempts
    assert [e["attempt"] for e in request["errors"]] == list(range(1, attempts + 1))
    assert metrics["failed_requests"] == 1 and metrics["attempts"] == attempts
    assert metrics["retries"] == attempts - 1 and metrics["verdict"] == "failed"
    assert metrics["errors_by_kind"][error_kind]["count"] == attempts
    assert events[0]["completed"] is False and events[0]["error"] == request["error"]
    assert out.count("Failure: agent 0 ") == 1
    assert f"Failed attempts by kind ({attempts}; " in out
    assert out.rstrip().splitlines()[-1].startswith("Result: FAILED: 1 of 1 sent requests failed")
    if kind == "rate_limit":
        assert request["latency_seconds"] >= 1.0  # Retry-After: 1 over a 0 ms backoff


def test_a_server_killed_mid_run_is_a_failed_run_with_every_request_accounted(tmp_path):
    """The simulator dies while agents are between requests: the run still ends by itself,
    exits 3, writes every output, and puts each planned request in one bucket."""
    summary, events, requests = tmp_path / "s.json", tmp_path / "e.jsonl", tmp_path / "r.jsonl"
    with SimProcess(sim_command("deepseek-v3", None, "--speed 0")) as sim:
        agent = subprocess.Popen(
            [
                sys.executable, "-m", "batchbench", "agent", "--host", sim.url,
                "--agents", "8", "--tool-invocations", "6", "--tool-call-latency-ms", "400",
                "--tokenizer-model", "deepseek-v3", "--retry-delay-ms", "0", "--no-progress",
                "--results-json", str(summary), "--agent-events-jsonl", str(events),
                "--request-events-jsonl", str(requests),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while (
            not requests.exists() or requests.stat().st_size == 0
        ) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
    out, err = agent.communicate(timeout=120)  # the simulator is gone
    assert agent.returncode == 3, err
    metrics = json.loads(summary.read_text())["metrics"]
    buckets = [metrics[f"{b}_requests"] for b in ("successful", "failed", "cancelled", "skipped")]
    assert sum(buckets) == metrics["planned_tool_invocations"] == 48
    assert metrics["failed_requests"] > 0 and metrics["successful_requests"] > 0
    assert set(metrics["errors_by_kind"]) <= {"connect", "disconnect"}
    statuses = [r["status"] for r in lines(requests)]
    assert statuses.count("ok") == buckets[0] and statuses.count("failed") == buckets[1]
    assert len(lines(events)) == 8
    assert out.rstrip().splitlines()[-1].startswith("Result: FAILED: ")
