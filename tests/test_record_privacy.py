"""Nothing private reaches a recording: a conversation full of distinctive strings goes
through ``batchbench record`` to the simulator, then every file the recording wrote (and
the proxy's own output) is searched for them in every spelling a careless store might
use."""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
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

BEARER = "sk-live-PRIVATEKEY-9d8e7f6a5b4c"
SECRETS = [
    "Zephyr-Orchid-4471 launch codes",  # system prompt
    "quarterly revenue of Nebulon Dynamics",  # user message
    "frobnicate_quasar",  # tool name
    "Reads the Tarkovsky ledger",  # tool description
    "/srv/vault/clientlist-ACME-8812.csv",  # tool call arguments
    "ledger row 77: Mx. Quillon owes 4410",  # tool result
    "Marigold answer for the board",  # assistant content sent back
    BEARER,
    "customer-SECRET-Halcyon",  # another header's value
    "session-cookie-Peregrine",  # a cookie
]
WORDS = [
    "Zephyr", "Nebulon", "frobnicate", "Tarkovsky", "clientlist", "Quillon", "Marigold",
    "PRIVATEKEY", "Halcyon", "Peregrine",
]  # fmt: skip
HEADERS = {
    "Content-Type": "application/json",
    "Authorization": f"Bearer {BEARER}",
    "X-Customer": SECRETS[8],
    "Cookie": f"sid={SECRETS[9]}",
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": SECRETS[2],
            "description": SECRETS[3],
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
]
FIRST = [
    {"role": "system", "content": SECRETS[0]},
    {"role": "user", "content": [{"type": "text", "text": SECRETS[1]}]},
]
SECOND = [
    *FIRST,
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_Zephyr",
                "type": "function",
                "function": {
                    "name": SECRETS[2],
                    "arguments": orjson.dumps({"path": SECRETS[4]}).decode(),
                },
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_Zephyr", "content": SECRETS[5]},
]
THIRD = [
    *SECOND,
    {"role": "assistant", "content": SECRETS[6]},
    {"role": "user", "content": "go on"},
]


def spellings(secret: str) -> list[bytes]:
    raw = secret.encode()
    return [
        raw,
        secret.lower().encode(),
        orjson.dumps(secret)[1:-1],
        raw.hex().encode(),
        base64.b64encode(raw),
    ]


def send(url: str, path: str, body: dict | None) -> bytes:
    data = None if body is None else orjson.dumps(body)
    request = urllib.request.Request(url + path, data=data, headers=HEADERS)
    with urllib.request.urlopen(request, timeout=30) as response:
        return response.read()


def test_no_text_key_or_header_value_reaches_the_recording(tmp_path):
    folder = tmp_path / "recording"
    folder.mkdir()
    rows = folder / "rows.jsonl"
    environment = dict(os.environ)
    environment["PYTHONPATH"] = os.pathsep.join(
        p for p in (PACKAGE_ROOT, environment.get("PYTHONPATH")) if p
    )
    with SimProcess(sim_command("deepseek-v3", None, "--speed 0")) as sim:
        proxy = subprocess.Popen(
            [sys.executable, "-c", RUN, "record", "--upstream", sim.url, "--listen",
             "127.0.0.1:0", "--rows-jsonl", str(rows)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=environment, cwd=PACKAGE_ROOT,
        )  # fmt: skip
        assert proxy.stdout is not None
        listening = proxy.stdout.readline()
        url = listening.decode().rsplit(" ", 1)[1].strip()
        send(url, "/v1/chat/completions", {"model": "m", "tools": TOOLS, "messages": FIRST})
        streamed = send(
            url, "/v1/chat/completions",
            {"model": "m", "tools": TOOLS, "messages": SECOND, "stream": True},
        )  # fmt: skip
        assert streamed.endswith(b"data: [DONE]\n\n")
        send(
            url, "/v1/chat/completions",
            {"model": "m", "tools": TOOLS, "messages": THIRD, "stream": True,
             "stream_options": {"include_usage": True}},
        )  # fmt: skip
        send(url, "/v1/models", None)
        proxy.send_signal(signal.SIGTERM)
        out, err = proxy.communicate(timeout=30)
    assert proxy.returncode == 0
    assert sorted(p.name for p in folder.iterdir()) == ["rows.jsonl", "rows.jsonl.key"]
    recorded = [orjson.loads(line) for line in rows.read_bytes().splitlines()]
    assert [r["block_roles"] for r in recorded] == [
        ["tool_definition", "system", "user"],
        ["tool_definition", "system", "user", "tool_call", "tool"],
        ["tool_definition", "system", "user", "tool_call", "tool", "assistant", "user"],
    ]
    assert all(r["completion_tokens"] for r in recorded)
    assert recorded[1]["chain"][:3] == recorded[0]["chain"]
    outputs = {
        "rows": rows.read_bytes(),
        "key": (folder / "rows.jsonl.key").read_bytes(),
        "stdout": listening + out,
        "stderr": err,
    }
    found = [
        (name, needle)
        for name, content in outputs.items()
        for secret in SECRETS
        for needle in spellings(secret)
        if needle in content
    ]
    found += [
        (name, word.encode())
        for name, content in outputs.items()
        for word in WORDS
        if word.lower().encode() in content.lower()
    ]
    assert found == []
