"""Scale-out without processes: the shard partition, ramp-up, the engine's start gate and
ramped starts, the scale flags' checks, and the merge helpers (docs/scale-out.md)."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import time

import numpy as np
import orjson
import pytest

from batchbench import __version__
from batchbench.cli.agent import run_console
from batchbench.cli.agent_args import config_from_argv
from batchbench.config import RunConfig
from batchbench.drive.engine import run_closed_loop, run_open_loop
from batchbench.errors import BatchbenchError, UsageError
from batchbench.results.recording import Recorder
from batchbench.scale.combine import merge_request_events
from batchbench.scale.merge import _engine, _peak_in_flight, _series, check_shards
from batchbench.scale.partial import ShardData, capture, data_path, load, save
from batchbench.scale.partition import (
    Shard,
    closed_loop_share,
    default_ramp_seconds,
    open_loop_share,
    parse_shard,
    ramp_delays,
    ramp_up_seconds,
)
from batchbench.scale.share import ShardAgents, global_result
from batchbench.scale.snapshot import config_fields

HOST = "http://127.0.0.1:8000"


# -- parse_shard ----------------------------------------------------------------------
def shard_error(text: str, environ: dict[str, str] | None = None) -> str:
    with pytest.raises(UsageError) as caught:
        parse_shard(text, {} if environ is None else environ)
    return str(caught.value)


def test_parse_shard_numbers():
    assert parse_shard("0/1", {}) == Shard(0, 1)
    assert parse_shard("3/4", {}) == Shard(3, 4)
    assert parse_shard(" 2 / 5 ", {}) == Shard(2, 5)
    assert parse_shard("07/8", {}) == Shard(7, 8)
    assert Shard(3, 4).label == "3/4"


def test_parse_shard_reads_the_index_from_the_given_environment():
    environ = {"JOB_COMPLETION_INDEX": "2", "PADDED": " 1 "}
    assert parse_shard("JOB_COMPLETION_INDEX/4", environ) == Shard(2, 4)
    assert parse_shard("PADDED/2", environ) == Shard(1, 2)
    assert parse_shard("_x9/3", {"_x9": "0"}) == Shard(0, 3)


def test_parse_shard_errors_are_exact():
    assert shard_error("JOB_COMPLETION_INDEX/4") == (
        "--shard JOB_COMPLETION_INDEX/4: the environment variable JOB_COMPLETION_INDEX is not "
        "set (in a Kubernetes Indexed Job every pod has JOB_COMPLETION_INDEX)"
    )
    assert shard_error("IDX/4", {"IDX": "two"}) == (
        "--shard IDX/4: IDX='two' is not a non-negative integer"
    )
    assert shard_error("IDX/4", {"IDX": "-1"}) == (
        "--shard IDX/4: IDX='-1' is not a non-negative integer"
    )
    assert shard_error("IDX/4", {"IDX": "4"}) == (
        "--shard IDX/4: index 4 is not below the shard count 4"
    )
    assert shard_error("2/2") == "--shard 2/2: index 2 is not below the shard count 2"
    assert shard_error("9/3") == "--shard 9/3: index 9 is not below the shard count 3"
    assert shard_error("0/0") == "--shard '0/0': the shard count must be at least 1"
    garbage = (
        "--shard {!r}: expected INDEX/COUNT, e.g. 0/4, or JOB_COMPLETION_INDEX/4 "
        "to read the index from that environment variable"
    )
    for text in ("abc", "1/", "/2", "1/x", "1/2/3", "", "1 2/3", "1/-2"):
        assert shard_error(text) == garbage.format(text)
    for text in ("-1/2", "a-b/2", "1.5/2", "9x/3"):
        assert shard_error(text) == (
            f"--shard {text!r}: the index must be a number or an environment variable name"
        )
    with pytest.raises(UsageError, match=r"^--shard 4/4: the index must be 0 to count - 1$"):
        Shard(4, 4)


def test_parse_shard_without_environ_reads_the_process_environment(monkeypatch):
    monkeypatch.setenv("BATCHBENCH_TEST_SHARD_INDEX", "1")
    assert parse_shard("BATCHBENCH_TEST_SHARD_INDEX/3") == Shard(1, 3)
    monkeypatch.delenv("BATCHBENCH_TEST_SHARD_INDEX")
    with pytest.raises(UsageError, match="BATCHBENCH_TEST_SHARD_INDEX is not set"):
        parse_shard("BATCHBENCH_TEST_SHARD_INDEX/3")


# -- the partition ----------------------------------------------------------------------
def shares(n: int, max_active: int | None, count: int):
    return [closed_loop_share(n, max_active, Shard(i, count)) for i in range(count)]


def test_closed_loop_shares_exact():
    # 10 trajectories, cap 4, 3 shards (3 does not divide 4): slot j mod 4, owner slot mod 3.
    s0, s1, s2 = shares(10, 4, 3)
    assert (s0.agents, s0.slots, s0.cap) == ((0, 3, 4, 7, 8), (0, 3), 2)
    assert (s1.agents, s1.slots, s1.cap) == ((1, 5, 9), (1,), 1)
    assert (s2.agents, s2.slots, s2.cap) == ((2, 6), (2,), 1)
    assert [s0.global_slot(local) for local in range(2)] == [0, 3]
    # 7 trajectories, cap 3, 2 shards (the end-to-end dry-run case).
    s0, s1 = shares(7, 3, 2)
    assert (s0.agents, s0.slots, s0.cap) == ((0, 2, 3, 5, 6), (0, 2), 2)
    assert (s1.agents, s1.slots, s1.cap) == ((1, 4), (1,), 1)
    # No cap: every trajectory has its own slot.
    s0, s1 = shares(5, None, 2)
    assert (s0.agents, s0.slots, s0.cap) == ((0, 2, 4), (0, 2, 4), 3)
    assert (s1.agents, s1.slots, s1.cap) == ((1, 3), (1, 3), 2)
    # A cap above the number of trajectories is the number of trajectories.
    s0, s1 = shares(3, 10, 2)
    assert (s0.agents, s0.slots, s0.cap) == ((0, 2), (0, 2), 2)
    assert (s1.agents, s1.slots, s1.cap) == ((1,), (1,), 1)
    # Nothing to run.
    empty = closed_loop_share(0, 4, Shard(0, 2))
    assert (empty.agents, empty.slots, empty.cap, empty.offsets) == ((), (), 0, None)


def test_open_loop_shares_exact():
    offsets = [0.5, 0.1, 0.3, 0.1, 0.0]  # start order (stable): 4, 1, 3, 2, 0
    s0 = open_loop_share(offsets, 3, Shard(0, 2))
    s1 = open_loop_share(offsets, 3, Shard(1, 2))
    assert (s0.agents, s0.offsets, s0.cap, s0.slots) == ((0, 3, 4), (0.5, 0.1, 0.0), 2, ())
    assert (s1.agents, s1.offsets, s1.cap, s1.slots) == ((1, 2), (0.1, 0.3), 1, ())
    assert [s1.global_slot(local) for local in range(3)] == [1, 3, 5]
    assert [s0.global_slot(local) for local in range(3)] == [0, 2, 4]
    uncapped = [open_loop_share(offsets, None, Shard(i, 3)) for i in range(3)]
    assert [(s.agents, s.cap) for s in uncapped] == [((2, 4), None), ((0, 1), None), ((3,), None)]
    assert [s.offsets for s in uncapped] == [(0.3, 0.0), (0.5, 0.1), (0.1,)]


CASES = [
    (n, cap, count)
    for n in (0, 1, 7, 10, 25)
    for cap in (None, 1, 3, 4, 6, 25, 40)
    for count in (1, 2, 3, 5)
]


@pytest.mark.parametrize(("n", "cap", "count"), CASES)
def test_shards_cover_every_trajectory_and_slot_once(n, cap, count):
    parts = shares(n, cap, count)
    limit = n if cap is None else min(cap, n)
    assert sorted(itertools.chain.from_iterable(s.agents for s in parts)) == list(range(n))
    assert sorted(itertools.chain.from_iterable(s.slots for s in parts)) == list(range(limit))
    assert sum(s.cap for s in parts) == limit
    offsets = [((7 * j) % 5) / 10 for j in range(n)]
    opened = [open_loop_share(offsets, cap, Shard(i, count)) for i in range(count)]
    assert sorted(itertools.chain.from_iterable(s.agents for s in opened)) == list(range(n))
    if cap is not None:
        assert sum(s.cap for s in opened) == cap


SPLITS = [(0, 1, 2), (0, 2, 2), (1, 2, 3), (2, 3, 2), (1, 4, 3), (0, 3, 4)]


@pytest.mark.parametrize(("index", "count", "workers"), SPLITS)
def test_split_is_associative(index, count, workers):
    parent = Shard(index, count)
    subs = [parent.split(workers, k) for k in range(workers)]
    assert subs == [Shard(index + k * count, count * workers) for k in range(workers)]
    for n, cap in [(30, 12), (30, None), (17, 7), (9, 100), (40, 24)]:
        whole = closed_loop_share(n, cap, parent)
        parts = [closed_loop_share(n, cap, sub) for sub in subs]
        assert sorted(itertools.chain.from_iterable(p.agents for p in parts)) == list(whole.agents)
        assert sorted(itertools.chain.from_iterable(p.slots for p in parts)) == list(whole.slots)
        offsets = [((3 * j) % 11) / 4 for j in range(n)]
        whole = open_loop_share(offsets, cap, parent)
        parts = [open_loop_share(offsets, cap, sub) for sub in subs]
        assert sorted(itertools.chain.from_iterable(p.agents for p in parts)) == list(whole.agents)


def test_split_exact():
    assert Shard(1, 2).split(3, 0) == Shard(1, 6)
    assert Shard(1, 2).split(3, 2) == Shard(5, 6)
    assert Shard(0, 1).split(4, 3) == Shard(3, 4)
    # Shard 0/2 of cap 5 owns slots 0, 2, 4; its 2 workers own 0, 4 and 2.
    assert closed_loop_share(12, 5, Shard(0, 2).split(2, 0)).slots == (0, 4)
    assert closed_loop_share(12, 5, Shard(0, 2).split(2, 1)).slots == (2,)


class InstantBody:
    """Agents that finish at once (as in a dry run): admission order is finish order."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, int]] = []

    async def prepare(self, agent: int):
        return agent

    async def run(self, agent: int, slot: int, prepared) -> bool:
        assert prepared == agent
        self.seen.append((agent, slot))
        return True


@pytest.mark.parametrize(("n", "cap", "count"), [(11, 4, 3), (7, 3, 2), (9, None, 2), (6, 6, 4)])
def test_each_shard_gives_every_trajectory_the_single_process_slot(n, cap, count):
    single = InstantBody()
    asyncio.run(run_closed_loop(n, cap, single))
    union: list[tuple[int, int]] = []
    for share in shares(n, cap, count):
        body = InstantBody()
        result = asyncio.run(
            run_closed_loop(len(share.agents), share.cap or None, ShardAgents(body, share))
        )
        result = global_result(result, share)
        assert sorted((r.agent_id, r.routing_slot) for r in result.records) == sorted(body.seen)
        union += body.seen
    assert sorted(union) == sorted(single.seen)
    limit = min(cap or n, n)
    assert sorted(single.seen) == [(j, j % limit) for j in range(n)]


# -- ramp-up --------------------------------------------------------------------------
def test_ramp_delays():
    share = closed_loop_share(10, 4, Shard(1, 2))  # slots 1, 3
    assert ramp_delays(share, 4, 2.0) == [0.5, 1.5]
    assert ramp_delays(closed_loop_share(10, 4, Shard(0, 2)), 4, 2.0) == [0.0, 1.0]
    assert ramp_delays(closed_loop_share(10, 4, Shard(0, 1)), 4, 1.0) == [0.0, 0.25, 0.5, 0.75]
    assert ramp_delays(share, 4, 0.0) == [0.0, 0.0]
    assert ramp_delays(share, 0, 3.0) == [0.0, 0.0]


def test_default_ramp_seconds():
    assert default_ramp_seconds(0) == 0.0
    assert default_ramp_seconds(256) == 0.0
    assert default_ramp_seconds(257) == 0.257
    assert default_ramp_seconds(2000) == 2.0
    assert default_ramp_seconds(10_000) == 10.0


def test_ramp_up_seconds_of_a_config():
    assert ramp_up_seconds(RunConfig(), 1000) == 1.0
    assert ramp_up_seconds(RunConfig(), 256) == 0.0
    assert ramp_up_seconds(RunConfig(max_active_agents=300), 1000) == 0.3
    assert ramp_up_seconds(RunConfig(max_active_agents=5000), 1000) == 1.0
    assert ramp_up_seconds(RunConfig(max_active_agents=100), 1000) == 0.0
    assert ramp_up_seconds(RunConfig(ramp_up=2.5), 10) == 2.5
    assert ramp_up_seconds(RunConfig(ramp_up=0.0), 5000) == 0.0
    assert ramp_up_seconds(RunConfig(dry_run=True, ramp_up=2.5), 5000) == 0.0
    assert ramp_up_seconds(RunConfig(dry_run=True), 5000) == 0.0
    assert ramp_up_seconds(RunConfig(arrival_rate=3.0), 5000) == 0.0


# -- the engine: ramped starts and the start gate --------------------------------------
class TimedBody:
    """Agents that run ``run_s`` seconds; notes the clock's start and every step's time."""

    def __init__(self, run_s: float = 0.0) -> None:
        self.run_s = run_s
        self.origin: float | None = None
        self.started: list[tuple[int, int]] = []
        self.prepared_at: list[float] = []

    def clock_started(self, origin: float) -> None:
        self.origin = origin

    async def prepare(self, agent: int):
        self.prepared_at.append(time.perf_counter())
        return agent

    async def run(self, agent: int, slot: int, prepared) -> bool:
        self.started.append((slot, agent))
        await asyncio.sleep(self.run_s)
        return True


def test_ramped_first_agents_never_start_before_their_delay():
    delays = [0.0, 0.1, 0.2, 0.3]
    body = TimedBody(run_s=0.02)
    result = asyncio.run(run_closed_loop(8, 4, body, start_delays=delays))
    by_agent = {r.agent_id: r for r in result.records}
    assert sorted(by_agent) == list(range(8)) and all(r.completed for r in result.records)
    for slot, delay in enumerate(delays):
        first = by_agent[slot]  # agent s is slot s's first agent
        assert first.routing_slot == slot
        assert first.scheduled_at == delay
        assert first.admitted_at >= delay
    assert [agent for _slot, agent in body.started if agent < 4] == [0, 1, 2, 3]
    assert result.max_active_agents == 4
    assert result.total_duration >= 0.3 + 0.02


def test_the_gate_runs_after_preparation_and_before_the_clock():
    calls: list[str] = []
    body = TimedBody(run_s=0.01)
    gate_span: list[float] = []

    async def gate() -> None:
        calls.append("gate")
        start = time.perf_counter()
        await asyncio.sleep(0.25)
        gate_span.extend([start, time.perf_counter()])

    result = asyncio.run(run_closed_loop(4, 2, body, gate=gate))
    assert calls == ["gate"]
    assert body.origin is not None and body.origin >= gate_span[1]
    assert max(body.prepared_at[:2]) <= gate_span[0]  # the first wave was prepared before
    assert result.total_duration < 0.25  # the wait is not on the benchmark clock
    assert [r.admitted_at for r in result.records if r.agent_id < 2] == [0.0, 0.0]

    open_body = TimedBody()
    gate_span.clear()
    result = asyncio.run(run_open_loop([0.0, 0.05], None, open_body, gate=gate))
    assert open_body.origin is not None and open_body.origin >= gate_span[1]
    assert max(open_body.prepared_at) <= gate_span[0]
    assert sorted(r.scheduled_at for r in result.records) == [0.0, 0.05]
    assert result.total_duration < 0.25


# -- the scale flags' checks -----------------------------------------------------------
DRY = ["--agents", "4", "--dry-run", "--tokenizer-model", "deepseek-v3"]


def usage_error(argv: list[str]) -> str:
    with pytest.raises(UsageError) as caught:
        config_from_argv(argv)
    return str(caught.value)


def test_ramp_up_with_open_loop_is_a_usage_error():
    message = (
        "--ramp-up spreads closed-loop starts; an open-loop run starts each agent at its own "
        "time already (drop --ramp-up)"
    )
    argv = ["--agents", "4", "--arrival-rate", "2", "--host", HOST, "--ramp-up", "1"]
    assert usage_error(argv) == message
    with pytest.raises(UsageError) as caught:
        RunConfig(arrival_rate=2.0, ramp_up=1.0, host=HOST).check()
    assert str(caught.value) == message
    config = config_from_argv([*argv[:-1], "0"])  # no ramp-up at all is fine
    assert config is not None and config.ramp_up == 0.0
    config = config_from_argv(["--agents", "4", "--host", HOST, "--ramp-up", "1.5"])
    assert config is not None and config.ramp_up == 1.5
    assert usage_error([*DRY, "--ramp-up", "-1"]) == (
        "argument --ramp-up: value must be a non-negative finite number"
    )


def test_shard_checks(tmp_path):
    results = ["--results-json", str(tmp_path / "r.json"), "--seed", "1"]
    assert usage_error([*DRY, "--max-active-agents", "2", "--shard", "0/3", *results]) == (
        "--max-active-agents 2 is fewer than the 3 shards: each needs at least one agent slot"
    )
    config = config_from_argv([*DRY, "--max-active-agents", "3", "--shard", "2/3", *results])
    assert config is not None and config.shard_spec() == Shard(2, 3)
    assert usage_error([*DRY, "--shard", "0/2", "--results-json", str(tmp_path / "r.json")]) == (
        "--shard 0/2 needs --seed: every shard must draw the same workload and content "
        "(give all shards the same --seed)"
    )
    assert usage_error([*DRY, "--shard", "0/2", "--seed", "1"]) == (
        "--shard 0/2 needs --results-json: `batchbench merge` reads every shard's results JSON "
        "(and the raw data saved beside it)"
    )
    assert usage_error([*DRY, "--shard", "2/2", *results]) == (
        "--shard 2/2: index 2 is not below the shard count 2"
    )


def test_shard_without_results_json_through_the_console(capsys):
    assert run_console([*DRY, "--shard", "0/2", "--seed", "1"], "batchbench-agent") == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        "Error: --shard 0/2 needs --results-json: `batchbench merge` reads every shard's "
        "results JSON (and the raw data saved beside it)\n"
    )


def test_workers_and_start_at_flags():
    config = config_from_argv([*DRY, "--workers", "auto", "--start-at", "2026-12-04T15:00:00Z"])
    assert config is not None
    assert (config.workers, config.start_at) == (0, 1796396400.0)
    assert config.worker_count >= 1
    for text in ("2026-12-04T15:00:00", "2026-12-04T16:00:00+01:00", "1796396400"):
        config = config_from_argv([*DRY, "--start-at", text])
        assert config is not None and config.start_at == 1796396400.0
    config = config_from_argv([*DRY, "--workers", "3"])
    assert config is not None and (config.workers, config.worker_count) == (3, 3)
    assert usage_error([*DRY, "--workers", "0"]) == (
        'argument --workers: "0" is not a positive integer or auto'
    )
    assert usage_error([*DRY, "--start-at", "yesterday"]) == (
        'argument --start-at: "yesterday" is not a time: give ISO 8601 (2026-12-04T15:00:00Z) '
        "or Unix seconds"
    )
    assert usage_error([*DRY, "--start-at", "0"]) == 'argument --start-at: "0" is not a time'


# -- merge helpers ----------------------------------------------------------------------
def series_shard(t, agents, flight, settled, output) -> ShardData:
    arrays = {
        "series.t": np.array(t, dtype=np.float64),
        "series.active_agents": np.array(agents, dtype=np.int32),
        "series.in_flight": np.array(flight, dtype=np.int32),
        "series.settled": np.array(settled, dtype=np.int64),
        "series.output_tokens": np.array(output, dtype=np.int64),
    }
    return ShardData({"shard": [0, 1], "live": {"series_interval": 0.5}}, arrays)


def test_series_are_resampled_on_one_grid_and_summed():
    a = series_shard([0.5, 1.0, 1.5], [2, 2, 1], [1, 2, 0], [1, 3, 5], [10, 30, 50])
    b = series_shard([0.5, 1.0, 1.5], [1, 1, 1], [1, 0, 1], [2, 4, 6], [20, 40, 60])
    c = series_shard([0.5], [4], [4], [7], [70])  # ends after its first point
    series = _series([a, b, c], (0.0, 0.25, 0.0))  # b's points at 0.75, 1.25, 1.75
    assert series.interval == 0.5
    assert list(series.t) == [0.5, 1.0, 1.5, 1.75]
    # Gauges: each shard's nearest point within half an interval (ties: the earlier one);
    # c has none after 0.5, a's last point (1.5) is still within reach of 1.75.
    assert list(series.active_agents) == [7, 3, 2, 2]
    assert list(series.in_flight) == [6, 3, 0, 1]
    # Counts: linear between a shard's points from 0 at its start, flat after its end.
    assert list(series.settled) == [9, 13, 17, 18]
    assert list(series.output_tokens) == [90, 130, 170, 180]
    assert len(_series([series_shard([], [], [], [], [])], (0.0,)).t) == 0


def recorder_with(rows: list[tuple[float, float]]) -> Recorder:
    recorder = Recorder()
    for start, latency_ms in rows:
        recorder.samples.add(start, latency_ms, 0.0, 0.0, 0.0, True, True, -1, 0, 1, 1, 0, 0, 0)
    return recorder


def test_peak_in_flight_from_send_times_and_latencies():
    assert _peak_in_flight(Recorder()) == 0
    assert _peak_in_flight(recorder_with([(0.0, 1000.0)])) == 1
    # One ends at 1.0 as another starts at 1.0: the end counts first.
    rows = [(0.0, 1000.0), (0.5, 1000.0), (1.0, 1000.0)]
    assert _peak_in_flight(recorder_with(rows)) == 2
    assert _peak_in_flight(recorder_with([*rows, (0.25, 500.0)])) == 3
    assert _peak_in_flight(recorder_with([(0.0, 100.0), (0.2, 100.0), (0.4, 100.0)])) == 1


def engine_shard(records, total, max_active, last, late, lag) -> ShardData:
    document = {
        "records": records,
        "total_duration": total,
        "max_active_agents": max_active,
        "last_agent_admitted_at": last,
        "late_admissions": late,
        "max_admission_lag": lag,
    }
    return ShardData({"shard": [0, 2], "engine": document})


def test_engine_records_move_to_the_common_clock_in_finish_order():
    a = engine_shard(
        [[0, 0, 0.0, 0.0, 1.0, 1.0, True, False, 0], [2, 0, 0.0, 1.0, 3.0, 2.0, True, False, 1]],
        3.0, 1, 1.0, 0, 0.0,
    )  # fmt: skip
    b = engine_shard([[1, 1, 0.0, 0.0, 2.0, 2.0, False, True, 0]], 3.0, 1, 0.0, 2, 0.25)
    result = _engine([a, b], (0.0, 0.5))
    rows = [
        (r.agent_id, r.routing_slot, r.scheduled_at, r.admitted_at, r.finished_at,
         r.loop_seconds, r.completed, r.interrupted, r.finish_sequence)
        for r in result.records
    ]  # fmt: skip
    assert rows == [
        (0, 0, 0.0, 0.0, 1.0, 1.0, True, False, 0),
        (1, 1, 0.5, 0.5, 2.5, 2.0, False, True, 1),
        (2, 0, 0.0, 1.0, 3.0, 2.0, True, False, 2),
    ]
    assert result.total_duration == 3.5
    assert result.max_active_agents == 2
    assert result.last_agent_admitted_at == 1.0
    assert result.late_admissions == 2
    assert result.max_admission_lag == 0.25


def identity_shard(index: int, count: int, config: RunConfig, sha: str = "abc") -> ShardData:
    meta = {
        "shard": [index, count],
        "config": config_fields(config),
        "setup": {"manifest_sha256": sha},
        "live": None,
    }
    return ShardData(meta)


def merge_error(shards: list[ShardData], names: list[str]) -> str:
    with pytest.raises(BatchbenchError) as caught:
        check_shards(shards, names)
    return str(caught.value)


def test_check_shards_orders_and_refuses_with_one_line():
    config = RunConfig(seed=7, max_active_agents=4)
    s0, s1, s2 = (identity_shard(i, 3, replace_shard(config, i, 3)) for i in range(3))
    assert check_shards([s2, s0, s1], ["c", "a", "b"]) == [s0, s1, s2]
    assert merge_error([], []) == "no shard results to merge"
    assert merge_error([s0, s2], ["a", "c"]) == (
        "shard 1 of 3 missing: merge needs every shard's results"
    )
    assert merge_error([s0], ["a"]) == "shard 1, 2 of 3 missing: merge needs every shard's results"
    assert merge_error([s0, s1, s0, s2], ["a", "b", "a2", "c"]) == "a2 and a are both shard 0/3"
    other = identity_shard(1, 2, replace_shard(config, 1, 2))
    assert merge_error([s0, other], ["a", "x"]) == (
        "the results come from runs split differently (a: 3, x: 2 shards)"
    )
    reseeded = identity_shard(1, 3, replace_shard(RunConfig(seed=8, max_active_agents=4), 1, 3))
    assert merge_error([s0, reseeded, s2], ["a", "b", "c"]) == (
        "b is from a different run than a: options differ (seed)"
    )
    twice = identity_shard(2, 3, replace_shard(RunConfig(seed=9, max_active_agents=5), 2, 3))
    assert merge_error([s0, s1, twice], ["a", "b", "c"]) == (
        "c is from a different run than a: options differ (max_active_agents, seed)"
    )
    foreign = identity_shard(1, 3, replace_shard(config, 1, 3), sha="def")
    assert merge_error([s0, foreign, s2], ["a", "b", "c"]) == ("b replayed another manifest than a")
    # Where outputs go and the shard label differ between shards of one run.
    moved = identity_shard(
        1, 3, replace_shard(RunConfig(seed=7, max_active_agents=4, results_json="b/r.json"), 1, 3)
    )
    assert check_shards([s0, moved, s2], ["a", "b", "c"]) == [s0, moved, s2]


def replace_shard(config: RunConfig, index: int, count: int) -> RunConfig:
    return dataclasses.replace(config, shard=f"{index}/{count}")


def test_request_events_merge_in_end_order_on_the_common_clock(tmp_path):
    def write(path, events):
        path.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in events))
        return str(path)

    a = write(tmp_path / "a.jsonl", [
        {"agent_id": 0, "start_offset_seconds": 0.0, "latency_seconds": 1.0},
        {"agent_id": 2, "start_offset_seconds": 0.5, "latency_seconds": 1.0},
    ])  # fmt: skip
    b = write(tmp_path / "b.jsonl", [
        {"agent_id": 1, "start_offset_seconds": 0.0, "latency_seconds": 0.5},
        {"agent_id": 3, "start_offset_seconds": 1.0, "latency_seconds": 0.5},
    ])  # fmt: skip
    target = tmp_path / "merged.jsonl"
    assert merge_request_events([(a, 0.0), (b, 0.25)], str(target)) == 4
    merged = [orjson.loads(line) for line in target.read_bytes().splitlines()]
    assert [(e["agent_id"], e["start_offset_seconds"]) for e in merged] == [
        (1, 0.25), (0, 0.0), (2, 0.5), (3, 1.25),
    ]  # fmt: skip
    with pytest.raises(BatchbenchError, match=r"missing\.jsonl: No such file or directory$"):
        merge_request_events([(str(tmp_path / "missing.jsonl"), 0.0)], str(target))


def test_shard_data_round_trip_and_load_errors(tmp_path):
    assert data_path(str(tmp_path / "run" / "results.json")) == str(
        tmp_path / "run" / "results.shard.npz"
    )
    meta = {"shard": [1, 2], "planned": [3, 7]}
    arrays = {"latencies_ms": np.array([1.5, 2.5]), "samples.rank": np.array([0, 1], np.int32)}
    path = str(tmp_path / "r.shard.npz")
    save(capture(meta, None), path)
    arrays_path = str(tmp_path / "arrays.shard.npz")
    save(ShardData(dict(capture(meta, None).meta), arrays), arrays_path)
    loaded = load(path)
    assert loaded.shard == (1, 2)
    assert loaded.meta == dict(meta, format=1, version=__version__)
    assert loaded.arrays == {}
    loaded = load(arrays_path)
    assert loaded.array("latencies_ms").tolist() == [1.5, 2.5]
    assert loaded.array("samples.rank").dtype == np.int32
    assert loaded.array("absent").tolist() == []
    missing = str(tmp_path / "none.shard.npz")
    with pytest.raises(BatchbenchError) as caught:
        load(missing)
    assert str(caught.value) == f"{missing}: no such file (the shard's raw data)"
    unversioned = str(tmp_path / "old.shard.npz")
    save(ShardData(meta, arrays), unversioned)
    with pytest.raises(BatchbenchError) as caught:
        load(unversioned)
    assert str(caught.value) == (
        f"{unversioned}: shard format None is not 1 (written by another batchbench version)"
    )
    foreign = tmp_path / "foreign.npz"
    np.savez(foreign, x=np.zeros(2))
    with pytest.raises(BatchbenchError) as caught:
        load(str(foreign))
    assert str(caught.value) == f"{foreign}: not a batchbench shard file (no meta)"
