"""Provenance of imported plans (``metadata.source``): the loader keeps each request's
source row, and a run carries it into its outputs (docs/outputs.md): ``source_row`` in the
request events, ``source_rows`` in the lifecycle records, ``manifest.sources`` in the
results JSON, also when ``--workers`` merge. Metadata of any other shape stays ignored."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from batchbench.cli.agent import main
from batchbench.cli.main import run as batchbench
from batchbench.plan.manifest import parse_manifest
from batchbench.plan.provenance import provenance_of

TRACE = "conversation_trace.jsonl"


def source(**fields: Any) -> dict[str, Any]:
    return {"source": {"format": "mooncake", **fields}}


def growth(*prompts: int) -> list[dict[str, int]]:
    return [{"prompt_tokens": p, "output_tokens": 8} for p in prompts]


BLOCKS = [
    {"seed": "d/system", "tokens": 60, "role": "system"},
    {"seed": "d/user-1", "tokens": 40, "role": "user"},
]

# Two trajectories from one file (one of them schema 1), one from two files, one whose
# metadata is free-form (the shape of benchmarks/bench_manifest.py's), one whose rows do
# not match its requests (those two are not provenance), and one made of blocks, as
# `batchbench import` writes them.
TRAJECTORIES = [
    {
        "schema_version": 2,
        "trajectory_id": "imp-a",
        "metadata": source(file=TRACE, rows=[12, 40, 77], origins=[None, "x", None],
                           branch_of_row=5),
        "requests": growth(120, 200, 300),
    },
    {
        "schema_version": 2,
        "trajectory_id": "imp-b",
        "metadata": source(files=["a.jsonl", "b.jsonl"], rows=[3, 0]),
        "requests": growth(90, 150),
    },
    {
        "schema_version": 2,
        "trajectory_id": "free",
        "metadata": {"source": "bench", "index": 2},
        "requests": growth(100),
    },
    {
        "schema_version": 1,
        "trajectory_id": "imp-c",
        "metadata": source(file=TRACE, rows=[7]),
        "requests": growth(110),
    },
    {
        "schema_version": 2,
        "trajectory_id": "short",
        "metadata": source(file=TRACE, rows=[1]),
        "requests": growth(100, 180),
    },
    {
        "schema_version": 2,
        "trajectory_id": "imp-d",
        "metadata": source(file="b.jsonl", rows=[9, 11]),
        "requests": [
            {"prompt_tokens": 100, "output_tokens": 8, "blocks": BLOCKS},
            {"prompt_tokens": 170, "output_tokens": 8, "blocks": [
                *BLOCKS,
                {"seed": "d/reply", "tokens": 8, "role": "assistant", "live": True},
                {"seed": "d/user-2", "tokens": 62, "role": "user"},
            ]},
        ],
    },
]  # fmt: skip

SOURCE_ROWS = {"imp-a": [12, 40, 77], "imp-b": [3, 0], "imp-c": [7], "imp-d": [9, 11]}
SOURCES = [
    {"format": "mooncake", "file": TRACE, "trajectories": 2, "requests": 4},
    {"format": "mooncake", "file": "a.jsonl", "trajectories": 1, "requests": 1},
    {"format": "mooncake", "file": "b.jsonl", "trajectories": 2, "requests": 3},
]
FREE_FORM = [
    {"schema_version": 2, "trajectory_id": "tagged", "metadata": {"tags": ["x"], "source": {}},
     "requests": growth(100, 180)},
    {"schema_version": 2, "trajectory_id": "listed", "metadata": [1, {"source": "y"}],
     "requests": growth(90)},
]  # fmt: skip


def manifest_bytes(trajectories: list[dict[str, Any]]) -> bytes:
    return b"".join(orjson.dumps(t) + b"\n" for t in trajectories)


def write(path: Path, trajectories: list[dict[str, Any]]) -> Path:
    path.write_bytes(manifest_bytes(trajectories))
    return path


def jsonl(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


# -- the loader ----------------------------------------------------------------------------
def test_the_loader_keeps_source_rows_per_request_and_the_distinct_files():
    manifest = parse_manifest(manifest_bytes(TRAJECTORIES), "m.jsonl")
    assert manifest.source_rows.tolist() == [12, 40, 77, 3, 0, -1, 7, -1, -1, 9, 11]
    assert manifest.source_ids.tolist() == [0, 0, 0, 1, 2, -1, 0, -1, -1, 2, 2]
    assert manifest.source_rows.dtype == np.int64 and manifest.source_ids.dtype == np.int32
    assert manifest.source_names == [
        ("mooncake", TRACE),
        ("mooncake", "a.jsonl"),
        ("mooncake", "b.jsonl"),
    ]
    assert manifest.source_summary() == SOURCES


def test_without_provenance_the_columns_cost_no_memory():
    manifest = parse_manifest(manifest_bytes(FREE_FORM), "m.jsonl")
    assert manifest.source_names == []
    assert manifest.source_rows.tolist() == [-1, -1, -1]
    assert manifest.source_rows.strides == (0,)  # one broadcast value
    assert manifest.source_ids.strides == (0,)
    assert manifest.source_summary() == []


@pytest.mark.parametrize(
    "metadata",
    [
        None,
        [source(file=TRACE, rows=[1])],
        {"source": [TRACE, 1]},
        {"source": {"file": TRACE, "rows": [1]}},  # no format
        {"source": {"format": 1, "file": TRACE, "rows": [1]}},
        source(rows=[1]),  # no file
        source(file=TRACE, files=[TRACE], rows=[1]),  # both
        source(file=[TRACE], rows=[1]),
        source(files=TRACE, rows=[1]),
        source(files=[TRACE, TRACE], rows=[1]),
        source(files=[1], rows=[1]),
        source(file=TRACE, rows=1),
        source(file=TRACE, rows=[]),
        source(file=TRACE, rows=[1, 2]),
        source(file=TRACE, rows=[-1]),
        source(file=TRACE, rows=[True]),
        source(file=TRACE, rows=[1.0]),
        source(file=TRACE, rows=["1"]),
        source(file=TRACE, rows=[2**63]),
    ],
)
def test_metadata_of_another_shape_is_not_provenance(metadata):
    assert provenance_of(metadata, 1) is None
    line = {"schema_version": 2, "trajectory_id": "t", "metadata": metadata,
            "requests": growth(100)}  # fmt: skip
    manifest = parse_manifest(manifest_bytes([line]), "m.jsonl")
    assert manifest.source_names == [] and manifest.source_rows.tolist() == [-1]


def test_the_shapes_that_are_provenance():
    assert provenance_of(source(file=TRACE, rows=[0, 2**63 - 1], extra={}), 2) == (
        "mooncake",
        TRACE,
        [0, 2**63 - 1],
    )
    assert provenance_of(source(file=None, files=["x", "y"], rows=[5, 6]), 2) == (
        "mooncake",
        ["x", "y"],
        [5, 6],
    )


# -- runs ----------------------------------------------------------------------------------
SIM = ["--sim", "--sim-args", "--speed 0", "--model", "batchbench-sim", "--seed", "9"]


def outputs(folder: Path, live: bool = True) -> list[str]:
    files = [
        "--results-json",
        str(folder / "r.json"),
        "--agent-events-jsonl",
        str(folder / "a.jsonl"),
    ]
    if live:
        files += ["--request-events-jsonl", str(folder / "q.jsonl")]
    return files


def run(capsys, plans: Path, folder: Path, *args: str) -> None:
    folder.mkdir()
    argv = [
        "--agent-plans-jsonl",
        str(plans),
        "--no-progress",
        *outputs(folder, "--dry-run" not in args),
        *args,
    ]
    status = main(argv)
    captured = capsys.readouterr()
    assert status == 0, captured.out[-2000:] + captured.err[-2000:]


def request_rows(folder: Path) -> dict[tuple[str, int], int | None]:
    """(trajectory, invocation) -> its source_row, None when the line has no such key."""
    rows = {}
    for event in jsonl(folder / "q.jsonl"):
        assert event["status"] == "ok"
        keys = list(event)
        if "source_row" in keys:
            assert keys[-1] == "source_row"  # after every other key, in their usual order
        rows[event["trajectory_id"], event["invocation"]] = event.get("source_row")
    return rows


def lifecycle_rows(folder: Path) -> dict[str, list[int] | None]:
    return {e["trajectory_id"]: e.get("source_rows") for e in jsonl(folder / "a.jsonl")}


EXPECTED_REQUEST_ROWS = {
    ("imp-a", 1): 12, ("imp-a", 2): 40, ("imp-a", 3): 77,
    ("imp-b", 1): 3, ("imp-b", 2): 0,
    ("free", 1): None,
    ("imp-c", 1): 7,
    ("short", 1): None, ("short", 2): None,
    ("imp-d", 1): 9, ("imp-d", 2): 11,
}  # fmt: skip
EXPECTED_LIFECYCLE_ROWS = {**SOURCE_ROWS, "free": None, "short": None}


def test_a_live_run_carries_the_provenance(capsys, tmp_path):
    plans = write(tmp_path / "m.jsonl", TRAJECTORIES)
    run(capsys, plans, tmp_path / "run", *SIM)
    assert request_rows(tmp_path / "run") == EXPECTED_REQUEST_ROWS
    assert lifecycle_rows(tmp_path / "run") == EXPECTED_LIFECYCLE_ROWS
    document = json.loads((tmp_path / "run" / "r.json").read_text())
    assert document["manifest"]["sources"] == SOURCES
    assert list(document["manifest"]) == ["path", "sha256", "schema_version", "sources"]


def test_free_form_metadata_runs_without_source_fields(capsys, tmp_path):
    plans = write(tmp_path / "m.jsonl", FREE_FORM)
    run(capsys, plans, tmp_path / "run", *SIM)
    assert request_rows(tmp_path / "run") == {("tagged", 1): None, ("tagged", 2): None,
                                              ("listed", 1): None}  # fmt: skip
    assert lifecycle_rows(tmp_path / "run") == {"tagged": None, "listed": None}
    document = json.loads((tmp_path / "run" / "r.json").read_text())
    assert document["manifest"]["sources"] == []


def test_a_dry_run_carries_the_provenance(capsys, tmp_path):
    plans = write(tmp_path / "m.jsonl", TRAJECTORIES)
    run(capsys, plans, tmp_path / "run", "--dry-run", "--tokenizer-model", "deepseek-v3")
    assert lifecycle_rows(tmp_path / "run") == EXPECTED_LIFECYCLE_ROWS
    document = json.loads((tmp_path / "run" / "r.json").read_text())
    assert document["manifest"]["sources"] == SOURCES


def test_a_sampled_run_has_no_sources(capsys, tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    status = main(["--agents", "2", "--tool-invocations", "1", "--dry-run", "--no-progress",
                   "--tokenizer-model", "deepseek-v3", *outputs(folder, live=False)])  # fmt: skip
    capsys.readouterr()
    assert status == 0
    assert json.loads((folder / "r.json").read_text())["manifest"]["sources"] is None
    assert all("source_rows" not in e for e in jsonl(folder / "a.jsonl"))


@pytest.mark.native_pass_only
def test_two_workers_keep_the_provenance(tmp_path):
    """Every worker loads the whole manifest and runs a share of it: the merged summary is
    the manifest's, and every worker's events keep their rows."""
    plans = write(tmp_path / "m.jsonl", TRAJECTORIES)
    folder = tmp_path / "run"
    folder.mkdir()
    command = [sys.executable, "-m", "batchbench", "agent", "--agent-plans-jsonl", str(plans),
               "--no-progress", *SIM, "--workers", "2", *outputs(folder)]  # fmt: skip
    process = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert process.returncode == 0, process.stderr
    assert "Workers: 2 processes" in process.stdout
    assert request_rows(folder) == EXPECTED_REQUEST_ROWS
    assert lifecycle_rows(folder) == EXPECTED_LIFECYCLE_ROWS
    document = json.loads((folder / "r.json").read_text())
    assert document["client_health"]["processes"] == 2
    assert document["manifest"]["sources"] == SOURCES


def test_merged_shards_keep_the_provenance(capsys, tmp_path):
    """Each shard's results describe the whole manifest (every shard loads all of it, and
    runs a share), and so do the merged results; the lifecycle records keep their rows."""
    plans = write(tmp_path / "m.jsonl", TRAJECTORIES)
    results = []
    for index in (0, 1):
        folder = tmp_path / f"s{index}"
        run(capsys, plans, folder, "--dry-run", "--tokenizer-model", "deepseek-v3",
            "--seed", "5", "--shard", f"{index}/2")  # fmt: skip
        assert json.loads((folder / "r.json").read_text())["manifest"]["sources"] == SOURCES
        results.append(str(folder / "r.json"))
    assert batchbench(["merge", *results, "-o", str(tmp_path / "merged")]) == 0
    capsys.readouterr()
    merged = tmp_path / "merged"
    assert json.loads((merged / "results.json").read_text())["manifest"]["sources"] == SOURCES
    assert {
        e["trajectory_id"]: e.get("source_rows") for e in jsonl(merged / "agent-events.jsonl")
    } == EXPECTED_LIFECYCLE_ROWS
