"""``batchbench record``'s blocks, keyed chains and cached token counts (deepseek-v3)."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import os
import stat

import pytest

from batchbench.errors import InputError
from batchbench.record.blocks import Block, chat_blocks, completion_blocks
from batchbench.record.chain import chain, principal, recording_key
from batchbench.record.counts import OFF_LOOP_CHARS, BlockCounter

# No compiled module serves this code, and the simulator's are covered elsewhere: the
# pure-twin pass would repeat it as is.
pytestmark = pytest.mark.native_pass_only

KEY = bytes(range(32))
OTHER_KEY = bytes(range(1, 33))

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
]
MESSAGES = [
    {"role": "system", "content": "You are a careful coding agent."},
    {"role": "developer", "content": "Prefer small diffs."},
    {
        "role": "user",
        "content": [
            {"type": "text", "text": "Open the config."},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
        ],
    },
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "read_file", "arguments": '{"path": "app.toml"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "port = 8080"},
    {"role": "assistant", "content": "The port is 8080.", "tool_calls": []},
    {"role": "user", "content": "Thanks"},
]
BODY = {"model": "m", "tools": TOOLS, "messages": MESSAGES}

EXPECTED_BLOCKS = [
    (
        "tool_definition",
        b'[{"function":{"name":"read_file","parameters":{"properties":{"path":{"type":"string"}},'
        b'"type":"object"}},"type":"function"}]',
    ),
    ("system", b"You are a careful coding agent."),
    ("system", b"Prefer small diffs."),
    ("user", b"Open the config."),
    ("user", b'{"image_url":{"url":"data:image/png;base64,AAAA"},"type":"image_url"}'),
    ("tool_call", b'{"arguments":"{\\"path\\": \\"app.toml\\"}","name":"read_file"}'),
    ("tool", b"port = 8080"),
    ("assistant", b"The port is 8080."),
    ("user", b"Thanks"),
]
# deepseek-v3, no special tokens, each block's text on its own.
EXPECTED_TOKENS = [32, 7, 6, 4, 23, 20, 5, 7, 1]


def test_chat_body_blocks_in_order_with_roles_and_canonical_bytes():
    blocks = chat_blocks(BODY)
    assert [(b.role, b.canonical) for b in blocks] == EXPECTED_BLOCKS
    assert all(b.text == b.canonical.decode() for b in blocks)


def test_same_content_spelled_differently_gives_the_same_blocks():
    """Key order, a one-part list for a string, a tool call's id: none changes a block."""
    respelled = {
        "tools": [
            {
                "function": {
                    "parameters": {"properties": {"path": {"type": "string"}}, "type": "object"},
                    "name": "read_file",
                },
                "type": "function",
            }
        ],
        "messages": [
            {
                "role": "system",
                "content": [{"type": "text", "text": "You are a careful coding agent."}],
            },
            MESSAGES[1],
            MESSAGES[2],
            {
                "role": "assistant",
                "tool_calls": [
                    {
                        "type": "function",
                        "id": "call_retry_9",
                        "function": {"arguments": '{"path": "app.toml"}', "name": "read_file"},
                    }
                ],
            },
            *MESSAGES[4:],
        ],
    }
    assert chat_blocks(respelled) == chat_blocks(BODY)


def test_roles_other_forms_and_completions_prompts():
    body = {
        "messages": [
            {"role": "function", "name": "f", "content": "42"},
            {"role": "narrator", "content": "x"},
            {"role": "assistant", "content": "", "function_call": {"name": "f", "arguments": "{}"}},
            {"role": "user", "content": None},
        ]
    }
    assert [(b.role, b.canonical) for b in chat_blocks(body)] == [
        ("tool", b"42"),
        ("user", b"x"),
        ("tool_call", b'{"arguments":"{}","name":"f"}'),
        ("user", b""),
    ]
    assert chat_blocks({"messages": []}) == []
    assert completion_blocks({"prompt": "Once upon a time"}) == [
        Block("user", b"Once upon a time", "Once upon a time")
    ]
    assert completion_blocks({"prompt": [1, 2, 3]}) == [Block("user", b"[1,2,3]", "[1,2,3]")]
    assert completion_blocks({}) == []


def reference_chain(key: bytes, blocks: list[Block]) -> list[str]:
    """The agreed formula written out: HMAC over the previous digest, role, NUL, bytes."""
    out, previous = [], b""
    for block in blocks:
        previous = hmac.new(
            key, previous + block.role.encode() + b"\0" + block.canonical, hashlib.sha256
        ).digest()
        out.append(previous[:16].hex())
    return out


def test_chain_is_the_keyed_cumulative_hash():
    blocks = chat_blocks(BODY)
    hashes = chain(KEY, blocks)
    assert hashes == reference_chain(KEY, blocks)
    assert hashes == chain(KEY, chat_blocks(BODY))  # deterministic
    assert all(len(h) == 32 and h == h.lower() for h in hashes)
    assert len(set(hashes)) == len(hashes)
    # The role is part of the hash: the same text as system and as user differ.
    assert chain(KEY, [Block("system", b"hi", "hi")]) != chain(KEY, [Block("user", b"hi", "hi")])


def test_another_key_gives_another_chain():
    blocks = chat_blocks(BODY)
    assert set(chain(KEY, blocks)).isdisjoint(chain(OTHER_KEY, blocks))


def test_a_grown_conversation_keeps_the_earlier_chain_as_a_strict_prefix():
    before = chain(KEY, chat_blocks(BODY))
    grown = {**BODY, "messages": [*MESSAGES, {"role": "assistant", "content": "You are welcome."}]}
    after = chain(KEY, chat_blocks(grown))
    assert len(after) == len(before) + 1
    assert after[: len(before)] == before
    # A compaction (an earlier message rewritten) keeps only the part before it.
    compacted = {**BODY, "messages": [MESSAGES[0], {"role": "user", "content": "Summary."}]}
    assert chain(KEY, chat_blocks(compacted))[:2] == before[:2]
    assert chain(KEY, chat_blocks(compacted))[2] != before[2]


def test_principal_from_header_bearer_hash_or_anonymous():
    expected = "key-" + hmac.new(KEY, b"sk-secret", hashlib.sha256).hexdigest()[:16]
    assert principal(KEY, "Bearer sk-secret", None) == expected
    assert principal(KEY, "bearer  sk-secret", None) == expected
    assert principal(OTHER_KEY, "Bearer sk-secret", None) != expected
    assert principal(KEY, "Bearer sk-secret", "team-a") == "team-a"
    assert principal(KEY, None, None) == "anonymous"
    basic = "key-" + hmac.new(KEY, b"Basic dXNlcg==", hashlib.sha256).hexdigest()[:16]
    assert principal(KEY, "Basic dXNlcg==", None) == basic


def test_recording_key_created_0600_then_reused(tmp_path):
    rows = str(tmp_path / "rows.jsonl")
    key = recording_key(rows)
    path = tmp_path / "rows.jsonl.key"
    assert len(key) == 32
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert path.read_text() == key.hex() + "\n"
    assert recording_key(rows) == key
    assert recording_key(str(tmp_path / "other.jsonl")) != key


def test_recording_key_that_is_not_a_key_is_one_line_error(tmp_path):
    (tmp_path / "rows.jsonl.key").write_text("not hex\n")
    with pytest.raises(
        InputError, match=r"rows\.jsonl\.key: not a hash key \(expected hexadecimal\)$"
    ):
        recording_key(str(tmp_path / "rows.jsonl"))
    (tmp_path / "rows.jsonl.key").write_text("abcd\n")
    with pytest.raises(InputError, match=r"a hash key of 2 bytes is too short$"):
        recording_key(str(tmp_path / "rows.jsonl"))


def test_counts_are_exact_and_cached(deepseek):
    counter = BlockCounter(deepseek)
    assert counter.fast is not None  # deepseek-v3's ASCII texts take the fast counter
    blocks = chat_blocks(BODY)
    assert asyncio.run(counter.counts(blocks)) == EXPECTED_TOKENS
    assert [deepseek.count(b.text) for b in blocks] == EXPECTED_TOKENS
    assert counter.encoded == 9
    # The same request again encodes nothing new.
    assert asyncio.run(counter.counts(chat_blocks(BODY))) == EXPECTED_TOKENS
    assert counter.encoded == 9
    # The conversation grown by one message encodes only that message.
    grown = {**BODY, "messages": [*MESSAGES, {"role": "assistant", "content": "You are welcome."}]}
    assert asyncio.run(counter.counts(chat_blocks(grown))) == [*EXPECTED_TOKENS, 4]
    assert counter.encoded == 10
    # Text the fast ASCII counter does not take goes to the tokenizer.
    text = "Grüße aus Köln, 東京から"
    assert asyncio.run(counter.counts([Block("user", text.encode(), text)])) == [10]


def test_count_cache_is_bounded_and_large_texts_count_off_the_loop(deepseek):
    counter = BlockCounter(deepseek, entries=2)
    a, b, c = (Block("user", t.encode(), t) for t in ("alpha", "beta gamma", "delta"))
    assert asyncio.run(counter.counts([a, b, c])) == [1, 2, 1]
    assert len(counter.cache) == 2
    assert asyncio.run(counter.counts([a])) == [1]  # evicted, so encoded again
    assert counter.encoded == 4
    assert counter.worker is None  # small work stays on the loop
    big = "word " * (OFF_LOOP_CHARS // 5 + 1)  # 2,050 characters: past the threshold
    assert asyncio.run(counter.counts([Block("tool", big.encode(), big)])) == [411]
    assert counter.worker is not None
    counter.close()
    assert counter.encoded == 5
