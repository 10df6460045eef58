"""Prompt correction's parts on their own: sizing, the framing model, reply counting in
context, content salts, the server prompt oracle and calibration probes (against a real
aiohttp stub on loopback and the real simulator)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp
import numpy as np
import pytest
from stubserver import Reply, StubServer, chat_completion

from batchbench.drive.calibrate import Calibration, CalibrationError, calibrate
from batchbench.drive.oracle import OracleError, PromptOracle, server_root
from batchbench.drive.simlaunch import SimProcess, sim_command
from batchbench.drive.sizing import Sizing, TrajectorySizer
from batchbench.drive.wire import BodyOptions, Conversation
from batchbench.plan.workload import Workload
from batchbench.rng import content_root
from batchbench.text.content import ContentFactory
from batchbench.text.framing import Framing, trimmed
from batchbench.text.replycount import REFERENCE_SHAPE, ReplyAccounting
from batchbench.text.synth import Synthesizer


def replay(prompts: list[int], outputs: list[int], resets=(), initial=0, turn=0) -> Workload:
    """A one-trajectory replay workload compiled the way the manifest compiler does."""
    n = len(prompts)
    reset = np.zeros(n, dtype=bool)
    reset[list(resets)] = True
    overhead, content = [], []
    for i, prompt in enumerate(prompts):
        if i == 0 or reset[i]:
            overhead.append(initial)
        else:
            overhead.append(overhead[-1] + turn)
        content.append(prompt - overhead[-1])
    environment = [0] * n
    for i in range(n - 1):
        if not reset[i + 1]:
            environment[i] = content[i + 1] - content[i] - outputs[i]
    return Workload(
        mode="trajectory_replay",
        trajectory_ids=["t"],
        request_offsets=np.array([0, n]),
        input_content_tokens=np.array(content),
        output_tokens=np.array(outputs),
        environment_tokens=np.array(environment),
        target_prompt_tokens=np.array(prompts),
        tool_call_latency_ms=np.zeros(n),
        reset_before=reset,
    )


# --- sizing -------------------------------------------------------------------------------


def test_replay_sizing_pays_back_served_drift_and_reply_difference():
    work = replay([100, 150, 260], [20, 30, 5], initial=5, turn=10)
    framing = Framing(5, 10)
    sizer = TrajectorySizer(work, 0, framing, correct=True)
    assert sizer.fresh(0) == Sizing(95, 100, 0)
    # Planned environment after request 1: 150 - 10 - 100 - 20 = 20 tokens. The server
    # counted 102 (2 more than planned) and the reply renders as 18 tokens, not 20.
    assert work.environment_tokens.tolist() == [20, 70, 0]
    assert sizer.appended(0, served=102, rendered=18) == Sizing(20, 150, 0)
    assert sizer.appended(1, served=149, rendered=33) == Sizing(68, 260, -2)


def test_sizing_without_correction_sends_the_plan():
    work = replay([100, 150], [20, 30], initial=5, turn=10)
    sizer = TrajectorySizer(work, 0, Framing(5, 10, learn=False), correct=False)
    assert sizer.fresh(0) == Sizing(95, 100)
    assert sizer.appended(0, served=140, rendered=None) == Sizing(20, 150)


def test_sizing_uses_learned_framing_for_fresh_requests_and_reports_when_it_cannot():
    work = replay([100, 150, 40], [20, 30, 5], resets=[2], initial=5, turn=10)
    framing = Framing(5, 10)
    framing.observe_initial(9)
    sizer = TrajectorySizer(work, 0, framing, correct=True)
    assert sizer.fresh(0) == Sizing(91, 100, -4)
    assert sizer.fresh(2) == Sizing(31, 40, -4)
    short = replay([8], [2], initial=5)
    framing.observe_initial(9)
    limited = TrajectorySizer(short, 0, framing, correct=True).fresh(0)
    assert (limited.tokens, limited.target, limited.correction) == (1, 8, -2)
    assert limited.note == (
        "the framing (9 tokens) leaves no room for content in a 8-token prompt; sent 1 token"
    )
    grow = TrajectorySizer(work, 0, framing, correct=True)
    grow.fresh(0)
    stuck = grow.appended(0, served=170, rendered=20)
    assert (stuck.tokens, stuck.correction) == (0, -20)
    assert stuck.note == (
        "the tool result would need -50 tokens to reach 150 after a 170-token prompt and a "
        "20-token reply; sent 0"
    )


def test_sampled_targets_are_content_plus_the_framing_estimate():
    work = replay([64, 128, 200], [16, 16, 16])
    work = Workload(**{**work.__dict__, "mode": "synthetic"})
    framing = Framing(9, 35)
    sizer = TrajectorySizer(work, 0, framing, correct=True)
    assert sizer.fresh(0) == Sizing(64, 73)
    # Target of request 2: content 128 + 9 + 35. The plan's environment is 128 - 64 - 16 = 48
    # tokens; the reply renders as 17 tokens instead of 16, so the tool result gets 47.
    assert sizer.appended(0, served=73, rendered=17) == Sizing(47, 172, -1)


def test_resized_moves_content_by_the_server_count():
    work = replay([100, 150], [20, 30], initial=5, turn=10)
    sizer = TrajectorySizer(work, 0, Framing(5, 10), correct=True)
    first = sizer.fresh(0)
    assert sizer.resized(first, counted=103) == Sizing(92, 100, -3)
    low = sizer.resized(first, counted=300)
    assert (low.tokens, low.note) == (
        1,
        "the server counts 300 tokens with 95 of content; the 100-token target needs -105; sent 1",
    )
    after = sizer.appended(0, served=100, rendered=20)
    assert sizer.resized(after, counted=148) == Sizing(22, 150, 2)


def test_framing_estimate_is_the_most_frequent_observation():
    framing = Framing(5, 10)
    assert (framing.initial, framing.turn) == (5, 10)
    for value in (9, 9, 8):
        framing.observe_initial(value)
    framing.observe_turn(12)
    assert (framing.initial, framing.turn) == (9, 12)
    assert framing.learned() == {
        "initial_overhead_tokens": 9,
        "turn_overhead_tokens": 12,
        "initial_observations": {"8": 1, "9": 2},
        "turn_observations": {"12": 1},
    }
    frozen = Framing(5, 10, learn=False)
    frozen.observe_initial(9)
    assert frozen.initial == 5


# --- replies in context -------------------------------------------------------------------


class FakeTemplate:
    """ChatML-like rendering with a Qwen-style "\\n\\n" after assistant content."""

    markers = frozenset({"<|im_start|>", "<|im_end|>", "<tool_call>"})

    def render(self, messages, add_generation_prompt=True, tools=None):
        out = []
        for message in messages:
            body = f"<|im_start|>{message['role']}\n{message['content']}"
            if message.get("tool_calls"):
                body += "\n\n<tool_call>call</tool_call>"
            out.append(body + "<|im_end|>\n")
        return "".join(out) + ("<|im_start|>assistant\n" if add_generation_prompt else "")


def test_reply_forms_reach_the_nearest_marker(packaged):
    accounting = ReplyAccounting.build(packaged("qwen3"), FakeTemplate(), "call_1")
    assert accounting.forms[REFERENCE_SHAPE].pieces == ("assistant\n", "\n\n")
    # The fake template drops reasoning: a thinking reply has the plain reply's form.
    assert accounting.forms[(True, True)].pieces == ("assistant\n", "\n\n")
    assert accounting.forms[(True, True)].holes == ("content",)


def test_reply_counter_charges_merges_with_the_template_text(packaged):
    qwen = packaged("qwen3")
    plain = ReplyAccounting.build(qwen)
    counter = ReplyAccounting.build(qwen, FakeTemplate(), "call_1")
    encode = qwen.tokenizer.encode
    # "Done." alone is 2 tokens; before "\n\n" its "." joins the newlines (".\n\n").
    assert len(encode("Done.", add_special_tokens=False).ids) == 2
    assert plain.count("Done.") == 2
    assert counter.count("Done.") == 1
    assert counter.count("Done") == 1
    # Empty, the template renders "assistant\n\n\n": one token less than around a text.
    empty = (
        len(encode("assistant\n\n\n", add_special_tokens=False).ids)
        - len(encode("assistant\n", add_special_tokens=False).ids)
        - len(encode("\n\n", add_special_tokens=False).ids)
    )
    assert counter.count("") == counter.count(None) == empty
    assert counter.count_many([("Done.", None), ("Done", None), ("", None)]) == [1, 1, empty]
    assert trimmed("  Done.\n") == "Done." and trimmed(None) is None


# --- content salt -------------------------------------------------------------------------


def test_content_salt_changes_text_but_not_sizes(deepseek):
    synth = Synthesizer.prepare(deepseek)
    work = replay([100, 150], [20, 30])
    one = ContentFactory(synth, work, 7, "a")
    again = ContentFactory(synth, work, 7, "a")
    other = ContentFactory(synth, work, 7, "b")
    assert one.initial_prompt(0) == again.initial_prompt(0)
    assert one.initial_prompt(0) != other.initial_prompt(0)
    assert deepseek.count(other.initial_prompt(0)) == deepseek.count(one.initial_prompt(0)) == 100
    assert one.environment(0, 0, 12) != other.environment(0, 0, 12)
    # Nearby salts and agents never share a stream root.
    roots = {content_root(7, str(salt)) for salt in range(200)}
    assert len(roots) == 200
    assert content_root(7, "x") == content_root(7, "x") != content_root(8, "x")


# --- the prompt oracle --------------------------------------------------------------------


def run(coroutine):
    return asyncio.run(coroutine)


async def _oracle(url: str) -> tuple[str, int, int]:
    async with aiohttp.ClientSession() as session:
        oracle = PromptOracle(session, server_root(url + "/v1/chat/completions"), {})
        protocol = await oracle.detect()
        conversation = Conversation("m")
        conversation.reset("hello there")
        count = await oracle.count(conversation.tokenize_body())
        return protocol, count, oracle.queries


def test_oracle_detects_vllm_style_tokenize_on_the_simulator():
    with SimProcess(sim_command("deepseek-v3", None, "--speed 0")) as sim:
        protocol, count, queries = run(_oracle(sim.url))
    assert protocol == "vllm"
    # ChatML: <|im_start|>user\n + "hello there" + <|im_end|>\n + <|im_start|>assistant\n
    assert count == 9 + 2 and queries == 1


def test_oracle_speaks_llama_cpp_apply_template_and_tokenize():
    def handler(recorded):
        body = recorded.json()
        if recorded.path == "/apply-template":
            text = "".join(f"<{m['role']}>{m['content']}" for m in body["messages"])
            return {"prompt": text}
        if recorded.path == "/tokenize" and "content" in body:
            assert body["add_special"] is True and body["parse_special"] is True
            return {"tokens": list(range(len(body["content"].split()) + 1))}
        return Reply(404, "not found")

    with StubServer(handler=handler) as stub:
        protocol, count, _ = run(_oracle(stub.url))
    assert protocol == "llamacpp"
    assert count == 3  # "<user>hello there" is 2 words, plus the BOS the stub adds


def test_oracle_refuses_a_server_that_counts_nothing():
    with (
        StubServer(handler=lambda recorded: Reply(404, "no")) as stub,
        pytest.raises(
            OracleError, match=r"counts no conversations \(neither vLLM's POST /tokenize"
        ),
    ):
        run(_oracle(stub.url))


# --- calibration --------------------------------------------------------------------------


async def _calibrate(url: str, synth, replies, stream: bool = False) -> Calibration:
    async with aiohttp.ClientSession() as session:
        return await calibrate(
            session,
            url + "/v1/chat/completions",
            {"content-type": "application/json"},
            BodyOptions(model="m", stream=stream),
            synth,
            replies,
        )


@pytest.mark.parametrize("stream", [False, True])
def test_calibration_on_the_simulator_finds_its_chatml_overheads(deepseek, stream):
    synth = Synthesizer.prepare(deepseek)
    with SimProcess(sim_command("deepseek-v3", None, "--speed 0")) as sim:
        calibration = run(_calibrate(sim.url, synth, ReplyAccounting.build(deepseek), stream))
    assert (calibration.initial, calibration.turn) == (9, 35)
    assert calibration.consistent and calibration.check_ok
    assert calibration.initial_seen == (9, 9, 9) and calibration.turn_seen == (35, 35, 35)
    assert calibration.check_planned == calibration.check_served
    assert calibration.check_planned[0] == 50 + 9
    lines = calibration.lines("http://sim")
    assert lines[-1] == "flags: --replay-initial-overhead-tokens 9 --replay-turn-overhead-tokens 35"
    assert lines[-2].endswith("-> OK")


def test_calibration_without_usage_is_a_clear_error(deepseek):
    synth = Synthesizer.prepare(deepseek)
    with (
        StubServer(handler=lambda r: chat_completion(usage=None)) as stub,
        pytest.raises(
            CalibrationError,
            match=r"^calibration needs usage\.prompt_tokens in every response, and .* sent none "
            r"\(response missing usage field\)$",
        ),
    ):
        run(_calibrate(stub.url, synth, ReplyAccounting.build(deepseek)))


def test_calibration_does_not_retry_a_client_error(deepseek):
    synth = Synthesizer.prepare(deepseek)
    with StubServer(handler=lambda r: Reply(404, "no such model")) as stub:
        with pytest.raises(
            CalibrationError,
            match=r"^calibration probe failed: request failed \(404 Not Found\) no such model$",
        ):
            run(_calibrate(stub.url, synth, ReplyAccounting.build(deepseek)))
        assert len(stub.requests) == 1


def test_calibrate_command_prints_flags_and_json(tmp_path: Path, capsys):
    from batchbench.cli.main import run as cli

    assert cli(["calibrate", "--sim", "--sim-args", "--speed 0", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["initial_overhead_tokens"] == 9
    assert document["turn_overhead_tokens"] == 35
    assert document["check_ok"] is True and document["chat_template"] == "chatml"
    assert cli(["calibrate", "--host", "http://", "--tokenizer-model", "deepseek-v3"]) == 2
    assert cli(["calibrate", "--sim-args", "x"]) == 2


# --- reports -------------------------------------------------------------------------------


def test_fidelity_is_not_measurable_when_the_server_sends_no_usage(tmp_path, capsys):
    from batchbench.cli.agent import main

    plans = tmp_path / "p.jsonl"
    plans.write_text(
        '{"schema_version":1,"trajectory_id":"t","requests":[{"prompt_tokens":40,"output_tokens":4}]}\n'
    )
    with StubServer(handler=lambda r: chat_completion(usage=None)) as stub:
        status = main(
            [
                "--host", stub.url, "--agent-plans-jsonl", str(plans), "--tokenizer-model",
                "deepseek-v3", "--no-progress", "--retry-delay-ms", "0", "--model", "m",
                "--no-preflight", "--no-stream", "--no-calibrate",
            ]
        )  # fmt: skip
    out = capsys.readouterr().out.splitlines()
    assert status == 3  # every request failed
    assert "Prompt fidelity: not measurable (server sent no usage)" in out
    assert "Output fidelity: not measurable (server sent no usage)" in out


# --- review follow-ups ---------------------------------------------------------------------


def test_reasoning_counts_where_the_template_renders_it(tmp_path):
    import test_chat_templates as templates

    from batchbench.text.chat_templates import load_chat_template
    from batchbench.text.tokenizer import LoadedTokenizer

    qwen = templates.model_dir(tmp_path, "qwen-3.5", "qwen-3.5")
    accounting = ReplyAccounting.build(qwen, load_chat_template("tokenizer", qwen), "call_1")
    # Qwen3.5 renders reasoning after the last query: its text and <think> framing count.
    plain = accounting.count("Done.")
    assert accounting.count("Done.", "Let me think about it.") > plain + 4
    chatml = load_chat_template("chatml", qwen)
    dropped = ReplyAccounting.build(qwen, chatml, "call_1")
    assert dropped.forms[(True, True)].holes == ("content",)
    assert dropped.count("Done.", "Let me think about it.") == dropped.count("Done.")
    assert isinstance(qwen, LoadedTokenizer)


def test_measured_framing_outweighs_one_odd_observation():
    framing = Framing(9, 10, measured=True)
    framing.observe_turn(14)
    assert framing.turn == 10
    framing.observe_turn(14)
    framing.observe_turn(14)
    assert framing.turn == 14
    guessed = Framing(0, 0)
    guessed.observe_turn(14)
    assert guessed.turn == 14


def test_calibration_retries_a_malformed_body(deepseek):
    synth = Synthesizer.prepare(deepseek)
    with SimProcess(sim_command("deepseek-v3", None, "--speed 0")) as sim:
        real = sim.url
        with StubServer() as stub:
            import urllib.request

            def forward(recorded):
                if recorded.index == 0:
                    return Reply(200, "{not json")
                request = urllib.request.Request(
                    real + recorded.path, data=recorded.body,
                    headers={"content-type": "application/json"},
                )  # fmt: skip
                with urllib.request.urlopen(request) as response:
                    return json.loads(response.read())

            stub.handler = forward
            calibration = run(_calibrate(stub.url, synth, ReplyAccounting.build(deepseek)))
    assert (calibration.initial, calibration.turn) == (9, 35) and calibration.check_ok


def test_sim_rejects_a_template_file_and_two_templates(tmp_path, capsys):
    from batchbench.agent import run_console

    plans = tmp_path / "p.jsonl"
    plans.write_text(
        '{"schema_version":1,"trajectory_id":"t","requests":[{"prompt_tokens":40,"output_tokens":4}]}\n'
    )
    base = ["--agent-plans-jsonl", str(plans), "--sim"]
    assert run_console([*base, "--chat-template", str(tmp_path / "t.jinja")], "x") == 2
    assert "with --sim, --chat-template must be chatml, gemma, llama3, qwen3 or tokenizer" in (
        capsys.readouterr().err
    )
    both = [*base, "--chat-template", "gemma", "--sim-args", "--chat-template llama3"]
    assert run_console(both, "x") == 2
    assert run_console([*base[:2], "--dry-run", "--prompt-oracle", "server"], "x") == 2


def test_unreadable_templates_and_cache_files_are_one_line_errors(tmp_path, deepseek):
    from batchbench.text import synth as synth_module
    from batchbench.text.chat_templates import TemplateError, load_chat_template

    binary = tmp_path / "bin.jinja"
    binary.write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(TemplateError, match=r"^cannot read .*bin\.jinja"):
        load_chat_template(str(binary), deepseek)
    cache = tmp_path / "table.json"
    cache.write_text("[1, 2]")
    assert synth_module._read_table(str(cache)) is None


def test_an_atypical_turn_stands_in_only_until_a_typical_one_is_seen():
    framing = Framing(9, 0)
    framing.observe_turn(32, typical=False)
    assert framing.turn == 32 and framing.learned()["turn_observations"] == {}
    framing.observe_turn(33)
    assert framing.turn == 33
    framing.observe_turn(32, typical=False)
    assert framing.turn == 33 and framing.learned()["turn_observations"] == {"33": 1}
    frozen = Framing(9, 10, learn=False)
    frozen.observe_turn(32, typical=False)
    assert frozen.turn == 10
