"""The library API: batchbench.run(config) -> RunResult, quiet, files only when asked."""

from __future__ import annotations

import asyncio
import csv
import dataclasses
import gc
import inspect
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import orjson
import pytest

import batchbench
import batchbench.stages.outputs as outputs_stage
from batchbench import RunConfig, RunResult, Summary, run, run_async
from batchbench.api import OutputError
from batchbench.capacity import Bounds, StepRecord, run_capacity
from batchbench.capacity.outdir import CAPACITY_FILE, step_file
from batchbench.cli.agent_args import config_from_argv
from batchbench.errors import BatchbenchError, KeywordError, UsageError
from batchbench.results.console import ALL_CSV_COLUMNS, csv_row, dry_run_lines

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
    result = run(replay(sim=True))  # streamed and calibrated: the defaults
    summary = result.summary
    assert (summary.successful_requests, summary.failed_requests) == (7, 0)
    assert (summary.prompt_exact_requests, summary.output_exact_requests) == (7, 7)
    assert summary.prompt_fidelity_requests == 7 and result.fidelity.prompt.exact == 7
    assert result.setup.calibration["check_ok"] is True
    assert result.config.host.startswith("http://127.0.0.1:")  # the config as run
    assert result.client_health.peak_in_flight == 2
    assert summary.stream is True and summary.ttft_p50_ms is not None
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


def test_readme_python_section_runs(tmp_path, monkeypatch, capsys):
    readme = (EXAMPLE.parents[2] / "README.md").read_text()
    section = readme.split("### Python: construct, run, run_async, load\n", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "README.md", "exec"), {})
    assert capsys.readouterr().out.splitlines() == ["12 ok", "12 12 7"]
    assert sorted(os.listdir(tmp_path)) == ["r.config.toml", "r.json"]


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


# -- constructing: the shape options as keywords, misspelled keywords -----------------------
def test_shape_options_are_keywords_by_their_python_names():
    keywords = RunConfig(agents=20, tool_invocations=3, input_tokens=512)
    spelled = RunConfig(agents=20, shape_options=(("tool-invocations", 3), ("input-tokens", 512)))
    assert keywords == spelled and hash(keywords) == hash(spelled)
    assert keywords.shape_options == (("input-tokens", 512), ("tool-invocations", 3))
    assert keywords.options() == spelled.options()
    assert (keywords.options()["input-tokens"], keywords.options()["tool-invocations"]) == (512, 3)
    argv = ["--agents", "20", "--tool-invocations", "3", "--input-tokens", "512", "--sim"]
    parsed = RunConfig.from_args([*argv, "--no-progress"])  # the command line's config, too
    assert dataclasses.replace(keywords, sim=True) == parsed
    # every one of the 25, with its alias spellings, and None for "not given"
    every = RunConfig(input_lognorm_median=100.0, input_lognorm_sigma=0.5,
                      tool_call_latency_lognorm_median=20.0, initial_prompt_tokens=None,
                      model_response_tokens=32, tool_call_latency_ms=None)  # fmt: skip
    assert every.shape_options == (
        ("input-lognorm-median", 100.0),
        ("input-lognorm-sigma", 0.5),
        ("output-tokens", 32),
        ("tool-call-latency-lognorm-median-ms", 20.0),
    )
    # a keyword replaces the same option given in shape_options (and in dataclasses.replace)
    assert dataclasses.replace(keywords, input_tokens=7).shape_options == (
        ("input-tokens", 7),
        ("tool-invocations", 3),
    )
    shown = inspect.signature(RunConfig).parameters
    assert shown["tool_invocations"].default is None and shown["agents"].default is None
    assert (
        len([name for name in shown if name not in {f.name for f in dataclasses.fields(RunConfig)}])
        == 25
    )


def test_shape_keywords_run_the_same_workload():
    common = {"agents": 2, "dry_run": True, "tokenizer_model": "deepseek-v3", "seed": 5}
    keywords = run(RunConfig(tool_invocations=3, input_tokens=512, **common))
    spelled = run(
        RunConfig(shape_options=(("tool-invocations", 3), ("input-tokens", 512)), **common)
    )
    lines = list(dry_run_lines(keywords.workload, keywords.engine))
    assert lines == list(dry_run_lines(spelled.workload, spelled.engine))
    assert [line.split()[3] for line in lines] == [
        "input_content_tokens=512", "input_content_tokens=640", "input_content_tokens=768",
    ] * 2  # fmt: skip
    assert (
        keywords.summary.planned_tool_invocations == spelled.summary.planned_tool_invocations == 6
    )


def test_a_misspelled_keyword_or_shape_name_is_one_line_with_a_suggestion():
    for keywords, message in [
        ({"tool_invocatons": 3}, "'tool_invocatons' (did you mean tool_invocations?)"),
        ({"agnets": 20}, "'agnets' (did you mean agents?)"),
        ({"tokenizer": "x"}, "'tokenizer' (did you mean tokenizer_model?)"),
        ({"max-active-agents": 2}, "'max-active-agents' (did you mean max_active_agents?)"),
        ({"Input_Tokens": 5}, "'Input_Tokens' (did you mean input_tokens?)"),
        ({"colour": 1}, "'colour'"),
    ]:
        with pytest.raises(KeywordError) as caught:
            RunConfig(**keywords)
        assert str(caught.value) == f"RunConfig() got an unexpected keyword argument {message}"
        assert isinstance(caught.value, TypeError) and isinstance(caught.value, UsageError)
    for name, message in [
        ("tool_invocations", "unknown shape option 'tool_invocations' (did you mean tool-invocations?)"),
        ("input-tokenz", "unknown shape option 'input-tokenz' (did you mean input-tokens?)"),
        ("colour", "unknown shape option 'colour'"),
    ]:  # fmt: skip
        with pytest.raises(UsageError) as caught:
            RunConfig(shape_options=((name, 3),)).check()
        assert str(caught.value) == message


# -- running inside a notebook's loop -------------------------------------------------------
def test_run_inside_a_running_loop_says_to_await_run_async():
    config = replay(dry_run=True, tokenizer_model="deepseek-v3")

    async def notebook_cell() -> str:
        with pytest.raises(UsageError) as caught:
            run(config)
        return str(caught.value)

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        message = asyncio.run(notebook_cell())
        gc.collect()  # a coroutine never awaited warns when it is collected
    assert message == (
        "run() cannot start a run while an event loop is running in this thread (as in a "
        "Jupyter notebook): use `await run_async(config)` instead"
    )
    assert [str(w.message) for w in seen if issubclass(w.category, RuntimeWarning)] == []


# -- results as dicts, and read back ----------------------------------------------------------
def test_to_dict_is_the_results_json_and_load_reads_it_back(tmp_path):
    path = tmp_path / "r.json"
    result = run(replay(sim=True, calibrate=True, results_json=str(path)))
    on_disk = json.loads(path.read_text())
    assert result.to_dict() == on_disk
    assert json.loads(json.dumps(result.to_dict())) == on_disk  # plain JSON values
    document = batchbench.load(path)
    assert isinstance(document, batchbench.SummaryDocument)
    assert document.to_dict() == on_disk and list(document.to_dict()) == list(on_disk)
    assert document.metrics["successful_requests"] == 7 and document.dry_run is False
    assert (document.configuration.agents, document.configuration.seed) == (3, 7)
    assert document.manifest.path == str(EXAMPLE) and document.failures == ()
    assert document.live.fidelity["prompt"]["exact"] == 7
    assert document.window.requests == 7 and document.sections["kind"] == "run"
    dry = run(replay(dry_run=True, tokenizer_model="deepseek-v3"))
    assert dry.to_dict()["metrics"]["planned_tool_invocations"] == 7
    assert "window" not in dry.to_dict() and dry.written == ()


def test_load_reads_a_capacity_document(tmp_path):
    def step(agents, phase, extension, previous=None) -> StepRecord:
        verdict = "pass" if agents <= 4 else "fail"
        (tmp_path / step_file(agents)).write_bytes(orjson.dumps({"kind": "run"}))
        window = {"requests": 100, "slo": [], "slo_verdict": verdict}
        return StepRecord(agents=agents, phase=phase, verdict=verdict, extensions=extension,
                          window=window, results_json=step_file(agents), window_seconds=30.0)  # fmt: skip

    config = RunConfig(sim=True, stream=True, slo="ttft_p99=2s", seed=7)
    run_capacity(config, str(tmp_path), Bounds(1, 16, 1), step=step)
    path = tmp_path / CAPACITY_FILE
    document = batchbench.load(str(path))
    assert isinstance(document, batchbench.CapacityDocument)
    assert document.to_dict() == json.loads(path.read_text())
    assert [(s.agents, s.verdict) for s in document.steps] == [
        (1, "pass"), (2, "pass"), (4, "pass"), (8, "fail"), (6, "fail"), (5, "fail"),
    ]  # fmt: skip
    assert (document.answer.agents, document.answer.breaking_agents) == (4, 5)
    assert document.slo == ("ttft_p99=2s",) and document.search.max_agents == 16


def test_load_names_a_file_that_is_no_results_document(tmp_path):
    other = tmp_path / "other.json"
    other.write_text('{"hello": 1}')
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    for path, message in [
        (other, f'{other} is not a batchbench results or capacity document (no "kind"; '
                "expected a --results-json file or a capacity.json)"),
        (tmp_path / "missing.json", f"cannot read {tmp_path / 'missing.json'}: No such file or directory"),
        (broken, f"{broken} is not JSON: "),
    ]:  # fmt: skip
        with pytest.raises(BatchbenchError) as caught:
            batchbench.load(path)
        assert str(caught.value).startswith(message) and "\n" not in str(caught.value)


def test_import_batchbench_loads_the_api_on_first_use():
    code = (
        "import sys, batchbench\n"
        "print(sorted(m for m in sys.modules if m.startswith('batchbench')))\n"
        "import batchbench.documents\n"
        "print(batchbench.load is batchbench.documents.load)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == ["['batchbench']", "True"]
