"""``batchbench export-plans`` (COMPAT §7): one test per check C71–C86 of §8.12, on
hand-written request-log rows, plus the CLI's errors and entry points."""

from __future__ import annotations

import copy
import hashlib
import os
import re
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest

from batchbench.cli.export_plans import console_main, run
from batchbench.cli.main import run as run_main
from batchbench.ingest.sampling import length_bucket, sample
from batchbench.ingest.window import parse_timestamp
from batchbench.ingest.write import encode, validate_lines
from batchbench.plan.manifest import load_manifest

# Pure Python that no compiled module serves: the pure-twin pass would repeat it as is.
pytestmark = pytest.mark.native_pass_only

ROOT = Path(__file__).resolve().parents[1]
T0 = datetime(2026, 1, 1, tzinfo=UTC)
START = "2026-01-01T00:00:00Z"
END = "2026-01-01T01:00:00Z"
STATS = re.compile(r"\((rows=.*)\)$")


def row(
    seconds: float,
    correlation: str,
    chain: list[str],
    *,
    principal: str = "p1",
    roles: list[str] | None = None,
    tokens: list[int] | None = None,
    prompt: int | None = None,
    completion: int | None = 3,
    **extra: Any,
) -> dict[str, Any]:
    """A §7.2 row ``seconds`` after the window start; prompt defaults to Σ tokens + 5."""
    tokens = tokens if tokens is not None else []
    return {
        "ts": (T0 + timedelta(seconds=seconds)).isoformat().replace("+00:00", "Z"),
        "principal_id": principal,
        "correlation_id": correlation,
        "model": extra.pop("model", "m1"),
        "chain": chain,
        "block_roles": roles if roles is not None else ["user"] * len(tokens),
        "block_tokens": tokens,
        "prompt_tokens": prompt if prompt is not None else sum(tokens) + 5,
        "completion_tokens": completion,
        **extra,
    }


class Export:
    """One in-process run: its status, stderr, the plans written and the stats."""

    def __init__(self, tmp_path: Path, rows: list[dict[str, Any]], *args: str, **kw: Any) -> None:
        self.rows_path = tmp_path / "rows.jsonl"
        self.rows_path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
        self.output = tmp_path / "plans.jsonl"
        self.output.unlink(missing_ok=True)  # left by an earlier export of the same test
        argv = [
            "--rows-jsonl",
            str(self.rows_path),
            "--start",
            kw.get("start", START),
            "--end",
            kw.get("end", END),
            "--output",
            str(self.output),
            *args,
        ]
        capsys = kw["capsys"]
        self.status = run(argv)
        captured = capsys.readouterr()
        self.out, self.err = captured.out, captured.err
        self.plans = (
            [orjson.loads(line) for line in self.output.read_bytes().splitlines()]
            if self.output.exists()
            else []
        )
        found = STATS.search(self.err.strip().splitlines()[0]) if self.err.strip() else None
        self.stats = dict(item.split("=") for item in found.group(1).split(", ")) if found else {}

    def ids(self) -> list[str]:
        return [plan["trajectory_id"] for plan in self.plans]


def export(tmp_path: Path, capsys: Any, rows: list[dict[str, Any]], *args: str, **kw: Any):
    result = Export(tmp_path, rows, *args, capsys=capsys, **kw)
    assert result.status == 0, result.err
    return result


def test_c71_strict_prefix_linking_within_a_principal(tmp_path, capsys):
    rows = [
        row(0, "c0", ["u1"], tokens=[10]),
        row(10, "c1", ["u1", "a1", "t1"], roles=["user", "assistant", "tool"], tokens=[10, 2, 3]),
        row(
            20,
            "c2",
            ["u1", "a1", "t1", "a2", "t2"],
            roles=["user", "assistant", "tool", "assistant", "tool"],
            tokens=[10, 2, 3, 2, 3],
        ),
        row(30, "c3", ["u1"], tokens=[10]),  # an identical chain is not a child
        row(40, "c4", ["u2"], tokens=[10], principal="p2"),
    ]
    result = export(tmp_path, capsys, rows)
    assert [len(plan["requests"]) for plan in result.plans] == [3, 1, 1]
    assert result.ids() == ["u1-0", "u1-1", "u2-0"]
    assert [plan["start_after_ms"] for plan in result.plans] == [0, 30_000, 40_000]
    assert result.stats["trajectories"] == "3"
    crossing = [row(0, "a", ["u1"], tokens=[10]), row(5, "b", ["u1", "x"], tokens=[10, 1])]
    crossing[1]["principal_id"] = "p9"
    result = export(tmp_path, capsys, crossing)
    assert result.ids() == ["u1-0", "x-0"]


def test_c72_latest_parent_wins_and_the_link_window(tmp_path, capsys):
    rows = [
        row(0, "a", ["r"], tokens=[10]),
        row(5, "b", ["r"], tokens=[10]),
        row(10, "c", ["r", "x"], tokens=[10, 4]),
    ]
    result = export(tmp_path, capsys, rows)
    assert result.ids() == ["r-0", "r-1"]
    assert [len(plan["requests"]) for plan in result.plans] == [1, 2]
    assert result.plans[1]["start_after_ms"] == 5_000
    gap = [row(0, "g", ["g"], tokens=[10]), row(30 * 3600, "h", ["g", "h"], tokens=[10, 4])]
    end = "2026-01-03T00:00:00Z"
    result = export(tmp_path, capsys, gap, end=end)
    assert result.ids() == ["g-0", "h-0"]
    result = export(tmp_path, capsys, gap, "--link-window-hours", "48", end=end)
    assert result.ids() == ["g-0"]
    assert result.plans[0]["requests"][0]["delay_after_ms"] == 30 * 3600 * 1000


def test_c73_a_session_begun_before_the_window(tmp_path, capsys):
    roles = ["system", "user", "assistant", "user"]
    rows = [
        row(-600, "before", ["s", "u"], roles=roles[:2], tokens=[10, 5]),
        row(60, "after", ["s", "u", "a", "v"], roles=roles, tokens=[10, 5, 3, 2]),
    ]
    result = export(tmp_path, capsys, rows)
    assert result.ids() == ["v-0"]
    plan = result.plans[0]
    assert plan["start_after_ms"] == 60_000
    first = plan["requests"][0]
    assert first["reset_before"] is True
    assert not any(block.get("live") for block in first["blocks"])
    assert result.stats["prewindow_sessions"] == "1"
    assert result.stats["usable"] == "2" and result.stats["in_window"] == "1"


def test_c74_a_sibling_branch_resets_and_its_blocks_are_normalized(tmp_path, capsys):
    roles = ["system", "user", "assistant", "tool"]
    rows = [
        row(0, "r1", ["s", "u"], roles=roles[:2], tokens=[10, 5]),
        row(5, "r2", ["s", "u", "a1", "t1"], roles=roles, tokens=[10, 5, 3, 4]),
        # A regenerated reply to r1: a sibling of r2, its system block re-tokenized.
        row(9, "r3", ["s", "u", "a2", "t2"], roles=roles, tokens=[11, 5, 2, 4]),
    ]
    result = export(tmp_path, capsys, rows)
    assert result.ids() == ["u-0"]
    requests = result.plans[0]["requests"]
    assert [r.get("reset_before", False) for r in requests] == [False, False, True]
    assert requests[1]["blocks"][2].get("live") is True
    assert not any(block.get("live") for block in requests[2]["blocks"])
    assert requests[2]["blocks"][0] == {"seed": "s", "role": "system", "tokens": 10}
    assert requests[2]["overhead_tokens"] == 27 - 21  # prompt Σ raw + 5, blocks normalized
    assert result.stats["normalized_block_tokens"] == "1"
    assert validate_lines(result.output.read_bytes().splitlines(keepends=True)) == []
    load_manifest(str(result.output))


def test_c75_the_live_block_is_the_reply_to_the_previous_request(tmp_path, capsys):
    roles = ["tool_definition", "system", "user", "assistant", "user"]
    rows = [
        row(0, "a", ["t", "s", "u"], roles=roles[:3], tokens=[10, 10, 5], prompt=30),
        row(
            5,
            "b",
            ["t", "s", "u", "r", "v"],
            roles=roles,
            tokens=[10, 10, 5, 3, 2],
            prompt=35,
            stream=True,
            max_tokens=64,
        ),
    ]
    result = export(tmp_path, capsys, rows)
    first, second = result.plans[0]["requests"]
    assert first["overhead_tokens"] == 5 and first["delay_after_ms"] == 5_000
    assert second["prompt_tokens"] == 35 and second["overhead_tokens"] == 5
    assert second["stream"] is True and second["max_tokens"] == 64
    assert "stream" not in first and "max_tokens" not in first
    assert [i for i, b in enumerate(second["blocks"]) if b.get("live")] == [3]
    assert second["blocks"][3] == {"seed": "r", "role": "assistant", "tokens": 3, "live": True}
    assert "delay_after_ms" not in second
    assert [r["recorded_start_after_ms"] for r in (first, second)] == [0, 5_000]


def test_c76_offsets_and_delays_follow_the_timestamps(tmp_path, capsys):
    rows = [
        row(30, "a", ["x"], tokens=[10], duration_ms=1000),
        row(35, "b", ["x", "y"], tokens=[10, 4], duration_ms=2500),
        row(36.5, "c", ["x", "y", "z"], tokens=[10, 4, 4]),  # starts before b ended
    ]
    for scale, offset, delays, recorded in (
        ("1", 30_000, [4_000, 0], [30_000, 35_000, 36_500]),
        ("4", 7_500, [1_000, 0], [7_500, 8_750, 9_125]),
    ):
        result = export(tmp_path, capsys, rows, "--time-scale", scale)
        plan = result.plans[0]
        assert plan["start_after_ms"] == offset
        assert [r.get("delay_after_ms") for r in plan["requests"]] == [*delays, None]
        assert [r["recorded_start_after_ms"] for r in plan["requests"]] == recorded


def test_c77_a_request_without_block_counts_gets_one_user_block(tmp_path, capsys):
    result = export(tmp_path, capsys, [row(0, "a", ["leaf1", "leaf2"], prompt=42)])
    request = result.plans[0]["requests"][0]
    assert request["blocks"] == [{"seed": "leaf2", "role": "user", "tokens": 42}]
    assert request["overhead_tokens"] == 0
    # Without a chain: the seed and the id fall back to the principal and correlation id.
    result = export(tmp_path, capsys, [row(0, "c9", [], prompt=8)])
    assert result.ids() == ["p1-c9-0"]
    assert result.plans[0]["requests"][0]["blocks"] == [
        {"seed": "p1-c9", "role": "user", "tokens": 8}
    ]


def test_c78_unusable_rows_are_dropped_and_counted(tmp_path, capsys):
    rows = [
        row(0, "a", ["a1", "a2"], tokens=[5]),  # malformed block arrays
        row(1, "b", ["b1", "b2"], roles=["user"], tokens=[5, 5]),  # malformed roles
        row(2, "c", ["c1"], tokens=[]),  # no prompt: none recorded, no block counts
        row(3, "d", ["d1"], tokens=[4, 3][:1], prompt=None, completion=2),  # Σ tokens
        row(4, "e", ["e1"], tokens=[4], completion=0),  # no completion
        row(5, "f", ["f1"], tokens=[4], completion=None),  # no completion
        row(6, "g", ["g1"], tokens=[2], prompt=-1),  # Σ tokens stands in
    ]
    rows[2]["prompt_tokens"] = None
    rows[3]["prompt_tokens"] = 0
    rows[6]["prompt_tokens"] = -1
    result = export(tmp_path, capsys, rows)
    assert result.ids() == ["d1-0", "g1-0"]
    assert [plan["requests"][0]["prompt_tokens"] for plan in result.plans] == [4, 2]
    assert result.err.splitlines()[0] == (  # the workload's description follows
        f"wrote 2 trajectories to {result.output} (rows=7, usable=2, "
        "dropped_no_prompt_tokens=1, dropped_no_completion_tokens=2, "
        "dropped_malformed_blocks=2, in_window=2, trajectories=2, sampled=2, "
        "normalized_block_tokens=0, prewindow_sessions=0)"
    )


def test_c79_block_tokens_are_normalized_per_seed_within_a_trajectory(tmp_path, capsys):
    rows = [
        row(0, "a", ["s", "u"], roles=["system", "user"], tokens=[10, 5]),
        row(5, "b", ["s", "u", "v"], roles=["system", "user", "user"], tokens=[12, 6, 2]),
        # Another trajectory keeps its own first count of the same seed.
        row(7, "c", ["s", "w"], roles=["system", "user"], tokens=[12, 1], principal="p2"),
    ]
    result = export(tmp_path, capsys, rows)
    assert result.ids() == ["u-0", "w-0"]
    second = result.plans[0]["requests"][1]
    assert [b["tokens"] for b in second["blocks"]] == [10, 5, 2]
    assert second["overhead_tokens"] == 25 - 17
    assert [b["tokens"] for b in result.plans[1]["requests"][0]["blocks"]] == [12, 1]
    assert result.stats["normalized_block_tokens"] == "2"


def test_c80_the_output_is_sorted_by_offset_and_valid(tmp_path, capsys):
    rows = [
        row(50, "z", ["h5"], tokens=[3], principal="p3"),
        row(20, "y", ["h2"], tokens=[3], principal="p1"),
        row(20, "x", ["h1"], tokens=[3], principal="p2"),
        row(35, "w", ["h2", "k"], tokens=[3, 1], principal="p1"),
        row(10, "v", ["h9"], tokens=[3], principal="p2"),
    ]
    result = export(tmp_path, capsys, rows)
    assert [(p["start_after_ms"], p["trajectory_id"]) for p in result.plans] == [
        (10_000, "h9-0"),
        (20_000, "h1-0"),
        (20_000, "h2-0"),
        (50_000, "h5-0"),
    ]
    data = result.output.read_bytes()
    assert data.count(b"\n") == 4 and b", " not in data and b'": ' not in data
    assert validate_lines(data.splitlines(keepends=True)) == []
    assert load_manifest(str(result.output)).n_requests == 5


def _expected_sample(ids: list[str], seed: int, keep: int) -> set[str]:
    """COMPAT §7.7 written out: the smallest keys of SHA-256("<seed>:<id>")."""

    def key(ident: str) -> tuple[int, str]:
        return int(hashlib.sha256(f"{seed}:{ident}".encode()).hexdigest()[:16], 16), ident

    return set(sorted(ids, key=key)[:keep])


def test_c81_sampling_is_deterministic_and_depends_on_the_seed(tmp_path, capsys):
    rows = [row(i, f"c{i:02d}", [f"h{i:02d}"], tokens=[4]) for i in range(40)]
    ids = [f"h{i:02d}-0" for i in range(40)]
    kept = export(tmp_path, capsys, rows, "--sample", "0.25")
    assert len(kept.plans) == 10
    assert set(kept.ids()) == _expected_sample(ids, 0, 10)
    offsets = [plan["start_after_ms"] for plan in kept.plans]
    assert offsets == sorted(offsets)
    assert kept.stats["trajectories"] == "40" and kept.stats["sampled"] == "10"
    reordered = export(tmp_path, capsys, rows[::-1], "--sample", "0.25")
    assert reordered.ids() == kept.ids()
    other = export(tmp_path, capsys, rows, "--sample", "0.25", "--seed", "1")
    assert set(other.ids()) == _expected_sample(ids, 1, 10) != set(kept.ids())
    assert len(export(tmp_path, capsys, rows).plans) == 40
    assert len(export(tmp_path, capsys, rows, "--sample", "1.0").plans) == 40
    none = Export(tmp_path, rows, "--sample", "0.0", capsys=capsys)
    assert none.status == 1 and none.err.startswith("error: no trajectories to export (")
    for bad in ("1.5", "-0.1", "nan", "inf"):
        failed = Export(tmp_path, rows, "--sample", bad, capsys=capsys)
        assert (failed.status, failed.err) == (
            1,
            "error: sample fraction must be between 0 and 1\n",
        )
        assert not failed.output.exists()


def test_c82_stratified_sampling_keeps_every_length_bucket(tmp_path, capsys):
    assert [length_bucket(n) for n in (1, 2, 3, 4, 7, 8, 16)] == [0, 1, 1, 2, 2, 3, 4]
    assert length_bucket(0) == 0
    lengths = {f"t{i}": n for i, n in enumerate([1, 1, 1, 1, 1, 2, 3, 2, 4, 5, 8])}
    kept = sample(list(lengths), 0.1, 0, ident=str, length=lengths.__getitem__, stratify=True)
    assert sorted(length_bucket(lengths[t]) for t in kept) == [0, 1, 2, 3]
    assert len(sample(list(lengths), 0.1, 0, ident=str, length=lengths.__getitem__)) == 1
    # Through the CLI: five one-request and one two-request trajectories at 10 %.
    rows = [row(i, f"c{i}", [f"h{i}"], tokens=[4]) for i in range(5)]
    rows += [row(9, "d0", ["g"], tokens=[4]), row(10, "d1", ["g", "g2"], tokens=[4, 1])]
    result = export(tmp_path, capsys, rows, "--sample", "0.1", "--stratify-by-session-length")
    assert sorted(len(plan["requests"]) for plan in result.plans) == [1, 2]


VALID_PLAN: dict[str, Any] = {
    "schema_version": 2,
    "trajectory_id": "t",
    "start_after_ms": 0,
    "requests": [
        {
            "prompt_tokens": 20,
            "output_tokens": 3,
            "delay_after_ms": 5,
            "overhead_tokens": 2,
            "stream": True,
            "max_tokens": 8,
            "recorded_start_after_ms": 0,
            "blocks": [
                {"seed": "s", "role": "system", "tokens": 10},
                {"seed": "u", "role": "user", "tokens": 8},
            ],
        },
        {
            "prompt_tokens": 30,
            "output_tokens": 3,
            "reset_before": False,
            "overhead_tokens": 2,
            "recorded_start_after_ms": 9,
            "blocks": [
                {"seed": "s", "role": "system", "tokens": 10},
                {"seed": "u", "role": "user", "tokens": 8},
                {"seed": "a", "role": "assistant", "tokens": 3, "live": True},
                {"seed": "v", "role": "user", "tokens": 7},
            ],
        },
    ],
}


def _req(n: int):
    return lambda plan: plan["requests"][n]


def _block(n: int, k: int):
    return lambda plan: plan["requests"][n]["blocks"][k]


# (what to change, key, value or DELETE) -> a fragment of the one error it must give
DELETE = object()
VALIDATOR_RULES = [
    (lambda p: p, "extra", 1, 'unknown field "extra"'),
    (_req(0), "extra", 1, 'request 1 has unknown field "extra"'),
    (_block(0, 0), "extra", 1, 'block 1 has unknown field "extra"'),
    (lambda p: p, "trajectory_id", "", "trajectory_id must not be empty"),
    (lambda p: p, "trajectory_id", 5, "trajectory_id must be a string"),
    (lambda p: p, "start_after_ms", -1, "start_after_ms must be a non-negative integer"),
    (lambda p: p, "start_after_ms", 1.5, "start_after_ms must be a non-negative integer"),
    (lambda p: p, "requests", [], "requests must contain at least one request"),
    (_req(0), "prompt_tokens", 0, "request 1 prompt_tokens must be greater than zero"),
    (_req(0), "prompt_tokens", True, "prompt_tokens must be a non-negative integer, found true"),
    (_req(0), "output_tokens", 0, "request 1 output_tokens must be greater than zero"),
    (_req(0), "delay_after_ms", -1, "delay_after_ms must be a non-negative integer"),
    (_req(0), "overhead_tokens", -1, "overhead_tokens must be a non-negative integer"),
    (_req(0), "recorded_start_after_ms", -1, "recorded_start_after_ms must be a non-negative"),
    (_req(0), "max_tokens", 0, "request 1 max_tokens must be greater than zero"),
    (_req(1), "reset_before", "yes", "reset_before must be a boolean"),
    (_req(0), "stream", 1, "stream must be a boolean"),
    (_block(1, 2), "live", "true", "live must be a boolean"),
    (_req(1), "blocks", DELETE, "request 2 must define blocks"),
    (_req(0), "blocks", [], "blocks must contain at least one block"),
    (_block(0, 0), "seed", "", "block 1 seed must not be empty"),
    (_block(0, 0), "tokens", -1, "tokens must be a non-negative integer"),
    (_block(0, 0), "role", "robot", 'unknown variant "robot"'),
    (_block(1, 3), "live", True, "only assistant blocks can be live"),
    (_block(1, 0), "tokens", 11, 'request 2 redefines seed "s"'),
    (_block(1, 1), "role", "tool", 'request 2 redefines seed "u"'),
    (lambda p: p, "schema_version", 1, "schema_version"),
]


def test_c83_the_validator_rules():
    assert validate_lines([encode(VALID_PLAN)]) == []
    for where, key, value, fragment in VALIDATOR_RULES:
        plan = copy.deepcopy(VALID_PLAN)
        target = where(plan)
        if value is DELETE:
            del target[key]
        else:
            target[key] = value
        if key != "trajectory_id":
            plan["trajectory_id"] = "u"  # only the rule under test fails
        errors = validate_lines([encode(VALID_PLAN), encode(plan)])
        assert len(errors) == 1 and errors[0].startswith("line 2: "), (key, value, errors)
        assert fragment in errors[0], (key, value, errors)
    # v1 without any v2 field parses, but the exporter's validator takes schema 2 only.
    v1 = {
        "schema_version": 1,
        "trajectory_id": "x",
        "requests": [{"prompt_tokens": 5, "output_tokens": 1}],
    }
    assert validate_lines([encode(v1)]) == ["line 1: unsupported schema_version 1; expected 2"]
    assert validate_lines([encode(VALID_PLAN), encode(VALID_PLAN)]) == [
        'line 2: duplicate trajectory_id "t"'
    ]


def test_c84_the_cli_exports_rows_and_applies_the_filters(tmp_path, capsys):
    rows = [
        row(0, "a", ["x"], tokens=[10]),
        row(1, "b", ["y"], tokens=[10], principal="p2"),
        row(2, "c", ["z"], tokens=[10], model="m2"),
        row(4, "d", ["x", "x2"], tokens=[10, 2]),
        row(5, "e", ["x", "x2", "x3"], tokens=[10, 2, 2], model="m2"),
    ]
    result = export(tmp_path, capsys, rows, "--principal-id", "p1", "--model", "m1")
    assert result.ids() == ["x-0"]
    assert [r["prompt_tokens"] for r in result.plans[0]["requests"]] == [15, 17]
    assert result.stats["rows"] == "5" and result.stats["usable"] == "2"
    scaled = export(tmp_path, capsys, rows, "--model", "m1", "--time-scale", "2")
    assert scaled.ids() == ["x-0", "y-0"]
    assert scaled.plans[0]["requests"][0]["delay_after_ms"] == 2_000
    assert scaled.plans[1]["start_after_ms"] == 500
    status = run_main(["export-plans", *_argv(tmp_path, "--principal-id", "p2")])
    assert status == 0 and "wrote 1 trajectories" in capsys.readouterr().err


def _argv(tmp_path: Path, *args: str) -> list[str]:
    """The export's command line, with ``args`` after it; a flag among them replaces the
    default value (a flag is given once)."""
    rows = tmp_path / "rows.jsonl"
    out = tmp_path / "plans.jsonl"
    flags = {"--rows-jsonl": str(rows), "--start": START, "--end": END, "--output": str(out)}
    for flag, value in zip(args[::2], args[1::2], strict=True):  # flag-value pairs
        flags[flag] = value
    return [item for pair in flags.items() for item in pair]


def test_c85_an_empty_export_or_a_bad_window_writes_nothing(tmp_path, capsys):
    rows = [row(-7200, "old", ["x"], tokens=[3]), row(7200, "late", ["y"], tokens=[3])]
    empty = Export(tmp_path, rows, capsys=capsys)
    assert empty.status == 1 and not empty.output.exists()
    assert empty.err == (
        # The early row is read (inside the 24 h look-back) as a possible parent only.
        "error: no trajectories to export (rows=2, usable=1, dropped_no_prompt_tokens=0, "
        "dropped_no_completion_tokens=0, dropped_malformed_blocks=0, in_window=0, "
        "trajectories=0, sampled=0, normalized_block_tokens=0, prewindow_sessions=0)\n"
    )
    for end in (START, "2025-12-31T23:00:00"):
        bad = Export(tmp_path, [row(0, "a", ["x"], tokens=[3])], end=end, capsys=capsys)
        assert (bad.status, bad.err) == (1, "error: --end must be after --start\n")
        assert not bad.output.exists()
    # An invalid export (an unknown role) writes nothing either.
    invalid = Export(tmp_path, [row(0, "a", ["x"], roles=["robot"], tokens=[3])], capsys=capsys)
    assert invalid.status == 1 and not invalid.output.exists()
    assert invalid.err.startswith(
        "error: export produced 1 invalid manifest line(s):\nline 1: request 1 blocks are "
        'invalid: block 1 role: unknown variant "robot"'
    )


@pytest.mark.parametrize("admission", [[], ["--admission", "open-loop"]])
def test_c86_an_exported_manifest_dry_runs_in_batchbench_agent(tmp_path, capsys, admission):
    roles = ["system", "user", "assistant", "user"]
    rows = [
        row(0, "a", ["s", "u"], roles=roles[:2], tokens=[10, 5]),
        row(2, "b", ["s", "u", "r", "v"], roles=roles, tokens=[10, 5, 3, 4], duration_ms=500),
        row(3, "c", ["w"], tokens=[6], principal="p2"),
        row(4, "d", ["q"], tokens=[7], principal="p3"),
    ]
    result = export(tmp_path, capsys, rows)
    assert len(result.plans) == 3
    from batchbench.cli.agent import main as agent_main

    argv = [
        "--agent-plans-jsonl",
        str(result.output),
        "--tokenizer-model",
        "deepseek-v3",
        "--time-scale",
        "1000",
        "--dry-run",
        *admission,
    ]
    assert agent_main(argv) == 0
    out = capsys.readouterr().out
    assert "Agents: 3 completed / 3 total" in out
    assert "live_blocks=1" in out


def test_bad_rows_name_the_file_line_and_field(tmp_path, capsys):
    good = orjson.dumps(row(0, "a", ["x"], tokens=[3])).decode()
    cases = [
        ("{not json", "invalid JSON"),
        ("[1]", "a row must be a JSON object, found an array"),
        (good.replace('"2026-01-01T00:00:00Z"', '"yesterday"'), "field 'ts' is not an RFC 3339"),
        (good.replace('"principal_id":"p1",', ""), "missing field 'principal_id'"),
        (good.replace('"chain":["x"]', '"chain":"x"'), "field 'chain' must be an array of"),
        (good.replace('"block_tokens":[3]', '"block_tokens":[-3]'), "field 'block_tokens'"),
        (good.replace('"completion_tokens":3', '"completion_tokens":"3"'), "'completion_tokens'"),
        (good.replace('"model":"m1"', '"model":7'), "field 'model' must be a string"),
        (good[:-1] + ',"stream":"yes"}', "field 'stream' must be a boolean or null"),
        (good[:-1] + ',"duration_ms":"slow"}', "field 'duration_ms' must be a number"),
    ]
    for text, fragment in cases:
        rows_path = tmp_path / "rows.jsonl"
        rows_path.write_text(f"{good}\n\n{text}\n")
        status = run(_argv(tmp_path))
        err = capsys.readouterr().err
        assert status == 1 and err.startswith(f"error: {rows_path}:3: "), err
        assert fragment in err and err.count("\n") == 1 and "Traceback" not in err, err
        assert not (tmp_path / "plans.jsonl").exists()


def test_cli_option_errors(tmp_path, capsys):
    (tmp_path / "rows.jsonl").write_text(orjson.dumps(row(0, "a", ["x"], tokens=[3])).decode())
    for args, message in (
        (["--link-window-hours", "-1"], "--link-window-hours must be non-negative"),
        (["--time-scale", "0"], "time scale must be a positive finite number"),
        (["--time-scale", "inf"], "time scale must be a positive finite number"),
        (["--start", "soon"], "--start must be an RFC 3339 timestamp, got 'soon'"),
    ):
        assert run(_argv(tmp_path, *args)) == 1
        assert capsys.readouterr().err == f"error: {message}\n"
    missing = ["--rows-jsonl", str(tmp_path / "none.jsonl"), "--start", START, "--end", END]
    assert run([*missing, "--output", str(tmp_path / "o.jsonl")]) == 1
    assert capsys.readouterr().err.startswith(f"error: cannot open {tmp_path / 'none.jsonl'}: ")
    assert run(["--start", START]) == 2  # a required flag missing: misuse
    assert "Error:" in capsys.readouterr().err


def test_help_and_entry_points(tmp_path, capsys, monkeypatch):
    assert run(["--help"]) == 0
    text = capsys.readouterr().out
    for flag in (
        "--rows-jsonl",
        "--start",
        "--end",
        "--principal-id",
        "--model",
        "--link-window-hours",
        "--sample",
        "--seed",
        "--stratify-by-session-length",
        "--time-scale",
        "--output",
    ):
        assert flag in text
    assert run_main(["--help"]) == 0 and "export-plans" in capsys.readouterr().out
    monkeypatch.setattr(sys, "argv", ["batchbench-export-plans", "--help"])
    with pytest.raises(SystemExit) as exited:
        console_main()
    assert exited.value.code == 0
    assert capsys.readouterr().out.startswith("usage: batchbench-export-plans ")
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'batchbench-export-plans = "batchbench.cli.export_plans:console_main"' in pyproject
    (tmp_path / "rows.jsonl").write_text(orjson.dumps(row(0, "a", ["x"], tokens=[3])).decode())
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "batchbench.export_plans", *_argv(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert done.returncode == 0 and done.stderr.startswith("wrote 1 trajectories to ")
    assert (tmp_path / "plans.jsonl").exists()


def test_timestamps_accept_z_a_space_and_naive_utc():
    base = parse_timestamp("2026-01-01T00:00:00Z")
    assert parse_timestamp("2026-01-01 00:00:00") == base
    assert parse_timestamp("2026-01-01T00:00:00.250+00:00") == base + 250_000
    assert parse_timestamp("2026-01-01T02:00:00+02:00") == base
    assert base == 1_767_225_600 * 1_000_000
    for bad in ("", "yesterday", "2026-13-01T00:00:00"):
        with pytest.raises(ValueError):
            parse_timestamp(bad)


def test_rows_before_the_look_back_are_not_read(tmp_path, capsys):
    rows = [
        row(-25 * 3600, "old", ["s"], tokens=[3]),  # beyond the 24 h look-back: ignored
        row(60, "new", ["s", "t"], tokens=[3, 2]),
    ]
    result = export(tmp_path, capsys, rows)
    assert result.ids() == ["t-0"]
    assert "reset_before" not in result.plans[0]["requests"][0]
    assert (result.stats["rows"], result.stats["usable"]) == ("2", "1")
    assert result.stats["prewindow_sessions"] == "0"
