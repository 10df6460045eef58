"""The library API: batchbench.run(config) -> RunResult, quiet, files only when asked."""

from __future__ import annotations

import asyncio
import csv
import dataclasses
import os
from pathlib import Path

import orjson
import pytest

import batchbench
import batchbench.stages.outputs as outputs_stage
from batchbench import RunConfig, RunResult, Summary, run, run_async
from batchbench.api import OutputError
from batchbench.cli.agent_args import config_from_argv
from batchbench.errors import BatchbenchError, UsageError
from batchbench.results.console import ALL_CSV_COLUMNS, csv_row

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "trajectory-replay" / "plans.jsonl"


def replay(**options) -> RunConfig:
    return RunConfig(
        agent_plans_jsonl=str(EXAMPLE), max_active_agents=2, seed=7, content_salt="api", **options
    )


def test_dry_run_is_quiet_and_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    result = run(replay(dry_run=True, tokenizer_model="deepseek-v3"))
    assert isinstance(result, RunResult) and isinstance(result.summary, Summary)
    summary = result.summary
    assert (summary.agents, summary.completed_agents, summary.planned_tool_invocations) == (3, 3, 7)
    assert summary.total_requests == 0 and summary.max_active_agents == 2
    assert summary.workload_mode == "trajectory_replay" and summary.content_salt == "api"
    assert sorted(r["agent_id"] for r in result.lifecycle) == [0, 1, 2]
    assert all(r["completed"] for r in result.lifecycle)
    assert result.fidelity is None and result.client_health is None and result.exit_status == 0
    assert result.written == ()
    assert os.listdir(tmp_path) == []
    captured = capsys.readouterr()
    assert (captured.out, captured.err) == ("", "")


def test_live_run_against_the_simulator(tmp_path, capsys):
    result = run(replay(sim=True, calibrate=True))
    summary = result.summary
    assert (summary.successful_requests, summary.failed_requests) == (7, 0)
    assert (summary.prompt_exact_requests, summary.output_exact_requests) == (7, 7)
    assert summary.prompt_fidelity_requests == 7 and result.fidelity.prompt.exact == 7
    assert result.setup.calibration["check_ok"] is True
    assert result.config.host.startswith("http://127.0.0.1:")  # the config as run
    assert result.client_health.peak_in_flight == 2
    assert summary.stream is False and summary.ttft_p50_ms is None
    assert summary.requests_per_second == pytest.approx(7 / summary.total_duration_seconds)
    assert len(result.lifecycle) == 3 and all(r["successful_requests"] for r in result.lifecycle)
    captured = capsys.readouterr()
    assert (captured.out, captured.err) == ("", "")


def test_run_async_inside_a_loop():
    async def main() -> RunResult:
        return await run_async(replay(sim=True, stream=True, calibrate=True))

    result = asyncio.run(main())
    assert result.summary.successful_requests == 7
    assert result.summary.ttft_p50_ms is not None and result.summary.stream is True
    assert len(result.stream.ttft_ms) == 7


def test_files_render_the_summary_record(tmp_path):
    (tmp_path / "out").mkdir()
    config = replay(
        dry_run=True,
        tokenizer_model="deepseek-v3",
        results_csv=str(tmp_path / "out" / "r.csv"),
        results_json=str(tmp_path / "out" / "r.json"),
        agent_events_jsonl=str(tmp_path / "events.jsonl"),
    )
    result = run(config)
    rows = list(csv.reader((tmp_path / "out" / "r.csv").open()))
    assert tuple(rows[0]) == ALL_CSV_COLUMNS
    assert rows[1] == csv_row(result.summary)
    document = orjson.loads((tmp_path / "out" / "r.json").read_bytes())
    assert document["metrics"] == orjson.loads(orjson.dumps(dataclasses.asdict(result.summary)))
    assert list(document["metrics"]) == [*ALL_CSV_COLUMNS, "errors_by_kind", "resent_requests"]
    events = [orjson.loads(line) for line in (tmp_path / "events.jsonl").read_bytes().splitlines()]
    assert events == [dict(record) for record in result.lifecycle]
    written = dict((what, path) for what, path in result.written)
    options = tmp_path / "out" / "r.config.toml"
    assert written["resolved options"] == str(options)
    again = config_from_argv(["--config", str(options)])
    assert again == dataclasses.replace(
        config, results_csv=None, results_json=None, agent_events_jsonl=None
    )
    rerun = run(again)
    assert [r["trajectory_id"] for r in rerun.lifecycle] == [
        r["trajectory_id"] for r in result.lifecycle
    ]


def test_random_seed_and_salt_are_written_for_a_rerun(tmp_path):
    config = RunConfig(
        agents=2, dry_run=True, tokenizer_model="deepseek-v3", results_json=str(tmp_path / "r.json")
    )
    result = run(config)
    options = tmp_path / "r.config.toml"
    assert f'# content-salt = "{result.setup.content_salt}"' in options.read_text()
    again = config_from_argv(["--config", str(options)])
    assert again == dataclasses.replace(config, seed=result.setup.root_seed, results_json=None)


def test_output_paths_are_checked_before_the_run(tmp_path):
    blocked = tmp_path / "a-directory"
    blocked.mkdir()
    for option, path, message in [
        ("results_csv", str(blocked), f"--results-csv {blocked} is a directory; give a file name"),
        (
            "results_json",
            str(tmp_path / "missing" / "r.json"),
            f"--results-json {tmp_path / 'missing' / 'r.json'}: the directory "
            f"{tmp_path / 'missing'} does not exist",
        ),
    ]:
        config = replay(dry_run=True, tokenizer_model="deepseek-v3", **{option: path})
        with pytest.raises(UsageError) as caught:
            run(config)
        assert str(caught.value) == message
    assert sorted(os.listdir(tmp_path)) == ["a-directory"]


def test_one_failed_output_keeps_the_others_and_the_result(tmp_path, monkeypatch):
    def failing(path, row, extra=()):
        raise BatchbenchError(f"failed to write {path}: disk full")

    monkeypatch.setattr(outputs_stage, "write_csv", failing)
    config = replay(
        dry_run=True,
        tokenizer_model="deepseek-v3",
        results_csv=str(tmp_path / "r.csv"),
        results_json=str(tmp_path / "r.json"),
    )
    with pytest.raises(OutputError, match="disk full") as caught:
        run(config)
    result = caught.value.result
    assert result.summary.completed_agents == 3
    assert result.written == (("agent benchmark JSON summary", str(tmp_path / "r.json")),)
    assert (tmp_path / "r.json").is_file()


def test_package_exports():
    assert batchbench.RunConfig is RunConfig and batchbench.run is run
    assert set(batchbench.__all__) >= {"RunConfig", "RunResult", "run", "run_async"}
    with pytest.raises(AttributeError):
        batchbench.not_a_name  # noqa: B018


def test_readme_example_runs(monkeypatch, capsys):
    readme = (EXAMPLE.parents[2] / "README.md").read_text()
    code = readme.split("```python\n", 1)[1].split("```", 1)[0]
    monkeypatch.chdir(EXAMPLE.parents[2])
    exec(compile(code, "README.md", "exec"), {})
    first = capsys.readouterr().out.splitlines()[0].split()
    assert first[:2] == ["7", "100.0"]


def test_each_stage_hands_on_a_frozen_value():
    """plans -> target -> prepare -> execute -> finish: every stage's output is frozen, and
    the public face re-exports the result types rather than copying them."""
    from batchbench.stages import execute, finish, hosting, outputs, plans, prepare, target

    for kind in (plans.Plans, target.Target, prepare.Prepared, execute.Executed,
                 finish.RunResult, hosting.Hosting):  # fmt: skip
        assert dataclasses.is_dataclass(kind) and kind.__dataclass_params__.frozen, kind
    assert RunResult is finish.RunResult and OutputError is outputs.OutputError


def test_run_result_reads_live_figures_by_name():
    """ranks, fidelity, client_health, stream, framing and interrupted_by come from
    ``live``: a dry run has none of them."""
    result = run(replay(dry_run=True, tokenizer_model="deepseek-v3"))
    assert result.live is None and result.ranks == () and result.stream is None
    assert result.framing is None and result.interrupted_by is None
