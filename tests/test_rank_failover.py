"""--rank-failover: what a rank's agents do once the worker behind it goes away.

The end-to-end tests run the real smg gateway (consistent_hashing) in front of two
simulators and stop rank 1's simulator once both of its first agents have been served:
with ``none`` its agents fail and the summary names the rank; with ``rehash`` they continue
on rank 0 and every trajectory completes. The unit tests pin the rules and the texts."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from fakegateway import FakeGateway
from smggateway import Gateway, require_smg, smg_gateway
from test_driver import argv, read_jsonl, req, run_agent, write_plans

from batchbench.config import RunConfig
from batchbench.drive.failover import RankFailover, down_code, down_reason
from batchbench.errors import UsageError
from batchbench.results.failures import AttemptError, ErrorKind
from batchbench.results.placement import rank_health_lines
from batchbench.results.recording import RankFigures

SMG_DOWN = (
    b'{"error":{"type":"server_error","code":"call_upstream_connection_failed",'
    b'"message":"error sending request for url (http://127.0.0.1:1/v1/chat/completions)",'
    b'"param":null}}'
)
SMG_NO_WORKERS = (
    b'{"error":{"type":"service_unavailable","code":"no_available_workers",'
    b'"message":"All workers are unavailable","param":null}}'
)


# -- rules -------------------------------------------------------------------------------
def test_a_gateways_worker_down_codes_are_read_from_a_5xx_body_only():
    assert down_code(500, SMG_DOWN) == "call_upstream_connection_failed"
    assert down_code(503, SMG_NO_WORKERS) == "no_available_workers"
    assert down_code(404, SMG_NO_WORKERS) is None  # a 4xx says nothing of the worker
    assert down_code(503, b'{"error":{"code":"overloaded"}}') is None
    # the code named in the message, not as the code, is not a verdict
    assert down_code(500, b'{"error":{"code":"x","message":"no_available_workers"}}') is None
    assert down_code(502, b"no_available_workers, not JSON") is None


def test_a_failed_attempt_says_its_rank_is_down_when_unreachable():
    # the client connects to the gateway alone: its own failure says nothing of one rank
    assert down_reason(AttemptError(1, ErrorKind.CONNECT, "refused")) is None
    assert down_reason(
        AttemptError(1, ErrorKind.HTTP_STATUS, "x", 503, "no_available_workers")
    ) == ("no_available_workers")
    assert down_reason(AttemptError(1, ErrorKind.HTTP_STATUS, "x", 503)) is None
    assert down_reason(AttemptError(1, ErrorKind.TIMEOUT, "slow")) is None
    assert down_reason(AttemptError(1, ErrorKind.DISCONNECT, "reset")) is None


def test_the_next_live_rank_wraps_around_and_runs_out():
    failover = RankFailover(3, "rehash", "smg", None, 5, None)
    assert failover.mark_down(1, "no_available_workers", 2.0)
    assert not failover.mark_down(1, "no_available_workers", 3.0)  # the first one stays
    assert failover.down[1].reason == "no_available_workers"
    assert failover.live_rank_after(1) == 2
    assert failover.live_rank_after(0) == 2
    failover.mark_down(2, "no_available_workers", 4.0)
    assert failover.live_rank_after(2) == 0
    failover.mark_down(0, "no_available_workers", 5.0)
    assert failover.live_rank_after(0) is None


@pytest.mark.parametrize(
    ("rank_header", "expected"),
    [
        ("smg", {}),
        ("vllm", {"x-data-parallel-rank": "2"}),
        ("both", {"x-data-parallel-rank": "2"}),
    ],
)
def test_a_moved_agent_keeps_its_routing_key_and_drops_the_target_index(rank_header, expected):
    failover = RankFailover(3, "rehash", rank_header, "sk-1", 5, "team")
    assert failover.headers(7, 2, None) == {
        "content-type": "application/json",
        "authorization": "Bearer sk-1",
        "x-smg-routing-key": "team-7",  # the tag it would have had
        **expected,
    }
    assert failover.headers(7, 2, "own-tag")["x-smg-routing-key"] == "own-tag"
    # a key that cannot travel as a header value is left out, not sent raw
    assert "x-smg-routing-key" not in RankFailover(3, "rehash", "smg", None, 5, "a\nb").headers(
        1, 2, None
    )


def test_rank_health_lines_name_down_ranks_failed_agents_and_moves():
    up = RankFigures()
    down = RankFigures(down_at_seconds=1.5, down_reason="no_available_workers", failed_agents=3)
    assert rank_health_lines([RankFigures(), RankFigures()], "none") == []
    assert rank_health_lines([up, down], "none") == [
        "Down ranks: rank 1 from 1.50 s (no_available_workers)",
        "Failed agents per rank: rank 0: 0, rank 1: 3",
        "Rank failover: none (--rank-failover rehash moves a down rank's agents on to a live rank)",
    ]
    moved = RankFigures(
        down_at_seconds=0.25, down_reason="no_available_workers", moved_agents=4,
        moved_completed=3,
    )  # fmt: skip
    assert rank_health_lines([RankFigures(failed_agents=1), moved], "rehash") == [
        "Down ranks: rank 1 from 0.25 s (no_available_workers)",
        "Failed agents per rank: rank 0: 1, rank 1: 0",
        "Rank failover (rehash): 4 agents (4 of rank 1) moved on to a live rank with their "
        "routing key; 3 of them completed",
    ]


def test_rank_health_merges_over_processes_and_survives_a_shard_document():
    first = RankFigures(down_at_seconds=2.0, down_reason="no_available_workers", failed_agents=1)
    second = RankFigures(
        down_at_seconds=1.0, down_reason="no_available_workers", moved_agents=2,
        moved_completed=2,
    )  # fmt: skip
    first.add(second)
    assert (first.down_at_seconds, first.down_reason) == (1.0, "no_available_workers")
    assert (first.failed_agents, first.moved_agents, first.moved_completed) == (1, 2, 2)
    first.add(RankFigures())  # an up rank keeps the earliest sighting
    assert first.down_reason == "no_available_workers"
    from dataclasses import asdict

    assert RankFigures.from_json(json.loads(json.dumps(asdict(first)))) == first
    row = first.as_row()
    assert (row["down"], row["down_at_seconds"], row["down_reason"]) == (
        True, 1.0, "no_available_workers",
    )  # fmt: skip
    assert (RankFigures().as_row()["down"], RankFigures().as_row()["down_at_seconds"]) == (
        False, None,
    )  # fmt: skip


def test_rank_failover_is_checked():
    with pytest.raises(
        UsageError, match=r"^invalid --rank-failover \"sometimes\" \(none or rehash\)$"
    ):
        RunConfig(host="http://h", model="m", dp_ranks=2, rank_failover="sometimes").check()
    with pytest.raises(UsageError) as caught:
        RunConfig(host="http://h", model="m", rank_failover="rehash").check()
    assert str(caught.value) == (
        "--rank-failover rehash needs --dp-rank-perfect-routing (without it the gateway "
        "already picks every request's worker)"
    )
    with pytest.raises(UsageError) as caught:
        RunConfig(host="http://h", model="m", dp_rank_header="vllm").check()
    assert str(caught.value) == (
        "--dp-rank-header vllm needs --dp-rank-perfect-routing (the header names the rank "
        "perfect routing gives each agent)"
    )


# -- against the real gateway -------------------------------------------------------------
def served(url: str) -> int:
    """Chat completions a simulator has served (its own /metrics)."""
    with urllib.request.urlopen(url + "/metrics", timeout=5) as response:
        text = response.read().decode()
    found = re.findall(r'^batchbench_sim_requests_total\{rank="\d+"\} (\S+)$', text, re.M)
    return sum(int(float(value)) for value in found)


def rank_worker(gateway: Gateway, rank: int) -> str:
    """The worker smg sends ``X-SMG-Target-Worker: rank`` to (registration order varies)."""
    body = {"model": "batchbench-sim", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 1}  # fmt: skip
    request = urllib.request.Request(
        gateway.url + "/v1/chat/completions", json.dumps(body).encode(),
        {"content-type": "application/json", "x-smg-target-worker": str(rank)},
    )  # fmt: skip
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.headers["x-smg-routed-worker-id"]


def run_losing_rank_1(tmp_path: Path, failover: str) -> tuple[dict, list[dict], list[str], str]:
    """8 agents of 4 requests on 4 slots over 2 ranks behind smg; rank 1's simulator is
    stopped once it has served both of its first agents' first requests (and the rank
    layout probe). Returns the results JSON, the request events, the console lines and
    the surviving worker's URL."""
    require_smg()
    results, events = tmp_path / f"{failover}.json", tmp_path / f"{failover}.jsonl"
    with smg_gateway(2, "consistent_hashing") as gateway:
        victim_url = rank_worker(gateway, 1)
        survivor = next(url for url in gateway.worker_urls if url != victim_url)
        victim = gateway.sims[gateway.worker_urls.index(victim_url)]
        before = served(victim.url)
        command = [
            sys.executable, "-m", "batchbench", "agent", "--host", gateway.url,
            "--model", "batchbench-sim", "--tokenizer-model", "deepseek-v3", "--no-progress",
            "--agents", "8", "--max-active-agents", "4", "--tool-invocations", "4",
            "--input-tokens", "64", "--output-tokens", "8", "--tool-call-latency-ms", "300",
            "--seed", "5", "--user-prefix", "a", "--max-retries", "1",
            "--dp-rank-perfect-routing", "--dp-rank-perfect-routing-num", "2",
            "--rank-failover", failover,
            "--results-json", str(results), "--request-events-jsonl", str(events),
        ]  # fmt: skip
        process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
        reader = threading.Thread(target=lambda: setattr(reader, "out", process.stdout.read()))
        reader.start()
        deadline = time.monotonic() + 60
        while served(victim.url) < before + 3:  # the layout probe and two first requests
            assert process.poll() is None and time.monotonic() < deadline
            time.sleep(0.01)
        victim.stop()
        # 0 when every request succeeded, 3 when some failed
        assert process.wait(timeout=60) == (0 if failover == "rehash" else 3)
        reader.join()
    rows = [json.loads(line) for line in events.read_text().splitlines()]
    return json.loads(results.read_text()), rows, reader.out.splitlines(), survivor


@pytest.mark.native_pass_only
def test_without_failover_a_lost_ranks_agents_fail_and_the_summary_names_it(tmp_path):
    document, events, out, _ = run_losing_rank_1(tmp_path, "none")
    failed_agents = {e["agent_id"] for e in events if e["status"] == "failed"}
    completed = 8 - len(failed_agents)
    assert f"Agents: {completed} completed / 8 total" in out
    assert len(failed_agents) >= 2  # at least the two that were running on rank 1
    assert {e["dp_rank"] for e in events if e["status"] == "failed"} == {1}
    ranks = document["ranks"]
    assert [r["failed_agents"] for r in ranks] == [0, len(failed_agents)]
    assert [r["down"] for r in ranks] == [False, True]
    assert ranks[1]["down_reason"] == "call_upstream_connection_failed"
    assert [r["moved_agents"] for r in ranks] == [0, 0]
    down = f"Down ranks: rank 1 from {ranks[1]['down_at_seconds']:.2f} s "
    assert down + "(call_upstream_connection_failed)" in out
    assert f"Failed agents per rank: rank 0: 0, rank 1: {len(failed_agents)}" in out
    assert any(line.startswith("Rank failover: none (--rank-failover rehash") for line in out)


@pytest.mark.native_pass_only
def test_with_rehash_a_lost_ranks_agents_complete_on_the_live_rank(tmp_path):
    document, events, out, survivor = run_losing_rank_1(tmp_path, "rehash")
    assert "Agents: 8 completed / 8 total" in out
    assert all(e["status"] == "ok" for e in events) and len(events) == 32
    ranks = document["ranks"]
    moved = ranks[1]["moved_agents"]
    assert moved >= 2 and ranks[1]["moved_completed"] == moved
    assert [r["failed_agents"] for r in ranks] == [0, 0]
    assert ranks[1]["down_reason"] == "call_upstream_connection_failed"
    # every request after the loss was served by the survivor, as rank 0
    first_down = ranks[1]["down_at_seconds"]
    late = [e for e in events if e["start_offset_seconds"] > first_down]
    assert late and {(e["dp_rank"], e["worker"]) for e in late} == {(0, survivor)}
    # the request that found the rank down was sent again: its attempts on rank 1 are kept
    resent = [e for e in events if e["errors"]]
    assert resent and all(e["dp_rank"] == 0 for e in resent)
    assert all(
        err["status"] == 500 and "call_upstream_connection_failed" in err["message"]
        for e in resent
        for err in e["errors"]
    )
    assert (
        f"Rank failover (rehash): {moved} agents ({moved} of rank 1) moved on to a live rank "
        f"with their routing key; {moved} of them completed"
    ) in out
    assert "Failed agents per rank: rank 0: 0, rank 1: 0" in out


# -- against a fake gateway: rules that need no real worker to die --------------------------
W = ["http://127.0.0.1:41101", "http://127.0.0.1:41102", "http://127.0.0.1:41103"]


def fake_run(tmp_path: Path, capsys, gateway: FakeGateway, *extra: str):
    """Six agents r-0..r-5 of three requests over three ranks (rank = agent % 3 at first)."""
    plans = write_plans(
        tmp_path / "p.jsonl", {f"t{i}": [req(24, 4), req(40, 4), req(56, 4)] for i in range(6)}
    )
    results, events = tmp_path / "run.json", tmp_path / "events.jsonl"
    run = run_agent(
        capsys,
        argv(
            gateway.server, plans, "--user-prefix", "r", "--no-preflight", "--max-retries", "0",
            "--dp-rank-perfect-routing", "--dp-rank-perfect-routing-num", "3",
            "--request-events-jsonl", str(events), "--results-json", str(results), *extra,
        ),
    )  # fmt: skip
    return run, read_jsonl(events), json.loads(results.read_text())


def test_moved_agents_replies_stay_out_of_the_placement_table(tmp_path, capsys):
    """Rank 1's worker is gone from the start: its agents move on to rank 2 with their
    routing key only; the gateway hashes them onto some live worker, which is not rank 2's
    usual one for every agent, and that is no misplacement."""
    with FakeGateway(W) as gateway:
        gateway.down = {1}
        run, events, document = fake_run(tmp_path, capsys, gateway, "--rank-failover", "rehash")
    assert "Agents: 6 completed / 6 total" in run.lines
    ranks = document["ranks"]
    assert [r["moved_agents"] for r in ranks] == [0, 2, 0]
    assert [r["moved_completed"] for r in ranks] == [0, 2, 0]
    # the moved agents' requests are counted on rank 2, but their replies are not placed
    assert [r["requests"] for r in ranks] == [6, 0, 12]
    assert [sum(r["workers"].values()) for r in ranks] == [6, 0, 6]
    assert [r["misplaced"] for r in ranks] == [0, 0, 0]
    assert not any(line.startswith("Warning:") for line in run.lines)
    moved = [e for e in events if e["agent_id"] in (1, 4)]
    assert {e["dp_rank"] for e in moved} == {2}
    first = [e for e in moved if e["invocation"] == 1]
    # r-1's first request found the rank down and was sent again on rank 2; r-4's did too,
    # unless it was sent after rank 1 was marked down (then it went to rank 2 at once)
    outcomes = sorted((e["attempts"], len(e["errors"])) for e in first)
    assert outcomes in ([(1, 0), (2, 1)], [(2, 1), (2, 1)])
    assert all(err["status"] == 500 for e in first for err in e["errors"])
    assert "Down ranks: rank 1 from" in "\n".join(run.lines)


def test_a_moved_agent_names_its_new_rank_to_engines_that_number_their_own(tmp_path, capsys):
    """Under --dp-rank-header both the moved agents still send X-data-parallel-rank (2), so
    their replies count in the placement table."""
    with FakeGateway(W) as gateway:
        gateway.down = {1}
        run, _events, document = fake_run(
            tmp_path, capsys, gateway, "--rank-failover", "rehash", "--dp-rank-header", "both"
        )
        sent = [r.headers for r in gateway.server.requests if r.method == "POST"]
    assert "Agents: 6 completed / 6 total" in run.lines
    moved = [h for h in sent if h.get("x-smg-routing-key") in ("r-1", "r-4")]
    assert {h.get("x-data-parallel-rank") for h in moved} == {"1", "2"}
    assert all("x-smg-target-worker" not in h for h in moved if h["x-data-parallel-rank"] == "2")
    assert sum(document["ranks"][2]["workers"].values()) == 12


def test_without_failover_the_down_ranks_agents_fail_and_later_ones_too(tmp_path, capsys):
    with FakeGateway(W) as gateway:
        gateway.down = {1}
        run, _events, document = fake_run(tmp_path, capsys, gateway)
    assert "Agents: 4 completed / 6 total" in run.lines
    assert [r["failed_agents"] for r in document["ranks"]] == [0, 2, 0]
    assert "Failed agents per rank: rank 0: 0, rank 1: 2, rank 2: 0" in run.lines
