"""``batchbench sim`` as a subprocess: argument errors, --show-overheads, serve and stop."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

import batchbench
from batchbench.cli.sim import run as run_sim

# Works whether batchbench is installed (CI) or imported from the checkout (PYTHONPATH):
# the child runs in the directory holding the package this process imported, with it on
# PYTHONPATH, so both import the same batchbench ("-c" puts the cwd first on sys.path).
RUN = "import sys; from batchbench.cli.main import run; sys.exit(run(sys.argv[1:]))"
PACKAGE_ROOT = str(Path(batchbench.__file__).resolve().parent.parent)


def env() -> dict[str, str]:
    out = dict(os.environ)
    out["PYTHONPATH"] = os.pathsep.join(p for p in (PACKAGE_ROOT, out.get("PYTHONPATH")) if p)
    return out


def command(*args: str) -> list[str]:
    return [sys.executable, "-c", RUN, "sim", *args]


def sim(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        command(*args),
        capture_output=True,
        text=True,
        env=env(),
        cwd=PACKAGE_ROOT,
        timeout=timeout,
        check=False,
    )


def test_help_mentions_speed():
    done = sim("--help")
    assert done.returncode == 0
    assert done.stdout.startswith("usage: batchbench sim ")
    assert "--speed SPEED" in done.stdout
    assert "--fault-missing-usage-rate" in done.stdout
    assert done.stderr == ""


ARGPARSE_ERRORS = [
    (
        ("--fault-error-rate", "2"),
        "argument --fault-error-rate: a rate must be between 0 and 1, got 2",
    ),
    (("--dp-ranks", "0"), "argument --dp-ranks: must be at least 1, got 0"),
    (
        ("--fault-error-statuses", "200"),
        "argument --fault-error-statuses: status codes must be 400..599, got '200'",
    ),
]
MORE_ARGPARSE_ERRORS = [
    (("--speed", "nan"), "argument --speed: must be a finite number >= 0, got nan"),
    (("--prefill-tokens-per-s", "0"), "argument --prefill-tokens-per-s: must be greater than zero"),
    (("--block-size", "x"), "argument --block-size: not an integer: 'x'"),
    (
        ("--fault-error-statuses", "500,x"),
        "argument --fault-error-statuses: expected comma-separated status codes: '500,x'",
    ),
    (("--chat-template", "vicuna"), "argument --chat-template: invalid choice: 'vicuna'"),
]


@pytest.mark.parametrize(("args", "message"), ARGPARSE_ERRORS)
def test_bad_values_are_argparse_errors(args, message):
    done = sim(*args)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.startswith("usage: batchbench sim ")
    assert done.stderr.endswith(f"batchbench sim: error: {message}\n")


@pytest.mark.parametrize(("args", "message"), ARGPARSE_ERRORS + MORE_ARGPARSE_ERRORS)
def test_bad_values_in_process(args, message, capsys):
    with pytest.raises(SystemExit) as caught:
        run_sim(list(args))
    assert caught.value.code == 2
    assert f"batchbench sim: error: {message}" in capsys.readouterr().err


def test_fault_rates_over_one_exit_1():
    done = sim("--fault-error-rate", "0.6", "--fault-drop-rate", "0.5")
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr == "Error: fault rates add up to 1.1; their sum must be at most 1\n"


def test_show_overheads_prints_three_lines():
    done = sim("--show-overheads")
    assert done.returncode == 0, done.stderr
    assert done.stdout == (
        "replay initial overhead: 9 tokens\n"
        "replay turn overhead: 35 tokens\n"
        "flags: --replay-initial-overhead-tokens 9 --replay-turn-overhead-tokens 35\n"
    )


@pytest.mark.parametrize(
    ("template", "initial", "turn"), [("chatml", 9, 35), ("gemma", 9, 10), ("llama3", 11, 61)]
)
def test_show_overheads_of_each_builtin(template, initial, turn, capsys):
    """deepseek-v3 (the default tokenizer). Checked by hand against the rendered text:
    chatml's turn is the tool-call JSON without the id and the markers and role lines;
    gemma renders no tool call; llama3 adds 61, the call id (11 tokens) twice among them."""
    assert run_sim(["--show-overheads", "--chat-template", template]) == 0
    assert capsys.readouterr().out == (
        f"replay initial overhead: {initial} tokens\n"
        f"replay turn overhead: {turn} tokens\n"
        f"flags: --replay-initial-overhead-tokens {initial} --replay-turn-overhead-tokens {turn}\n"
    )


def test_serves_until_sigterm():
    process = subprocess.Popen(
        command("--port", "0", "--dp-ranks", "2", "--model-name", "cli-model"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env(),
        cwd=PACKAGE_ROOT,
    )
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(
        target=lambda: [lines.put(line) for line in process.stdout], daemon=True
    ).start()
    try:
        first = lines.get(timeout=60)
        match = re.fullmatch(r"batchbench sim listening on http://127\.0\.0\.1:(\d+)\n", first)
        assert match, first
        base = f"http://127.0.0.1:{match.group(1)}"
        with urllib.request.urlopen(f"{base}/health", timeout=10) as response:
            assert response.status == 200
            assert json.loads(response.read()) == {"status": "ok"}
        with urllib.request.urlopen(f"{base}/v1/models", timeout=10) as response:
            assert json.loads(response.read())["data"][0]["id"] == "cli-model"
        request = urllib.request.Request(
            f"{base}/v1/chat/completions",
            data=json.dumps(
                {
                    "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 3,
                    "ignore_eos": True,
                }
            ).encode(),
            headers={"Content-Type": "application/json", "x-smg-target-worker": "1"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            usage = json.loads(response.read())["usage"]
        assert usage["prompt_tokens"] == 10 and usage["completion_tokens"] == 3
        with urllib.request.urlopen(f"{base}/metrics", timeout=10) as response:
            text = response.read().decode()
        assert 'batchbench_sim_requests_total{rank="1"} 1\n' in text
        assert 'batchbench_sim_requests_total{rank="0"} 0\n' in text
        started = time.monotonic()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=5) == 0
        assert time.monotonic() - started < 5
        assert process.stderr.read() == ""
        assert lines.empty()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
