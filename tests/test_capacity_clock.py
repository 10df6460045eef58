"""A capacity search that respects the clock (issue 28, item 2): the estimate before the
first step, --max-time, re-judging stored steps when --slo changes, --sweep, and
``batchbench.capacity()`` from Python. Fake steps where the arithmetic is checked exactly;
the real simulator where the pieces meet (a probe, a sweep, a re-judged directory)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
from types import SimpleNamespace

import orjson
import pytest
from test_capacity import FakeServer, WritingServer, search_config, window

import batchbench
from batchbench.capacity import PASS, UNRESOLVED, Bounds, StepRecord, WindowPlan, run_capacity
from batchbench.capacity.api import write_capacity_report
from batchbench.capacity.estimate import duration_words, estimate, estimate_objective
from batchbench.capacity.outdir import CAPACITY_FILE, OutputDirectory, current_names, step_file
from batchbench.capacity.rejudge import rejudged_window
from batchbench.capacity.search import FAIL, MEASURED, OUT_OF_TIME, sweep_caps
from batchbench.capacity.steps import StepRunner
from batchbench.cli.capacity import run as capacity_cli
from batchbench.config import RunConfig
from batchbench.errors import UsageError
from batchbench.options.values import wall_duration
from batchbench.results.slo import parse_slo

# The search, its estimate and re-judging are pure-Python logic (no compiled twin):
# checked in the native pass.
pytestmark = pytest.mark.native_pass_only

SIM_ARGS = (
    "--decode-step-ms 0 --decode-step-ms-per-seq 40 --decode-step-ms-per-ktoken 0 "
    "--prefill-tokens-per-s 1e9"
)
FAST = ["--sim", "--sim-args", SIM_ARGS, "--stream", "--output-tokens", "4", "--warmup", "0.5",
        "--window", "1.5", "--no-progress"]  # fmt: skip


# -- 1. the estimate -------------------------------------------------------------------------
def test_estimate_line_from_the_probe_rate():
    # the case: ttft_p99 at ~0.4 samples/s with the defaults (5 s warm-up, 30 s
    # window, 1 to 1024 agents): 381 / 0.4 = 952.5 s of window
    ttft_p99 = parse_slo("ttft_p99=1s")[0]
    found = estimate_objective(ttft_p99, 2, 5.0, 1, Bounds(), WindowPlan())
    assert (found.samples_needed, found.samples_per_second, found.step_seconds) == (
        381, 0.4, 5.0 + 381 / 0.4
    )  # fmt: skip
    # the doubling caps 1, 2, ..., 1024 with the rate growing with the agents
    caps = [2**i for i in range(11)]
    assert found.search_seconds == sum(5.0 + max(30.0, 381 / (0.4 * cap)) for cap in caps)
    assert found.text(5.0) == (
        "Estimate: ttft_p99 needs 381 samples per step; at ~0.40 samples/s (1 agent) a step "
        "takes ~16 min, the search's 11 doubling steps ~35 min if the rate grows with the "
        "agents. Cheaper: ttft_p90 (35 samples, ~1.5 min/step) or --min-agents 32 (~35 s/step)"
    )
    # 381 / (0.4 x 32) = 29.8 s: the first doubling cap whose samples fit in 30 s
    assert (found.cheaper_min_agents, found.cheaper_step_seconds) == (32, 5.0 + 35 / 0.4)
    # a step whose samples fit in its window needs no cheaper alternative
    quick = estimate_objective(parse_slo("e2e_p50=9s")[0], 10, 5.0, 1, Bounds(1, 4), WindowPlan())
    assert quick.text(5.0) == (
        "Estimate: e2e_p50 needs 4 samples per step; at ~2.00 samples/s (1 agent) a step "
        "takes ~35 s, the search's 3 doubling steps ~1.8 min if the rate grows with the agents"
    )
    assert estimate(None, (ttft_p99,), 5.0, 2, Bounds(2, 8), WindowPlan())[0].text(5.0) == (
        "Estimate: ttft_p99 needs 381 samples per step; the 5 s probe at 2 agents measured "
        "none, so a step may take far longer than its window"
    )
    assert [duration_words(s) for s in (1.84, 34.6, 95.0, 957.5, 4800.0, 7200.0)] == [
        "1.8 s", "35 s", "1.6 min", "16 min", "1 h 20 min", "2 h"
    ]  # fmt: skip


ESTIMATE = re.compile(
    r"Estimate: (\w+) needs (\d+) samples per step; at ~([\d.]+) samples/s \(1 agent\) a step "
    r"takes ~(.+), the sweep's 2 steps ~(.+) if the rate grows with the agents(\. Cheaper: .*)?"
)


@pytest.mark.native_pass_only
def test_probe_sweep_and_rejudged_slo_on_the_simulator(tmp_path, capsys):
    """One real directory: a probe then a --sweep of 2 caps (items 1 and 4), then the same
    directory with another --slo, re-judged without a run (item 3)."""
    out = str(tmp_path / "sweep")
    argv = [*FAST, "--max-agents", "4", "--sweep", "2", "--max-extensions", "0",
            "--output-dir", out]  # fmt: skip
    assert capacity_cli([*argv, "--slo", "itl_p50=100ms,ttft_p99=1s", "--probe", "1"]) == 0
    first = capsys.readouterr()
    lines = first.out.splitlines()
    assert "--model not given" not in first.err  # the simulator's one model needs no note
    assert lines[0] == (
        "Capacity sweep: ITL p50 ≤ 100 ms and TTFT p99 ≤ 1 s; caps 1, 4 active agents; each "
        f"step 0.5 s warm-up + 1.5 s window (unresolved: extended up to 0 times); output in {out}"
    )
    document = json.loads((tmp_path / "sweep" / CAPACITY_FILE).read_text())
    probe = document["estimate"]
    assert (probe["probe_seconds"], probe["agents"]) == (1.0, 1)
    for line, figures in zip(lines[1:3], probe["objectives"], strict=True):
        match = ESTIMATE.fullmatch(line)
        assert match is not None, line
        rate, needed = figures["samples_per_second"], figures["samples_needed"]
        assert (match[1], int(match[2]), match[3]) == (
            figures["objective"], needed, f"{rate:.2f}"
        )  # fmt: skip
        assert rate > 0
        # a step: the warm-up, then the window or the longer one that holds the samples
        assert figures["step_seconds"] == pytest.approx(0.5 + max(1.5, needed / rate))
        assert match[4] == duration_words(figures["step_seconds"])
        sweep = sum(0.5 + max(1.5, needed / (rate * cap)) for cap in (1, 4))
        assert figures["search_seconds"] == pytest.approx(sweep)
    assert [f["samples_needed"] for f in probe["objectives"]] == [4, 381]
    assert probe["objectives"][1]["cheaper_objective"] == "ttft_p90"  # 381 cannot fit 1.5 s
    assert lines[3].startswith("agents   window")
    assert [line.split()[0] for line in lines[4:6]] == ["1", "4"]
    steps = document["steps"]
    assert [(s["agents"], s["phase"]) for s in steps] == [(1, "sweep"), (4, "sweep")]
    assert document["search"]["sweep"] == 2
    # ITL is 40 ms x agents: 4 agents break 100 ms; at 1 agent the p99 of TTFT needs more
    # samples than 1.5 s hold (unresolved; --max-extensions 0 keeps the test short)
    assert [s["verdict"] for s in steps] == [UNRESOLVED, FAIL]

    # the same directory with another --slo: both steps re-judged, nothing runs
    assert capacity_cli([*argv, "--slo", "itl_p50=260ms,e2e_p50=500ms"]) == 0
    captured = capsys.readouterr()
    assert captured.err.splitlines()[0] == (
        "note: --slo was itl_p50=100ms,ttft_p99=1s, now itl_p50=260ms,e2e_p50=500ms: 2 stored "
        "steps re-judged from their results JSON, not re-run"
    )
    rows = captured.out.splitlines()
    assert all(row.endswith("(resumed)") for row in rows[2:4])
    again = json.loads((tmp_path / "sweep" / CAPACITY_FILE).read_text())
    assert again["slo"] == ["itl_p50=260ms", "e2e_p50=500ms"] and again["estimate"] is None
    verdicts = [(s["agents"], s["verdict"]) for s in again["steps"]]
    # 4 agents: ITL ~160 ms holds 260 ms, E2E ~800 ms breaks 500 ms
    assert verdicts == [(1, PASS), (4, FAIL)]
    outcomes = {o["objective"]: o["verdict"] for o in again["steps"][1]["window"]["slo"]}
    assert outcomes == {"itl_p50": PASS, "e2e_p50": FAIL}
    assert rows[-2] == (
        "Sweep: 1 active agent holds " + again["answer"]["text"].split(" holds ", 1)[1]
    )
    answer_line = rows[-2]
    assert re.fullmatch(
        r"Sweep: 1 active agent holds ITL p50 ≤ 260 ms \(\d+(\.\d)? ms\) and E2E p50 ≤ 500 ms "
        r"\(\d+ ms\): the highest passing cap of 2 caps measured \(1, 4\)",
        rows[-2],
    ), rows[-2]

    # item 5: the same search from Python, batchbench.capacity(), reads it back (the
    # directory's options are the command's: a real run's steps, typed result)
    config = RunConfig.from_args(["--sim", "--sim-args", SIM_ARGS, "--stream",
                                  "--output-tokens", "4", "--no-progress"])  # fmt: skip
    notes: list[str] = []
    result = batchbench.capacity(
        config, slo="itl_p50=260ms,e2e_p50=500ms", output_dir=out, max_agents=4, sweep=2,
        max_extensions=0, warmup=0.5, window=1.5, warn=notes.append,
    )  # fmt: skip
    assert isinstance(result, batchbench.capacity.CapacityResult) and notes == []
    assert (result.answer.text, result.answer.agents, result.answer.concluded) == (
        answer_line, 1, True
    )  # fmt: skip
    assert (result.resumed_steps, result.path) == (2, os.path.join(out, CAPACITY_FILE))
    assert [s.verdict for s in result.search.steps] == [PASS, FAIL]


# -- 2. --max-time ------------------------------------------------------------------------------
class Clock:
    """A fake time.monotonic: each fake step advances it by its warm-up and window."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_max_time_ends_the_search_with_its_bracket(tmp_path):
    directory = str(tmp_path)
    clock = Clock()
    server = WritingServer(directory, 48)

    def step(agents, phase, extension, previous=None):
        clock.now += 35.0  # 5 s warm-up + 30 s window
        return server(agents, phase, extension, previous)

    result = run_capacity(search_config(), directory, step=step, max_time=100.0, clock=clock)
    # 1 and 2 agents take 70 s; the step at 4 would take 35 s, 30 s are left
    assert server.calls == [(1, 0), (2, 0)]
    assert result.answer.text == (
        "Capacity: not concluded: --max-time 1.7 min ran out before the step at 4 active "
        "agents: it would take ~35 s, ~30 s were left; so far 2 active agents hold TTFT p99 ≤ "
        "2 s (82.5 ms)"
    )
    assert (result.answer.agents, result.answer.concluded) == (2, False)
    document = json.loads((tmp_path / CAPACITY_FILE).read_text())
    assert document["stop_reason"] == "max-time"
    assert document["answer"]["text"] == result.answer.text
    # without --max-time nothing is recorded as a stop
    other = tmp_path / "other"
    plain = run_capacity(search_config(), str(other), step=WritingServer(str(other), 48))
    assert json.loads((other / CAPACITY_FILE).read_text())["stop_reason"] is None
    assert plain.answer.concluded


def test_max_time_leaves_the_one_off_setup_out_of_each_steps_estimate(tmp_path, monkeypatch):
    """The simulator's start and the calibration happen once, when the first step's runner
    is made: they count against --max-time but are no per-step overhead."""
    from batchbench.capacity import api

    clock = Clock()
    server = WritingServer(str(tmp_path), 48)

    class Runner:
        def __init__(self, *args, **kwargs):
            clock.now += 20.0  # the one-off setup
            self.deadline = None

        def __call__(self, agents, phase, extension, previous=None):
            clock.now += 35.0  # 5 s warm-up + 30 s window
            return server(agents, phase, extension, previous)

    monkeypatch.setattr(api, "StepRunner", Runner)
    monkeypatch.setattr(api._Target, "get", lambda self: self.config)
    result = run_capacity(
        search_config(), str(tmp_path), max_time=140.0, clock=clock, probe_seconds=0
    )
    # 20 s of setup, then 35 s per step: the step at 8 would take 35 s, 15 s are left
    assert server.calls == [(1, 0), (2, 0), (4, 0)]
    assert result.answer.text.startswith(
        "Capacity: not concluded: --max-time 2.3 min ran out before the step at 8 active "
        "agents: it would take ~35 s, ~15 s were left"
    )


def test_a_search_recorded_before_the_new_defaults_resumes_as_it_ran(tmp_path):
    """capacity.json of a search run before streaming and calibration were the defaults
    says ``stream`` and ``calibrate = false``: read in today's terms, the same options
    resume it, and today's defaults are refused with what to add."""
    directory = str(tmp_path)
    run_capacity(search_config(), directory, step=WritingServer(directory, 48))
    path = tmp_path / CAPACITY_FILE
    document = json.loads(path.read_text())
    options = document["configuration"]
    del options["no-stream"]
    options.update(stream=True, calibrate=False)  # as such a search recorded them
    path.write_text(json.dumps(document))
    with pytest.raises(UsageError) as refused:
        run_capacity(search_config(), directory, step=WritingServer(directory, 48))
    assert str(refused.value) == (
        f"--output-dir {directory} holds a search with other options (--no-calibrate was "
        "on, now unset) (it was measured before streamed replies and calibration became the "
        "defaults: add --no-stream and --no-calibrate as it ran to resume it): run with the "
        "same options, add --restart to discard it, or give another --output-dir"
    )
    again = WritingServer(directory, 48)
    run_capacity(search_config(calibrate=False), directory, step=again)
    assert again.calls == []  # every step read back
    # an unstreamed older search: its stream = false is today's --no-stream
    assert current_names({"stream": False, "calibrate": True, "seed": 7}) == {
        "seed": 7,
        "no-stream": True,
        "calibrate": True,
    }


def test_max_time_used_up_and_an_extension_that_cannot_fit(tmp_path):
    clock = Clock()
    server = WritingServer(str(tmp_path), 48, overrides={2: lambda ext: UNRESOLVED})

    def step(agents, phase, extension, previous=None):
        clock.now += 35.0
        return server(agents, phase, extension, previous)

    # the step at 2 is unresolved; its extension (8 x 30 s) does not fit in 200 - 70 s
    result = run_capacity(search_config(), str(tmp_path), step=step, max_time=200.0,
                          clock=clock)  # fmt: skip
    assert server.calls == [(1, 0), (2, 0)]
    assert result.answer.text.startswith(
        "Capacity: not concluded: --max-time 3.3 min ran out before the step at 2 active "
        "agents (extension 1): it would take ~4.1 min, ~2.2 min were left; so far 1 active "
        "agent holds"
    )
    # the unresolved attempt is kept (a resume extends it), after the steps that decided
    document = json.loads((tmp_path / CAPACITY_FILE).read_text())
    assert [(s["agents"], s["verdict"], s["extensions"]) for s in document["steps"]] == [
        (1, PASS, 0), (2, UNRESOLVED, 0)
    ]  # fmt: skip
    resumed = WritingServer(str(tmp_path), 48)
    run_capacity(search_config(), str(tmp_path), Bounds(1, 4), step=resumed)
    assert resumed.calls[0] == (2, 1)
    used = tmp_path / "used"
    clock.now = 0.0

    def slow(agents, phase, extension, previous=None):
        clock.now += 1000.0  # far beyond the plan: the time is up after it
        return WritingServer(str(used), 48)(agents, phase, extension, previous)

    result = run_capacity(search_config(), str(used), step=slow, max_time=60.0, clock=clock)
    assert result.answer.text.startswith(
        "Capacity: not concluded: --max-time 1.0 min was used up before the step at 2 active "
        "agents; so far 1 active agent holds"
    )


def test_max_time_estimates_a_trajectory_window_from_the_last_step(tmp_path):
    clock = Clock()
    server = WritingServer(str(tmp_path), 48)

    def step(agents, phase, extension, previous=None):
        clock.now += 20.0 * agents  # 20 trajectories: 1 s each at 1 agent, 2 s at 2, ...
        return server(agents, phase, extension, previous)

    plan = WindowPlan(5.0, None, 20)
    result = run_capacity(search_config(), str(tmp_path), window=plan, step=step,
                          max_time=70.0, clock=clock)  # fmt: skip
    # 1 agent took 20 s and 2 agents 40 s; the step at 4 is estimated at 40 s (2 s per
    # trajectory, the last step's), 10 s are left
    assert server.calls == [(1, 0), (2, 0)]
    assert result.answer.text.startswith(
        "Capacity: not concluded: --max-time 1.2 min ran out before the step at 4 active "
        "agents: it would take ~40 s, ~10 s were left; so far"
    )


def test_a_step_running_when_the_time_runs_out_is_stopped_and_not_judged(tmp_path):
    configs: list[RunConfig] = []

    def fake_run(config, output):
        configs.append(config)
        with open(config.results_json, "w") as handle:
            handle.write("{}")
        engine = SimpleNamespace(records=[None] * 3, total_duration=12.0,
                                 last_agent_admitted_at=1.0)  # fmt: skip
        return SimpleNamespace(
            interrupted_by=None, exit_status=0, engine=engine, workload=[None] * 10,
            finished_by="duration",  # the --max-time cap, before the 400 trajectories
            window=SimpleNamespace(as_dict=lambda: window(PASS, samples=40, duration=7.0)),
            summary=SimpleNamespace(failed_requests=0, total_requests=40),
        )  # fmt: skip

    config = RunConfig(sim=True, stream=True, slo="ttft_p99=2s", agents=10)
    outdir = OutputDirectory(str(tmp_path), {}, {})
    runner = StepRunner(config, WindowPlan(5.0, None, 400), outdir, print, run=fake_run)
    runner.deadline = time.monotonic() + 12.0
    record = runner(1, "doubling", 0)
    assert configs[0].window_trajectories == 400
    assert 11.0 < configs[0].duration <= 12.0  # what was left of --max-time
    # the window said pass; a part of a window is not judged
    assert (record.verdict, record.note, record.results_json) == (
        UNRESOLVED, OUT_OF_TIME, "step-0001.json"
    )  # fmt: skip

    def cut(agents, phase, extension, previous=None):
        return StepRecord(agents, phase, UNRESOLVED, extension, record.window, step_file(agents),
                          note=OUT_OF_TIME)  # fmt: skip

    directory = str(tmp_path / "search")
    result = run_capacity(search_config(), directory, step=cut, max_time=600.0)
    assert len(result.search.steps) == 1  # never extended: the search ends there
    assert result.answer.text == (
        "Capacity: not concluded: --max-time 10 min ran out during the step at 1 active agent "
        "(stopped after 7.0 s of its window, not judged)"
    )
    with open(os.path.join(directory, CAPACITY_FILE), encoding="utf-8") as handle:
        document = json.load(handle)
    assert document["stop_reason"] == "max-time"
    # a resume measures that step again
    again = FakeServer(48)
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, step_file(1)), "wb") as handle:
        handle.write(orjson.dumps({"kind": "run", "window": record.window}))
    run_capacity(search_config(), directory, Bounds(1, 1), step=again)
    assert again.calls == [(1, 0)]


def test_max_time_values_and_banner(tmp_path, capsys, monkeypatch):
    assert [wall_duration(t) for t in ("90", "90s", "30m", "1.5h", "1h30m")] == [
        90.0, 90.0, 1800.0, 5400.0, 5400.0
    ]  # fmt: skip
    # as the search prints durations (duration_words): they are accepted back
    assert [wall_duration(duration_words(s)) for s in (35.0, 960.0, 4800.0)] == [
        35.0, 960.0, 4800.0
    ]  # fmt: skip
    assert wall_duration("1 h 20 min") == 4800.0
    out = str(tmp_path / "out")
    argv = ["--sim", "--slo", "e2e_p95=1s", "--output-dir", out, "--max-time"]
    assert capacity_cli([*argv, "soon"]) == 2
    assert (
        capsys.readouterr()
        .err.strip()
        .endswith(
            'argument --max-time: "soon" is not a duration (a number of seconds, or with units h, '
            "m, s: 90s, 30m, 1h30m)"
        )
    )
    assert not os.path.exists(out)
    from batchbench.cli import capacity as capacity_module

    seen = {}

    def fake_capacity(config, output_dir, *args, **kwargs):
        seen.update(kwargs)
        raise UsageError("stop here")

    monkeypatch.setattr(capacity_module, "run_capacity", fake_capacity)
    assert capacity_cli([*argv, "30m"]) == 2
    assert (seen["max_time"], seen["sweep"], seen["probe_seconds"]) == (1800.0, None, 5.0)


# -- 3. a changed --slo re-judges the stored steps ---------------------------------------------
def stored_step(ttft_ms: list[float], failed: int = 0, thinned: bool = False) -> dict:
    """A step's results JSON as the run writes it: its window (judged on ttft_p99=2s) and
    the window's TTFT CDF."""
    measured = window(PASS, max(ttft_ms), samples=len(ttft_ms) + failed)
    measured["failed_requests"] = failed
    measured["latency"]["ttft_ms"]["count"] = len(ttft_ms) + (5 if thinned else 0)
    ordered = sorted(ttft_ms)
    cdf = {"values": ordered, "fractions": [(i + 1) / len(ordered) for i in range(len(ordered))]}
    return {"kind": "run", "window": measured, "distributions": {"ttft_ms": cdf}}


def test_rejudged_window_from_the_stored_cdf():
    # 400 TTFTs: 396 of 100 ms, 4 of 1500 ms
    document = stored_step([100.0] * 396 + [1500.0] * 4)
    rejudged = rejudged_window(document, parse_slo("ttft_p99=1s,ttft_p50=200ms"), ())
    outcomes = rejudged["slo"]
    assert [(o["objective"], o["samples"], o["within"], o["verdict"]) for o in outcomes] == [
        ("ttft_p99", 400, 396, UNRESOLVED),  # 99.0 % within: exactly the share needed
        ("ttft_p50", 400, 396, PASS),
    ]
    assert outcomes[1]["value_ms"] == 100.0 and rejudged["slo_verdict"] == UNRESOLVED
    # the same objective as stored: its outcome as it was
    same = rejudged_window(document, parse_slo("ttft_p99=2s"), ())
    assert same["slo"] == document["window"]["slo"]
    # a failed request is a sample beyond the limit
    failing = rejudged_window(stored_step([100.0] * 200, failed=40), parse_slo("ttft_p90=1s"),
                              ())  # fmt: skip
    assert [(o["samples"], o["within"], o["verdict"]) for o in failing["slo"]] == [(240, 200, FAIL)]
    # what the document cannot say: a thinned CDF, ITL without a stored ITL objective, a
    # speed floor, goodput under other thresholds
    for text in ("ttft_p99=1s", "itl_p99=1s", "output_speed_p10>=30", "goodput=90%"):
        document = stored_step([100.0] * 10, thinned=text == "ttft_p99=1s")
        assert rejudged_window(document, parse_slo(text), (("ttft", 1.0),)) is None, text


def test_changed_slo_rejudges_stored_steps_and_continues(tmp_path):
    directory = str(tmp_path)

    class CdfServer(WritingServer):
        """TTFT of every request: 100 ms x agents (so p99 = p50 = 100 ms x agents), judged
        against ``slo``."""

        slo = "ttft_p99=2s"

        def __call__(self, agents, phase, extension, previous=None):
            record = super().__call__(agents, phase, extension, previous)
            document = stored_step([100.0 * agents] * 400)
            document["window"]["slo"] = []  # judged below, from the CDF
            record.window = rejudged_window(document, parse_slo(self.slo), ())
            record.verdict = record.window["slo_verdict"]
            with open(os.path.join(self.directory, step_file(agents)), "wb") as handle:
                handle.write(orjson.dumps(document))
            return record

    first = CdfServer(directory, 16)
    run_capacity(search_config(), directory, Bounds(1, 64), step=first)
    # TTFT 100 ms x agents: 20 agents hold 2 s, 21 do not
    assert [a for a, _e in first.calls] == [1, 2, 4, 8, 16, 32, 24, 20, 22, 21]
    notes: list[str] = []
    second = CdfServer(directory, 16)
    second.slo = "ttft_p99=450ms"
    # ttft_p99=450ms: 4 agents (400 ms) hold, 8 (800 ms) do not, judged from the CDFs
    result = run_capacity(search_config(slo="ttft_p99=450ms"), directory, Bounds(1, 64),
                          step=second, warn=notes.append)  # fmt: skip
    assert notes == [
        "note: --slo was ttft_p99=2s, now ttft_p99=450ms: 10 stored steps re-judged from "
        "their results JSON, not re-run"
    ]
    # bisection between 4 and 8 goes on: 6 and 5 were never measured, they run now
    assert [a for a, _e in second.calls] == [6, 5]
    assert [(s.agents, s.verdict, s.resumed) for s in result.search.steps] == [
        (1, PASS, True), (2, PASS, True), (4, PASS, True), (8, FAIL, True),
        (6, FAIL, False), (5, FAIL, False),
    ]  # fmt: skip
    # other options still refuse
    with pytest.raises(UsageError, match=r"\(--seed was 7, now 9\)"):
        run_capacity(search_config(slo="ttft_p99=1s", seed=9), directory, step=second)


def test_changed_slo_remeasures_steps_it_cannot_rejudge(tmp_path):
    directory = str(tmp_path)
    run_capacity(search_config(), directory, Bounds(1, 4), step=WritingServer(directory, 8))
    notes: list[str] = []
    again = WritingServer(directory, 8)
    run_capacity(search_config(slo="ttft_p99=1s"), directory, Bounds(1, 4), step=again,
                 warn=notes.append)  # fmt: skip
    # the fake's results JSON holds no CDF: every step is measured again, and the note says so
    assert notes == [
        "note: --slo was ttft_p99=2s, now ttft_p99=1s: 0 stored steps re-judged from their "
        "results JSON, not re-run; measured again (their results cannot judge the new "
        "objectives): the steps at 1, 2, 4 agents"
    ]
    assert again.calls == [(1, 0), (2, 0), (4, 0)]


# -- 4. --sweep -----------------------------------------------------------------------------
def test_sweep_caps_and_answer(tmp_path):
    assert sweep_caps(Bounds(1, 16), 4) == (1, 6, 11, 16)
    assert sweep_caps(Bounds(1, 1024), 3) == (1, 512, 1024)
    assert sweep_caps(Bounds(2, 3), 5) == (2, 3) and sweep_caps(Bounds(4, 9), 1) == (4,)
    server = WritingServer(str(tmp_path), 8)
    result = run_capacity(search_config(), str(tmp_path), Bounds(1, 16), step=server, sweep=4)
    # every cap measured, a failing one does not end the sweep
    assert server.calls == [(1, 0), (6, 0), (11, 0), (16, 0)]
    assert result.answer.as_dict() == {
        "agents": 6,
        "breaking_agents": 11,
        "text": "Sweep: 6 active agents hold TTFT p99 ≤ 2 s (1.41 s): the highest passing "
        "cap of 4 caps measured (1, 6, 11, 16)",
        "concluded": True,
    }
    document = json.loads((tmp_path / CAPACITY_FILE).read_text())
    assert document["search"]["sweep"] == 4
    assert [(s["agents"], s["phase"], s["verdict"]) for s in document["steps"]] == [
        (1, "sweep", PASS), (6, "sweep", PASS), (11, "sweep", FAIL), (16, "sweep", FAIL)
    ]  # fmt: skip
    # the same HTML chart as a search's
    write_capacity_report(str(tmp_path / CAPACITY_FILE), str(tmp_path / "report.html"))
    assert "Sweep: 6 active agents hold" in (tmp_path / "report.html").read_text()
    # without --slo: measured, no verdict
    bare = tmp_path / "bare"
    steps: list[StepRecord] = []

    def measure(agents, phase, extension, previous=None):
        steps.append(StepRecord(agents, phase, MEASURED, 0, window(PASS), step_file(agents)))
        with open(os.path.join(bare, step_file(agents)), "wb") as handle:
            handle.write(orjson.dumps({"kind": "run", "window": window(PASS)}))
        return steps[-1]

    plain = RunConfig(sim=True, stream=True, seed=7)
    result = run_capacity(plain, str(bare), Bounds(1, 16), step=measure, sweep=2)
    assert result.answer.text == "Sweep: 2 caps measured (1, 16); no --slo, so no verdict"
    assert result.answer.concluded
    with pytest.raises(UsageError, match="a capacity search needs --slo"):
        run_capacity(plain, str(tmp_path / "x"), step=measure)


def test_sweep_on_the_command_line(capsys, tmp_path):
    out = str(tmp_path / "out")
    assert capacity_cli(["--sim", "--output-dir", out, "--sweep", "0"]) == 2
    assert "--sweep: value must be" in capsys.readouterr().err
    assert capacity_cli(["--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    for flag in ("--max-time DURATION", "--sweep N", "--probe S"):
        assert flag in text
    assert "another --slo (the stored steps are re-judged from their results JSON)" in text


# -- 5. batchbench.capacity() -------------------------------------------------------------------
def test_python_api_in_a_running_loop_and_its_checks(tmp_path):
    config = RunConfig(sim=True, stream=True)

    async def inside() -> None:
        batchbench.capacity(config, slo="ttft_p99=2s", output_dir=str(tmp_path))

    with pytest.raises(UsageError) as raised:
        asyncio.run(inside())
    assert str(raised.value) == (
        "capacity() cannot run a search while an event loop is running in this thread (as in "
        "a Jupyter notebook): use `await asyncio.to_thread(batchbench.capacity, config, ...)` "
        "instead"
    )
    with pytest.raises(UsageError, match="capacity\\(\\) needs output_dir"):
        batchbench.capacity(config, slo="ttft_p99=2s")
    with pytest.raises(UsageError, match="a capacity search needs --slo"):
        batchbench.capacity(config, output_dir=str(tmp_path))
    assert "capacity" in batchbench.__all__
