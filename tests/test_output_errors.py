"""Unwritable outputs and a simulator that does not start: one-line errors, nothing left
running, nothing written twice."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from batchbench.cli.agent import run_console
from batchbench.drive.simlaunch import LISTENING, SimError, SimProcess
from batchbench.errors import BatchbenchError
from batchbench.results.events import JsonlFile

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "trajectory-replay" / "plans.jsonl"
DRY = ["--agent-plans-jsonl", str(EXAMPLE), "--tokenizer-model", "deepseek-v3", "--dry-run"]


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_full_disk_is_a_one_line_error(capsys):
    assert run_console([*DRY, "--agent-events-jsonl", "/dev/full"], "batchbench-agent") == 1
    err = capsys.readouterr().err
    assert err == "Error: failed to write /dev/full: No space left on device\n"


def test_a_directory_as_results_file_is_a_usage_error_before_the_run(tmp_path, capsys):
    assert run_console([*DRY, "--results-json", str(tmp_path)], "batchbench-agent") == 2
    captured = capsys.readouterr()
    assert captured.err == f"Error: --results-json {tmp_path} is a directory; give a file name\n"
    assert captured.out == ""  # refused before anything ran


def test_an_uncreatable_events_file_is_a_usage_error_before_the_run(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    target = blocker / "events.jsonl"  # a path under a regular file
    assert run_console([*DRY, "--agent-events-jsonl", str(target)], "batchbench-agent") == 2
    assert capsys.readouterr().err == (
        f"Error: --agent-events-jsonl {target}: the directory {blocker} does not exist\n"
    )


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_failed_flush_sends_nothing_twice_and_closes():
    sink = JsonlFile("/dev/full")
    with pytest.raises(BatchbenchError, match="No space left on device"):
        sink.write_now({"a": 1})
    sink.write_batched({"b": 2})  # still usable: the buffer is not pinned by the failure
    with pytest.raises(BatchbenchError):
        sink.close()
    assert sink._fd is None


def test_sim_flag_rejects_a_full_url_endpoint(capsys):
    args = ["--sim", "--endpoint", "http://10.0.0.1/v1/chat/completions", "--agents", "1"]
    assert run_console(args, "batchbench-agent") == 2
    assert "--sim cannot be combined with a full-URL --endpoint" in capsys.readouterr().err


def _fake_sim(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_a_simulator_that_never_gets_healthy_is_stopped():
    # Prints the listening line for a port nobody serves, then sleeps.
    code = f"import time; print({LISTENING!r} + 'http://127.0.0.1:9', flush=True); time.sleep(60)"
    sim = SimProcess(_fake_sim(code))
    started = time.monotonic()
    with pytest.raises(SimError, match="did not become healthy"):
        sim.start(timeout=0.5)
    assert time.monotonic() - started < 20
    assert sim._process is None  # stopped and forgotten


def test_a_simulator_that_prints_something_else_is_stopped_not_waited_for():
    sim = SimProcess(_fake_sim("import time; print('hello', flush=True); time.sleep(60)"))
    started = time.monotonic()
    with pytest.raises(SimError, match="the simulator did not start"):
        sim.start(timeout=0.5)
    assert time.monotonic() - started < 20
    assert sim._process is None
