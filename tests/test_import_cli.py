"""``batchbench import``: exit statuses, the closing summary, the help's format list, and
the written manifest as the other commands read it (``batchbench validate``, a dry run,
and a replay on the simulator with prompt correction)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from toyformat import MC, MOONCAKE_OPTIONS, hashed, install, mooncake_records, record

from batchbench.cli.agent import main as agent_main
from batchbench.cli.import_trace import run
from batchbench.errors import InputError
from batchbench.ingest.importer import FORMATS, ImportOptions, import_trace
from batchbench.ingest.record import FormatOptions, Record, Segment

# No compiled module serves this code, and the simulator's are covered elsewhere: the
# pure-twin pass would repeat it as is.
pytestmark = pytest.mark.native_pass_only

ROOT = Path(__file__).resolve().parents[1]
WEKA = ROOT / "tests" / "fixtures" / "traces" / "weka" / "trace_small.json"


@pytest.fixture
def toy(monkeypatch):
    return install(monkeypatch)


def batchbench(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The real command in a child process, importing this source tree."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "batchbench", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        check=False,
        timeout=120,
    )


def small_trace(toy) -> None:
    toy["c.jsonl"] = [
        hashed("c.jsonl", 1, 0.0, (1, 2), 200, 20),
        hashed("c.jsonl", 2, 1.0, (1, 2, 3), 300, 20),  # grows from row 1
        hashed("c.jsonl", 3, 2.0, (7, 8), 100, 0),  # no output: dropped
        hashed("c.jsonl", 4, 3.0, (1, 9), 150, 10),  # shares id 1 only
    ]


def test_the_summary_says_what_the_import_did(tmp_path, toy, capsys) -> None:
    small_trace(toy)
    out = tmp_path / "m.jsonl"
    assert run(["toy", "c.jsonl", "-o", str(out), "--max-delay-ms", "500"]) == 0
    captured = capsys.readouterr()
    # h1 (100 tokens) is in all three requests of both trajectories: 300 of 650.
    assert captured.out.splitlines()[:8] == [
        f"wrote 2 trajectories (3 requests) to {out}",
        "  rows read       4; dropped: 1 no output tokens",
        "  trajectories    2, 1 of more than one request",
        "  lineage         roots 2, links 1, branches 0, idle splits 0, resets 0 (hash-prefix "
        "links 1)",
        "  blocks          1 requests grown from their predecessor with its live reply, 0 with "
        "reply and new content as one block; hash ids 4 collapsed into 4 blocks",
        "  tokens          prompt 650 (46.2% in blocks other trajectories share), output 50; "
        "equal to the rows kept; the dropped rows held 100 prompt and 0 output tokens",
        "  delays          1 capped at --max-delay-ms",
        "workload: 3 requests in 2 trajectories (1 with more than one request)",
    ]
    assert captured.err == ""
    assert [json.loads(line)["trajectory_id"] for line in out.read_text().splitlines()] == [
        "c.jsonl:1",
        "c.jsonl:4",
    ]


def test_the_summary_of_a_sample(tmp_path, toy, capsys) -> None:
    toy["s.jsonl"] = [record("s.jsonl", r, float(r), 1000, 100) for r in range(1, 5)]
    out = tmp_path / "m.jsonl"
    assert run(["toy", "s.jsonl", "-o", str(out), "--sample", "0.5"]) == 0
    assert capsys.readouterr().out.splitlines()[:8] == [
        f"wrote 2 trajectories (2 requests) to {out} (4 built, sampled 0.5)",
        "  rows read       4; dropped: none",
        "  trajectories    2, 0 of more than one request",
        "  lineage         roots 2, links 0, branches 0, idle splits 0, resets 0",
        "  blocks          0 requests grown from their predecessor with its live reply, 0 with "
        "reply and new content as one block",
        "  tokens          prompt 2,000 (0.0% in blocks other trajectories share), output 200; "
        "the sample of rows kept (4,000 / 400 before sampling)",
        "  delays          uncapped (latency model none)",
        "workload: 2 requests in 2 trajectories (0 with more than one request)",
    ]


def test_prompts_under_the_floor_are_raised_and_counted(tmp_path, toy, capsys) -> None:
    """A 5-token prompt and a 12-token one of two segments become 16 tokens of their own
    (a chat template's framing alone would exceed them); a 16-token prompt stays."""
    parts = (Segment("system", 4, key="sys"), Segment("user", 8))
    toy["p.jsonl"] = [
        record("p.jsonl", 1, 0.0, 5, 10),
        record("p.jsonl", 2, 1.0, 12, 10, segments=parts),
        record("p.jsonl", 3, 2.0, 16, 10),
    ]
    out = tmp_path / "m.jsonl"
    assert run(["toy", "p.jsonl", "-o", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[5:7] == [
        "  tokens          prompt 48 (0.0% in blocks other trajectories share), output 30; "
        "equal to the input's, plus the 15 tokens of raised prompts",
        "  small prompts   2 kept prompts under 16 tokens raised to 16 (+15 tokens): a chat "
        "template's framing alone would exceed them (--min-prompt-tokens 0 keeps them)",
    ]
    written = [json.loads(line)["requests"][0] for line in out.read_text().splitlines()]
    assert [(r["prompt_tokens"], r["blocks"]) for r in written] == [
        (16, [{"seed": "n0", "role": "user", "tokens": 16}]),
        (16, [{"seed": "n1", "role": "user", "tokens": 16}]),
        (16, [{"seed": "n2", "role": "user", "tokens": 16}]),
    ]
    assert run(["toy", "p.jsonl", "-o", str(out), "--min-prompt-tokens", "0"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[5] == (
        "  tokens          prompt 33 (0.0% in blocks other trajectories share), output 30; "
        "equal to the input's"
    )
    assert "small prompts" not in "\n".join(lines)
    prompts = [json.loads(line)["requests"][0] for line in out.read_text().splitlines()]
    assert [r["prompt_tokens"] for r in prompts] == [5, 12, 16]


def test_options_reach_the_import(tmp_path, toy, capsys) -> None:
    toy["t.jsonl"] = [
        record("t.jsonl", 1, 10.0, 100, 10, session="s", model="m"),
        record("t.jsonl", 2, 12.0, 200, 10, session="s", model="m"),
        record("t.jsonl", 3, 14.0, 300, 10, session="s", model="other"),
    ]
    out = tmp_path / "m.jsonl"
    argv = [
        "toy", "t.jsonl", "-o", str(out), "--start", "8", "--model", "m", "--time-scale", "2",
        "--latency-model", "fixed:1000", "--block-size", "64",
    ]  # fmt: skip
    assert run(argv) == 0
    (plan,) = [json.loads(line) for line in out.read_text().splitlines()]
    # (12 - 10 - 1 s) / 2; the start 2 s after --start, halved.
    assert (plan["start_after_ms"], plan["requests"][0]["delay_after_ms"]) == (1000, 500)
    assert [r["recorded_start_after_ms"] for r in plan["requests"]] == [1000, 2000]
    assert toy.options == [FormatOptions(block_size=64)]
    assert "dropped: 1 another model" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["toy", "c.jsonl"], "Error: the following arguments are required: -o/--output"),
        (["toy", "-o", "m.jsonl"], "Error: the following arguments are required: INPUT"),
        (["toy", "c.jsonl", "-o", "m.jsonl", "--sample", "half"],
         'Error: argument --sample: "half" is not a valid number'),
        (["toy", "c.jsonl", "-o", "m.jsonl", "--seed", "x"],
         "Error: argument --seed: invalid int value: 'x'"),
        (["toy", "c.jsonl", "-o", "m.jsonl", "--bogus"], "Error: unrecognized arguments: --bogus"),
    ],
)  # fmt: skip
def test_misuse_exits_2(tmp_path, toy, capsys, monkeypatch, argv, message) -> None:
    monkeypatch.chdir(tmp_path)
    assert run(argv) == 2
    captured = capsys.readouterr()
    assert (captured.out, captured.err) == ("", message + "\n")
    assert list(tmp_path.iterdir()) == []


def test_an_unknown_format_is_misuse(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert run(["nope", "c.jsonl", "-o", "m.jsonl"]) == 2
    assert capsys.readouterr().err == (
        "Error: argument FORMAT: invalid choice: 'nope' (choose from 'mooncake', 'bailian', "
        "'weka', 'tracelab', 'azure', 'burstgpt', 'ragpulse', 'claude-code')\n"
    )


def failing_reader(path: str, options: FormatOptions):
    yield record(path, 1, 0.0, 100, 10)
    raise InputError(f'{path}:2: field "input_length" must be a non-negative integer, got a string')


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["toy", "c.jsonl", "-o", "m.jsonl", "--sample", "0"],
         "Error: no trajectories to write from 4 rows"),
        (["toy", "c.jsonl", "-o", "m.jsonl", "--end", "-1"],
         "Error: no trajectories to write from 4 rows"),
        (["toy", "c.jsonl", "-o", "m.jsonl", "--latency-model", "fast"],
         "Error: --latency-model must be none, fixed:MS or linear:TTFT_MS,TPOT_MS, got 'fast'"),
        (["toy", "c.jsonl", "-o", "m.jsonl", "--shared-prefix-followers", "1"],
         "Error: --shared-prefix-followers must be at least 2"),
        (["toy", "bad.jsonl", "-o", "m.jsonl"],
         'Error: bad.jsonl:2: field "input_length" must be a non-negative integer, got a string'),
    ],
)  # fmt: skip
def test_bad_input_or_an_empty_import_exits_1_and_writes_nothing(
    tmp_path, toy, capsys, monkeypatch, argv, message
) -> None:
    small_trace(toy)
    toy["bad.jsonl"] = []
    module = sys.modules["batchbench.ingest.formats.toy_trace"]
    plain = module.read

    def read(path: str, options: FormatOptions):
        return failing_reader(path, options) if path == "bad.jsonl" else plain(path, options)

    monkeypatch.setattr(module, "read", read)
    monkeypatch.chdir(tmp_path)
    assert run(argv) == 1
    captured = capsys.readouterr()
    assert (captured.out, captured.err) == ("", message + "\n")
    assert list(tmp_path.iterdir()) == []


def test_help_lists_every_format(tmp_path) -> None:
    done = batchbench("import", "--help", cwd=tmp_path)
    assert (done.returncode, done.stderr) == (0, "")
    text = done.stdout
    listed = text[text.index("formats:\n") :].split("\n\n")[0].splitlines()[1:]
    names = [line.split()[0] for line in listed if line.startswith("  ") and line[2] != " "]
    assert names == list(FORMATS)
    assert (
        "Exit status: 0 on success, 1 on bad input or an empty or invalid import, 2 on misuse."
        in text
    )


def test_a_real_format_imports_validates_and_dry_runs(tmp_path) -> None:
    """The whole command in a child process on a real reader's fixture, then the manifest
    read back by ``batchbench validate`` and replayed by a dry run."""
    done = batchbench("import", "weka", str(WEKA), "-o", "m.jsonl", cwd=tmp_path)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.startswith("wrote 2 trajectories (5 requests) to m.jsonl\n")
    check_replayable(tmp_path / "m.jsonl", trajectories=2, requests=5)
    done = batchbench("import", "weka", "missing.json", "-o", "m2.jsonl", cwd=tmp_path)
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == "Error: cannot read missing.json: No such file or directory\n"
    done = batchbench("import", "weka", str(WEKA), cwd=tmp_path)
    assert done.returncode == 2 and not (tmp_path / "m2.jsonl").exists()


def check_replayable(path: Path, trajectories: int, requests: int) -> None:
    done = batchbench("validate", str(path), cwd=path.parent)
    assert (done.returncode, done.stderr) == (0, "")
    assert f"  trajectories: {trajectories}\n  requests: {requests}\n" in done.stdout
    done = batchbench(
        "agent", "--dry-run", "--agent-plans-jsonl", str(path), "--tokenizer-model",
        "deepseek-v3", "--no-progress", cwd=path.parent,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("[DRY-RUN] agent=") == requests
    assert f"Agents: {trajectories} completed / {trajectories} total" in done.stdout


def test_an_imported_hash_trace_is_valid_for_the_other_commands(tmp_path, toy) -> None:
    """Branches and splits (their parent's hash units, then one block of their own),
    folded requests, and (a hash link always holds its parent's prompt, so from a session
    that shrinks) a reset request: every line passes the manifest parser a run uses."""
    toy[MC] = mooncake_records()
    toy["s.jsonl"] = [
        record("s.jsonl", 1, 0.0, 300, 20, session="s"),
        record("s.jsonl", 2, 1.0, 200, 20, session="s"),  # shorter: a reset
    ]
    out = tmp_path / "mc-plans.jsonl"
    options = ImportOptions(
        format="toy", inputs=(MC, "s.jsonl"), output=str(out), **MOONCAKE_OPTIONS
    )
    stats, _ = import_trace(options)
    assert (stats.branches, stats.splits, stats.blocks.folded, stats.resets) == (2, 1, 1, 1)
    check_replayable(out, trajectories=17, requests=22)


# --- a replay on the simulator ------------------------------------------------------------

SIM = "sim.jsonl"


def sim_records(branch: bool) -> list[Record]:
    """Id 1 (a system prompt) starts every prompt: a 3-turn conversation that grows, one
    whose second turn is folded, a single request, and optionally a regenerated turn."""
    rows = [
        hashed(SIM, 1, 0.0, (1, 10, 11), 300, 40),
        hashed(SIM, 2, 1.0, (1, 10, 11, 12, 13), 480, 30),  # grown: 140 new tokens
        hashed(SIM, 3, 2.0, (1, 10, 11, 12, 14, 15), 560, 20),  # grown: 50 new tokens
        hashed(SIM, 4, 3.0, (1, 20), 200, 40),
        hashed(SIM, 5, 4.0, (1, 20, 21), 260, 10),  # folded: 20 new tokens
        hashed(SIM, 6, 6.0, (1, 30), 200, 20),
    ]
    if branch:
        rows.append(hashed(SIM, 7, 5.0, (1, 10, 11, 50), 400, 10))  # row 1 regenerated
    return rows


def replay(tmp_path: Path, toy, branch: bool) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    toy[SIM] = sim_records(branch)
    plans = tmp_path / "plans.jsonl"
    stats, _ = import_trace(
        ImportOptions(format="toy", inputs=(SIM,), output=str(plans), shared_prefix_followers=3)
    )
    blocks = stats.blocks
    assert (blocks.grown, blocks.branch_grown, blocks.folded, stats.branches) == (
        2,
        branch,
        1,
        branch,
    )
    summary, events = tmp_path / "summary.json", tmp_path / "requests.jsonl"
    status = agent_main(
        [
            "--agent-plans-jsonl", str(plans), "--sim", "--sim-args", "--speed 0", "--calibrate",
            "--max-active-agents", "1", "--seed", "11", "--no-progress",
            "--results-json", str(summary), "--request-events-jsonl", str(events),
        ]
    )  # fmt: skip
    assert status == 0
    lines = [orjson.loads(line) for line in events.read_bytes().splitlines()]
    return lines, json.loads(summary.read_text())


def assert_exact(events: list[dict[str, Any]], summary: dict[str, Any], requests: int) -> None:
    assert [e["status"] for e in events] == ["ok"] * requests
    assert [e["prompt_drift"] for e in events] == [0] * requests
    assert [e["output_drift"] for e in events] == [0] * requests
    assert summary["fidelity"]["prompt"]["exact"] == requests
    assert summary["fidelity"]["correction_limited_requests"] == 0


@pytest.mark.slow
def test_an_import_replays_exactly_on_the_simulator(tmp_path, toy, capsys) -> None:
    events, summary = replay(tmp_path, toy, branch=False)
    assert_exact(events, summary, 6)
    out = capsys.readouterr().out
    assert "Prompt fidelity: 6/6 exact (100.0%)" in out
    assert "Output fidelity: 6/6 exact (100.0%)" in out
    # The shared system block is cached for the first request of every later trajectory.
    firsts = {e["trajectory_id"]: e["cached_tokens"] for e in events if e["invocation"] == 1}
    assert list(firsts) == ["sim.jsonl:1", "sim.jsonl:4", "sim.jsonl:6"]
    assert firsts["sim.jsonl:1"] == 0
    assert firsts["sim.jsonl:4"] > 0 and firsts["sim.jsonl:6"] > 0
    later = [e["cached_tokens"] for e in events if e["invocation"] > 1]
    assert len(later) == 3 and all(cached > 0 for cached in later)


@pytest.mark.slow
def test_an_import_with_a_branch_replays_exactly_on_the_simulator(tmp_path, toy) -> None:
    events, summary = replay(tmp_path, toy, branch=True)
    assert_exact(events, summary, 7)


def test_every_flag_reaches_the_import_options(monkeypatch, capsys) -> None:
    seen: list[ImportOptions] = []

    def capture(options: ImportOptions, tick: Any) -> Any:
        seen.append(options)
        raise InputError("stop here")

    monkeypatch.setattr("batchbench.cli.import_trace.import_trace", capture)
    argv = [
        "mooncake", "a.jsonl", "b.jsonl.zst", "-o", "m.jsonl", "--start", "2026-01-01T00:00:00Z",
        "--end", "100", "--first-seconds", "5", "--model", "m", "--sample", "0.5", "--seed", "9",
        "--stratify-by-session-length", "--block-size", "16", "--link-window-hours", "2",
        "--shared-prefix-followers", "4", "--min-new-tokens", "0", "--split-idle-ms", "60000",
        "--latency-model", "fixed:5", "--max-delay-ms", "1000", "--time-scale", "3",
    ]  # fmt: skip
    assert run(argv) == 1
    assert capsys.readouterr().err == "Error: stop here\n"
    assert seen == [
        ImportOptions(
            format="mooncake", inputs=("a.jsonl", "b.jsonl.zst"), output="m.jsonl",
            start="2026-01-01T00:00:00Z", end="100", first_seconds=5.0, model="m",
            block_size=16, link_window_hours=2.0, shared_prefix_followers=4, min_new_tokens=0,
            latency_model="fixed:5", max_delay_ms=1000.0, split_idle_ms=60000.0, sample=0.5,
            seed=9, stratify_by_session_length=True, time_scale=3.0,
        )
    ]  # fmt: skip
    seen.clear()
    assert run(["weka", "t.json", "-o", "m.jsonl"]) == 1
    assert seen == [ImportOptions(format="weka", inputs=("t.json",), output="m.jsonl")]


# --- inputs out of range, and the page's path -----------------------------------------------


@pytest.mark.parametrize(
    ("lines", "flags", "message"),
    [
        (
            [b'{"timestamp": 0, "input_length": 100, "output_length": 9007199254740993}'],
            (),
            "Error: {path}:1: output tokens 9007199254740993 exceed 2^53\n",
        ),
        (
            [
                b'{"timestamp": 0, "input_length": 100, "output_length": 9}',
                b'{"timestamp": 1e300, "input_length": 100, "output_length": 9}',
            ],
            (),
            "Error: {path}:2: its time 1e+297 is out of range\n",
        ),
        (
            [
                b'{"timestamp": 0, "input_length": 100, "output_length": 9}',
                b'{"timestamp": 1000, "input_length": 100, "output_length": 9}',
            ],
            ("--time-scale", "1e-14"),
            "Error: an offset or delay of 1e+17 ms is out of range (at most 2^53 ms); check "
            "--time-scale\n",
        ),
        ([b"(\xb5/\xfd not a zstd frame"], (), None),
    ],
)
def test_values_out_of_range_are_one_line_errors(tmp_path, capsys, lines, flags, message) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_bytes(b"\n".join(lines) + b"\n")
    out = tmp_path / "m.jsonl"
    assert run(["mooncake", str(trace), "-o", str(out), *flags]) == 1
    err = capsys.readouterr().err
    if message is None:  # the decompressor's own words follow the file
        assert err.startswith(f"Error: cannot read {trace}: ") and err.count("\n") == 1
    else:
        assert err == message.format(path=trace)
    assert not out.exists()


def test_the_page_may_not_overwrite_the_manifest_or_miss_its_folder(tmp_path, capsys) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 100, "output_length": 9}\n')
    out = tmp_path / "m.jsonl"
    assert run(["mooncake", str(trace), "-o", str(out), "--describe-html", str(out)]) == 2
    assert capsys.readouterr().err == (
        f"Error: --describe-html {out} would overwrite the manifest; name another file\n"
    )
    page = tmp_path / "missing" / "page.html"
    assert run(["mooncake", str(trace), "-o", str(out), "--describe-html", str(page)]) == 1
    assert capsys.readouterr().err == (
        f"Error: cannot write {page}: its folder {page.parent} is missing or not writable\n"
    )
    assert not out.exists()  # checked before any work
