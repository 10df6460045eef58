"""``batchbench record`` as a subprocess: --help, one-line errors, the listening line, a
recording against the simulator stopped by SIGTERM and resumed with the same key."""

from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import orjson
import pytest

import batchbench
from batchbench.drive.simlaunch import SimProcess, sim_command

# No compiled module serves this code, and the simulator's are covered elsewhere: the
# pure-twin pass would repeat it as is.
pytestmark = pytest.mark.native_pass_only

RUN = "import sys; from batchbench.cli.main import run; sys.exit(run(sys.argv[1:]))"
PACKAGE_ROOT = str(Path(batchbench.__file__).resolve().parent.parent)
LISTENING = "batchbench record listening on http://127.0.0.1:"


def env() -> dict[str, str]:
    out = dict(os.environ)
    out["PYTHONPATH"] = os.pathsep.join(p for p in (PACKAGE_ROOT, out.get("PYTHONPATH")) if p)
    return out


def command(*args: str) -> list[str]:
    return [sys.executable, "-c", RUN, "record", *args]


def record(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        command(*args), capture_output=True, text=True, env=env(), cwd=PACKAGE_ROOT,
        timeout=60, check=False,
    )  # fmt: skip


def test_help_says_what_is_stored_and_what_is_not():
    done = record("--help")
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.startswith(
        "usage: batchbench record [-h] --upstream URL [--listen HOST:PORT]"
    )
    text = " ".join(done.stdout.split())
    assert (
        "Stored: per block (the tools array; each message or content part; each tool call) its role, its token count"
        in text
    )
    assert (
        "Not stored: any text (messages, tool definitions, tool arguments), API keys, other header values."
        in text
    )
    assert 'prints one line, "batchbench record listening on http://HOST:PORT"' in text


def test_the_command_is_listed():
    done = subprocess.run(
        [sys.executable, "-c", RUN, "--help"], capture_output=True, text=True, env=env(),
        cwd=PACKAGE_ROOT, timeout=60, check=False,
    )  # fmt: skip
    assert (
        "  record       a proxy that records your agents' requests as content-free rows for\n"
        in done.stdout
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--upstream", "ftp://host", "--rows-jsonl", "r"],
            "argument --upstream: must be an http:// or https:// URL with a host (e.g. http://127.0.0.1:8000)",
        ),
        (
            ["--upstream", "http://user:pw-SECRET@host:99999", "--rows-jsonl", "r"],
            "argument --upstream: not a URL (Port out of range 0-65535)",
        ),
        (
            ["--upstream", "https://user:pw-SECRET@host", "--rows-jsonl", "r"],
            "argument --upstream: must not hold credentials: the clients' own Authorization headers are forwarded",
        ),
        (
            ["--upstream", "http://host/v1?x=1", "--rows-jsonl", "r"],
            "argument --upstream: must not have a query or a fragment",
        ),
        (
            ["--upstream", "http://h", "--rows-jsonl", "r", "--listen", "8100"],
            "argument --listen: '8100' must be HOST:PORT with a port from 0 to 65535 (e.g. 127.0.0.1:8100)",
        ),
        (
            ["--upstream", "http://h", "--rows-jsonl", "r", "--listen", "127.0.0.1:70000"],
            "argument --listen: '127.0.0.1:70000' must be HOST:PORT with a port from 0 to 65535 (e.g. 127.0.0.1:8100)",
        ),
        (
            ["--upstream", "http://h", "--rows-jsonl", "r", "--hash-key", "xyz"],
            "argument --hash-key: must be hexadecimal (e.g. 64 hex digits)",
        ),
        (
            ["--upstream", "http://h", "--rows-jsonl", "r", "--hash-key", "00ff"],
            "argument --hash-key: must hold at least 16 bytes (32 hex digits), found 2",
        ),
        (["--upstream", "http://h"], "the following arguments are required: --rows-jsonl"),
    ],
)
def test_bad_flags_are_one_line_errors(args, message):
    done = record(*args)
    assert (done.returncode, done.stdout, done.stderr) == (2, "", f"Error: {message}\n")


def free_port_held() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock


def test_cannot_start_is_one_line_error(tmp_path):
    missing = tmp_path / "no-such-dir" / "rows.jsonl"
    done = record("--upstream", "http://127.0.0.1:9", "--rows-jsonl", str(missing))
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == f"Error: cannot open {missing}: No such file or directory\n"
    rows = tmp_path / "rows.jsonl"
    with free_port_held() as held:
        port = held.getsockname()[1]
        done = record(
            "--upstream", "http://127.0.0.1:9", "--rows-jsonl", str(rows), "--listen",
            f"127.0.0.1:{port}",
        )  # fmt: skip
    assert done.returncode == 1
    assert done.stderr == f"Error: cannot listen on 127.0.0.1:{port}: Address already in use\n"
    assert done.stdout == ""
    done = record("--upstream", "http://h", "--rows-jsonl", str(rows), "--tokenizer-model", "nope")
    assert done.returncode == 1
    assert done.stderr.startswith("Error: tokenizer 'nope' is not a tokenizer.json file")
    assert done.stderr.count("\n") == 1


class Proxy:
    """``batchbench record`` running: its URL from the listening line."""

    def __init__(self, *args: str) -> None:
        self.process = subprocess.Popen(
            command(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=env(), cwd=PACKAGE_ROOT,
        )  # fmt: skip
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        assert line.startswith(LISTENING), (line, self.process.stderr.read())  # type: ignore[union-attr]
        self.url = line.removeprefix("batchbench record listening on ").strip()

    def stop(self) -> tuple[int, str, str]:
        self.process.send_signal(signal.SIGTERM)
        out, err = self.process.communicate(timeout=30)
        return self.process.returncode, out, err


def chat(url: str, body: dict) -> dict:
    request = urllib.request.Request(
        url + "/v1/chat/completions", data=orjson.dumps(body),
        headers={"Content-Type": "application/json", "Authorization": "Bearer sk-test"},
    )  # fmt: skip
    with urllib.request.urlopen(request, timeout=30) as response:
        return orjson.loads(response.read())


BODY = {"model": "m", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 3}


def test_records_against_the_simulator_then_resumes_with_the_same_key(tmp_path):
    rows = tmp_path / "rows.jsonl"
    with SimProcess(sim_command("deepseek-v3", None, "--speed 0")) as sim:
        first = Proxy("--upstream", sim.url, "--listen", "127.0.0.1:0", "--rows-jsonl", str(rows))
        reply = chat(first.url, BODY)
        assert reply["usage"]["prompt_tokens"] == 11  # ChatML around "hello there"
        assert first.stop() == (0, f"recorded 1 requests to {rows}\n", "")
        key = tmp_path / "rows.jsonl.key"
        assert stat.S_IMODE(os.stat(key).st_mode) == 0o600
        key_text = key.read_text()
        second = Proxy("--upstream", sim.url, "--listen", "127.0.0.1:0", "--rows-jsonl", str(rows))
        chat(second.url, BODY)
        assert second.stop() == (0, f"recorded 1 requests to {rows}\n", "")
        assert key.read_text() == key_text
        other = tmp_path / "other.jsonl"
        third = Proxy(
            "--upstream", sim.url, "--listen", "127.0.0.1:0", "--rows-jsonl", str(other),
            "--hash-key", "ab" * 32,
        )  # fmt: skip
        chat(third.url, BODY)
        assert third.stop()[0] == 0
    one, two = (orjson.loads(line) for line in rows.read_bytes().splitlines())
    assert [one["correlation_id"], two["correlation_id"]] == ["000000000000", "000000000001"]
    assert one["chain"] == two["chain"] and one["principal_id"] == two["principal_id"]
    assert (one["block_roles"], one["block_tokens"]) == (["user"], [2])
    assert (one["prompt_tokens"], one["completion_tokens"], one["max_tokens"]) == (11, 3, 3)
    [given] = (orjson.loads(line) for line in other.read_bytes().splitlines())
    assert given["chain"] != one["chain"] and given["principal_id"] != one["principal_id"]
    assert not (tmp_path / "other.jsonl.key").exists()


def test_a_stop_lets_the_request_in_flight_finish_and_record(tmp_path):
    rows = tmp_path / "rows.jsonl"
    slow = "--speed 1 --decode-step-ms 100 --decode-step-ms-per-seq 0 --decode-step-ms-per-ktoken 0"
    with SimProcess(sim_command("deepseek-v3", None, slow)) as sim:
        proxy = Proxy("--upstream", sim.url, "--listen", "127.0.0.1:0", "--rows-jsonl", str(rows))
        replies: list[dict] = []
        body = {**BODY, "max_tokens": 8, "ignore_eos": True}
        client = threading.Thread(target=lambda: replies.append(chat(proxy.url, body)))
        started = time.monotonic()
        client.start()
        time.sleep(0.3)
        assert proxy.stop() == (0, f"recorded 1 requests to {rows}\n", "")
        client.join(10)
    assert time.monotonic() - started >= 0.7  # the reply took its eight decode steps
    assert replies[0]["usage"]["completion_tokens"] == 8
    [row] = (orjson.loads(line) for line in rows.read_bytes().splitlines())
    assert (row["prompt_tokens"], row["completion_tokens"]) == (11, 8)
    assert row["duration_ms"] >= 700
