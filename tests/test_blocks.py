"""Block plans (schema v2 with blocks), unit by unit, with exact values.

Seeded block text, the JSON-wrapped tool blocks, the assembly of a request from its blocks,
live blocks and their fallbacks, the prompt correction's absorbing block, the compiled
workload (block sums, timings, overheads, warnings) and the body fields of a request.
The tokenizer is the built-in DeepSeek-V3 one.
"""

from __future__ import annotations

import hashlib
import re

import orjson
import pytest

from batchbench.drive.blocks import (
    BlockFraming,
    LiveFill,
    TrajectoryBlocks,
    assemble,
    build_messages,
    prepare_blocks,
)
from batchbench.drive.wire import BodyOptions, body_fields, body_tail
from batchbench.plan.manifest import BLOCK_ROLES, parse_manifest
from batchbench.plan.workload import compile_manifest
from batchbench.text.blocks import (
    ROLE_ASSISTANT,
    ROLE_SYSTEM,
    ROLE_TOOL,
    ROLE_TOOL_CALL,
    ROLE_TOOL_DEFINITION,
    ROLE_USER,
    BlockText,
    BlockTexts,
    call_arguments,
    call_id,
    function_name,
    seed_value,
    tool_entry,
)
from batchbench.text.synth import Synthesizer

FN_RE = re.compile(r"^fn_[0-9a-f]{12}$")
CALL_RE = re.compile(r"^call_[0-9a-f]{24}$")


# ---------------------------------------------------------------------------------------
# Helpers


@pytest.fixture(scope="module")
def synth(deepseek) -> Synthesizer:
    return Synthesizer.prepare(deepseek)


@pytest.fixture
def texts(synth) -> BlockTexts:
    return BlockTexts(synth)


def count(deepseek, text: str) -> int:
    return len(deepseek.tokenizer.encode(text, add_special_tokens=False).ids)


def sha(seed: str) -> str:
    return hashlib.sha256(seed.encode("utf-8")).hexdigest()


def blk(seed: str, tokens: int, role: str, live: bool | None = None) -> dict:
    block = {"seed": seed, "tokens": tokens, "role": role}
    if live is not None:
        block["live"] = live
    return block


def req(prompt: int, output: int, blocks: list[dict] | None = None, **extra) -> dict:
    request = {"prompt_tokens": prompt, "output_tokens": output, **extra}
    if blocks is not None:
        request["blocks"] = blocks
    return request


def traj(ident: str, *requests: dict, **extra) -> dict:
    return {"schema_version": 2, "trajectory_id": ident, "requests": list(requests), **extra}


def manifest_of(*lines: dict):
    data = b"\n".join(orjson.dumps(line) for line in lines) + b"\n"
    return parse_manifest(data, "plans.jsonl")


def workload_of(*lines: dict, **options):
    return compile_manifest(manifest_of(*lines), **options)


def auto_prompt(blocks: list[dict], overhead: int = 0) -> int:
    """The prompt that matches the blocks exactly (no mismatch warning)."""
    return sum(block["tokens"] for block in blocks) + overhead


def rows_by_seed(work, request: int) -> dict[str, int]:
    plan = work.blocks
    return {plan.seeds[int(plan.seed[row])]: row for row in plan.of(request)}


def seed_index(work, seed: str) -> int:
    return work.blocks.seeds.index(seed)


# ---------------------------------------------------------------------------------------
# Seeds, names and ids


@pytest.mark.parametrize("seed", ["abc", "tools/editor-shell-v1", "ünïcode ✓", "3f1c9a0b5d7e2c44"])
def test_seed_value_is_the_first_eight_sha256_bytes_little_endian(seed):
    digest = hashlib.sha256(seed.encode("utf-8")).digest()
    assert seed_value(seed) == int.from_bytes(digest[:8], "little")
    assert 0 <= seed_value(seed) < 2**64


def test_seed_value_of_abc_exactly():
    # sha256(b"abc") = ba7816bf 8f01cfea ...: its first 8 bytes read little-endian.
    assert seed_value("abc") == int.from_bytes(hashlib.sha256(b"abc").digest()[:8], "little")
    assert seed_value("abc") == 0xEACF018FBF1678BA


def test_function_names_and_call_ids_are_sha256_hex_prefixes():
    assert function_name("abc") == "fn_ba7816bf8f01"
    assert call_id("abc") == "call_ba7816bf8f01cfea414140de"
    for seed in ("a", "session-a/call-1", "tools/editor-shell-v1"):
        assert FN_RE.match(function_name(seed))
        assert CALL_RE.match(call_id(seed))
        assert function_name(seed) == "fn_" + sha(seed)[:12]
        assert call_id(seed) == "call_" + sha(seed)[:24]
    assert function_name("a") != function_name("b") and call_id("a") != call_id("b")


# ---------------------------------------------------------------------------------------
# Block text


@pytest.mark.parametrize("role", [ROLE_SYSTEM, ROLE_USER, ROLE_ASSISTANT, ROLE_TOOL])
@pytest.mark.parametrize("tokens", [1, 7, 40, 420])
def test_plain_blocks_re_encode_to_exactly_their_tokens(deepseek, texts, role, tokens):
    made = texts.make("plain/seed", tokens, role)
    assert isinstance(made, BlockText)
    assert (made.tokens, made.exact) == (tokens, True)
    assert count(deepseek, made.text) == tokens
    # The text of a plain block is the synthesizer's text of the seed's stream.
    assert made.text == texts.synth.text(tokens, seed_value("plain/seed"))


def test_equal_seed_tokens_and_role_give_identical_text(synth):
    first, second = BlockTexts(synth), BlockTexts(synth)
    for role in range(len(BLOCK_ROLES)):
        a = first.make("same/seed", 64, role)
        assert first.make("same/seed", 64, role) == a  # across calls
        assert second.make("same/seed", 64, role) == a  # across instances
        assert second.make("same/seed", 64, role, shared=True) == a  # shared or not
        # A shared seed is made once per run and kept.
        assert second.make("same/seed", 64, role, shared=True) is second.make(
            "same/seed", 64, role, shared=True
        )


def test_different_seeds_give_different_text(texts):
    for role in range(len(BLOCK_ROLES)):
        assert texts.make("seed-one", 40, role).text != texts.make("seed-two", 40, role).text


@pytest.mark.parametrize("role", [ROLE_SYSTEM, ROLE_USER, ROLE_ASSISTANT, ROLE_TOOL])
def test_zero_token_plain_block_is_empty(texts, role):
    assert texts.make("empty", 0, role) == BlockText("", 0, True)


@pytest.mark.parametrize("tokens", [5, 12, 40, 250])
def test_tool_call_text_is_the_arguments_json_with_the_planned_count(deepseek, texts, tokens):
    made = texts.make("session-a/call-1", tokens, ROLE_TOOL_CALL)
    assert made.text.startswith('{"input":"') and made.text.endswith('"}')
    inner = orjson.loads(made.text)
    assert list(inner) == ["input"] and inner["input"]
    assert made.text == call_arguments(inner["input"])  # compact, as sent
    assert (made.tokens, made.exact) == (tokens, True)
    assert count(deepseek, made.text) == tokens


def test_a_tool_calls_first_size_tried_is_exact(deepseek, texts, monkeypatch):
    """The call's JSON scaffold is measured around texts (4 tokens on DeepSeek-V3, where
    the empty arguments `{"input":""}` take 5), so sizing a call encodes its JSON once."""
    texts.make("warm-up", 20, ROLE_TOOL_CALL)  # the one-time checks and the scaffold
    assert texts._call_scaffold == 4 and count(deepseek, call_arguments("")) == 5
    encoded: list[str] = []
    counter = texts._count
    monkeypatch.setattr(texts, "_count", lambda text: encoded.append(text) or counter(text))
    for index, tokens in enumerate((6, 12, 30, 250)):
        made = texts.make(f"session-b/call-{index}", tokens, ROLE_TOOL_CALL)
        assert (made.tokens, made.exact) == (tokens, True)
    assert len(encoded) == 4


@pytest.mark.parametrize("tokens", [40, 200, 600])
def test_tool_definition_counts_the_whole_compact_tools_entry(deepseek, texts, tokens):
    seed = "tools/editor-shell-v1"
    made = texts.make(seed, tokens, ROLE_TOOL_DEFINITION)
    assert (made.tokens, made.exact) == (tokens, True)
    entry = tool_entry(seed, made.text)
    assert entry == {
        "type": "function",
        "function": {
            "name": function_name(seed),
            "description": made.text,
            "parameters": {"type": "object", "properties": {}},
        },
    }
    assert count(deepseek, orjson.dumps(entry).decode()) == tokens
    # The description is JSON-safe: serializing it escapes nothing.
    assert orjson.dumps(made.text).decode() == '"' + made.text + '"'


@pytest.mark.parametrize(
    ("role", "tokens"),
    [
        (ROLE_TOOL_DEFINITION, 0),
        (ROLE_TOOL_DEFINITION, 3),
        (ROLE_TOOL_CALL, 0),
        (ROLE_TOOL_CALL, 2),
    ],
)
def test_tool_block_below_its_scaffold_is_non_empty_and_inexact(deepseek, texts, role, tokens):
    made = texts.make("tiny", tokens, role)
    assert made.exact is False
    assert made.tokens > tokens
    if role == ROLE_TOOL_DEFINITION:
        assert made.text != ""
        wrapped = orjson.dumps(tool_entry("tiny", made.text)).decode()
    else:
        assert orjson.loads(made.text)["input"] != ""
        wrapped = made.text
    assert count(deepseek, wrapped) == made.tokens  # the count is the one really sent


# ---------------------------------------------------------------------------------------
# Assembly


ASSEMBLY_BLOCKS = [
    blk("tools/editor", 40, "tool_definition"),
    blk("prompt/system", 30, "system"),
    blk("t/task", 20, "user"),
    blk("t/reply-1", 15, "assistant", live=True),
    blk("t/call-1", 12, "tool_call"),
    blk("t/result-1", 25, "tool"),
    blk("t/call-2", 10, "tool_call"),
    blk("t/result-2", 18, "tool"),
    blk("t/final", 8, "assistant"),
]


def test_assembly_of_tools_messages_calls_and_answers(deepseek, texts):
    blocks = ASSEMBLY_BLOCKS
    work = workload_of(traj("t", req(auto_prompt(blocks), 10, blocks)))
    state = TrajectoryBlocks(work.blocks)
    reply = {"role": "assistant", "content": "the first reply", "reasoning_content": "why"}
    kept = dict(reply)
    state.keep_reply(kept, 4)
    sizing = prepare_blocks(state, 0, texts, auto_prompt(blocks), 0, None)
    assert (sizing.target, sizing.planned, sizing.correction, sizing.note) == (178, 178, 0, None)
    assert state.fallbacks == 0  # the live block took the kept reply
    messages, tools = build_messages(state, 0)

    def text(seed: str, tokens: int, role: int) -> str:
        return texts.make(seed, tokens, role).text

    call_1 = {
        "id": "call_" + sha("t/call-1")[:24],
        "type": "function",
        "function": {
            "name": "fn_" + sha("t/call-1")[:12],
            "arguments": text("t/call-1", 12, ROLE_TOOL_CALL),
        },
    }
    call_2 = {
        "id": "call_" + sha("t/call-2")[:24],
        "type": "function",
        "function": {
            "name": "fn_" + sha("t/call-2")[:12],
            "arguments": text("t/call-2", 10, ROLE_TOOL_CALL),
        },
    }
    assert len(tools) == 1
    assert tools[0]["function"]["name"] == "fn_" + sha("tools/editor")[:12]
    assert tools == [tool_entry("tools/editor", text("tools/editor", 40, ROLE_TOOL_DEFINITION))]
    assert [m["role"] for m in messages] == [
        "system", "user", "assistant", "tool", "assistant", "tool", "assistant",
    ]  # fmt: skip
    assert messages == [
        {"role": "system", "content": text("prompt/system", 30, ROLE_SYSTEM)},
        {"role": "user", "content": text("t/task", 20, ROLE_USER)},
        # The first call hangs on the live block's message: the reply itself.
        {**reply, "tool_calls": [call_1]},
        {
            "role": "tool",
            "tool_call_id": call_1["id"],
            "content": text("t/result-1", 25, ROLE_TOOL),
        },
        # The second call follows a tool message: a new envelope without content.
        {"role": "assistant", "content": None, "tool_calls": [call_2]},
        {
            "role": "tool",
            "tool_call_id": call_2["id"],
            "content": text("t/result-2", 18, ROLE_TOOL),
        },
        {"role": "assistant", "content": text("t/final", 8, ROLE_ASSISTANT)},
    ]
    # Attaching the call changed neither the kept reply nor the cached live fill.
    assert kept == reply and "tool_calls" not in kept
    filled = state.cache[seed_index(work, "t/reply-1")]
    assert isinstance(filled, LiveFill) and filled.message == reply and filled.tokens == 4
    # A second assembly of the same request gives the same bytes (nothing accumulated).
    assert build_messages(state, 0) == (messages, tools)
    head, n_messages = assemble(state, 0, "m")
    assert n_messages == 7
    body = orjson.loads(head + b"," + body_fields(BodyOptions(model="m"), 10, None))
    assert list(body) == ["model", "messages", "tools", "max_tokens", "min_tokens"]
    assert (body["messages"], body["tools"]) == (messages, tools)


def test_tool_answers_take_pending_call_ids_in_fifo_order(texts):
    blocks = [
        blk("u/task", 10, "user"),
        blk("u/call-a", 8, "tool_call"),
        blk("u/call-b", 8, "tool_call"),
        blk("u/result-a", 6, "tool"),
        blk("u/result-b", 6, "tool"),
        blk("u/orphan", 6, "tool"),
    ]
    work = workload_of(traj("u", req(auto_prompt(blocks), 5, blocks)))
    state = TrajectoryBlocks(work.blocks)
    prepare_blocks(state, 0, texts, 0, 0, None)
    messages, tools = build_messages(state, 0)
    assert tools == []
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "tool", "tool"]
    # Both calls share one envelope (the last message was already an assistant one).
    envelope = messages[1]
    assert envelope["content"] is None
    assert [c["id"] for c in envelope["tool_calls"]] == [call_id("u/call-a"), call_id("u/call-b")]
    assert [m["tool_call_id"] for m in messages[2:]] == [
        call_id("u/call-a"),  # oldest pending first
        call_id("u/call-b"),
        call_id("u/orphan"),  # nothing pending: the block's own seed names the call
    ]
    head, _ = assemble(state, 0, "m")
    assert b'"tools"' not in head  # no tool definition, no tools key


# ---------------------------------------------------------------------------------------
# Live blocks


def live_plan():
    """Three requests of one trajectory; request 3 holds two live blocks not sent before."""
    r1 = [
        blk("sys", 20, "system"),
        blk("task", 10, "user"),
        blk("reply-1", 15, "assistant", live=True),
    ]
    r2 = [*r1, blk("question-2", 8, "user"), blk("reply-2", 12, "assistant", live=True)]
    r3 = [
        *r2,
        blk("question-3", 9, "user"),
        blk("reply-3", 11, "assistant", live=True),
        blk("reply-4", 7, "assistant", live=True),
    ]
    return workload_of(
        traj(
            "t",
            req(auto_prompt(r1), 5, r1),
            req(auto_prompt(r2), 5, r2),
            req(auto_prompt(r3), 5, r3),
        )
    )


def test_live_block_without_a_reply_falls_back_to_its_seed(texts):
    work = live_plan()
    state = TrajectoryBlocks(work.blocks)
    prepare_blocks(state, 0, texts, 0, 0, None)
    assert state.fallbacks == 1
    fallback = state.cache[seed_index(work, "reply-1")]
    assert fallback == texts.make("reply-1", 15, ROLE_ASSISTANT)
    messages, _ = build_messages(state, 0)
    assert messages[-1] == {"role": "assistant", "content": fallback.text}


def test_kept_reply_fills_the_next_live_block_once(texts):
    work = live_plan()
    state = TrajectoryBlocks(work.blocks)
    prepare_blocks(state, 0, texts, 0, 0, None)
    state.fallbacks = 0
    first_messages, _ = build_messages(state, 0)
    first_cache = dict(state.cache)

    reply_1 = {"role": "assistant", "content": "reply one"}
    state.keep_reply(reply_1, 3)
    state.fill_live(1, texts)
    # reply-1 is cached (sent as its fallback); reply-2 takes the kept reply.
    assert state.fallbacks == 0 and state.reply is None
    assert state.cache[seed_index(work, "reply-2")] == LiveFill(reply_1, 3)
    rows = rows_by_seed(work, 1)
    assert state.missing(1) == [rows["question-2"]]  # the only block still to make
    prepare_blocks(state, 1, texts, 0, 0, None)
    assert state.fallbacks == 0
    for seed, filled in first_cache.items():
        assert state.cache[seed] is filled  # reused, not made again
    messages, _ = build_messages(state, 1)
    assert orjson.dumps(messages[:3]) == orjson.dumps(first_messages)  # byte-identical prefix
    assert messages[3:] == [
        {"role": "user", "content": texts.make("question-2", 8, ROLE_USER).text},
        reply_1,
    ]

    reply_2 = {"role": "assistant", "content": "reply two"}
    state.keep_reply(reply_2, 3)
    rows = rows_by_seed(work, 2)
    prepare_blocks(state, 2, texts, 0, 0, None)
    # Two uncached live blocks: the first takes the reply, the second falls back.
    assert state.fallbacks == 1
    assert state.cache[seed_index(work, "reply-3")] == LiveFill(reply_2, 3)
    assert state.cache[seed_index(work, "reply-4")] == texts.make("reply-4", 7, ROLE_ASSISTANT)
    messages, _ = build_messages(state, 2)
    assert messages[:5] == build_messages(state, 1)[0]
    assert messages[5:] == [
        {"role": "user", "content": texts.make("question-3", 9, ROLE_USER).text},
        reply_2,
        {"role": "assistant", "content": texts.make("reply-4", 7, ROLE_ASSISTANT).text},
    ]


def test_reset_forgets_the_cache_and_the_reply(texts):
    work = live_plan()
    state = TrajectoryBlocks(work.blocks)
    prepare_blocks(state, 0, texts, 0, 0, None)
    state.keep_reply({"role": "assistant", "content": "kept"}, 2)
    state.previous = (5, 0)
    state.reset()
    assert (state.cache, state.reply, state.reply_tokens, state.previous) == ({}, None, 0, None)
    rows = rows_by_seed(work, 1)
    assert state.missing(1) == [
        rows[s] for s in ("sys", "task", "reply-1", "question-2", "reply-2")
    ]
    prepare_blocks(state, 1, texts, 0, 0, None)
    assert state.fallbacks == 1 + 2  # request 1's, then both live blocks after the reset


def test_dry_run_preparation_resolves_no_live_block(texts):
    work = live_plan()
    state = TrajectoryBlocks(work.blocks)
    state.keep_reply({"role": "assistant", "content": "kept"}, 2)
    prepare_blocks(state, 0, texts, 0, 0, None, resolve_live=False)
    assert state.fallbacks == 0
    assert state.cache[seed_index(work, "reply-1")] == texts.make("reply-1", 15, ROLE_ASSISTANT)


# ---------------------------------------------------------------------------------------
# Prompt correction


def correction_plan():
    """Trajectory "t" shares its tool definition and system prompt with "u"."""
    shared = [blk("tools/shared", 40, "tool_definition"), blk("sys/shared", 30, "system")]
    t1 = [
        *shared,
        blk("t/task", 20, "user"),
        blk("t/note", 10, "user"),  # the last new, plain, unshared, non-live block used once
        blk("t/twice", 6, "tool"),  # used twice in the request: never absorbs
        blk("t/twice", 6, "tool"),
        blk("t/live", 8, "assistant", live=True),
    ]
    u1 = [*shared, blk("u/call", 9, "tool_call")]
    u2 = [*u1, blk("u/result", 12, "tool")]
    return workload_of(
        traj("t", req(auto_prompt(t1), 5, t1)),
        traj("u", req(auto_prompt(u1), 5, u1), req(auto_prompt(u2), 5, u2)),
    )


def known_framing(state: TrajectoryBlocks, request: int, framing: int) -> BlockFraming:
    estimator = BlockFraming()
    estimator.observe(state.shape(request), framing, 0)
    assert estimator.estimate(state.shape(request), 0, None) == framing
    return estimator


def others_of(texts, work) -> int:
    """What every block of trajectory t's request but the absorbing one costs as sent."""
    return (
        texts.make("tools/shared", 40, ROLE_TOOL_DEFINITION).tokens
        + 30
        + 20
        + 6
        + 6
        + 8  # the live block's fallback
    )


def test_shared_seeds_are_marked_in_the_plan():
    work = correction_plan()
    shared = {seed: bool(work.blocks.shared[i]) for i, seed in enumerate(work.blocks.seeds)}
    assert shared == {
        "tools/shared": True,
        "sys/shared": True,
        "t/task": False,
        "t/note": False,
        "t/twice": False,
        "t/live": False,
        "u/call": False,
        "u/result": False,
    }


def test_correction_resizes_only_the_absorbing_block(deepseek, texts):
    work = correction_plan()
    state = TrajectoryBlocks(work.blocks)
    framing = known_framing(state, 0, 7)
    others = others_of(texts, work)
    target = others + 7 + 25
    sizing = prepare_blocks(state, 0, texts, target, 0, framing)
    assert (sizing.target, sizing.planned, sizing.correction, sizing.note) == (
        target,
        120,
        15,
        None,
    )
    rows = rows_by_seed(work, 0)
    assert (
        state.absorbing_row(0, [rows[s] for s in ("t/task", "t/note", "t/twice")]) == rows["t/note"]
    )
    note = state.cache[seed_index(work, "t/note")]
    assert note.tokens == 25 and count(deepseek, note.text) == 25
    assert note.text == texts.synth.text(25, seed_value("t/note"))  # the seed's own stream
    # Everything else keeps its planned text, shared blocks above all.
    for seed, tokens, role in [
        ("tools/shared", 40, ROLE_TOOL_DEFINITION),
        ("sys/shared", 30, ROLE_SYSTEM),
        ("t/task", 20, ROLE_USER),
        ("t/twice", 6, ROLE_TOOL),
        ("t/live", 8, ROLE_ASSISTANT),
    ]:
        assert state.cache[seed_index(work, seed)] == texts.make(seed, tokens, role), seed
    assert state.content_tokens(0) == target - 7


def test_correction_at_the_planned_size_keeps_the_planned_text(texts):
    work = correction_plan()
    state = TrajectoryBlocks(work.blocks)
    framing = known_framing(state, 0, 7)
    sizing = prepare_blocks(state, 0, texts, others_of(texts, work) + 7 + 10, 0, framing)
    assert (sizing.correction, sizing.note) == (0, None)
    assert state.cache[seed_index(work, "t/note")] == texts.make("t/note", 10, ROLE_USER)


def test_negative_correction_sends_the_absorbing_block_empty(texts):
    work = correction_plan()
    state = TrajectoryBlocks(work.blocks)
    framing = known_framing(state, 0, 7)
    predicted = others_of(texts, work) + 7
    sizing = prepare_blocks(state, 0, texts, 100, 0, framing)
    assert sizing.correction == -10
    assert sizing.note == (
        f"the other blocks and the framing already cost {predicted} tokens of the "
        "100-token target; the absorbing block was sent empty"
    )
    assert state.cache[seed_index(work, "t/note")] == BlockText("", 0)
    messages, _ = build_messages(state, 0)
    assert {"role": "user", "content": ""} in messages


def test_no_absorbing_block_leaves_a_note(texts):
    work = correction_plan()
    u1, u2 = work.turns(1)
    state = TrajectoryBlocks(work.blocks)
    # Request 1 of "u": only shared blocks and a tool call are new.
    framing = known_framing(state, u1, 11)
    predicted = texts.make("tools/shared", 40, ROLE_TOOL_DEFINITION).tokens + 30
    predicted += texts.make("u/call", 9, ROLE_TOOL_CALL).tokens + 11
    sizing = prepare_blocks(state, u1, texts, predicted + 6, 0, framing)
    assert sizing.correction == 0
    assert sizing.note == (
        "no block can absorb a correction of 6 tokens (every new block is shared, live or a "
        "tool block)"
    )
    # Exactly on target: nothing to say.
    again = TrajectoryBlocks(work.blocks)
    assert prepare_blocks(again, u1, texts, predicted, 0, framing).note is None
    # Request 2: the new tool result absorbs, the cached blocks are reused as they were.
    framing.observe(state.shape(u2), 11, 0)
    sizing = prepare_blocks(state, u2, texts, predicted + 30, 0, framing)
    assert (sizing.correction, sizing.note) == (30 - 12, None)
    assert state.cache[seed_index(work, "u/result")].tokens == 30


# ---------------------------------------------------------------------------------------
# The compiled workload


def test_block_trajectory_content_is_the_block_sum():
    r1 = [blk("tools", 40, "tool_definition"), blk("sys", 30, "system"), blk("task", 20, "user")]
    r2 = [*r1, blk("reply", 15, "assistant", live=True), blk("next", 25, "user")]
    work = workload_of(
        traj("t", req(100, 10, r1, overhead_tokens=10), req(150, 12, r2, overhead_tokens=20))
    )
    assert work.input_content_tokens.tolist() == [90, 130]
    assert work.environment_tokens.tolist() == [0, 0]
    assert work.target_prompt_tokens.tolist() == [100, 150]
    assert work.overhead_tokens.tolist() == [10, 20]
    assert work.has_blocks(0) and work.warnings == ()
    plan = work.blocks
    assert [len(plan.of(r)) for r in work.turns(0)] == [3, 5]
    assert [BLOCK_ROLES[int(role)] for role in plan.role[plan.of(1).start : plan.of(1).stop]] == [
        "tool_definition", "system", "user", "assistant", "user",
    ]  # fmt: skip
    assert plan.live.tolist() == [False] * 3 + [False, False, False, True, False]


def test_scaled_start_and_delay_of_a_block_plan():
    r1 = [blk("sys", 20, "system"), blk("task", 4, "user")]
    r2 = [*r1, blk("reply", 6, "assistant", live=True), blk("next", 8, "user")]
    work = workload_of(
        traj(
            "t",
            req(30, 5, r1, overhead_tokens=6, delay_after_ms=200),
            req(44, 5, r2, overhead_tokens=6),
            start_after_ms=400,
        ),
        time_scale=2.0,
    )
    assert work.start_seconds.tolist() == [0.2]
    assert work.tool_call_latency_ms.tolist() == [100.0, 0.0]
    assert work.input_content_tokens.tolist() == [24, 38]
    assert work.target_prompt_tokens.tolist() == [30, 44]
    unscaled = workload_of(
        traj("t", req(30, 5, r1, overhead_tokens=6, delay_after_ms=200), start_after_ms=400)
    )
    assert unscaled.start_seconds.tolist() == [0.4]
    assert unscaled.tool_call_latency_ms.tolist() == [200.0]


def test_own_overhead_wins_over_the_globals():
    line = traj(
        "t",
        req(100, 10),
        req(150, 10),
        req(200, 10, overhead_tokens=7),
        req(250, 10),
        req(60, 10, reset_before=True),
    )
    assert workload_of(line, initial_overhead=5, turn_overhead=10).overhead_tokens.tolist() == [
        5, 15, 7, 17, 5,
    ]  # fmt: skip
    assert workload_of(line).overhead_tokens.tolist() == [0, 0, 7, 7, 0]
    work = workload_of(line, initial_overhead=5, turn_overhead=10)
    assert work.input_content_tokens.tolist() == [95, 135, 193, 233, 55]


def test_own_overhead_on_appended_requests_sets_contents_and_environment():
    work = workload_of(
        traj("t", req(100, 20), req(130, 10, overhead_tokens=10), req(170, 5, overhead_tokens=10)),
        initial_overhead=5,
    )
    assert work.input_content_tokens.tolist() == [95, 120, 160]
    assert work.environment_tokens.tolist() == [5, 30, 0]


def test_mismatch_warning_once_per_trajectory_for_its_first_mismatch():
    r1 = [blk("sys", 20, "system"), blk("task", 4, "user")]
    r2 = [*r1, blk("next", 8, "user")]
    work = workload_of(
        traj("ok", req(24, 5, r1), req(32, 5, r2)),
        traj("off", req(24, 5, r1), req(40, 5, r2, overhead_tokens=3), req(50, 5, r2)),
        traj("off-first", req(30, 5, r1), req(99, 5, r2)),
    )
    assert work.warnings == (
        'warning: trajectory "off" request 2: prompt_tokens 40 != sum(blocks.tokens) 32 + '
        "overhead_tokens 3; replaying the blocks as written",
        'warning: trajectory "off-first" request 1: prompt_tokens 30 != sum(blocks.tokens) 24 + '
        "overhead_tokens 0; replaying the blocks as written",
    )
    # Replayed as written: the content is the block sum whatever the prompt says.
    assert work.input_content_tokens.tolist() == [24, 32, 24, 32, 32, 24, 32]
    assert work.target_prompt_tokens.tolist() == [24, 32, 24, 40, 50, 30, 99]


def test_mismatch_counts_the_global_overheads():
    r1 = [blk("sys", 20, "system"), blk("task", 4, "user")]
    r2 = [*r1, blk("next", 8, "user")]
    line = traj("t", req(29, 5, r1), req(39, 5, r2))
    assert workload_of(line, initial_overhead=5, turn_overhead=2).warnings == ()
    assert workload_of(line).warnings == (
        'warning: trajectory "t" request 1: prompt_tokens 29 != sum(blocks.tokens) 24 + '
        "overhead_tokens 0; replaying the blocks as written",
    )


def test_seed_redefinition_warning():
    r1 = [blk("sys", 20, "system"), blk("task", 4, "user")]
    r2 = [blk("sys", 20, "system"), blk("task", 6, "user")]  # same seed, other size
    r3 = [blk("sys", 20, "user"), blk("task", 4, "user")]  # same seed, other role
    manifest = manifest_of(traj("t", req(24, 5, r1), req(26, 5, r2), req(24, 5, r3)))
    message = (
        'warning: trajectory "t" request 2: block seed "task" is redefined with different '
        "tokens or role; reusing its first content"
    )
    assert manifest.seed_redefinition_warnings() == [message]
    assert compile_manifest(manifest).warnings == (message,)


def test_redefinition_after_a_reset_is_a_new_first_use():
    r1 = [blk("sys", 20, "system"), blk("task", 4, "user")]
    r2 = [blk("sys", 20, "system"), blk("task", 6, "user")]
    manifest = manifest_of(traj("t", req(24, 5, r1), req(26, 5, r2, reset_before=True)))
    assert manifest.seed_redefinition_warnings() == []


def test_reset_on_the_first_request_is_accepted_and_shown_false():
    r1 = [blk("sys", 20, "system")]
    r2 = [blk("other", 12, "user")]
    work = workload_of(
        traj("t", req(20, 5, r1, reset_before=True), req(12, 5, r2, reset_before=True))
    )
    assert work.reset_before.tolist() == [False, True]
    assert work.input_content_tokens.tolist() == [20, 12]


def test_v2_columns_of_the_compiled_workload():
    r1 = [blk("sys", 20, "system")]
    work = workload_of(
        traj(
            "t",
            req(20, 8, r1, stream=True, max_tokens=32, recorded_start_after_ms=1234),
            req(20, 8, r1, stream=False),
            req(20, 8, r1),
        )
    )
    assert work.request_stream.tolist() == [1, 0, -1]
    assert work.request_max_tokens.tolist() == [32, 0, 0]
    assert work.recorded_start_after_ms.tolist() == [1234, -1, -1]
    assert work.start_seconds is None  # no trajectory sets start_after_ms
    plain = workload_of(traj("t", req(20, 8, r1)))
    assert (plain.request_stream, plain.request_max_tokens, plain.recorded_start_after_ms) == (
        None,
        None,
        None,
    )


# ---------------------------------------------------------------------------------------
# Body fields


def test_request_cap_and_stream_override_the_run():
    options = BodyOptions(model="m")
    assert body_fields(options, 8, None, 32, True) == (
        b'"max_tokens":32,"min_tokens":8,"stream":true,"stream_options":{"include_usage":true}}'
    )
    assert body_tail(options, 8, None, 32, True) == (
        b'],"max_tokens":32,"min_tokens":8,"stream":true,"stream_options":{"include_usage":true}}'
    )
    # A request's stream=false wins over a streaming run.
    assert body_fields(BodyOptions(model="m", stream=True), 8, None, None, False) == (
        b'"max_tokens":8,"min_tokens":8}'
    )
    # Unset: the run's setting and the planned output.
    assert body_fields(BodyOptions(model="m", stream=True), 8, "u") == (
        b'"max_tokens":8,"min_tokens":8,"stream":true,"stream_options":{"include_usage":true},'
        b'"user":"u"}'
    )


def test_sglang_cap_below_the_planned_output():
    options = BodyOptions(model="m", sglang=True)
    fields = body_fields(options, 8, None, 4, None)
    assert fields == b'"max_new_tokens":4,"min_new_tokens":4}'
    parsed = orjson.loads(b"{" + fields)
    assert parsed == {"max_new_tokens": 4, "min_new_tokens": 4}
    assert not {"stream", "tools", "max_tokens", "stream_options"} & set(parsed)


def test_block_request_body_with_tools_cap_and_stream(texts):
    blocks = [blk("tools/x", 40, "tool_definition"), blk("task", 12, "user")]
    work = workload_of(traj("t", req(52, 8, blocks, stream=True, max_tokens=32)))
    state = TrajectoryBlocks(work.blocks)
    prepare_blocks(state, 0, texts, 0, 0, None)
    head, _ = assemble(state, 0, "m")
    cap, stream = int(work.request_max_tokens[0]), bool(work.request_stream[0])
    body = orjson.loads(head + b"," + body_fields(BodyOptions(model="m"), 8, None, cap, stream))
    assert list(body) == [
        "model", "messages", "tools", "max_tokens", "min_tokens", "stream", "stream_options",
    ]  # fmt: skip
    assert (body["max_tokens"], body["min_tokens"], body["stream"]) == (32, 8, True)
    assert body["stream_options"] == {"include_usage": True}
    assert [tool["function"]["name"] for tool in body["tools"]] == [function_name("tools/x")]
