"""Wire format: user tags, headers, bodies, response and stream parsing, retries, verbose views
(request bodies, headers, parsing and retries as the driver sends and reads them)."""

from __future__ import annotations

import email.utils
import hashlib
import itertools
import re
import uuid

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchbench.drive.wire import (
    BodyOptions,
    Conversation,
    Reply,
    ResponseError,
    StreamAssembler,
    assistant_with_tool_call,
    backoff_ms,
    body_tail,
    http_error_text,
    is_retryable_status,
    normalized_assistant,
    parse_response,
    parse_retry_after,
    reasoning_of,
    request_headers,
    tool_call_id,
    tool_message,
    user_message,
    user_tag,
    valid_header_value,
    verbose_request,
    verbose_response,
    without_reasoning,
)
from batchbench.results.metrics import StreamSamples, median_seconds

# The spec's messages, quoted verbatim (not imported from wire.py, so a typo there shows).
MISSING_USAGE = "response missing usage field"
BAD_PROMPT_TOKENS = "usage.prompt_tokens missing or not an integer"
MISSING_MESSAGE = "response missing choices[0].message"
MESSAGE_NOT_OBJECT = "choices[0].message is not an object"
NO_CHUNKS = "streamed response contained no chunks"
NO_STREAM_USAGE = (
    "streamed response missing usage; the backend must honor stream_options.include_usage"
)
BAD_CHUNK = "invalid JSON in streamed response chunk"

SYNTHETIC_ARGUMENTS = '{"request":"continue"}'
UUID4_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")


def _synthetic_call(call_id: str) -> dict:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": "environment", "arguments": SYNTHETIC_ARGUMENTS},
    }


def _synthetic_call_bytes(call_id: str) -> bytes:
    return (
        b'"tool_calls":[{"id":"'
        + call_id.encode()
        + b'","type":"function","function":{"name":"environment",'
        + b'"arguments":"{\\"request\\":\\"continue\\"}"}}]'
    )


# ---------------------------------------------------------------------------------------
# user tags (seeded UUIDv4 values, or <prefix>-<agent>)


def _seeded_tag(seed: int, agent: int) -> str:
    """The seeded UUIDv4 user tag, computed without wire.py or the uuid module."""
    raw = bytearray(
        hashlib.sha256(f"batchbench-user-tag:{seed}:{agent}".encode("ascii")).digest()[:16]
    )
    raw[6] = (raw[6] & 0x0F) | 0x40  # version 4
    raw[8] = (raw[8] & 0x3F) | 0x80  # RFC 4122 variant (10xx)
    h = raw.hex()
    return f"{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def test_prefix_tag():
    assert user_tag(1, None, "loadtest") == "loadtest-1"
    assert user_tag(0, None, "loadtest") == "loadtest-0"
    # The prefix wins over the seed (seeded tags apply only without --user-prefix).
    assert user_tag(7, 42, "p") == "p-7"


@pytest.mark.parametrize(("seed", "agent"), [(42, 0), (42, 1), (7, 0), (0, 0), (2**64 - 1, 9999)])
def test_seeded_tag_matches_derivation(seed, agent):
    tag = user_tag(agent, seed, None)
    assert tag == _seeded_tag(seed, agent)
    assert UUID4_RE.match(tag)
    parsed = uuid.UUID(tag)
    assert parsed.version == 4
    assert parsed.variant == uuid.RFC_4122
    assert str(parsed) == tag  # lowercase, hyphenated


def test_seeded_tag_known_values():
    assert user_tag(0, 42, None) == "b0058fcb-7500-40bb-a41e-94912461834e"
    assert user_tag(1, 42, None) == "2e863e9b-db30-42f2-af8a-501072a763f7"
    assert user_tag(0, 7, None) == "de7dc006-385a-4397-b62a-7a0b8023e0c2"


def test_seeded_tags_stable_and_distinct_per_agent():
    first = [user_tag(agent, 42, None) for agent in range(20)]
    second = [user_tag(agent, 42, None) for agent in range(20)]
    assert first == second
    assert len(set(first)) == 20
    assert user_tag(0, 42, None) != user_tag(0, 43, None)


def test_unseeded_tags_are_random_uuid4():
    a, b = user_tag(0, None, None), user_tag(0, None, None)
    assert a != b
    for tag in (a, b):
        assert uuid.UUID(tag).version == 4
        assert UUID4_RE.match(tag)


# ---------------------------------------------------------------------------------------
# headers (an invalid user-tag header value fails the request without retries)


@pytest.mark.parametrize(
    "value",
    ["user-123", "loadtest-1", "b0058fcb-7500-40bb-a41e-94912461834e", "a b\tc", "~!@#$%^&*()"],
)
def test_valid_header_value_accepts_printable_ascii(value):
    assert valid_header_value(value) is True


@pytest.mark.parametrize(
    "value", ["a\nb", "\n", "a\rb", "\x00", "x\x7f", "é", "tag-\u2603", "\x1f"]
)
def test_valid_header_value_rejects_controls_and_non_ascii(value):
    assert valid_header_value(value) is False


@pytest.mark.parametrize(
    ("api_key", "tag", "worker", "expected"),
    [
        (
            "sk-1",
            "user-123",
            None,
            {
                "content-type": "application/json",
                "authorization": "Bearer sk-1",
                "x-smg-routing-key": "user-123",
            },
        ),
        (None, None, None, {"content-type": "application/json"}),
        ("", None, None, {"content-type": "application/json"}),
        (
            "",
            "t",
            0,
            {
                "content-type": "application/json",
                "x-smg-routing-key": "t",
                "x-smg-target-worker": "0",
            },
        ),
        (None, None, 9, {"content-type": "application/json", "x-smg-target-worker": "9"}),
        (
            "k",
            "loadtest-1",
            9,
            {
                "content-type": "application/json",
                "authorization": "Bearer k",
                "x-smg-routing-key": "loadtest-1",
                "x-smg-target-worker": "9",
            },
        ),
    ],
)
def test_request_headers(api_key, tag, worker, expected):
    headers = request_headers(api_key, tag, worker)
    assert headers == expected
    assert list(headers) == list(expected)
    assert all(name == name.lower() for name in headers)


def test_target_worker_independent_of_tagging():
    for slot in range(10):
        headers = request_headers(None, None, slot % 8)
        assert headers["x-smg-target-worker"] == str(slot % 8)
        assert "x-smg-routing-key" not in headers
    assert request_headers(None, None, 8 % 8)["x-smg-target-worker"] == "0"
    assert request_headers(None, None, 9 % 8)["x-smg-target-worker"] == "1"


# ---------------------------------------------------------------------------------------
# bodies


def _body(options: BodyOptions, content: str, output: int, tag: str | None) -> bytes:
    conversation = Conversation(options.model)
    conversation.reset(content)
    return conversation.body(body_tail(options, output, tag))


def test_default_body_exact_bytes():
    body = _body(BodyOptions("m"), "hi", 17, "u")
    assert body == (
        b'{"model":"m","messages":[{"role":"user","content":"hi"}],'
        b'"max_tokens":17,"min_tokens":17,"user":"u"}'
    )
    document = orjson.loads(body)
    assert document == {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 17,
        "min_tokens": 17,
        "user": "u",
    }
    assert list(document) == ["model", "messages", "max_tokens", "min_tokens", "user"]
    assert "tools" not in document
    assert "tool_choice" not in document


@pytest.mark.parametrize(
    ("options", "tag", "tail"),
    [
        (BodyOptions("m"), "u", b'],"max_tokens":17,"min_tokens":17,"user":"u"}'),
        (BodyOptions("m"), None, b'],"max_tokens":17,"min_tokens":17}'),
        (
            BodyOptions("m", sglang=True),
            "u",
            b'],"max_new_tokens":17,"min_new_tokens":17,"user":"u"}',
        ),
        (
            BodyOptions("m", ignore_eos=True),
            "u",
            b'],"max_tokens":17,"min_tokens":17,"ignore_eos":true,"user":"u"}',
        ),
        (
            BodyOptions("m", sglang=True, ignore_eos=True),
            None,
            b'],"max_new_tokens":17,"min_new_tokens":17,"ignore_eos":true}',
        ),
        (
            BodyOptions("m", stream=True),
            "u",
            b'],"max_tokens":17,"min_tokens":17,'
            b'"stream":true,"stream_options":{"include_usage":true},"user":"u"}',
        ),
        (
            BodyOptions("m", sglang=True, ignore_eos=True, stream=True),
            "u",
            b'],"max_new_tokens":17,"min_new_tokens":17,"ignore_eos":true,'
            b'"stream":true,"stream_options":{"include_usage":true},"user":"u"}',
        ),
        (
            BodyOptions("m", ignore_eos=True, stream=True),
            None,
            b'],"max_tokens":17,"min_tokens":17,"ignore_eos":true,'
            b'"stream":true,"stream_options":{"include_usage":true}}',
        ),
    ],
)
def test_body_tail_exact_bytes(options, tag, tail):
    assert body_tail(options, 17, tag) == tail
    body = _body(options, "hi", 17, tag)
    assert body == b'{"model":"m","messages":[{"role":"user","content":"hi"}' + tail


def test_body_key_order_with_every_option():
    options = BodyOptions("m", sglang=False, ignore_eos=True, stream=True)
    document = orjson.loads(_body(options, "hi", 8, "loadtest-1"))
    assert list(document) == [
        "model",
        "messages",
        "max_tokens",
        "min_tokens",
        "ignore_eos",
        "stream",
        "stream_options",
        "user",
    ]
    assert document["ignore_eos"] is True  # --ignore-eos
    assert document["stream"] is True
    assert document["stream_options"] == {"include_usage": True}
    assert document["user"] == "loadtest-1"  # --user-prefix loadtest, agent 1


def test_sglang_body_has_no_default_token_fields():
    document = orjson.loads(_body(BodyOptions("m", sglang=True), "hi", 4, None))
    assert document["max_new_tokens"] == 4
    assert document["min_new_tokens"] == 4
    for key in ("max_tokens", "min_tokens", "stream", "stream_options", "tools", "user"):
        assert key not in document  # no user without tagging


def test_model_name_is_json_escaped():
    body = _body(BodyOptions('m"x\\y'), "hi", 1, None)
    assert body.startswith(b'{"model":"m\\"x\\\\y","messages":[')
    assert orjson.loads(body)["model"] == 'm"x\\y'


def test_conversation_append_reset_and_size():
    conversation = Conversation("m")
    conversation.reset("hi")
    assert conversation.messages == 1
    head = b'{"model":"m","messages":[{"role":"user","content":"hi"}'
    assert conversation.size == len(head)

    call = tool_call_id(0, 1)
    assistant = assistant_with_tool_call({"role": "assistant", "content": "ok"}, call)
    tool = tool_message(call, "env")
    conversation.append(assistant, tool)
    assert conversation.messages == 3
    tail = body_tail(BodyOptions("m"), 5, "u")
    expected = (
        head
        + b',{"role":"assistant","content":"ok",'
        + _synthetic_call_bytes("call_batchbench_00000000_000001")
        + b'},{"role":"tool","tool_call_id":"call_batchbench_00000000_000001","content":"env"}'
        + b'],"max_tokens":5,"min_tokens":5,"user":"u"}'
    )
    body = conversation.body(tail)
    assert body == expected
    assert conversation.size == len(body) - len(tail)
    # Retries send the same bytes; body() does not consume anything.
    assert conversation.body(tail) == body

    document = orjson.loads(body)
    assert [m["role"] for m in document["messages"]] == ["user", "assistant", "tool"]
    assert document["messages"][1]["tool_calls"] == [
        _synthetic_call("call_batchbench_00000000_000001")
    ]
    assert document["messages"][2]["tool_call_id"] == "call_batchbench_00000000_000001"

    conversation.append(user_message("more"))
    assert conversation.messages == 4

    conversation.reset("again")
    assert conversation.messages == 1
    assert conversation.body(tail) == (
        b'{"model":"m","messages":[{"role":"user","content":"again"}]'
        b',"max_tokens":5,"min_tokens":5,"user":"u"}'
    )


def test_user_message_escaping_exact_bytes():
    assert user_message('a"b\nc\\d\te') == b'{"role":"user","content":"a\\"b\\nc\\\\d\\te"}'
    # Non-ASCII travels as UTF-8, not \u escapes.
    assert user_message("é🚀") == '{"role":"user","content":"é🚀"}'.encode()


@pytest.mark.parametrize(
    "content",
    ['say "hi"\nnext\tline', "ünïcødé 🚀 — 中文", "back\\slash </script>", "\x00\x01\x1f", ""],
)
def test_content_escaping_round_trips(content):
    body = _body(BodyOptions("m"), content, 3, None)
    assert orjson.loads(body)["messages"] == [{"role": "user", "content": content}]


# ---------------------------------------------------------------------------------------
# assistant normalization and appended messages


def test_reply_with_own_tool_calls_and_reasoning():
    reply = {
        "role": "assistant",
        "content": "Let me look.",
        "reasoning_content": "thinking",
        "tool_calls": [
            {
                "id": "call_model_abc",
                "type": "function",
                "function": {"name": "search", "arguments": '{"q":"x"}'},
            }
        ],
    }
    call = tool_call_id(0, 1)
    assert call == "call_batchbench_00000000_000001"
    serialized = assistant_with_tool_call(reply, call)
    assert serialized == (
        b'{"role":"assistant","content":"Let me look.","reasoning_content":"thinking",'
        + _synthetic_call_bytes(call)
        + b"}"
    )
    document = orjson.loads(serialized)
    assert len(document["tool_calls"]) == 1
    assert document["tool_calls"][0]["id"] == call
    assert document["tool_calls"][0]["function"]["name"] == "environment"
    assert document["tool_calls"][0]["function"]["arguments"] == '{"request":"continue"}'
    assert document["reasoning_content"] == "thinking"
    assert "call_model_abc" not in serialized.decode()
    # The reply itself is left untouched (block mode may reuse it).
    assert reply["tool_calls"][0]["id"] == "call_model_abc"

    following = orjson.loads(tool_message(call, "env text"))
    assert following["tool_call_id"] == call


def test_content_only_reply():
    call = tool_call_id(2, 3)
    assert call == "call_batchbench_00000002_000003"
    serialized = assistant_with_tool_call({"role": "assistant", "content": "Done."}, call)
    assert serialized == (
        b'{"role":"assistant","content":"Done.",' + _synthetic_call_bytes(call) + b"}"
    )


def test_absent_content_becomes_null():
    serialized = assistant_with_tool_call({"role": "assistant"}, "call_batchbench_1_2")
    assert serialized == (
        b'{"role":"assistant","content":null,' + _synthetic_call_bytes("call_batchbench_1_2") + b"}"
    )
    assert normalized_assistant({}) == {"role": "assistant", "content": None}
    assert normalized_assistant({"content": None}) == {"role": "assistant", "content": None}


def test_normalization_keeps_name_refusal_drops_function_call_fixed_order():
    message = {
        "refusal": "no",
        "function_call": {"name": "f", "arguments": "{}"},
        "name": "bot",
        "tool_calls": [],
        "content": "c",
        "audio": {"id": "a"},
        "reasoning_content": "r",
        "role": "assistant",
    }
    normalized = normalized_assistant(message)
    assert normalized == {
        "role": "assistant",
        "content": "c",
        "reasoning_content": "r",
        "name": "bot",
        "refusal": "no",
    }
    assert list(normalized) == ["role", "content", "reasoning_content", "name", "refusal"]
    serialized = assistant_with_tool_call(message, "call_batchbench_0_4")
    assert serialized == (
        b'{"role":"assistant","content":"c","reasoning_content":"r","name":"bot","refusal":"no",'
        + _synthetic_call_bytes("call_batchbench_0_4")
        + b"}"
    )
    assert b"function_call" not in serialized


def test_tool_message_exact_bytes():
    assert tool_message("call_batchbench_0_1", "env") == (
        b'{"role":"tool","tool_call_id":"call_batchbench_0_1","content":"env"}'
    )
    assert tool_message("call_batchbench_3_7", 'a "q"\n') == (
        b'{"role":"tool","tool_call_id":"call_batchbench_3_7","content":"a \\"q\\"\\n"}'
    )


# ---------------------------------------------------------------------------------------
# non-streaming responses (a non-object message is a retried parse error)


def test_parse_response_happy_path():
    raw = (
        b'{"id":"x","object":"chat.completion","choices":[{"index":0,'
        b'"message":{"role":"assistant","content":"hi","reasoning_content":"r"},'
        b'"finish_reason":"stop"}],"usage":{"prompt_tokens":100,"completion_tokens":7,'
        b'"total_tokens":107,"prompt_tokens_details":{"cached_tokens":64}}}'
    )
    reply = parse_response(raw)
    assert reply.message == {"role": "assistant", "content": "hi", "reasoning_content": "r"}
    assert reply.prompt_tokens == 100
    assert reply.completion_tokens == 7
    assert reply.cached_tokens == 64
    assert reply.usage == {
        "prompt_tokens": 100,
        "completion_tokens": 7,
        "total_tokens": 107,
        "prompt_tokens_details": {"cached_tokens": 64},
    }
    assert reply.ttft is None
    assert reply.gaps is None
    assert reply.tpot is None


@pytest.mark.parametrize(
    "usage", [b'{"prompt_tokens":5}', b'{"prompt_tokens":5,"completion_tokens":null}']
)
def test_parse_response_missing_completion_tokens_is_zero(usage):
    raw = b'{"choices":[{"message":{"role":"assistant","content":"x"}}],"usage":' + usage + b"}"
    reply = parse_response(raw)
    assert reply.prompt_tokens == 5
    assert reply.completion_tokens == 0
    assert reply.cached_tokens is None


@pytest.mark.parametrize(
    "details", [b"", b',"prompt_tokens_details":null', b',"prompt_tokens_details":{}']
)
def test_parse_response_without_cached_tokens(details):
    raw = (
        b'{"choices":[{"message":{"content":"x"}}],"usage":{"prompt_tokens":5,'
        b'"completion_tokens":2' + details + b"}}"
    )
    assert parse_response(raw).cached_tokens is None


@pytest.mark.parametrize("raw", [b"", b"not json", b'{"choices":', b"<html>502</html>"])
def test_parse_response_invalid_json(raw):
    with pytest.raises(ResponseError, match=r"^invalid JSON in response body"):
        parse_response(raw)


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        (b'{"choices":[{"message":{"content":"x"}}]}', MISSING_USAGE),
        (b'{"choices":[{"message":{"content":"x"}}],"usage":null}', MISSING_USAGE),
        (b'{"choices":[{"message":{"content":"x"}}],"usage":{}}', BAD_PROMPT_TOKENS),
        (
            b'{"choices":[{"message":{"content":"x"}}],"usage":{"completion_tokens":3}}',
            BAD_PROMPT_TOKENS,
        ),
        (
            b'{"choices":[{"message":{"content":"x"}}],"usage":{"prompt_tokens":1.5}}',
            BAD_PROMPT_TOKENS,
        ),
        (
            b'{"choices":[{"message":{"content":"x"}}],"usage":{"prompt_tokens":5.0}}',
            BAD_PROMPT_TOKENS,
        ),
        (
            b'{"choices":[{"message":{"content":"x"}}],"usage":{"prompt_tokens":"12"}}',
            BAD_PROMPT_TOKENS,
        ),
        (
            b'{"choices":[{"message":{"content":"x"}}],"usage":{"prompt_tokens":null}}',
            BAD_PROMPT_TOKENS,
        ),
        (
            b'{"choices":[{"message":{"content":"x"}}],"usage":{"prompt_tokens":true}}',
            BAD_PROMPT_TOKENS,
        ),
        (b'{"usage":{"prompt_tokens":5}}', MISSING_MESSAGE),
        (b'{"choices":[],"usage":{"prompt_tokens":5}}', MISSING_MESSAGE),
        (b'{"choices":null,"usage":{"prompt_tokens":5}}', MISSING_MESSAGE),
        (b'{"choices":[{"index":0}],"usage":{"prompt_tokens":5}}', MISSING_MESSAGE),
        (b'{"choices":[{"message":"hello"}],"usage":{"prompt_tokens":5}}', MESSAGE_NOT_OBJECT),
        (b'{"choices":[{"message":["a"]}],"usage":{"prompt_tokens":5}}', MESSAGE_NOT_OBJECT),
    ],
)
def test_parse_response_errors(raw, error):
    with pytest.raises(ResponseError) as caught:
        parse_response(raw)
    assert str(caught.value) == error


# ---------------------------------------------------------------------------------------
# streaming (with TTFT, inter-token latency and TPOT samples)


def _chunk(delta: dict | None = None, usage: dict | None = None, *, choices=True) -> bytes:
    document: dict = {"choices": [{"index": 0, "delta": delta}] if choices else []}
    if usage is not None:
        document["usage"] = usage
    return orjson.dumps(document)


C46_STREAM = (
    b": keep-alive\r\n"
    b"\r\n"
    b"event: message\r\n"
    b"data: " + _chunk({"role": "assistant", "content": ""}) + b"\r\n\r\n"
    b"data: " + _chunk({"reasoning_content": "think"}) + b"\r\n\r\n"
    b": keep-alive\r\n\r\n"
    b"event: message\r\n"
    b"data: " + _chunk({"content": "Hel"}) + b"\r\n\r\n"
    b"data:" + _chunk({"content": "lo"}) + b"\r\n\r\n"
    b"data: "
    + _chunk(usage={"prompt_tokens": 12, "completion_tokens": 3}, choices=False)
    + b"\r\n\r\n"
    b"data: [DONE]\r\n\r\n"
)


def _assemble(pieces, sent: float = 0.0) -> Reply:
    assembler = StreamAssembler()
    for i, piece in enumerate(pieces):
        assembler.feed(piece, 1.0 + i)
    return assembler.finish(sent)


def test_stream_assembly_with_split_chunk():
    split_at = C46_STREAM.index(b'"con', C46_STREAM.index(b"Hel") - 20) + 3  # mid-JSON
    crlf = C46_STREAM.index(b"\r\n", C46_STREAM.index(b"lo")) + 1  # between \r and \n
    pieces = [C46_STREAM[:split_at], C46_STREAM[split_at:crlf], C46_STREAM[crlf:]]
    assert b"".join(pieces) == C46_STREAM
    reply = _assemble(pieces)
    assert reply.message == {
        "role": "assistant",
        "content": "Hello",
        "reasoning_content": "think",
    }
    assert list(reply.message) == ["role", "content", "reasoning_content"]
    assert reply.prompt_tokens == 12
    assert reply.completion_tokens == 3
    assert reply.usage == {"prompt_tokens": 12, "completion_tokens": 3}


def test_stream_byte_by_byte():
    reply = _assemble([C46_STREAM[i : i + 1] for i in range(len(C46_STREAM))])
    assert reply.message["content"] == "Hello"
    assert reply.message["reasoning_content"] == "think"
    assert reply.prompt_tokens == 12


def test_stream_last_non_null_usage_wins_and_cached_tokens():
    stream = (
        b"data: " + _chunk({"content": "a"}, {"prompt_tokens": 5, "completion_tokens": 1}) + b"\n\n"
        b"data: "
        + _chunk(
            {"content": "b"},
            {
                "prompt_tokens": 12,
                "completion_tokens": 2,
                "prompt_tokens_details": {"cached_tokens": 8},
            },
        )
        + b"\n\n"
        b'data: {"choices":[{"index":0,"delta":{"content":"c"}}],"usage":null}\n\n'
        b"data: [DONE]\n\n"
    )
    reply = _assemble([stream])
    assert reply.message == {"role": "assistant", "content": "abc"}
    assert reply.prompt_tokens == 12
    assert reply.completion_tokens == 2
    assert reply.cached_tokens == 8


def test_stream_tool_call_deltas_ignored():
    stream = (
        b"data: "
        + _chunk({"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "f"}}]})
        + b"\n\ndata: "
        + _chunk({"content": "x"})
        + b"\n\ndata: "
        + _chunk(usage={"prompt_tokens": 1, "completion_tokens": 1}, choices=False)
        + b"\n\n"
    )
    reply = _assemble([stream])
    assert reply.message == {"role": "assistant", "content": "x"}


def test_stream_without_usage():
    stream = b"data: " + _chunk({"content": "Hello"}) + b"\n\ndata: [DONE]\n\n"
    with pytest.raises(ResponseError) as caught:
        _assemble([stream])
    assert str(caught.value) == NO_STREAM_USAGE


@pytest.mark.parametrize(
    "stream",
    [
        b"data: [DONE]\n\n",
        b": keep-alive\r\n\r\n: keep-alive\r\n\r\ndata: [DONE]\r\n\r\n",
    ],
)
def test_stream_without_chunks(stream):
    with pytest.raises(ResponseError) as caught:
        _assemble([stream])
    assert str(caught.value) == NO_CHUNKS and caught.value.kind == "missing_usage"


@pytest.mark.parametrize(
    "stream",
    [b"", b"event: ping\n\ndata:\n\ndata:   \r\n\r\n", b"id: 1\nretry: 100\n\n"],
)
def test_stream_cut_before_any_chunk_is_truncated(stream):
    with pytest.raises(ResponseError) as caught:
        _assemble([stream])
    assert str(caught.value) == ("streamed response ended before [DONE] and usage after 0 chunks")
    assert caught.value.kind == "truncated_stream"


def test_stream_cut_after_content_is_truncated_and_with_usage_it_is_whole():
    content = b"data: " + _chunk({"content": "a"}) + b"\n\n"
    with pytest.raises(ResponseError) as caught:
        _assemble([content])
    assert caught.value.kind == "truncated_stream" and str(caught.value).endswith("after 1 chunks")
    usage = _chunk(usage={"prompt_tokens": 4, "completion_tokens": 1}, choices=False)
    reply = _assemble([content + b"data: " + usage + b"\n\n"])  # no [DONE]: usage suffices
    assert reply.prompt_tokens == 4 and reply.message["content"] == "a"


def test_stream_invalid_json_chunk():
    assembler = StreamAssembler()
    with pytest.raises(ResponseError) as caught:
        assembler.feed(b"data: " + _chunk({"content": "a"}) + b'\n\ndata: {"choices":\n\n', 1.0)
        assembler.finish(0.0)
    assert str(caught.value) == BAD_CHUNK


def test_stream_invalid_json_in_unterminated_last_line():
    assembler = StreamAssembler()
    assembler.feed(b"data: " + _chunk({"content": "a"}) + b"\n\ndata: {oops", 1.0)
    with pytest.raises(ResponseError) as caught:
        assembler.finish(0.0)
    assert str(caught.value) == BAD_CHUNK


@pytest.mark.parametrize("ending", [b"", b"\r"])
def test_stream_unterminated_last_line_parsed_by_finish(ending):
    assembler = StreamAssembler()
    assembler.feed(b"data: " + _chunk({"content": "He"}) + b"\n\n", 1.0)
    assembler.feed(
        b"data: " + _chunk({"content": "y"}, {"prompt_tokens": 3, "completion_tokens": 2}) + ending,
        1.1,
    )
    reply = assembler.finish(0.5)
    assert reply.message == {"role": "assistant", "content": "Hey"}
    assert reply.prompt_tokens == 3
    assert reply.completion_tokens == 2


def test_stream_timing():
    assembler = StreamAssembler()
    assembler.feed(b"data: " + _chunk({"role": "assistant"}) + b"\n\n", 0.95)
    for i, (text, at) in enumerate([("a", 1.0), ("b", 1.05), ("c", 1.10), ("d", 1.15)]):
        delta = {"content": text} if i % 2 == 0 else {"reasoning_content": text}
        assembler.feed(b"data: " + _chunk(delta) + b"\n\n", at)
    assembler.feed(b'data: {"choices":[{"index":0,"delta":{"content":""}}]}\n\n', 1.17)
    usage = _chunk(usage={"prompt_tokens": 9, "completion_tokens": 4}, choices=False)
    assembler.feed(b"data: " + usage + b"\n\ndata: [DONE]\n\n", 1.2)
    reply = assembler.finish(0.9)
    assert reply.message == {"role": "assistant", "content": "ac", "reasoning_content": "bd"}
    assert reply.ttft == pytest.approx(0.1)
    assert reply.gaps == pytest.approx([0.05, 0.05, 0.05])
    assert reply.tpot == pytest.approx(0.15 / (4 - 1))


def test_arrival_is_that_of_the_read_completing_the_line():
    line = b"data: " + _chunk({"content": "x"}) + b"\n\n"
    assembler = StreamAssembler()
    assembler.feed(line[:10], 1.0)
    assembler.feed(line[10:], 1.3)
    assembler.feed(b"data: " + _chunk({"content": "y"}) + b"\n\n", 1.5)
    assembler.feed(
        b"data: "
        + _chunk(usage={"prompt_tokens": 1, "completion_tokens": 3}, choices=False)
        + b"\n",
        1.6,
    )
    reply = assembler.finish(1.0)
    assert reply.ttft == pytest.approx(0.3)
    assert reply.gaps == pytest.approx([0.2])
    assert reply.tpot == pytest.approx(0.2 / 2)


@pytest.mark.parametrize("completion", [None, 0, 1])
def test_tpot_needs_two_completion_tokens(completion):
    usage = (
        {"prompt_tokens": 1}
        if completion is None
        else {"prompt_tokens": 1, "completion_tokens": completion}
    )
    assembler = StreamAssembler()
    assembler.feed(b"data: " + _chunk({"content": "a"}) + b"\n\n", 2.0)
    assembler.feed(b"data: " + _chunk({"content": "b"}) + b"\n\n", 2.5)
    assembler.feed(b"data: " + _chunk(usage=usage, choices=False) + b"\n\n", 2.6)
    reply = assembler.finish(1.5)
    assert reply.ttft == pytest.approx(0.5)
    assert reply.gaps == pytest.approx([0.5])
    assert reply.tpot is None


def test_no_content_chunks_no_timing():
    assembler = StreamAssembler()
    assembler.feed(b"data: " + _chunk({"role": "assistant"}) + b"\n\n", 1.0)
    assembler.feed(
        b"data: "
        + _chunk(usage={"prompt_tokens": 4, "completion_tokens": 5}, choices=False)
        + b"\n\n",
        1.1,
    )
    reply = assembler.finish(0.5)
    assert reply.message == {"role": "assistant", "content": ""}
    assert reply.ttft is None
    assert reply.gaps is None
    assert reply.tpot is None
    samples = StreamSamples()
    samples.add(reply.ttft, reply.gaps, reply.tpot)
    assert (len(samples.ttft_ms), len(samples.itl_ms), len(samples.tpot_ms)) == (0, 0, 0)


# ---------------------------------------------------------------------------------------
# error text, retryable statuses, Retry-After and backoff (0 ms means no delay)


def test_http_error_text_known_status():
    assert (
        http_error_text(503, b"overloaded") == "request failed (503 Service Unavailable) overloaded"
    )
    assert http_error_text(429, b"slow down") == "request failed (429 Too Many Requests) slow down"
    assert http_error_text(404, b"") == "request failed (404 Not Found) "


def test_http_error_text_unknown_status_and_trim():
    assert http_error_text(599, b"  \n upstream gone \r\n") == "request failed (599) upstream gone"


def test_http_error_text_cut_at_500_chars():
    long = http_error_text(500, b"\n  " + b"x" * 600 + b"  \n")
    assert long == "request failed (500 Internal Server Error) " + "x" * 500 + "..."
    assert http_error_text(500, b"y" * 501) == (
        "request failed (500 Internal Server Error) " + "y" * 500 + "..."
    )


def test_http_error_text_exactly_500_not_cut():
    assert http_error_text(502, b"z" * 500) == "request failed (502 Bad Gateway) " + "z" * 500
    # Trimming comes first, so surrounding whitespace does not push it over.
    assert http_error_text(502, b"   " + b"z" * 500 + b"   ") == (
        "request failed (502 Bad Gateway) " + "z" * 500
    )


def test_http_error_text_counts_characters_not_bytes():
    body = ("é" * 501).encode()
    assert http_error_text(400, body) == "request failed (400 Bad Request) " + "é" * 500 + "..."
    assert http_error_text(400, ("é" * 500).encode()) == (
        "request failed (400 Bad Request) " + "é" * 500
    )


@pytest.mark.parametrize("status", [408, 409, 429, 500, 501, 502, 503, 504, 550, 599])
def test_retryable_statuses(status):
    assert is_retryable_status(status) is True


@pytest.mark.parametrize("status", [400, 401, 403, 404, 405, 413, 422, 499, 600, 200, 302])
def test_final_statuses(status):
    assert is_retryable_status(status) is False


NOW = 1_700_000_000.0


@pytest.mark.parametrize(
    ("value", "seconds"), [("1", 1.0), ("0", 0.0), (" 2 ", 2.0), ("120", 120.0)]
)
def test_retry_after_delta_seconds(value, seconds):
    assert parse_retry_after(value, now=NOW) == seconds


def test_retry_after_http_date():
    future = email.utils.formatdate(NOW + 5, usegmt=True)
    assert parse_retry_after(future, now=NOW) == pytest.approx(5.0)
    past = email.utils.formatdate(NOW - 100, usegmt=True)
    assert parse_retry_after(past, now=NOW) == 0.0
    # RFC 850 form, also an HTTP-date.
    assert parse_retry_after("Sunday, 06-Nov-94 08:49:37 GMT", now=NOW) == 0.0
    assert parse_retry_after("Sun, 06 Nov 1994 08:49:47 GMT", now=784111777.0) == pytest.approx(
        10.0
    )


@pytest.mark.parametrize(
    "value", [None, "", "garbage", "-1", "1.5", "1e3", "+5", "0x10", "soon GMT"]
)
def test_retry_after_invalid(value):
    assert parse_retry_after(value, now=NOW) is None


@pytest.mark.parametrize("value", ["\xb2", "\u0661", "1\xb9"])
def test_retry_after_non_ascii_digits_ignored(value):
    assert parse_retry_after(value, now=NOW) is None


@pytest.mark.parametrize("digits", [400, 5000])
def test_retry_after_huge_delta_saturates(digits):
    seconds = parse_retry_after("9" * digits, now=NOW)
    assert seconds == float(1 << 31)
    assert backoff_ms(10, 0, seconds) == (1 << 31) * 1000  # the driver bounds the wait


def test_retry_after_asctime_date():
    assert parse_retry_after("Sun Nov  6 08:49:47 1994", now=784111777.0) == pytest.approx(10.0)


@pytest.mark.parametrize(
    ("base", "attempt", "expected"),
    [
        (250, 0, 250),
        (250, 1, 500),
        (250, 2, 1000),
        (250, 7, 32_000),
        (250, 8, 60_000),
        (1, 15, 32_768),
        (1, 16, 60_000),
        (250, 31, 60_000),
        (250, 100, 60_000),
        (250, 10**18, 60_000),
        (2**63, 40, 2**63),
        (0, 0, 0),
        (0, 5, 0),
        (0, 10**9, 0),
        (100_000, 0, 100_000),
        (100_000, 3, 100_000),
        (60_000, 0, 60_000),
        (60_001, 1, 60_001),
    ],
)
def test_backoff_ms(base, attempt, expected):
    assert backoff_ms(base, attempt) == expected


@pytest.mark.parametrize(
    ("base", "attempt", "retry_after", "expected"),
    [
        (10, 0, 1.0, 1000),  # Retry-After: 1 with --retry-delay-ms 10
        (10, 0, 120.0, 120_000),  # honoured as sent, beyond the backoff ceiling
        (250, 2, 0.2, 1000),  # computed backoff is larger
        (250, 0, 0.0, 250),
        (10, 0, 0.0015, 10),
        (10, 0, 0.0125, 13),  # rounded up to whole ms
        (100_000, 0, 200.0, 200_000),
        (250, 100, 5.0, 60_000),
    ],
)
def test_backoff_ms_with_retry_after(base, attempt, retry_after, expected):
    assert backoff_ms(base, attempt, retry_after) == expected


# ---------------------------------------------------------------------------------------
# verbose views


def test_verbose_request_cuts_contents_arguments_descriptions():
    long_text = "  " + "a" * 60 + "  "
    document = {
        "model": "m",
        "messages": [
            {"role": "system", "content": "  short  "},
            {"role": "user", "content": long_text},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "fn_1", "arguments": '{"input":"' + "b" * 70 + '"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "c" * 50},
            {"role": "assistant", "content": "d" * 51},
        ],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "fn_1",
                    "description": "e" * 80,
                    "parameters": {"type": "object", "properties": {}},
                },
            }
        ],
        "max_tokens": 4,
        "min_tokens": 4,
        "user": "u" * 60,
    }
    text = verbose_request(orjson.dumps(document))
    view = orjson.loads(text)  # valid JSON
    assert view["messages"][0]["content"] == "short"
    assert view["messages"][1]["content"] == "a" * 50 + "..."
    assert view["messages"][2]["content"] is None
    assert view["messages"][2]["tool_calls"][0]["function"]["arguments"] == (
        '{"input":"' + "b" * 40 + "..."
    )
    assert view["messages"][2]["tool_calls"][0]["function"]["name"] == "fn_1"
    assert view["messages"][3]["content"] == "c" * 50
    assert view["messages"][4]["content"] == "d" * 50 + "..."
    assert view["tools"][0]["function"]["description"] == "e" * 50 + "..."
    assert view["tools"][0]["function"]["parameters"] == {"type": "object", "properties": {}}
    # Everything else is untouched, key order included.
    assert view["user"] == "u" * 60
    assert list(view) == ["model", "messages", "tools", "max_tokens", "min_tokens", "user"]


def test_verbose_request_of_a_conversation_body_exact():
    body = _body(BodyOptions("m"), "x" * 55, 2, "t")
    assert verbose_request(body) == (
        '{"model":"m","messages":[{"role":"user","content":"' + "x" * 50 + '..."}],'
        '"max_tokens":2,"min_tokens":2,"user":"t"}'
    )


def test_verbose_response():
    reply = Reply(
        message={"role": "assistant", "content": "  " + "b" * 80, "reasoning_content": "r"},
        prompt_tokens=3,
        completion_tokens=4,
        cached_tokens=None,
        usage={"prompt_tokens": 3, "completion_tokens": 4},
    )
    text = verbose_response(reply)
    assert text == (
        '{"choices":[{"message":{"role":"assistant","content":"' + "b" * 50 + '...",'
        '"reasoning_content":"r"}}],"usage":{"prompt_tokens":3,"completion_tokens":4}}'
    )
    orjson.loads(text)
    assert reply.message["content"] == "  " + "b" * 80  # the reply is not modified

    short = Reply({"role": "assistant", "content": "ok"}, 1, 1, None, {"prompt_tokens": 1})
    assert verbose_response(short) == (
        '{"choices":[{"message":{"role":"assistant","content":"ok"}}],"usage":{"prompt_tokens":1}}'
    )
    empty = Reply({"role": "assistant", "content": None}, 1, 0, None, {"prompt_tokens": 1})
    assert orjson.loads(verbose_response(empty))["choices"][0]["message"]["content"] is None


# ---------------------------------------------------------------------------------------
# streaming latency samples


def test_stream_samples_in_ms():
    samples = StreamSamples()
    samples.add(0.1, [0.05, 0.02], 0.04)
    samples.add(0.25, [], None)
    samples.add(None, None, None)  # non-streamed: nothing
    assert samples.ttft_ms == pytest.approx([100.0, 250.0])
    assert samples.itl_ms == pytest.approx([50.0, 20.0])
    assert samples.tpot_ms == pytest.approx([40.0])


def test_median_seconds():
    assert median_seconds([0.3, 0.1, 0.2]) == 0.2
    assert median_seconds([0.4, 0.1, 0.3, 0.2]) == 0.3  # round half away from zero
    assert median_seconds([]) is None


# ---------------------------------------------------------------------------------------
# Properties


@settings(max_examples=200, deadline=None)
@given(content=st.text(), env=st.text(), tag=st.none() | st.text(), output=st.integers(0, 2**32))
def test_property_conversation_body_parses(content, env, tag, output):
    conversation = Conversation("m")
    conversation.reset(content)
    conversation.append(
        assistant_with_tool_call({"content": content}, "call_batchbench_0_1"),
        tool_message("call_batchbench_0_1", env),
    )
    body = conversation.body(body_tail(BodyOptions("m"), output, tag))
    expected = {
        "model": "m",
        "messages": [
            {"role": "user", "content": content},
            {
                "role": "assistant",
                "content": content,
                "tool_calls": [_synthetic_call("call_batchbench_0_1")],
            },
            {"role": "tool", "tool_call_id": "call_batchbench_0_1", "content": env},
        ],
        "max_tokens": output,
        "min_tokens": output,
    }
    if tag is not None:
        expected["user"] = tag
    document = orjson.loads(body)
    assert document == expected
    assert list(document) == list(expected)


@settings(max_examples=300, deadline=None)
@given(cuts=st.lists(st.integers(0, len(C46_STREAM)), max_size=25))
def test_property_stream_split_points_do_not_matter(cuts):
    points = [0, *sorted(set(cuts)), len(C46_STREAM)]
    pieces = [C46_STREAM[a:b] for a, b in itertools.pairwise(points)]
    reply = _assemble(pieces)
    assert reply.message == {"role": "assistant", "content": "Hello", "reasoning_content": "think"}
    assert reply.prompt_tokens == 12
    assert reply.completion_tokens == 3


def test_reasoning_is_replayed_under_the_name_the_server_used():
    old = {"role": "assistant", "content": "a", "reasoning_content": " r "}
    new = {"role": "assistant", "content": "a", "reasoning": " r "}
    assert reasoning_of(old) == reasoning_of(new) == " r "
    assert reasoning_of({"content": "a"}) is None
    assert normalized_assistant(old, "a", "r") == {
        "role": "assistant",
        "content": "a",
        "reasoning_content": "r",
    }
    assert normalized_assistant(new, "a", "r") == {
        "role": "assistant",
        "content": "a",
        "reasoning": "r",
    }
    # A reasoning trimmed to nothing is left out: the server renders what was counted.
    assert normalized_assistant(new, "a", "") == {"role": "assistant", "content": "a"}
    assert normalized_assistant(old, "a", None) == {"role": "assistant", "content": "a"}
    # --replay-reasoning drop: both names go.
    both = {"role": "assistant", "content": "a", "reasoning": "r", "reasoning_content": "r"}
    assert without_reasoning(both) == {"role": "assistant", "content": "a"}
    plain = {"role": "assistant", "content": "a"}
    assert without_reasoning(plain) is plain


def test_a_stream_with_vllms_reasoning_field_is_assembled_under_it():
    head = b'{"id":"x","choices":[{"index":0,"delta":'
    reads = [
        b"data: " + head + b'{"reasoning":"think"}}]}\n\n',
        b"data: " + head + b'{"content":"done"}}]}\n\n',
        b'data: {"id":"x","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2}}\n\n',
        b"data: [DONE]\n\n",
    ]
    assembler = StreamAssembler()
    for index, data in enumerate(reads):
        assembler.feed(data, float(index))
    reply = assembler.finish(9.0)
    assert reply.message == {"role": "assistant", "content": "done", "reasoning": "think"}


@pytest.mark.parametrize(
    ("rank_header", "expected"),
    [
        ("smg", {"content-type": "application/json", "x-smg-target-worker": "3"}),
        ("vllm", {"content-type": "application/json", "x-data-parallel-rank": "3"}),
        (
            "both",
            {
                "content-type": "application/json",
                "x-smg-target-worker": "3",
                "x-data-parallel-rank": "3",
            },
        ),
    ],
)
def test_rank_header_choice(rank_header, expected):
    assert request_headers(None, None, 3, rank_header) == expected
    assert request_headers(None, None, None, rank_header) == {"content-type": "application/json"}
