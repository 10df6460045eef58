"""``batchbench validate``: every bad line reported, summaries of valid files, --json."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from batchbench.cli.main import COMMANDS, USAGE, run

ROLES_LISTED = "tool_definition, system, user, assistant, tool, tool_call"


def req(prompt: int = 100, output: int = 20, **extra: Any) -> dict[str, Any]:
    return {"prompt_tokens": prompt, "output_tokens": output, **extra}


def blk(seed: str, tokens: int, role: str, **extra: Any) -> dict[str, Any]:
    return {"seed": seed, "tokens": tokens, "role": role, **extra}


def traj(ident: str, *requests: dict[str, Any], version: int = 2, **extra: Any) -> dict[str, Any]:
    return {"schema_version": version, "trajectory_id": ident, "requests": list(requests), **extra}


def write(path: Path, *lines: dict[str, Any] | str) -> bytes:
    data = b"".join(
        (json.dumps(line) if isinstance(line, dict) else line).encode() + b"\n" for line in lines
    )
    path.write_bytes(data)
    return data


SHARED = [blk("tools", 600, "tool_definition"), blk("sys", 420, "system")]
GOOD = (
    traj("plain", req(100, 20), req(150, 10), version=1),
    traj(
        "agent-a",
        req(1100, 40, blocks=[*SHARED, blk("a-u1", 64, "user")]),
        req(
            1300,
            60,
            stream=True,
            max_tokens=1024,
            blocks=[
                *SHARED,
                blk("a-u1", 64, "user"),
                blk("a-r1", 40, "assistant", live=True),
                blk("a-c1", 20, "tool_call"),
                blk("a-t1", 90, "tool"),
                blk("a-u2", 30, "user"),
            ],
        ),
    ),
    traj("agent-b", req(1050, 10, blocks=[*SHARED, blk("b-u1", 0, "user")]), start_after_ms=750),
)
# 3 trajectories, 5 requests; prompts 100+150+1100+1300+1050, outputs 20+10+40+60+10;
# 13 blocks over 8 seeds, of which "tools" and "sys" are used by both block trajectories:
# 3 x 600 + 3 x 420 = 3060 of 1084 + 1264 + 1020 = 3368 block tokens.


def summary(path: Path, data: bytes) -> str:
    return (
        f"{path}: valid\n"
        "  trajectories: 3\n"
        "  requests: 5\n"
        "  schema versions: 1 (1 trajectory), 2 (2 trajectories)\n"
        "  prompt tokens: 3700\n"
        "  output tokens: 140\n"
        "  blocks: 13\n"
        "  distinct seeds: 8\n"
        "  seeds shared by more than one trajectory: 2\n"
        "  tokens in shared-seed blocks: 3060 of 3368 block tokens\n"
        "  live blocks: 1\n"
        "  trajectories with a start offset: 1 (the last starts at 750 ms)\n"
        f"  sha256: {hashlib.sha256(data).hexdigest()}\n"
    )


BAD = (
    traj("ok", req()),
    "",
    traj("bad-role", req(blocks=[blk("x", 1, "robot")])),
    traj("ok", req()),
    traj("bad-live", req(blocks=[blk("x", 1, "user", live=True)])),
    traj("v1", req(), req(130, 1, max_tokens=5), version=1),
    '{"schema_version": 3, "trajectory_id": "future", "requests": []}',
)


def bad_errors(path: Path) -> list[str]:
    at = f"invalid trajectory plan at {path}"
    return [
        f"{at}:3: request 1 blocks are invalid: block 1 role: unknown variant "
        f'"robot", expected one of {ROLES_LISTED}',
        f'{at}:4: duplicate trajectory_id "ok"',
        f"{at}:5: request 1 blocks are invalid: block 1 is live but has role user; "
        "only assistant blocks can be live",
        f"{at}:6: request 2 field max_tokens requires schema_version 2",
        f"{at}:7: unsupported schema_version 3; expected one of [1, 2]",
    ]


def test_a_valid_file_gets_its_summary(tmp_path, capsys):
    path = tmp_path / "good.jsonl"
    data = write(path, *GOOD)
    assert run(["validate", str(path)]) == 0
    out, err = capsys.readouterr()
    assert (out, err) == (summary(path, data), "")


def test_every_bad_line_is_reported_then_the_count(tmp_path, capsys):
    path = tmp_path / "bad.jsonl"
    write(path, *BAD)
    assert run(["validate", str(path)]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [
        *(f"Error: {message}" for message in bad_errors(path)),
        f"{path}: 5 errors",
    ]


def test_one_error_is_counted_in_the_singular(tmp_path, capsys):
    path = tmp_path / "empty.jsonl"
    path.write_bytes(b"\n\n")
    assert run(["validate", str(path)]) == 1
    assert capsys.readouterr().err == (
        f"Error: trajectory plan file {path} contains no trajectory plans\n{path}: 1 error\n"
    )


def test_a_missing_file_is_one_error_line(tmp_path, capsys):
    path = tmp_path / "missing.jsonl"
    assert run(["validate", str(path)]) == 1
    assert capsys.readouterr() == (
        "",
        f"Error: failed to open trajectory plan file {path}: No such file or directory\n",
    )


def test_several_files_are_all_checked(tmp_path, capsys):
    good, bad, missing = tmp_path / "good.jsonl", tmp_path / "bad.jsonl", tmp_path / "nope"
    data = write(good, *GOOD)
    write(bad, *BAD)
    assert run(["validate", str(bad), str(missing), str(good)]) == 1
    out, err = capsys.readouterr()
    assert out == summary(good, data)
    assert err.splitlines() == [
        *(f"Error: {message}" for message in bad_errors(bad)),
        f"{bad}: 5 errors",
        f"Error: failed to open trajectory plan file {missing}: No such file or directory",
    ]
    assert run(["validate", str(good), str(good)]) == 0
    assert capsys.readouterr().out == summary(good, data) * 2


def test_seed_redefinitions_are_warnings(tmp_path, capsys):
    path = tmp_path / "redefined.jsonl"
    data = write(
        path,
        traj(
            "t",
            req(blocks=[blk("s", 5, "user")]),
            req(blocks=[blk("s", 5, "user"), blk("r", 2, "assistant")]),
            req(blocks=[blk("s", 6, "user"), blk("r", 3, "assistant")]),
        ),
    )
    assert run(["validate", str(path)]) == 0
    out, err = capsys.readouterr()
    assert err == (
        'warning: trajectory "t" request 3: block seed "s" is redefined with different tokens '
        "or role; reusing its first content\n"
    )
    assert out.splitlines()[1:] == [
        "  trajectories: 1",
        "  requests: 3",
        "  schema versions: 2 (1 trajectory)",
        "  prompt tokens: 300",
        "  output tokens: 60",
        "  blocks: 5",
        "  distinct seeds: 2",
        "  seeds shared by more than one trajectory: 0",
        "  tokens in shared-seed blocks: 0 of 21 block tokens",
        "  live blocks: 0",
        "  trajectories with a start offset: 0",
        f"  sha256: {hashlib.sha256(data).hexdigest()}",
    ]


def test_json_output(tmp_path, capsys):
    good, bad, missing = tmp_path / "good.jsonl", tmp_path / "bad.jsonl", tmp_path / "nope"
    data = write(good, *GOOD)
    write(bad, *BAD)
    assert run(["validate", "--json", str(good), str(bad), str(missing)]) == 1
    out, err = capsys.readouterr()
    assert err == ""
    assert json.loads(out) == [
        {
            "path": str(good),
            "readable": True,
            "valid": True,
            "errors": [],
            "warnings": [],
            "trajectories": 3,
            "requests": 5,
            "schema_versions": {"1": 1, "2": 2},
            "prompt_tokens": 3700,
            "output_tokens": 140,
            "blocks": 13,
            "distinct_seeds": 8,
            "shared_seeds": 2,
            "shared_seed_block_tokens": 3060,
            "block_tokens": 3368,
            "live_blocks": 1,
            "trajectories_with_start_offset": 1,
            "last_start_after_ms": 750,
            "sha256": hashlib.sha256(data).hexdigest(),
        },
        {"path": str(bad), "readable": True, "valid": False, "errors": bad_errors(bad)},
        {
            "path": str(missing),
            "readable": False,
            "valid": False,
            "errors": [f"failed to open trajectory plan file {missing}: No such file or directory"],
        },
    ]


def test_json_output_of_a_v1_file(tmp_path, capsys):
    path = tmp_path / "v1.jsonl"
    write(path, traj("a", req(5, 1), version=1), traj("b", req(7, 2), version=1))
    assert run(["validate", str(path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)[0]
    assert {key: report[key] for key in report if key not in ("path", "sha256")} == {
        "readable": True,
        "valid": True,
        "errors": [],
        "warnings": [],
        "trajectories": 2,
        "requests": 2,
        "schema_versions": {"1": 2},
        "prompt_tokens": 12,
        "output_tokens": 3,
        "blocks": 0,
        "distinct_seeds": 0,
        "shared_seeds": 0,
        "shared_seed_block_tokens": 0,
        "block_tokens": 0,
        "live_blocks": 0,
        "trajectories_with_start_offset": 0,
        "last_start_after_ms": 0,
    }


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "Error: the following arguments are required: FILE\n"),
        (["--jsn", "x"], "Error: unrecognized arguments: --jsn (did you mean --json?)\n"),
    ],
)
def test_usage_errors_exit_2(argv, message, capsys):
    assert run(["validate", *argv]) == 2
    assert capsys.readouterr() == ("", message)


def test_help_explains_the_command(capsys):
    assert run(["validate", "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: batchbench validate [-h] [--json] FILE [FILE ...]\n")
    assert "reports every invalid line" in out
    assert "Exit status: 0 when every file is valid, 1 when any file is invalid" in out


def test_the_command_is_listed():
    assert "validate" in COMMANDS
    assert "\n  validate     check trajectory manifests" in USAGE


def test_as_a_process(tmp_path):
    bad = tmp_path / "bad.jsonl"
    write(bad, *BAD)
    env = {**os.environ, "PYTHONIOENCODING": "utf-8"}
    done = subprocess.run(
        [sys.executable, "-m", "batchbench", "validate", str(bad)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        *(f"Error: {message}" for message in bad_errors(bad)),
        f"{bad}: 5 errors",
    ]
