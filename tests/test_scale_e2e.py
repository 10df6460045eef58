"""Scale-out end to end (docs/scale-out.md): shard processes and ``batchbench merge`` give
the single run's dry-run lines; live shards (common --start-at) and ``--workers 2`` give
the single run's totals, per-rank rows and events, with merged percentiles exactly those
of the union of every shard's samples; merge refuses shards that do not belong together."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from batchbench.cli.agent import main
from batchbench.cli.main import run as batchbench
from batchbench.drive.simlaunch import SimProcess, sim_command
from batchbench.results.metrics import percentile

TIMED = re.compile(r"admitted_at_ms=\d+")
MERGED = re.compile(
    r"Merged 2 shards of (\d+) trajectories \(clock starts \d+\.\d ms apart at most\)"
)


def jsonl(path: Path) -> list[dict]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def agent_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "batchbench", "agent", *args]


def finish(process: subprocess.Popen, timeout: float = 90.0) -> tuple[str, str]:
    out, err = process.communicate(timeout=timeout)
    assert process.returncode == 0, err
    return out, err


def merge(capsys, *args: str) -> tuple[int, list[str], str]:
    status = batchbench(["merge", *args])
    captured = capsys.readouterr()
    return status, captured.out.splitlines(), captured.err


def write_manifest(path: Path) -> Path:
    """7 trajectories of 1 to 3 requests, all different sizes."""
    with open(path, "w") as handle:
        for t in range(7):
            requests = [
                {"prompt_tokens": 100 * (k + 1) + 10 * t, "output_tokens": 8 + t}
                for k in range(1 + t % 3)
            ]
            handle.write(
                json.dumps({"schema_version": 1, "trajectory_id": f"t{t}", "requests": requests})
                + "\n"
            )
    return path


DRY = ["--max-active-agents", "3", "--dry-run", "--seed", "5", "--tokenizer-model", "deepseek-v3"]


def dry_lines(out: str) -> list[str]:
    return [TIMED.sub("admitted_at_ms=T", line) for line in out.splitlines() if "[DRY-RUN]" in line]


def line_starting(lines: list[str], prefix: str) -> str:
    [line] = [line for line in lines if line.startswith(prefix)]
    return line


# -- dry run ---------------------------------------------------------------------------
@pytest.mark.native_pass_only
def test_dry_run_shard_processes_together_are_the_single_run(tmp_path, capsys):
    """Cap 3 over 2 shards (2 does not divide 3); shard 1 reads its index from the
    environment, as in a Kubernetes Indexed Job."""
    manifest = write_manifest(tmp_path / "m.jsonl")
    common = ["--agent-plans-jsonl", str(manifest), *DRY]
    single_events = tmp_path / "single.jsonl"
    assert main([*common, "--agent-events-jsonl", str(single_events)]) == 0
    single_out = capsys.readouterr().out
    single = dry_lines(single_out)
    folders = [tmp_path / "s0", tmp_path / "s1"]
    processes = []
    for index, folder in zip(("0", "SHARD_INDEX"), folders, strict=True):
        folder.mkdir()
        processes.append(
            subprocess.Popen(
                agent_command(
                    *common,
                    "--shard",
                    f"{index}/2",
                    "--results-json",
                    str(folder / "r.json"),
                    "--agent-events-jsonl",
                    str(folder / "a.jsonl"),
                ),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=dict(os.environ, SHARD_INDEX="1"),
            )
        )
    outs = [finish(process)[0] for process in processes]
    shard_lines = [dry_lines(out) for out in outs]

    assert len(single) == 13  # 1 + 2 + 3 + 1 + 2 + 3 + 1 requests
    assert sorted(shard_lines[0] + shard_lines[1]) == sorted(single)
    for lines in shard_lines:  # each shard in the single run's order
        assert lines == [line for line in single if line in set(lines)]
    # Cap 3: trajectory j in slot j mod 3; shard 0 owns slots 0 and 2, shard 1 slot 1.
    assert {int(re.search(r"agent=(\d+)", line).group(1)) for line in shard_lines[1]} == {1, 4}
    assert all("routing_slot=1 " in line for line in shard_lines[1])
    banner = [out.splitlines() for out in outs]
    assert "Shard: 0/2 (routing slots 0, 2, ...)" in banner[0]
    assert "Shard: 1/2 (routing slots 1, 3, ...)" in banner[1]
    assert not any(line.startswith("Ramp-up:") for line in banner[0])  # no clock in a dry run
    section = json.loads((folders[1] / "r.json").read_text())["shard"]
    assert {k: v for k, v in section.items() if k != "wall_origin"} == {
        "index": 1,
        "count": 2,
        "data": "r.shard.npz",
        "data_path": str(folders[1] / "r.shard.npz"),
        "agent_events": "a.jsonl",
        "request_events": None,
    }
    assert isinstance(section["wall_origin"], float)

    status, lines, err = merge(capsys, str(folders[1] / "r.json"), str(folders[0] / "r.json"),
                               "-o", str(tmp_path / "merged"))  # fmt: skip
    assert (status, err) == (0, "")
    assert lines[0] == "=== Agent Loop Benchmark Configuration ==="  # as one run prints
    merged_line = next(line for line in lines if line.startswith("Merged "))
    assert MERGED.fullmatch(merged_line) and MERGED.fullmatch(merged_line).group(1) == "7"
    assert dry_lines("\n".join(lines)) == single  # every shard's lines, in one run's order
    single_summary = single_out.splitlines()
    assert line_starting(lines, "Agents:") == "Agents: 7 completed / 7 total"
    assert line_starting(lines, "Agents:") == line_starting(single_summary, "Agents:")
    assert line_starting(lines, "Tool invocations:") == (
        "Tool invocations: 13 planned; requests 0 (success 0, failure 0)"
    )
    assert line_starting(lines, "Tool invocations:") == (
        line_starting(single_summary, "Tool invocations:")
    )
    assert re.fullmatch(
        r"Rolling admission: 3 maximum active; last admission at \d+\.\d\ds; "
        r"final drain \d+\.\d\ds",
        line_starting(lines, "Rolling admission:"),
    )
    merged = tmp_path / "merged"
    assert sorted(os.listdir(merged)) == [
        "agent-events.jsonl", "results.config.toml", "results.csv", "results.json",
    ]  # fmt: skip
    slots = {e["agent_id"]: e["routing_slot"] for e in jsonl(merged / "agent-events.jsonl")}
    assert slots == {e["agent_id"]: e["routing_slot"] for e in jsonl(single_events)}
    assert slots == {j: j % 3 for j in range(7)}
    metrics = json.loads((merged / "results.json").read_text())["metrics"]
    assert (metrics["agents"], metrics["completed_agents"]) == (7, 7)
    assert (metrics["planned_tool_invocations"], metrics["max_active_agents"]) == (13, 3)


# -- merge refusals (in-process dry runs: cheap) ---------------------------------------
@pytest.mark.native_pass_only
def test_a_shard_split_over_workers_merges_with_the_other_shards(tmp_path, capsys):
    """Shard 1/2 over 2 workers (shards 1/4 and 3/4 of the run), merged with shard 0/2:
    the single run's lines; the workers' shard keeps its banner line."""
    manifest = write_manifest(tmp_path / "m.jsonl")
    cap = ["--max-active-agents", "4"]
    assert main(["--agent-plans-jsonl", str(manifest), *overriding(DRY, *cap)]) == 0
    single = dry_lines(capsys.readouterr().out)
    first = dry_shard(tmp_path / "s0", manifest, "0/2", *cap)
    (tmp_path / "s1").mkdir()
    second = tmp_path / "s1" / "r.json"
    command = agent_command("--agent-plans-jsonl", str(manifest), *overriding(DRY, *cap), "--shard", "1/2",
                            "--workers", "2", "--results-json", str(second))  # fmt: skip
    out, _ = finish(
        subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    )
    assert "Shard: 1/2 (routing slots 1, 3, ...)" in out.splitlines()
    assert "Workers: 2 processes (worker k runs shard 1+2k of 4)" in out.splitlines()
    assert json.loads(second.read_text())["shard"]["count"] == 2
    status, lines, err = merge(capsys, str(first), str(second), "-o", str(tmp_path / "m"))
    assert (status, err) == (0, "")
    assert dry_lines("\n".join(lines)) == single
    assert line_starting(lines, "Agents:") == "Agents: 7 completed / 7 total"


def overriding(argv: list[str], *pairs: str) -> list[str]:
    """``argv`` with each ``flag value`` of ``pairs`` replacing that flag's value (a
    single-value flag given twice is refused)."""
    out = list(argv)
    for flag, value in zip(pairs[::2], pairs[1::2], strict=True):
        if flag in out:
            out[out.index(flag) + 1] = value
        else:
            out += [flag, value]
    return out


def dry_shard(folder: Path, manifest: Path, shard: str, *extra: str) -> Path:
    folder.mkdir()
    results = folder / "r.json"
    argv = ["--agent-plans-jsonl", str(manifest), *overriding(DRY, *extra), "--shard", shard,
            "--results-json", str(results)]  # fmt: skip
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(argv) == 0
    return results


def test_merge_refuses_shards_that_do_not_make_one_run(tmp_path, capsys):
    manifest = write_manifest(tmp_path / "m.jsonl")
    s0 = dry_shard(tmp_path / "s0", manifest, "0/2")
    s1 = dry_shard(tmp_path / "s1", manifest, "1/2")
    reseeded = dry_shard(tmp_path / "x1", manifest, "1/2", "--seed", "6")
    thirds = dry_shard(tmp_path / "t1", manifest, "1/3")
    shutil.copytree(tmp_path / "s0", tmp_path / "copy")
    copy = tmp_path / "copy" / "r.json"
    out = tmp_path / "out"

    def refused(*paths: Path) -> str:
        status, lines, err = merge(capsys, *map(str, paths), "-o", str(out))
        assert (status, lines) == (1, [])
        assert err.count("\n") == 1
        return err

    assert refused(s0) == "Error: shard 1 of 2 missing: merge needs every shard's results\n"
    assert refused(s1) == "Error: shard 0 of 2 missing: merge needs every shard's results\n"
    assert refused(s0, copy, s1) == f"Error: {copy} and {s0} are both shard 0/2\n"
    assert refused(s0, reseeded) == (
        f"Error: {reseeded} is from a different run than {s0}: options differ (seed)\n"
    )
    assert refused(s0, thirds) == (
        f"Error: the results come from runs split differently ({s0}: 2, {thirds}: 3 shards)\n"
    )
    (tmp_path / "s1" / "r.shard.npz").unlink()
    missing = tmp_path / "s1" / "r.shard.npz"
    assert refused(s0, s1) == f"Error: {missing}: no such file (the shard's raw data)\n"
    single = tmp_path / "single.json"
    with contextlib.redirect_stdout(io.StringIO()):
        assert (
            main(["--agent-plans-jsonl", str(manifest), *DRY, "--results-json", str(single)]) == 0
        )
    assert refused(s0, single) == (
        f"Error: {single}: not a shard's results (no shard section: was it run with --shard?)\n"
    )
    assert not out.exists()


def test_merge_refuses_shards_of_another_manifest(tmp_path, capsys):
    manifest = write_manifest(tmp_path / "m.jsonl")
    s0 = dry_shard(tmp_path / "s0", manifest, "0/2")
    text = manifest.read_text().replace('"output_tokens": 8}', '"output_tokens": 9}')
    manifest.write_text(text)  # the same path, other contents
    s1 = dry_shard(tmp_path / "s1", manifest, "1/2")
    status, lines, err = merge(capsys, str(s0), str(s1), "-o", str(tmp_path / "out"))
    assert (status, lines) == (1, [])
    assert err == f"Error: {s1} replayed another manifest than {s0}\n"


def test_shards_without_a_common_seed_are_not_merged_as_one_run(tmp_path, capsys):
    """Without --seed each shard would draw its own seed, so a sampled workload would
    differ from shard to shard: --shard asks for --seed up front."""
    sampled = ["--agents", "6", "--tool-invocations-lognorm-median", "3",
               "--tool-invocations-lognorm-sigma", "1", "--dry-run",
               "--tokenizer-model", "deepseek-v3"]  # fmt: skip
    results = []
    for index in range(2):
        folder = tmp_path / f"s{index}"
        folder.mkdir()
        results.append(folder / "r.json")
        argv = [*sampled, "--shard", f"{index}/2", "--results-json", str(results[-1])]
        status = batchbench(["agent", *argv])
        captured = capsys.readouterr()
        assert (status, captured.out) == (2, "")
        assert captured.err == (
            f"Error: --shard {index}/2 needs --seed: every shard must draw the same workload "
            "and content (give all shards the same --seed)\n"
        )


# -- live runs against one simulator -----------------------------------------------------
@pytest.fixture(scope="module")
def sim_url():
    command = sim_command("deepseek-v3", 2, "--speed 0 --kv-cache-tokens 1000000")
    with SimProcess(command) as sim:
        yield sim.url


def live_args(url: str) -> list[str]:
    """24 identical agents of 3 turns on 6 slots over 2 ranks: 12 trajectories per rank."""
    return [
        "--host", url, "--model", "batchbench-sim", "--tokenizer-model", "deepseek-v3",
        "--no-progress", "--no-preflight", "--seed", "9", "--stream",
        "--agents", "24", "--max-active-agents", "6", "--tool-invocations", "3",
        "--output-tokens", "8", "--tool-call-latency-ms", "30",
        "--dp-rank-perfect-routing", "--dp-rank-perfect-routing-num", "2",
    ]  # fmt: skip


def outputs(folder: Path) -> list[str]:
    return [
        "--results-json", str(folder / "r.json"),
        "--request-events-jsonl", str(folder / "q.jsonl"),
        "--agent-events-jsonl", str(folder / "a.jsonl"),
    ]  # fmt: skip


@pytest.fixture(scope="module")
def single_live(sim_url, tmp_path_factory):
    """The run in one process: (results JSON, agent events, request events, stdout)."""
    folder = tmp_path_factory.mktemp("single")
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        assert main([*live_args(sim_url), *outputs(folder)]) == 0
    document = json.loads((folder / "r.json").read_text())
    return document, jsonl(folder / "a.jsonl"), jsonl(folder / "q.jsonl"), text.getvalue()


TOTALS = (
    "planned_tool_invocations",
    "total_requests",
    "successful_requests",
    "failed_requests",
    "total_input_tokens",
    "total_output_tokens",
    "server_cached_input_tokens",
    "agents",
    "completed_agents",
    "max_active_agents",
)
RANK_TIMED = ("ttft_p50_ms", "ttft_p99_ms")


def untimed(ranks: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if k not in RANK_TIMED} for row in ranks]


def check_like_single(document: dict, single: dict) -> None:
    metrics, expected = document["metrics"], single["metrics"]
    assert {k: metrics[k] for k in TOTALS} == {k: expected[k] for k in TOTALS}
    assert (metrics["total_requests"], metrics["successful_requests"]) == (72, 72)
    assert metrics["completed_agents"] == 24 and metrics["verdict"] == "ok"
    assert untimed(document["ranks"]) == untimed(single["ranks"])
    assert [(r["rank"], r["trajectories"], r["requests"]) for r in document["ranks"]] == [
        (0, 12, 36),
        (1, 12, 36),
    ]


def ends(events: list[dict]) -> list[float]:
    return [e["start_offset_seconds"] + e["latency_seconds"] for e in events]


@pytest.mark.native_pass_only
def test_live_shards_and_merge_are_the_single_run(sim_url, single_live, tmp_path, capsys):
    single, _single_agents, single_requests, _ = single_live
    start_at = time.time() + 2.5
    folders = [tmp_path / "s0", tmp_path / "s1"]
    processes = []
    for index, folder in enumerate(folders):
        folder.mkdir()
        processes.append(
            subprocess.Popen(
                agent_command(
                    *live_args(sim_url),
                    *outputs(folder),
                    "--shard",
                    f"{index}/2",
                    "--start-at",
                    f"{start_at:.3f}",
                ),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    finished = [finish(process) for process in processes]
    outs = [out.splitlines() for out, _err in finished]
    late = any("--start-at was" in err for _out, err in finished)  # a very slow machine
    assert "Shard: 1/2 (routing slots 1, 3, ...)" in outs[1]
    assert "Ramp-up: none (default up to 256 active agents)" in outs[0]
    shard_requests = [jsonl(folder / "q.jsonl") for folder in folders]
    assert [len(events) for events in shard_requests] == [36, 36]
    assert {e["routing_slot"] % 2 for e in shard_requests[1]} == {1}

    results = [str(folder / "r.json") for folder in folders]
    status, lines, err = merge(capsys, *results, "-o", str(tmp_path / "merged"))
    assert (status, err) == (0, "")
    merged_line = next(line for line in lines if line.startswith("Merged "))
    assert MERGED.fullmatch(merged_line) and MERGED.fullmatch(merged_line).group(1) == "24"
    origins = [json.loads(Path(path).read_text())["shard"]["wall_origin"] for path in results]
    if not late:  # both clocks started at the common time
        assert all(origin >= round(start_at, 3) - 0.01 for origin in origins)
        assert abs(origins[0] - origins[1]) < 0.25
    assert "Agents: 24 completed / 24 total" in lines
    assert "Tool invocations: 72 planned; requests 72 (success 72, failure 0)" in lines
    merged = tmp_path / "merged"
    document = json.loads((merged / "results.json").read_text())
    check_like_single(document, single)
    assert document["client_health"]["processes"] == 2
    assert single["client_health"]["processes"] == 1

    # Percentiles over the union of both shards' samples, by the package's rule.
    union = [e for events in shard_requests for e in events]
    latencies = sorted(e["latency_seconds"] * 1000.0 for e in union)
    ttfts = sorted(e["ttft_seconds"] * 1000.0 for e in union)
    metrics = document["metrics"]
    for q, name in ((0.5, "p50"), (0.9, "p90"), (0.99, "p99")):
        assert metrics[f"latency_{name}_ms"] == percentile(latencies, q)
        assert metrics[f"ttft_{name}_ms"] == percentile(ttfts, q)
    window = document["window"]["latency"]["e2e_ms"]
    assert window["count"] == 72 and window["min"] == latencies[0]
    assert window["max"] == latencies[-1]
    assert window["percentiles"]["p95"] == percentile(latencies, 0.95)
    for row in document["ranks"]:
        mine = sorted(e["ttft_seconds"] * 1000.0 for e in union if e["dp_rank"] == row["rank"])
        assert row["ttft_p50_ms"] == percentile(mine, 0.5)
        assert row["ttft_p99_ms"] == percentile(mine, 0.99)

    requests = jsonl(merged / "request-events.jsonl")
    assert len(requests) == metrics["total_requests"] == 72
    assert ends(requests) == sorted(ends(requests))
    key = [(e["agent_id"], e["invocation"]) for e in requests]
    assert sorted(key) == sorted((e["agent_id"], e["invocation"]) for e in single_requests)
    agents = jsonl(merged / "agent-events.jsonl")
    assert sorted(e["agent_id"] for e in agents) == list(range(24))
    # Each trajectory runs on a slot of its shard (slot j mod 6 owned by shard j mod 6 mod
    # 2); which of the shard's slots depends on which frees first.
    assert all(e["routing_slot"] % 2 == e["agent_id"] % 6 % 2 for e in agents)
    assert all(e["dp_rank"] == e["routing_slot"] % 2 for e in agents)
    assert sorted({e["routing_slot"] for e in agents}) == list(range(6))


@pytest.mark.native_pass_only
def test_two_workers_are_the_single_run(sim_url, single_live, tmp_path):
    single, single_agents, single_requests, single_out = single_live
    folder = tmp_path / "w"
    folder.mkdir()
    out, _err = finish(
        subprocess.Popen(
            agent_command(
                *live_args(sim_url),
                *outputs(folder),
                "--workers",
                "2",
                "--results-csv",
                str(folder / "r.csv"),
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    )
    lines = out.splitlines()
    assert "Workers: 2 processes (worker k owns routing slots k, k+2, ...)" in lines
    assert not any(line.startswith("Shard:") for line in lines)
    assert "Ramp-up: none (default up to 256 active agents)" in lines
    assert "Agents: 24 completed / 24 total" in lines
    assert line_starting(lines, "Tool invocations:") == line_starting(
        single_out.splitlines(), "Tool invocations:"
    )
    document = json.loads((folder / "r.json").read_text())
    check_like_single(document, single)
    assert document["client_health"]["processes"] == 2
    assert "shard" not in document

    requests = jsonl(folder / "q.jsonl")
    assert len(requests) == 72
    assert ends(requests) == sorted(ends(requests))
    assert sorted((e["agent_id"], e["invocation"]) for e in requests) == sorted(
        (e["agent_id"], e["invocation"]) for e in single_requests
    )
    agents = jsonl(folder / "a.jsonl")
    assert len(agents) == 24
    assert sorted(e["agent_id"] for e in agents) == sorted(e["agent_id"] for e in single_agents)
    # The workers' hidden folder of events files is gone.
    files = ["a.jsonl", "q.jsonl", "r.config.toml", "r.csv", "r.json"]
    assert sorted(os.listdir(folder)) == files
    latencies = sorted(e["latency_seconds"] * 1000.0 for e in requests)
    assert document["metrics"]["latency_p90_ms"] == percentile(latencies, 0.9)


@pytest.mark.native_pass_only
def test_ramp_up_starts_each_slot_at_its_offset(sim_url, tmp_path, capsys):
    """--ramp-up 0.6 over 4 slots: slot s's first agent starts at 0.15·s s, in one process
    and in shard 1/2 (slots 1 and 3)."""
    args = [
        "--host", sim_url, "--model", "batchbench-sim", "--tokenizer-model", "deepseek-v3",
        "--no-progress", "--no-preflight", "--seed", "3", "--agents", "4",
        "--max-active-agents", "4", "--tool-invocations", "1", "--output-tokens", "8",
        "--ramp-up", "0.6",
    ]  # fmt: skip
    for name, extra, slots in (("one", [], [0, 1, 2, 3]), ("shard", ["--shard", "1/2"], [1, 3])):
        folder = tmp_path / name
        folder.mkdir()
        assert main([*args, *extra, *outputs(folder)]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert "Ramp-up: 0.6 s (--ramp-up)" in lines
        events = sorted(jsonl(folder / "a.jsonl"), key=lambda e: e["routing_slot"])
        assert [e["routing_slot"] for e in events] == slots
        assert [e["agent_id"] for e in events] == slots
        for event in events:
            delay = 0.6 * event["routing_slot"] / 4
            assert event["scheduled_at_seconds"] == delay
            assert event["admitted_at_seconds"] >= delay


def child_pids(pid: int) -> list[int]:
    """Processes whose parent is ``pid`` (from /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry))
    return found


@pytest.mark.native_pass_only
@pytest.mark.parametrize("when", ["while loading", "while running"])
def test_an_interrupted_workers_run_stops_gracefully_and_writes_its_results(
    sim_url, tmp_path, when
):
    """SIGINT to the parent: each worker stops once its graceful stop is installed (a signal
    while it loads waits for that), the run exits 130 with its outputs, no traceback, no
    hidden folder left."""
    folder = tmp_path / "w"
    folder.mkdir()
    argv = overriding(
        live_args(sim_url), "--agents", "40", "--max-active-agents", "4",
        "--tool-invocations", "5", "--tool-call-latency-ms", "1500", "--workers", "2",
        "--results-json", str(folder / "r.json"),
    )  # fmt: skip
    process = subprocess.Popen(
        agent_command(*argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    if when == "while loading":  # the workers exist, and are loading (the banner is not out)
        deadline = time.monotonic() + 30
        while len(child_pids(process.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(child_pids(process.pid)) >= 2
    else:  # the banner comes from worker 0 once it has loaded; the clocks start soon after
        assert process.stdout is not None
        while process.stdout.readline().strip() != "==========================================":
            pass
        time.sleep(1.0)
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    assert "Traceback" not in err and "Error:" not in err
    assert (
        "Interrupted by SIGINT: admission stopped; results cover work finished before shutdown"
        in out
    )
    document = json.loads((folder / "r.json").read_text())
    assert document["interrupted_by"] == "SIGINT"
    assert document["metrics"]["agents"] == 40
    assert document["metrics"]["completed_agents"] == 0  # 5 turns of 1.5 s: none could finish
    assert sorted(os.listdir(folder)) == ["r.config.toml", "r.json"]
