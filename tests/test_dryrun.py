"""The dry-run command end to end, on the README example (docs/outputs.md)."""

from __future__ import annotations

import csv
import hashlib
import re
from pathlib import Path

import orjson
import pytest

from batchbench.cli.agent import main
from batchbench.results.console import (
    CSV_COLUMNS,
    EXTRA_CSV_COLUMNS,
    FIDELITY_CSV_COLUMNS,
    LIVE_CSV_COLUMNS,
    LOSS_CSV_COLUMNS,
    OUTCOME_CSV_COLUMNS,
)

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "trajectory-replay" / "plans.jsonl"
README_ARGS = [
    "--agent-plans-jsonl",
    str(EXAMPLE),
    "--max-active-agents",
    "2",
    "--replay-initial-overhead-tokens",
    "10",
    "--replay-turn-overhead-tokens",
    "4",
    "--tokenizer-model",
    "deepseek-v3",
    "--dry-run",
    "--seed",
    "7",
]
TIMED = re.compile(r"admitted_at_ms=\d+")


def run(capsys, argv):
    assert main(argv) == 0
    captured = capsys.readouterr()
    return captured.out.splitlines(), captured.err


def test_readme_example_banner_lines_and_summary(capsys):
    lines, err = run(capsys, README_ARGS)
    assert err == ""
    digest = hashlib.sha256(EXAMPLE.read_bytes()).hexdigest()
    assert lines[:16] == [
        "=== Agent Loop Benchmark Configuration ===",
        "Endpoint: none (dry run)",  # a dry run needs no server
        "Model: none",
        "Tokenizer: deepseek-v3",
        lines[4],
        f"Workload: trajectory replay from {EXAMPLE}",
        f"Trajectory manifest SHA-256: {digest}",
        "Replay prompt overhead: initial/reset 10 tokens; appended turn 4 tokens",
        "Maximum active agents: 2",
        "Admission: closed-loop; time scale 1",
        "Output token params: default (min_tokens/max_tokens)",
        "Ignore EOS: false",
        "DP-rank perfect routing: disabled",
        "Per-agent user tagging: enabled",
        lines[14],
        "==========================================",
    ]
    assert lines[4].startswith("Tokenizer file: ") and lines[4].endswith("tokenizer.json")
    assert re.fullmatch(r"Content salt: [0-9a-f]{16}", lines[14])  # random unless pinned
    assert lines[16] == ""
    dry = [TIMED.sub("admitted_at_ms=T", line) for line in lines if line.startswith("[DRY-RUN]")]
    common = "[DRY-RUN] agent={} invocation={} input_content_tokens={} output_tokens={} environment_tokens={} tool_call_latency_ms={} trajectory_id={} routing_slot={} admitted_at_ms=T target_prompt_tokens={} reset_before={}"
    assert dry == [
        common.format(0, 1, 246, 64, 124, 0, "short-agent", 0, 256, "false"),
        common.format(0, 2, 434, 96, 0, 0, "short-agent", 0, 448, "false"),
        common.format(1, 1, 502, 128, 252, 0, "long-agent", 1, 512, "false"),
        common.format(1, 2, 882, 128, 252, 25, "long-agent", 1, 896, "false"),
        common.format(1, 3, 1262, 64, 0, 0, "long-agent", 1, 1280, "false"),
        common.format(2, 1, 758, 128, 0, 0, "compacting-agent", 0, 768, "false"),
        common.format(2, 2, 374, 64, 0, 0, "compacting-agent", 0, 384, "true"),
    ]
    first_two = [line for line in lines if "agent=0 " in line or "agent=1 " in line]
    assert all("admitted_at_ms=0 " in line for line in first_two)
    summary = lines[lines.index(next(line for line in lines if line.startswith("Agents:"))) :]
    assert summary[0] == "Agents: 3 completed / 3 total"
    assert re.fullmatch(
        r"Rolling admission: 2 maximum active; last admission at \d+\.\d\ds; final drain \d+\.\d\ds",
        summary[1],
    )
    # Closed loop: no open-loop line (there is no schedule to be late against).
    assert not any(line.startswith("Open-loop admission") for line in summary)
    assert summary[2:7] == [
        "Tool invocations: 7 planned; requests 0 (success 0, failure 0)",
        "Total input tokens sent: 0",
        "Total output tokens generated: 0",
        "Estimated cached input tokens (perfect server-side caching): 0",
        "Total simulated tool-call latency: 0.00s",
    ]
    assert summary[8] == "Request latency (ms): p50=n/a p90=n/a p99=n/a"
    assert re.fullmatch(
        r"Agent end-to-end latency \(ms, completed agents\): p50=\d+\.\d\d p90=\d+\.\d\d p99=\d+\.\d\d",
        summary[9],
    )
    assert len(summary) == 10


def test_dry_run_is_deterministic(capsys):
    first, _ = run(capsys, README_ARGS)
    second, _ = run(capsys, README_ARGS)
    strip = [TIMED.sub("", line) for line in first if line.startswith("[DRY-RUN]")]
    assert strip == [TIMED.sub("", line) for line in second if line.startswith("[DRY-RUN]")]


def test_events_and_csv_in_dry_run(capsys, tmp_path):
    events = tmp_path / "out" / "events.jsonl"
    results = tmp_path / "out" / "nested" / "summary.csv"
    results.parent.mkdir(parents=True)
    lines, _ = run(
        capsys,
        [
            *README_ARGS,
            "--agent-events-jsonl",
            str(events),
            "--results-csv",
            str(results),
            "--dp-rank-perfect-routing",
            "--dp-rank-perfect-routing-num",
            "2",
        ],
    )
    assert lines[-3:] == [
        f"Wrote agent lifecycle events to {events}",
        f"Wrote agent benchmark summary to {results}",
        f"Wrote resolved options to {results.with_name('summary.config.toml')}",
    ]
    records = [orjson.loads(line) for line in events.read_bytes().splitlines()]
    assert [r["agent_id"] for r in records] == [0, 1, 2]  # finish order
    assert list(records[0]) == [
        "agent_id",
        "trajectory_id",
        "routing_slot",
        "dp_rank",
        "scheduled_at_seconds",
        "admitted_at_seconds",
        "queue_wait_seconds",
        "finished_at_seconds",
        "runtime_seconds",
        "completed",
    ]
    assert [
        (r["trajectory_id"], r["routing_slot"], r["dp_rank"], r["completed"]) for r in records
    ] == [
        ("short-agent", 0, 0, True),
        ("long-agent", 1, 1, True),
        ("compacting-agent", 0, 0, True),
    ]
    assert records[0]["admitted_at_seconds"] == 0.0 and records[2]["admitted_at_seconds"] > 0.0
    assert b" " not in events.read_bytes()
    text = results.read_text()
    assert text.count("\n") == 2 and "\r" not in text
    header, row = list(csv.reader(text.splitlines()))
    assert header[:51] == list(CSV_COLUMNS)
    assert header[51:61] == list(EXTRA_CSV_COLUMNS)
    assert header[61:] == (
        list(LIVE_CSV_COLUMNS)
        + list(FIDELITY_CSV_COLUMNS)
        + list(OUTCOME_CSV_COLUMNS)
        + list(LOSS_CSV_COLUMNS)
    )
    values = dict(zip(header, row, strict=True))
    assert values["workload_mode"] == "trajectory_replay"
    assert values["agent_plans_sha256"] == hashlib.sha256(EXAMPLE.read_bytes()).hexdigest()
    assert values["trajectory_schema_version"] == "1"
    assert (
        values["agents"],
        values["requested_max_active_agents"],
        values["max_active_agents"],
    ) == ("3", "2", "2")
    assert (
        values["completed_agents"],
        values["planned_tool_invocations"],
        values["total_requests"],
    ) == ("3", "7", "0")
    assert (values["latency_p50_ms"], values["ttft_p50_ms"], values["interrupted"]) == (
        "",
        "",
        "false",
    )
    assert (values["dp_rank_perfect_routing"], values["dp_rank_perfect_routing_num"]) == (
        "true",
        "2",
    )
    assert (
        values["seed"],
        values["replay_initial_overhead_tokens"],
        values["tool_call_latency_ms"],
    ) == ("7", "10", "")
    assert values["time_scale"] == "1.0" and values["admission_mode"] == "closed-loop"


def test_sampled_dry_run_eight_agents_four_slots(capsys):
    lines, _ = run(
        capsys,
        [
            "--agents",
            "8",
            "--max-active-agents",
            "4",
            "--input-tokens",
            "32",
            "--output-tokens",
            "8",
            "--environment-tokens",
            "16",
            "--tool-invocations",
            "2",
            "--tokenizer-model",
            "deepseek-v3",
            "--dry-run",
            "--seed",
            "3",
        ],
    )
    assert "Total synthetic agents: 8" in lines and "Maximum active agents: 4" in lines
    assert "Initial prompt: 32 (fixed)" in lines and "Tool-call latency: 0 ms (fixed)" in lines
    assert "Agents: 8 completed / 8 total" in lines
    dry = [line for line in lines if line.startswith("[DRY-RUN]")]
    assert len(dry) == 16
    assert dry[0] == (
        "[DRY-RUN] agent=0 invocation=1 input_content_tokens=32 output_tokens=8 environment_tokens=16 "
        "tool_call_latency_ms=0 trajectory_id=sampled-0 routing_slot=0 admitted_at_ms=0 "
        "target_prompt_tokens=32 reset_before=false"
    )
    assert "input_content_tokens=56" in dry[1]
    slots = [int(re.search(r"routing_slot=(\d+)", line).group(1)) for line in dry[::2]]
    assert slots == [0, 1, 2, 3, 0, 1, 2, 3]


def test_open_loop_dry_run(capsys):
    lines, _ = run(capsys, [*README_ARGS, "--admission", "open-loop", "--time-scale", "1000"])
    assert "Admission: open-loop; time scale 1000" in lines
    assert "Agents: 3 completed / 3 total" in lines
    assert any(line.startswith("Open-loop admission: ") for line in lines)


def test_unconstructable_content_fails_the_run(tmp_path):
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    tok.normalizer = normalizers.Replace(r"a", "")
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(["[UNK]"])  # the only id left, "a", normalizes to nothing
    tok.save(str(tmp_path / "tokenizer.json"))
    from batchbench.errors import BatchbenchError

    with pytest.raises(BatchbenchError) as caught:
        main([*README_ARGS[:-5], "--tokenizer-model", str(tmp_path), "--dry-run", "--seed", "7"])
    message = str(caught.value)
    assert message.startswith('failed to generate initial prompt for trajectory "short-agent"')
    assert "failed to generate synthetic text with exactly 246 tokens after 256 attempts" in message


def test_ten_thousand_one_request_trajectories_all_admitted_at_zero(capsys, tmp_path):
    """The shape of benchmarks/bench_dryrun.py (10^6 there): every trajectory in its own
    slot at t = 0, one exact line each, every lifecycle record written."""
    n = 10_000
    manifest = tmp_path / "many.jsonl"
    line = '{"schema_version":1,"trajectory_id":"t%05d","requests":[{"prompt_tokens":%d,"output_tokens":16}]}\n'
    manifest.write_text("".join(line % (i, 64 + i % 64) for i in range(n)))
    events = tmp_path / "agents.jsonl"
    argv = ["--agent-plans-jsonl", str(manifest), "--tokenizer-model", "deepseek-v3",
            "--dry-run", "--seed", "7", "--agent-events-jsonl", str(events)]  # fmt: skip
    lines, err = run(capsys, argv)
    assert err == ""
    dry = [line for line in lines if line.startswith("[DRY-RUN]")]
    assert dry == [
        f"[DRY-RUN] agent={i} invocation=1 input_content_tokens={64 + i % 64} output_tokens=16 "
        f"environment_tokens=0 tool_call_latency_ms=0 trajectory_id=t{i:05d} routing_slot={i} "
        f"admitted_at_ms=0 target_prompt_tokens={64 + i % 64} reset_before=false"
        for i in range(n)
    ]
    assert f"Agents: {n} completed / {n} total" in lines
    assert any(
        re.fullmatch(
            rf"Rolling admission: {n} maximum active; last admission at 0\.00s; "
            r"final drain \d+\.\d\ds",
            line,
        )
        for line in lines
    )
    records = [orjson.loads(line) for line in events.read_bytes().splitlines()]
    assert sorted(r["agent_id"] for r in records) == list(range(n))
    assert all(r["routing_slot"] == r["agent_id"] and r["completed"] for r in records)
    assert all(r["admitted_at_seconds"] == 0.0 for r in records)
