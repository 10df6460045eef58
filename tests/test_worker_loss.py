"""Worker loss and parent death with real processes (docs/scale-out.md, "When a worker
dies"): a worker killed by SIGKILL costs only what it had not written down, and the run
still writes every output, with planned = the sum of the buckets and exit status 1; a
stopped worker cannot hold the parent past the grace period; a double Ctrl+C exits 130
with the summary; the simulator of ``--sim`` (and the workers) end when the parent is
killed with SIGKILL. Bounded in time: short runs against a zero-latency simulator."""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from batchbench.config import RunConfig
from batchbench.drive.simlaunch import SimProcess, sim_command
from batchbench.scale.loss import LostWorker, death_cause
from batchbench.scale.merge import check_shards, merge
from batchbench.scale.salvage import WorkerStart, salvage
from batchbench.scale.supervisor import STOP_MARGIN_SECONDS

# -- helpers --------------------------------------------------------------------------


def agent_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "batchbench", "agent", *args]


def jsonl(path: Path) -> list[dict]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def parent_of(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def gone(pid: int) -> bool:
    """Exited (a zombie nobody reaps counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def children(pid: int, marker: str) -> list[int]:
    """Processes whose parent is ``pid`` and whose command line holds ``marker``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and parent_of(int(entry)) == pid:
            try:
                command = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:
                continue
            if marker.encode() in command:
                found.append(int(entry))
    return sorted(found)


def listening_port(pid: int) -> int | None:
    """The TCP port process ``pid`` listens on (its sockets matched in /proc/net/tcp)."""
    inodes = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for row in Path(table).read_text().splitlines()[1:]:
                fields = row.split()
                if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
                    return int(fields[1].rsplit(":", 1)[1], 16)
    return None


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def lines_in(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except OSError:
        return 0


def hidden_file(folder: Path, name: str) -> Path | None:
    """A worker's events file in the hidden folder beside the results."""
    for entry in folder.glob(".batchbench-workers-*"):
        return entry / name
    return None


def worker_events(folder: Path, name: str, at_least: int) -> int:
    """Wait until a worker's hidden events file holds ``at_least`` lines; their count."""

    def enough() -> int:
        path = hidden_file(folder, name)
        count = lines_in(path) if path is not None else 0
        return count if count >= at_least else 0

    return wait_for(enough, 60, f"{at_least} lines in {name}")


def buckets(metrics: dict) -> int:
    return sum(
        metrics[name]
        for name in (
            "successful_requests",
            "failed_requests",
            "cancelled_requests",
            "skipped_requests",
            "lost_requests",
        )
    )


@pytest.fixture(scope="module")
def sim_url():
    with SimProcess(sim_command("deepseek-v3", None, "--speed 0")) as sim:
        yield sim.url


PLANNED = 48  # 8 agents of 6 requests; each worker owns 4 of them (24 requests)


def run_args(url: str, folder: Path, *extra: str) -> list[str]:
    """8 agents of 6 turns, 0.15 s of tool time each, on 4 slots over 2 workers: each
    worker runs 2 waves of 2 trajectories, about 2 s in all."""
    return [
        "--host", url, "--model", "batchbench-sim", "--tokenizer-model", "deepseek-v3",
        "--no-progress", "--no-preflight", "--seed", "9",
        "--agents", "8", "--max-active-agents", "4", "--tool-invocations", "6",
        "--output-tokens", "8", "--tool-call-latency-ms", "150", "--workers", "2",
        "--results-json", str(folder / "r.json"), "--results-csv", str(folder / "r.csv"),
        "--request-events-jsonl", str(folder / "q.jsonl"),
        "--agent-events-jsonl", str(folder / "a.jsonl"), *extra,
    ]  # fmt: skip


@contextlib.contextmanager
def running(argv: list[str], **options) -> Iterator[subprocess.Popen]:
    """``batchbench-agent`` in a child process; a test that fails leaves nothing running."""
    process = subprocess.Popen(
        agent_command(*argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        **options,
    )  # fmt: skip
    try:
        yield process
    finally:
        if process.poll() is None:
            for pid in children(process.pid, "spawn_main") + children(process.pid, "sim"):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            process.kill()
            process.communicate()


def worker_pids(process: subprocess.Popen) -> list[int]:
    """The two workers, in the order they were started (worker 0 first)."""

    def both() -> list[int] | None:
        pids = children(process.pid, "spawn_main")
        return pids if len(pids) == 2 else None

    return wait_for(both, 30, "two workers")


# -- a lost worker loses nothing ------------------------------------------------------


@pytest.mark.native_pass_only
def test_a_worker_killed_by_sigkill_costs_only_what_it_had_not_written(sim_url, tmp_path):
    """Worker 1 dies by SIGKILL after finishing a trajectory: worker 0 runs to the end, and
    the outputs hold everything recorded: worker 1's requests from its events file, the
    rest of its share as ``lost``; planned = the sum of the buckets; exit status 1."""
    with running(run_args(sim_url, tmp_path)) as process:
        victim = worker_pids(process)[1]
        worker_events(tmp_path, "agents.1.jsonl", 1)  # a whole trajectory of worker 1 finished
        seen = lines_in(hidden_file(tmp_path, "requests.1.jsonl"))  # type: ignore[arg-type]
        os.kill(victim, signal.SIGKILL)
        out, err = process.communicate(timeout=60)
    assert process.returncode == 1, err
    assert "Traceback" not in err

    document = json.loads((tmp_path / "r.json").read_text())
    metrics = document["metrics"]
    [lost_worker] = document["lost_workers"]
    recorded, lost = lost_worker["recorded_requests"], lost_worker["lost_requests"]
    assert lost_worker == {
        "worker": 1, "workers": 2, "pid": victim, "cause": "was killed by SIGKILL",
        "signal": "SIGKILL", "exit_status": None, "planned_requests": 24,
        "recorded_requests": recorded, "lost_requests": 24 - recorded,
    }  # fmt: skip
    assert seen <= recorded < 24 and lost > 0
    assert metrics["planned_tool_invocations"] == PLANNED == buckets(metrics)
    assert (metrics["failed_requests"], metrics["cancelled_requests"]) == (0, 0)
    assert (metrics["skipped_requests"], metrics["lost_requests"]) == (0, lost)
    assert metrics["successful_requests"] == 24 + recorded  # worker 0 ran to the end
    assert metrics["verdict"] == "incomplete" and document["interrupted_by"] is None

    # Every recorded request is in the merged events: worker 0's even agents, all 24 of
    # them; worker 1's odd ones, exactly those it had written.
    events = jsonl(tmp_path / "q.jsonl")
    assert sum(1 for e in events if e["agent_id"] % 2 == 0) == 24
    assert sum(1 for e in events if e["agent_id"] % 2 == 1) == recorded
    assert all(e["status"] == "ok" for e in events)
    records = jsonl(tmp_path / "a.jsonl")
    finished_by_victim = [r for r in records if r["agent_id"] % 2 == 1]
    assert len(finished_by_victim) >= 1 and all(r["completed"] for r in finished_by_victim)
    assert sum(1 for r in records if r["agent_id"] % 2 == 0) == 4
    assert metrics["completed_agents"] == 4 + len(finished_by_victim)

    header, values = list(csv.reader((tmp_path / "r.csv").read_text().splitlines()))
    assert header[header.index("verdict") + 1] == "lost_requests"  # added after the last
    row = dict(zip(header, values, strict=True))
    assert (row["lost_requests"], row["verdict"]) == (str(lost), "incomplete")
    ok = 24 + recorded
    assert (
        f"Requests by outcome: {PLANNED} planned = {ok} succeeded + 0 failed + 0 cancelled "
        f"+ 0 skipped + {lost} lost; {ok} attempts (0 retries)"
    ) in out
    assert (
        f"Result: INCOMPLETE: {lost} of {PLANNED} planned requests were lost with a worker "
        "(not recorded); exit status 1"
    ) in out
    errors = [line for line in err.splitlines() if line.startswith("Error:")]
    assert errors == [
        f"Error: worker 1 (of 2, pid {victim}) was killed by SIGKILL: {recorded} of its 24 "
        f"planned requests recorded, {lost} lost"
    ]
    assert (
        f"warning: worker 1 (of 2, pid {victim}) was killed by SIGKILL; the other workers run on"
    ) in err
    # The hidden events folder went only after the merge had taken what it held.
    assert sorted(os.listdir(tmp_path)) == [
        "a.jsonl", "q.jsonl", "r.config.toml", "r.csv", "r.json",
    ]  # fmt: skip


@pytest.mark.native_pass_only
def test_a_stopped_worker_cannot_hold_the_parent_past_the_grace_period(sim_url, tmp_path):
    """Worker 1 is SIGSTOPped, then the parent gets SIGTERM: worker 0 stops gracefully,
    worker 1 is killed once the grace period (1 s) and the stop margin have passed, and the
    run writes what exists: exit 143, planned = the sum of the buckets."""
    with running(run_args(sim_url, tmp_path, "--grace-seconds", "1")) as process:
        victim = worker_pids(process)[1]
        worker_events(tmp_path, "requests.1.jsonl", 2)
        os.kill(victim, signal.SIGSTOP)
        sent = time.monotonic()
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=60)
    took = time.monotonic() - sent
    assert process.returncode == 143, err
    assert took < 1 + STOP_MARGIN_SECONDS + 3.0, took
    assert gone(victim)
    document = json.loads((tmp_path / "r.json").read_text())
    metrics = document["metrics"]
    [lost_worker] = document["lost_workers"]
    assert lost_worker["cause"] == "did not stop within the grace period (killed with SIGKILL)"
    assert lost_worker["signal"] == "SIGKILL" and lost_worker["worker"] == 1
    assert metrics["planned_tool_invocations"] == PLANNED == buckets(metrics)
    assert metrics["lost_requests"] == lost_worker["lost_requests"] > 0
    assert metrics["verdict"] == "interrupted" and document["interrupted_by"] == "SIGTERM"
    assert "Interrupted by SIGTERM" in out and "Traceback" not in err
    assert len(jsonl(tmp_path / "q.jsonl")) == (
        metrics["successful_requests"] + metrics["failed_requests"] + metrics["cancelled_requests"]
    )


@pytest.mark.native_pass_only
@pytest.mark.parametrize("when", ["while booting", "while running"])
def test_a_double_ctrl_c_to_the_process_group_exits_130_with_the_summary(sim_url, tmp_path, when):
    """Two SIGINTs 0.5 s apart to the whole process group, as a terminal sends them: the
    workers hear them from the parent only (even while they boot, still in its group),
    and the run exits 130 with its summary and outputs, never killed by the signal."""
    with running(run_args(sim_url, tmp_path), start_new_session=True) as process:
        worker_pids(process)
        if when == "while running":
            worker_events(tmp_path, "requests.1.jsonl", 2)
        os.killpg(process.pid, signal.SIGINT)
        time.sleep(0.5)
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGINT)
        out, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    assert "Error:" not in err and "Traceback" not in err
    assert (
        "Interrupted by SIGINT: admission stopped; results cover work finished before shutdown"
        in out
    )
    document = json.loads((tmp_path / "r.json").read_text())
    metrics = document["metrics"]
    assert document["interrupted_by"] == "SIGINT" and "lost_workers" not in document
    assert metrics["planned_tool_invocations"] == PLANNED == buckets(metrics)
    assert metrics["lost_requests"] == 0
    if when == "while booting":  # each worker stopped as soon as its graceful stop was ready
        assert (metrics["successful_requests"], metrics["skipped_requests"]) == (0, PLANNED)
    line = next(line for line in out.splitlines() if line.startswith("Requests by outcome:"))
    assert line.startswith(f"Requests by outcome: {PLANNED} planned = ") and "lost" not in line


# -- the simulator dies with its parent -----------------------------------------------


@pytest.mark.native_pass_only
@pytest.mark.parametrize("workers", ["1", "2"])
def test_the_simulator_and_workers_end_when_the_parent_is_killed(tmp_path, workers):
    """``kill -9`` of a ``--sim`` run: the simulator stops listening and exits within a few
    seconds (PR_SET_PDEATHSIG, and the end of its stdin pipe), and so do the workers."""
    argv = [
        "--sim", "--sim-args", "--speed 0", "--no-progress", "--seed", "9",
        "--agents", "8", "--max-active-agents", "4", "--tool-invocations", "6",
        "--output-tokens", "8", "--tool-call-latency-ms", "500", "--grace-seconds", "1",
        "--workers", workers,
    ]  # fmt: skip
    with running(argv, cwd=tmp_path) as process:
        [sim] = wait_for(lambda: children(process.pid, "batchbench sim"), 30, "the simulator")
        port = wait_for(lambda: listening_port(sim), 30, "the simulator to listen")
        pids = worker_pids(process) if workers == "2" else []
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            pass  # listening while the parent lives
        process.kill()
        process.communicate(timeout=30)
        wait_for(lambda: gone(sim), 5, "the simulator to exit")
        with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=2):
            pass
        for pid in pids:
            wait_for(lambda pid=pid: gone(pid), 5, f"worker {pid} to exit")


@pytest.mark.native_pass_only
def test_the_simulator_ends_at_the_end_of_its_stdin_pipe():
    """The tie that works without prctl: with ``--parent-pid``, the end of the simulator's
    standard input (the parent's end of the pipe closed) stops it gracefully."""
    command = [sys.executable, "-m", "batchbench", "sim", "--port", "0", "--speed", "0",
               "--parent-pid", str(os.getpid())]  # fmt: skip
    sim = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert sim.stdout is not None and sim.stdin is not None
        assert sim.stdout.readline().startswith("batchbench sim listening on http://")
        sim.stdin.close()
        assert sim.wait(timeout=10) == 0
    finally:
        if sim.poll() is None:
            sim.kill()
            sim.wait()


# -- units: the dead worker's account ---------------------------------------------------


def test_death_causes_and_the_lost_worker_line():
    assert death_cause(-9) == "was killed by SIGKILL"
    assert death_cause(-15) == "was killed by SIGTERM"
    assert death_cause(1) == "exited with status 1"
    lost = LostWorker(1, 2, 4242, death_cause(-9), -9, 24, 10, 14, events_file=False)
    assert lost.text() == (
        "worker 1 (of 2, pid 4242) was killed by SIGKILL: 10 of its 24 planned requests "
        "recorded, 14 lost (--request-events-jsonl keeps a lost worker's finished requests)"
    )
    assert lost.as_dict()["signal"] == "SIGKILL" and lost.as_dict()["exit_status"] is None


def _event(agent: int, invocation: int, status: str, start: float, **extra) -> dict:
    ok = status == "ok"
    event = {
        "agent_id": agent, "trajectory_id": f"t{agent}", "invocation": invocation,
        "routing_slot": 1, "dp_rank": None, "target_prompt_tokens": 100,
        "prompt_tokens": 102 if ok else None, "completion_tokens": 8 if ok else None,
        "cached_tokens": 64 if ok else None, "start_offset_seconds": start,
        "latency_seconds": 0.5, "ttft_seconds": None, "attempts": 1, "status": status,
        "error": None if ok else "boom", "error_kind": None if ok else "http_status",
        "status_code": None if ok else 500,
        "errors": [] if ok else [{"attempt": 1, "kind": "http_status", "status": 500,
                                  "message": "boom"}],
        "prompt_drift": 2 if ok else None, "prompt_correction_tokens": 0,
        "correction_note": None, "planned_output_tokens": 8, "output_drift": 0 if ok else None,
        "reply_rendered_tokens": None, "oracle_seconds": None, "worker": None,
    }  # fmt: skip
    event.update(extra)
    return event


def test_a_dead_workers_files_become_its_shard_data(tmp_path):
    """Salvage: succeeded, failed and cancelled requests land in their buckets (with their
    tokens, latencies and error kinds), a finished trajectory's skipped requests are
    skipped, a line cut short by the death is left out, and the rest is lost."""
    requests, agents = tmp_path / "requests.1.jsonl", tmp_path / "agents.1.jsonl"
    lines = [
        _event(1, 1, "ok", 0.0),
        _event(1, 2, "ok", 1.0),
        _event(3, 1, "failed", 0.2),
        _event(
            5,
            1,
            "cancelled",
            1.5,
            latency_seconds=None,
            start_offset_seconds=None,
            errors=[{"attempt": 1, "kind": "cancelled", "status": None, "message": "c"}],
        ),
    ]
    requests.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in lines) + b'{"agent_id": 7,')
    record = {
        "agent_id": 3, "trajectory_id": "t3", "routing_slot": 1, "dp_rank": None,
        "scheduled_at_seconds": 0.0, "admitted_at_seconds": 0.0, "queue_wait_seconds": 0.0,
        "finished_at_seconds": 0.7, "runtime_seconds": 0.7, "completed": False,
        "requests": 1, "successful_requests": 0, "failed_requests": 1, "skipped_requests": 3,
        "error": "boom",
    }  # fmt: skip
    agents.write_bytes(orjson.dumps(record) + b"\n")
    config = RunConfig.from_args([
        "--agents", "4", "--tool-invocations", "4", "--tokenizer-model", "deepseek-v3",
        "--host", "http://127.0.0.1:9", "--seed", "1",
        "--request-events-jsonl", str(requests), "--agent-events-jsonl", str(agents),
    ])  # fmt: skip
    config = dataclasses.replace(config, shard="1/2", workers=2)  # worker 1's, as spawned
    setup = {
        "timestamp": "2026-12-04T00:00:00+00:00", "agents": 4, "manifest_sha256": None,
        "schema_version": None, "tokenizer_source": "deepseek-v3", "root_seed": 1,
        "content_salt": "s", "chat_template": None, "calibration": None,
        "replay_initial_overhead_tokens": None, "replay_turn_overhead_tokens": None,
        "framing_initial": 0, "framing_turn": 0, "framing_measured": False,
    }  # fmt: skip
    salvaged = salvage(config, (1, 2), WorkerStart((2, 8), setup), 1000.0, 2.0, 2)
    assert (salvaged.recorded, salvaged.lost) == (4 + 3, 1)
    live = salvaged.data.meta["live"]
    scalars = live["totals"]["scalars"]
    assert (
        scalars["successful_requests"], scalars["failed_requests"],
        scalars["cancelled_requests"], scalars["skipped_requests"], scalars["lost_requests"],
    ) == (2, 1, 1, 3, 1)  # fmt: skip
    assert (scalars["total_input_tokens"], scalars["total_output_tokens"]) == (204, 16)
    assert scalars["estimated_cached_input_tokens"] == 102  # the second reuses the first
    assert live["totals"]["errors"]["counts"] == {"cancelled": 1, "http_status": 1}
    assert live["server_cached_tokens"] == 128
    assert list(salvaged.data.array("latencies_ms")) == [500.0, 500.0]
    assert sorted(live["started_agents"]) == [1, 3, 5]
    # Without request events, the finished trajectory's record still counts its requests.
    only_records = dataclasses.replace(config, request_events_jsonl=None)
    counted = salvage(only_records, (1, 2), WorkerStart((2, 8), setup), 1000.0, 2.0, 2)
    assert (counted.recorded, counted.lost) == (1 + 3, 4)
    scalars = counted.data.meta["live"]["totals"]["scalars"]
    assert (scalars["failed_requests"], scalars["skipped_requests"]) == (1, 3)
    assert counted.data.meta["live"]["totals"]["failures"] == [[3, "t3", 1, "boom"]]
    merged = merge(check_shards([salvaged.data], ["worker 1"], [1]))
    assert merged.planned == (2, 8)
    assert merged.live is not None and merged.live.recorder.totals.lost_requests == 1
    assert [r.agent_id for r in merged.engine.records] == [3]
