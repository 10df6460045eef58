"""Command-line parsing and the runtime-check order."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from batchbench.cli.agent import main, run_console
from batchbench.cli.agent_args import parse_agent_args, shape_dests
from batchbench.config import RunConfig, resolve_endpoint
from batchbench.errors import BatchbenchError, UsageError


def usage_error(argv) -> str:
    with pytest.raises(UsageError) as caught:
        parse_agent_args(argv)
    return str(caught.value)


def test_perfect_routing_needs_both_flags():
    assert usage_error(["--dp-rank-perfect-routing"]) == (
        "--dp-rank-perfect-routing requires --dp-rank-perfect-routing-num"
    )
    assert usage_error(["--dp-rank-perfect-routing-num", "4"]) == (
        "--dp-rank-perfect-routing-num requires --dp-rank-perfect-routing"
    )
    assert usage_error(["--dp-rank-perfect-routing", "--dp-rank-perfect-routing-num", "0"]) == (
        "argument --dp-rank-perfect-routing-num: value must be greater than zero"
    )


def test_replay_flags_parse():
    args = parse_agent_args(
        [
            "--agent-plans-jsonl",
            "plans.jsonl",
            "--max-active-agents",
            "128",
            "--replay-initial-overhead-tokens",
            "1113",
            "--replay-turn-overhead-tokens=104",
        ]
    )
    assert (args.agent_plans_jsonl, args.max_active_agents) == ("plans.jsonl", 128)
    assert (args.replay_initial_overhead_tokens, args.replay_turn_overhead_tokens) == (1113, 104)
    assert args.agents is None


@pytest.mark.parametrize(
    "flag",
    [
        "--input-tokens",
        "--initial-prompt-tokens",
        "--output-tokens",
        "--model-response-tokens",
        "--environment-tokens",
        "--environment-response-tokens",
        "--tool-invocations",
        "--input-lognorm-max",
        "--initial-prompt-lognorm-max",
        "--output-lognorm-max",
        "--model-response-lognorm-max",
        "--environment-lognorm-max",
        "--environment-response-lognorm-max",
        "--tool-invocations-lognorm-max",
        "--tool-call-latency-ms",
        "--tool-latency-ms",
        "--tool-call-latency-lognorm-max-ms",
        "--tool-call-latency-lognorm-max",
    ],
)
def test_shape_flags_detected_with_manifest(flag, tmp_path):
    plans = tmp_path / "plans.jsonl"
    plans.write_text(
        '{"schema_version":1,"trajectory_id":"a","requests":[{"prompt_tokens":5,"output_tokens":1}]}\n'
    )
    argv = ["--agent-plans-jsonl", str(plans), flag, "3", "--dry-run"]
    given = parse_agent_args(argv)
    assert any(getattr(given, dest) is not None for dest in shape_dests())
    with pytest.raises(UsageError) as caught:
        main(argv)
    assert (
        str(caught.value)
        == "synthetic workload-shape flags cannot be combined with --agent-plans-jsonl"
    )


def test_there_are_25_shape_flags():
    assert len(shape_dests()) == 25


def test_agents_with_manifest(tmp_path):
    with pytest.raises(UsageError, match="--agents cannot be combined"):
        main(["--agent-plans-jsonl", str(tmp_path / "x.jsonl"), "--agents", "2", "--dry-run"])


def test_max_active_zero_and_text():
    assert usage_error(["--max-active-agents", "0"]) == (
        "argument --max-active-agents: value must be greater than zero"
    )
    assert usage_error(["--max-active-agents", "two"]) == (
        'argument --max-active-agents: "two" is not a valid positive integer'
    )


def test_admission_and_time_scale(tmp_path):
    args = parse_agent_args(
        ["--agent-plans-jsonl", "p", "--admission", "open-loop", "--time-scale", "4"]
    )
    assert (args.admission, args.time_scale) == ("open-loop", 4.0)
    assert "--agent-plans-jsonl" in usage_error(["--admission", "open-loop"])
    assert "positive finite number" in usage_error(
        ["--agent-plans-jsonl", "p", "--time-scale", "0"]
    )
    for bad in ("nan", "inf", "-1"):
        assert "positive finite number" in usage_error(
            ["--agent-plans-jsonl", "p", "--time-scale", bad]
        )
    assert usage_error(["--agent-plans-jsonl", "p", "--time-scale", "fast"]) == (
        'argument --time-scale: "fast" is not a valid number'
    )
    assert "invalid value" in usage_error(["--agent-plans-jsonl", "p", "--admission", "sometimes"])
    manifest = tmp_path / "p.jsonl"
    manifest.write_text("")
    host = ["--host", "http://127.0.0.1:8000"]
    assert RunConfig.from_args(["--agent-plans-jsonl", str(manifest), *host]).admission_mode == (
        "closed-loop"
    )

    assert parse_agent_args(["--agent-plans-jsonl", "p"]).admission is None


def test_admission_default_displays_as_closed_loop(capsys):
    assert main(["--help"]) == 0
    assert "default: closed-loop" in capsys.readouterr().out


@pytest.mark.parametrize(
    "flag", ["--replay-initial-overhead-tokens", "--replay-turn-overhead-tokens"]
)
def test_overheads_need_manifest(flag):
    assert usage_error([flag, "3"]) == f"{flag} requires --agent-plans-jsonl"


def test_runtime_check_order(tmp_path):
    missing = tmp_path / "missing.jsonl"
    with pytest.raises(UsageError, match=r"^--agents cannot be combined"):
        main(["--agent-plans-jsonl", str(missing), "--agents", "0", "--dry-run"])
    with pytest.raises(BatchbenchError, match=f"^failed to open {missing} for hashing"):
        main(["--agent-plans-jsonl", str(missing), "--request-timeout-secs", "0", "--dry-run"])
    with pytest.raises(UsageError, match=r"^agents must be greater than zero$"):
        main(["--agents", "0", "--request-timeout-secs", "0", "--dry-run"])
    with pytest.raises(UsageError, match=r"^request-timeout-secs must be greater than zero$"):
        main(["--request-timeout-secs", "0", "--input-tokens", "0", "--dry-run"])
    with pytest.raises(UsageError, match=r"^invalid fixed input value"):
        main(["--input-tokens", "0", "--model", "", "--dry-run"])
    with pytest.raises(UsageError, match=r"^model must not be empty$"):
        main(["--model", "", "--dry-run"])


def test_no_abbreviations():
    assert "unrecognized arguments: --agent" in usage_error(["--agent", "3"])
    assert "unrecognized arguments" in usage_error(["--dry"])


def test_equals_form_and_short_verbose():
    args = parse_agent_args(["--agents=3", "-v", "--seed=18446744073709551615"])
    assert (args.agents, args.verbose, args.seed) == (3, True, 2**64 - 1)
    assert "does not fit in 64 bits" in usage_error(["--seed", str(2**64)])
    assert "not a valid non-negative integer" in usage_error(["--agents", "-1"])


def test_console_exit_statuses(capsys, tmp_path):
    assert run_console(["--max-active-agents", "0"], "batchbench-agent") == 2
    err = capsys.readouterr().err
    assert err == "Error: argument --max-active-agents: value must be greater than zero\n"
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"schema_version":1,"trajectory_id":"a","requests":[]}\n')
    dry = ["--dry-run", "--tokenizer-model", "deepseek-v3"]
    assert run_console(["--agent-plans-jsonl", str(bad), *dry], "batchbench-agent") == 1
    assert capsys.readouterr().err == (
        f"Error: invalid trajectory plan at {bad}:1: requests must contain at least one request\n"
    )


@pytest.mark.parametrize(
    ("host", "endpoint", "url"),
    [
        (
            "https://api.openai.com",
            "/v1/chat/completions",
            "https://api.openai.com/v1/chat/completions",
        ),
        ("localhost:8000/", "v1/chat/completions", "https://localhost:8000/v1/chat/completions"),
        ("http://127.0.0.1:8000//", "//v1/x", "http://127.0.0.1:8000/v1/x"),
        ("ignored", "http://10.0.0.1:9/v1/chat", "http://10.0.0.1:9/v1/chat"),
    ],
)
def test_endpoint_resolution(host, endpoint, url):
    assert resolve_endpoint(host, endpoint) == url


def test_invalid_endpoint():
    with pytest.raises(UsageError, match=r"^invalid endpoint URL: http://host:port/x$"):
        resolve_endpoint("http://host:port", "/x")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--sim-dp-ranks", "2"], "--sim-dp-ranks requires --sim"),
        (["--sim-args", "--speed 0"], "--sim-args requires --sim"),
        (["--sim", "--dry-run"], "--sim cannot be combined with --dry-run"),
        (["--grace-seconds", "-1"], "value must be a non-negative finite number"),
        (["--sim-dp-ranks", "0", "--sim"], "value must be greater than zero"),
    ],
)
def test_live_run_flag_rules(args, message, capsys):
    assert run_console(args, "batchbench-agent") == 2
    err = capsys.readouterr().err
    assert err.startswith("Error: ") and message in err


def test_help_lists_the_live_run_flags(capsys):
    assert run_console(["--help"], "batchbench-agent") == 0
    out = capsys.readouterr().out
    for flag in (
        "--stream",
        "--request-events-jsonl",
        "--results-json",
        "--grace-seconds",
        "--no-progress",
        "--sim",
        "--sim-dp-ranks",
        "--sim-args",
    ):
        assert flag in out


LATE_SIGNALS = """
import os, signal, sys
from batchbench.cli.agent import hold_late_signals
from batchbench.drive.shutdown import note_signal_stop

hold_late_signals()
if sys.argv[1] == "after a stop":
    note_signal_stop()
for name in sys.argv[2:]:
    os.kill(os.getpid(), getattr(signal, name))
print("summary printed", flush=True)
"""


@pytest.mark.parametrize(
    ("when", "signals", "status"),
    [
        ("after a stop", ["SIGINT", "SIGINT", "SIGTERM"], 0),
        ("before any stop", ["SIGINT"], -signal.SIGINT),
        ("before any stop", ["SIGTERM"], -signal.SIGTERM),
    ],
)
def test_a_late_signal_of_a_stopped_run_does_not_kill_the_console(tmp_path, when, signals, status):
    """A double Ctrl+C as a stopped run ends reaches the console after the run gave its
    handlers back: it is part of that stop (the summary still prints); before any stop,
    SIGINT interrupts and SIGTERM ends the process as they always did."""
    done = subprocess.run(
        [sys.executable, "-c", LATE_SIGNALS, when, *signals],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == status, done.stderr
    assert ("summary printed" in done.stdout) == (status == 0)


SIGNAL_AT_SHUTDOWN = """
import os, signal, sys
from batchbench.cli.agent import exit_process, hold_late_signals
from batchbench.drive.shutdown import note_signal_stop


class SignalsAtShutdown:
    # Collected while the interpreter clears its modules, after it gave every signal its
    # default action back: the last instant a terminal's second Ctrl+C can land in.
    def __del__(self):
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGTERM)


shutdown_witness = SignalsAtShutdown()
hold_late_signals()
if sys.argv[1] == "after a stop":
    note_signal_stop()
if sys.argv[2] == "exit_process":
    exit_process(130)
sys.exit(130)
"""


@pytest.mark.parametrize(
    ("when", "ending", "status"),
    [
        ("after a stop", "exit_process", 130),
        ("after a stop", "sys.exit", -signal.SIGINT),  # the window exit_process closes
        ("before any stop", "exit_process", -signal.SIGINT),
    ],
)
def test_a_signal_while_the_interpreter_shuts_down_keeps_the_exit_status(when, ending, status):
    """The interpreter restores default signal actions before it clears its modules; a
    stopped run's process blocks SIGINT/SIGTERM as it exits, so the status stays 130."""
    done = subprocess.run(
        [sys.executable, "-c", SIGNAL_AT_SHUTDOWN, when, ending],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == status, done.stderr
