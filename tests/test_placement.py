"""Actual placement: where each request was served, as the reply's worker header says,
recorded in request events, lifecycle records, the per-rank table and the results JSON,
against a fake smg gateway (a real aiohttp server on loopback)."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from fakegateway import NO_WORKERS_BODY, FakeGateway
from stubserver import Reply, StubServer, chat_completion
from test_driver import DEFAULT_MODEL, argv, read_jsonl, req, run_agent, write_plans

from batchbench.cli.agent import main
from batchbench.cli.agent_args import config_from_argv
from batchbench.config import RunConfig
from batchbench.drive.preflight import PreflightError
from batchbench.drive.rankcheck import RankLayout, probe_ranks, refusal_text
from batchbench.drive.wire import BodyOptions
from batchbench.errors import UsageError

W0, W1 = "http://127.0.0.1:41001", "http://127.0.0.1:41002"
SMG_WARNING = (
    "the gateway ignored x-smg-target-worker: its policy may not honour it (smg's default "
    "cache_aware does not); use --policy consistent_hashing"
)


def four_agents(tmp_path):
    """Agents r-0..r-3 of three requests each; with two ranks, r-0 and r-2 are rank 0."""
    return write_plans(
        tmp_path / "p.jsonl", {f"t{i}": [req(24, 4), req(40, 4), req(56, 4)] for i in range(4)}
    )


def routed_run(capsys, tmp_path, gateway, *extra):
    events = tmp_path / "events.jsonl"
    lifecycle = tmp_path / "agents.jsonl"
    results = tmp_path / "run.json"
    run = run_agent(
        capsys,
        argv(
            gateway.server, four_agents(tmp_path), "--user-prefix", "r",
            "--dp-rank-perfect-routing", "--dp-rank-perfect-routing-num", "2",
            "--request-events-jsonl", str(events), "--agent-events-jsonl", str(lifecycle),
            "--results-json", str(results), *extra,
        ),
    )  # fmt: skip
    document = json.loads(results.read_text())
    return run, read_jsonl(events), read_jsonl(lifecycle), document


def placement_block(run) -> list[str]:
    start = run.lines.index(next(x for x in run.lines if x.startswith("Per-rank placement")))
    return run.lines[start : start + 4]


def test_a_misrouted_request_is_counted_misplaced_and_warned(capsys, tmp_path):
    # The gateway sends r-1's second request (three messages) to the other worker.
    gateway = FakeGateway(
        [W0, W1], misroute=lambda tag, messages, index: (tag, messages) == ("r-1", 3)
    )
    with gateway:
        run, events, lifecycle, document = routed_run(capsys, tmp_path, gateway)
    by_request = {(e["agent_id"], e["invocation"]): e["worker"] for e in events}
    assert by_request == {
        (agent, invocation): (W0 if agent % 2 == 0 else W1) if (agent, invocation) != (1, 2) else W0
        for agent in range(4)
        for invocation in (1, 2, 3)
    }
    assert placement_block(run) == [
        "Per-rank placement (the worker each reply named in x-smg-routed-worker-id):",
        "  rank            usual_worker  served  misplaced  switching_agents  switches",
        f"     0  {W0}       6          0                 0         0",
        f"     1  {W1}       6          1                 1         2",
    ]
    assert run.line("Warning: ") == (
        "Warning: 1 of 12 requests were served by a worker other than their rank's usual "
        f"one, 1 agent switched workers: {SMG_WARNING}"
    )
    switches = {r["agent_id"]: (r["last_worker"], r["worker_switches"]) for r in lifecycle}
    assert switches == {0: (W0, 0), 1: (W1, 2), 2: (W0, 0), 3: (W1, 0)}
    rows = [(r["rank"], r["workers"], r["usual_worker"], r["misplaced"]) for r in document["ranks"]]
    assert rows == [(0, {W0: 6}, W0, 0), (1, {W1: 5, W0: 1}, W1, 1)]
    assert gateway.served == {W0: 7, W1: 5}


def test_honoured_routing_matches_the_gateways_own_counts(capsys, tmp_path):
    """Streamed replies carry the header too; every rank keeps its worker: no warning."""
    with FakeGateway([W1, W0]) as gateway:
        run, events, _, document = routed_run(capsys, tmp_path, gateway, "--stream")
    assert [r["workers"] for r in document["ranks"]] == [{W1: 6}, {W0: 6}]
    assert {w: sum(e["worker"] == w for e in events) for w in (W0, W1)} == gateway.served
    assert placement_block(run)[2:] == [
        f"     0  {W1}       6          0                 0         0",
        f"     1  {W0}       6          0                 0         0",
    ]
    assert not run.has("Warning: ")


def test_ranks_collapsed_on_one_worker_are_warned(capsys, tmp_path):
    """A gateway that sends everything to one worker leaves no rank misplaced by its own
    usual worker; the shared worker is what gives it away."""
    with FakeGateway(
        [W0, W1], misroute=lambda tag, messages, index: tag in ("r-1", "r-3")
    ) as gateway:
        run, _, _, _ = routed_run(capsys, tmp_path, gateway)
    assert run.line("Warning: ") == (
        f"Warning: ranks 0, 1 share their usual worker {W0}: {SMG_WARNING}"
    )


@pytest.mark.parametrize("choice", ["vllm", "both"])
def test_the_warning_names_the_rank_headers_sent(capsys, tmp_path, choice):
    # Without x-smg-target-worker the fake gateway takes index 0: rank 1 lands on W0.
    with FakeGateway([W0, W1]) as gateway:
        run, _, _, _ = routed_run(capsys, tmp_path, gateway, "--dp-rank-header", choice)
    expected = {
        "vllm": f"Warning: ranks 0, 1 share their usual worker {W0}: the server ignored "
        "x-data-parallel-rank",
        "both": None,
    }[choice]
    assert (run.line("Warning: ") if run.has("Warning: ") else None) == expected


def test_a_named_header_is_read_instead(capsys, tmp_path):
    with FakeGateway([W0, W1], worker_header="X-Served-By") as gateway:
        run, events, _, _ = routed_run(
            capsys, tmp_path, gateway, "--routed-worker-header", "X-Served-By"
        )
    assert {e["worker"] for e in events} == {W0, W1}
    assert placement_block(run)[0] == (
        "Per-rank placement (the worker each reply named in x-served-by):"
    )


def test_without_the_header_the_table_says_it_is_intended_placement(capsys, tmp_path):
    with FakeGateway([W0, W1], worker_header="x-not-read") as gateway:
        run, events, lifecycle, document = routed_run(capsys, tmp_path, gateway)
    assert {e["worker"] for e in events} == {None}
    assert run.line("Per-rank figures are ") == (
        "Per-rank figures are the client's intended placement: no reply named the worker "
        "that served it (x-smg-routed-worker-id)"
    )
    assert not run.has("Per-rank placement")
    assert all("worker_switches" not in r for r in lifecycle)
    assert [(r["workers"], r["usual_worker"]) for r in document["ranks"]] == [({}, None)] * 2


def test_a_bad_header_name_is_a_usage_error():
    with pytest.raises(UsageError) as caught:
        config_from_argv(["--routed-worker-header", "x served", "--agents", "1", "--dry-run"])
    assert str(caught.value) == (
        'argument --routed-worker-header: "x served" is not an HTTP header name'
    )
    with pytest.raises(UsageError) as caught:
        RunConfig(dry_run=True, agents=1, model="m", routed_worker_header="a:b").check()
    assert str(caught.value) == "--routed-worker-header 'a:b' is not an HTTP header name"


def test_workers_merge_their_placement(capsys, tmp_path):
    """--workers 2: each process counts the workers its requests reached; the merged ranks
    hold the sum, as one process would."""
    gateway = FakeGateway(
        [W0, W1], misroute=lambda tag, messages, index: (tag, messages) == ("r-3", 5)
    )
    with gateway:
        run, _, _, document = routed_run(capsys, tmp_path, gateway, "--workers", "2")
    rows = [(r["workers"], r["misplaced"], r["switches"]) for r in document["ranks"]]
    assert rows == [({W0: 6}, 0, 0), ({W1: 5, W0: 1}, 1, 1)]
    assert run.line("Warning: ").startswith("Warning: 1 of 12 requests were served by")


def preflighted(gateway, tmp_path, ranks: int, *extra: str) -> list[str]:
    """A run with the preflight on (the stub tests' default turns it off)."""
    args = argv(
        gateway.server, four_agents(tmp_path), "--user-prefix", "r",
        "--dp-rank-perfect-routing", "--dp-rank-perfect-routing-num", str(ranks), *extra,
    )  # fmt: skip
    args.remove("--no-preflight")
    return args


def test_a_rank_past_the_last_worker_is_refused_before_the_run(capsys, tmp_path):
    with FakeGateway([W0, W1], model=DEFAULT_MODEL) as gateway:
        with pytest.raises(PreflightError) as caught:
            main(preflighted(gateway, tmp_path, 3))
        chats = [r for r in gateway.server.requests if r.method == "POST"]
    assert str(caught.value) == (
        "rank 2: the gateway answered 503 no_available_workers (All workers are unavailable "
        "(circuit breaker open or unhealthy)): --dp-rank-perfect-routing-num 3 is more than "
        "its 2 workers"
    )
    # the preflight's 1-token completion and one probe per rank index, nothing of the run
    assert sorted(r.headers.get("x-smg-target-worker") for r in chats[1:]) == ["0", "1", "2"]
    assert len(chats) == 4 and all(len(r.messages) == 1 for r in chats)


def test_the_banner_shows_the_rank_layout_the_probes_found(capsys, tmp_path):
    with FakeGateway([W1, W0], model=DEFAULT_MODEL) as gateway:
        main(preflighted(gateway, tmp_path, 2))
    out = capsys.readouterr().out.splitlines()
    start = next(i for i, line in enumerate(out) if line.startswith("Rank layout"))
    assert out[start : start + 2] == [
        f"Rank layout (preflight probes): 0 -> {W1}, 1 -> {W0}",
        "  (smg numbers its workers in registration order, which can change when the gateway "
        "restarts)",
    ]
    assert out[start - 1] == "DP-rank perfect routing: enabled (2 ranks)"


def test_a_layout_no_reply_names_is_said(capsys, tmp_path):
    with FakeGateway([W0, W1], worker_header="x-other", model=DEFAULT_MODEL) as gateway:
        main(preflighted(gateway, tmp_path, 2))
    out = capsys.readouterr().out.splitlines()
    assert [line for line in out if line.startswith("Rank layout")] == [
        "Rank layout: 2 rank probes answered; no reply named its worker (x-smg-routed-worker-id)"
    ]


def test_refusals_name_the_index_and_the_answer():
    body = json.dumps(NO_WORKERS_BODY).encode()
    assert refusal_text(0, 2, 503, "no_available_workers", body) == (
        "rank 0: the gateway answered 503 no_available_workers (All workers are unavailable "
        "(circuit breaker open or unhealthy)): it has no worker to send to"
    )
    # the code from the body when no header says it; one worker is one
    assert refusal_text(1, 4, 503, None, body).endswith(
        ": --dp-rank-perfect-routing-num 4 is more than its 1 worker"
    )
    noisy = json.dumps({"error": {"code": "bad\nrank", "message": "line one\n  line two"}})
    assert refusal_text(2, 4, 400, None, noisy.encode()) == (
        "rank 2: the gateway answered 400 bad rank (line one line two) "
        "(--no-preflight skips this check)"
    )
    assert refusal_text(3, 4, 400, None, b"rank 3 out of range") == (
        "rank 3: the gateway answered request failed (400 Bad Request) rank 3 out of range "
        "(--no-preflight skips this check)"
    )


def test_a_busy_rank_probe_is_a_warning_not_a_refusal():
    def answer(recorded):
        if recorded.headers.get("x-data-parallel-rank") == "1":
            return Reply(429, "slow down")
        return Reply(body=chat_completion(), headers={"x-served-by": "engine-a"})

    async def probe(url):
        async with aiohttp.ClientSession() as session:
            return await probe_ranks(
                session, url, None, 2, "vllm", "x-served-by", "m", BodyOptions(model="m")
            )

    with StubServer(answer) as server:
        layout = asyncio.run(probe(server.url + "/v1/chat/completions"))
        bodies = [r.json() for r in server.requests]
    assert layout == RankLayout(
        ("engine-a", None),
        ("warning: the rank 1 probe was answered request failed (429 Too Many Requests) "
         "slow down; the run goes on",),
    )  # fmt: skip
    assert all(b["max_tokens"] == 1 and len(b["messages"]) == 1 for b in bodies)


def test_a_layout_with_one_worker_for_two_ranks_says_so(capsys, tmp_path):
    # The gateway sends rank 1's probe (no user tag) to worker 0.
    gateway = FakeGateway(
        [W0, W1],
        misroute=lambda tag, messages, index: tag is None and index == 1,
        model=DEFAULT_MODEL,
    )
    with gateway:
        main(preflighted(gateway, tmp_path, 2))
    out = capsys.readouterr().out.splitlines()
    start = out.index(f"Rank layout (preflight probes): 0 -> {W0}, 1 -> {W0}")
    assert out[start + 2] == (
        "  (several ranks reached one worker: the gateway may ignore the rank header, or have "
        "fewer workers than ranks)"
    )
