"""The SSE scanner (batchbench.drive.sse): exact chunk counts, texts, usage and arrival
times, whatever the read boundaries, with and without the template fast path.

Every case runs against the compiled module and its pure-Python twin; the oracle is the
scanning the assembler did before the scanner (parse every ``data:`` payload with orjson).
"""

from __future__ import annotations

import itertools

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchbench import _impl
from batchbench.drive import _sse_py, sse
from batchbench.drive.wire import BAD_CHUNK, ResponseError, StreamAssembler


def _implementations() -> list:
    params = [pytest.param(_sse_py, id="python")]
    if not _impl.extensions_disabled():
        try:
            from batchbench._native import _sse
        except ImportError:  # not built
            pass
        else:
            params.insert(0, pytest.param(_sse, id="native"))
    return params


IMPLS = _implementations()
impl = pytest.mark.parametrize("mod", IMPLS)


class Oracle:
    """The reference: every ``data:`` line of every read parsed in full."""

    def __init__(self) -> None:
        self.carry = b""
        self.after_cr = False
        self.last = 0.0
        self.done = False
        self.chunks = 0
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.times: list[float] = []
        self.usage = None

    def feed(self, data: bytes, arrived: float) -> None:
        """Byte by byte, as the SSE grammar reads: CR, LF and CRLF each end a line, at the
        read that brought the CR or the lone LF."""
        self.last = arrived
        line = bytearray(self.carry)
        for byte in data:
            if byte == 10 and self.after_cr:
                self.after_cr = False
                continue
            self.after_cr = byte == 13
            if byte in (10, 13):
                if line.startswith(b"data:"):
                    self.payload(bytes(line[5:]).strip(), arrived)
                line.clear()
            else:
                line.append(byte)
        self.carry = bytes(line)

    def flush(self) -> None:
        line, self.carry = self.carry, b""
        if line.startswith(b"data:"):
            self.payload(line[5:].strip(), self.last)

    def payload(self, payload: bytes, arrived: float) -> None:
        if not payload:
            return
        if payload == b"[DONE]":
            self.done = True
            return
        try:
            chunk = orjson.loads(payload)
        except orjson.JSONDecodeError:
            raise ResponseError(BAD_CHUNK) from None
        self.chunks += 1
        if not isinstance(chunk, dict):
            return
        if chunk.get("usage") is not None:
            self.usage = chunk["usage"]
        choices = chunk.get("choices")
        if not choices or not isinstance(choices, list) or not isinstance(choices[0], dict):
            return
        delta = choices[0].get("delta")
        if not isinstance(delta, dict):
            return
        carried = False
        reasoning = delta.get("reasoning_content")
        if reasoning is None:  # vLLM's name since 0.17
            reasoning = delta.get("reasoning")
        for text, into in ((delta.get("content"), self.content), (reasoning, self.reasoning)):
            if isinstance(text, str) and text:
                into.append(text)
                carried = True
        if carried:
            self.times.append(arrived)


def state(scanner) -> tuple:
    return (
        scanner.chunks,
        list(scanner.content),
        list(scanner.reasoning),
        list(scanner.times),
        scanner.usage,
        scanner.done,
    )


def run(factory, reads, times=None):
    """Feed ``reads`` (at 1.0, 2.0, … unless ``times``), flush: the state, or the error."""
    scanner = factory()
    try:
        for index, data in enumerate(reads):
            scanner.feed(data, float(index + 1) if times is None else times[index])
        scanner.flush()
    except ResponseError as exc:
        return ("error", str(exc))
    return state(scanner), scanner


def outcome(factory, reads, times=None):
    result = run(factory, reads, times)
    return result if result[0] == "error" else result[0]


BASE = {"id": "chatcmpl-7", "object": "chat.completion.chunk", "created": 1, "model": "m"}


def chunk(delta: dict | None = None, usage=None, finish=None, **extra) -> bytes:
    document = dict(BASE, **extra)
    document["choices"] = (
        [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    )
    if usage is not None:
        document["usage"] = usage
    return orjson.dumps(document)


def event(payload: bytes, ending: bytes = b"\n\n") -> bytes:
    return b"data: " + payload + ending


USAGE = {"prompt_tokens": 7, "completion_tokens": 3}


def typical(texts: list[str]) -> list[bytes]:
    """A vLLM-shaped stream, one read per event: role, texts, finish, usage, [DONE]."""
    events = [event(chunk({"role": "assistant", "content": ""}))]
    events += [event(chunk({"content": text})) for text in texts]
    events.append(event(chunk({}, finish="stop")))
    events.append(event(chunk(usage=USAGE)))
    events.append(b"data: [DONE]\n\n")
    return events


# ---------------------------------------------------------------------------------------
# Exact values


@impl
def test_typical_stream_counts_without_parsing_every_chunk(mod):
    texts = [f"w{i} " for i in range(50)]
    reads = typical(texts)
    got, scanner = run(mod.SseScanner, reads)
    assert got == outcome(Oracle, reads)
    chunks, content, reasoning, times, usage, done = got
    assert chunks == 53 and done and usage == USAGE and reasoning == []
    assert content == texts
    assert times == [float(i) for i in range(2, 52)]  # the read of each text chunk
    # role+"" (learns), w0 (learns the plain shape), finish and usage: the rest fit.
    assert scanner.parsed == 4


@impl
def test_one_read_gives_every_chunk_that_read_time(mod):
    reads = [b"".join(typical(["a", "b", "c"]))]
    got, _ = run(mod.SseScanner, reads, [0.25])
    assert got == (6, ["a", "b", "c"], [], [0.25, 0.25, 0.25], USAGE, True)


@impl
def test_arrival_is_that_of_the_read_completing_the_line(mod):
    first, second = event(chunk({"content": "x"})), event(chunk({"content": "y"}))
    scanner = mod.SseScanner()
    scanner.feed(first[:10], 1.0)
    scanner.feed(first[10:] + second[:-3], 1.5)
    scanner.feed(second[-3:], 2.0)
    assert scanner.times == [1.5, 2.0] and scanner.content == ["x", "y"]


@impl
def test_reasoning_then_content_both_fast(mod):
    reads = [event(chunk({"reasoning_content": t})) for t in ("r1", "r2", "r3")]
    reads += [event(chunk({"content": t})) for t in ("c1", "c2", "c3")]
    reads.append(event(chunk(usage=USAGE)))
    got, scanner = run(mod.SseScanner, reads)
    assert got == outcome(Oracle, reads)
    assert got[1] == ["c1", "c2", "c3"] and got[2] == ["r1", "r2", "r3"]
    assert got[3] == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    assert scanner.parsed == 3  # r1, c1 learn; usage


@impl
def test_reasoning_under_vllms_newer_name_is_read_fast_and_named(mod):
    reads = [event(chunk({"reasoning": t})) for t in ("r1", "r2", "r3")]
    reads += [event(chunk({"content": t})) for t in ("c1", "c2")]
    reads.append(event(chunk(usage=USAGE)))
    got, scanner = run(mod.SseScanner, reads)
    assert got == outcome(Oracle, reads)
    assert got[1] == ["c1", "c2"] and got[2] == ["r1", "r2", "r3"]
    assert scanner.reasoning_key == "reasoning"
    assert scanner.parsed == 3  # r1, c1 learn; usage
    assert mod.learn(b'{"delta":{"reasoning":"r"}}', 2) == (b'{"delta":{"reasoning":"', b'"}}')
    _, older = run(mod.SseScanner, [event(chunk({"reasoning_content": "r"}))])
    assert older.reasoning_key == "reasoning_content"


@impl
@pytest.mark.parametrize(
    "text",
    [
        'say "hi"',
        "back\\slash",
        "line\nbreak",
        "tab\there",
        "\u00e9t\u00e9 \u6f22\u5b57 \U0001f600",
        "",
    ],
)
def test_texts_that_need_escapes_or_are_empty(mod, text):
    reads = typical(["plain", text, "plain"])
    got, _ = run(mod.SseScanner, reads)
    assert got == outcome(Oracle, reads)
    assert "".join(got[1]) == "plain" + text + "plain"
    assert len(got[3]) == (3 if text else 2)


@impl
def test_empty_text_chunks_count_but_carry_no_time(mod):
    reads = typical(["a", "", "", "b"])
    got, _ = run(mod.SseScanner, reads)
    assert got[0] == 7 and got[1] == ["a", "b"] and got[3] == [2.0, 5.0]


@impl
@pytest.mark.parametrize("bad", [b"\x01", b"\xff", b"\xc3", b"\xed\xa0\x80"])
def test_invalid_middle_after_a_template_is_a_bad_chunk(mod, bad):
    good = event(chunk({"content": "ab"}))
    at = good.index(b"ab")
    broken = good[:at] + b"a" + bad + b"b" + good[at + 2 :]
    with pytest.raises(ResponseError) as caught:
        mod_scanner = mod.SseScanner()
        mod_scanner.feed(good + good, 1.0)
        mod_scanner.feed(broken, 2.0)
    assert str(caught.value) == BAD_CHUNK
    assert outcome(Oracle, [good + good, broken]) == ("error", BAD_CHUNK)


@impl
def test_non_ascii_utf8_takes_the_fast_path(mod):
    texts = ["é", "漢字", "😀 ok"]
    reads = typical(texts)
    got, scanner = run(mod.SseScanner, reads)
    assert got[1] == texts and scanner.parsed == 4


@impl
def test_usage_in_every_chunk_is_parsed_every_time(mod):
    reads = [
        event(chunk({"content": t}, usage={"prompt_tokens": 5, "completion_tokens": i}))
        for i, t in enumerate("abcd")
    ]
    got, scanner = run(mod.SseScanner, reads)
    assert got == outcome(Oracle, reads)
    assert got[4] == {"prompt_tokens": 5, "completion_tokens": 3} and scanner.parsed == 4


@impl
def test_duplicate_content_key_is_never_a_template(mod):
    payload = b'{"choices":[{"delta":{"content":"x","content":"y"}}]}'
    reads = [event(payload)] * 3
    got, scanner = run(mod.SseScanner, reads)
    assert got == outcome(Oracle, reads) and got[1] == ["y", "y", "y"]
    assert scanner.parsed == 3


@impl
def test_crlf_comments_events_and_done(mod):
    stream = (
        b": keep-alive\r\n\r\nevent: message\r\n"
        + event(chunk({"content": "He"}), b"\r\n\r\n")
        + b"id: 3\r\nretry: 10\r\n"
        + b"data:" + chunk({"content": "llo"}) + b"\r\n\r\n"
        + b"data:   \r\n\r\n"
        + event(chunk(usage=USAGE), b"\r\n\r\n")
        + b"data: [DONE]\r\n\r\n"
    )  # fmt: skip
    got, _ = run(mod.SseScanner, [stream])
    assert got == outcome(Oracle, [stream])
    assert got == (3, ["He", "llo"], [], [1.0, 1.0], USAGE, True)


@impl
def test_unterminated_last_line_is_scanned_by_flush_at_the_last_read(mod):
    scanner = mod.SseScanner()
    scanner.feed(event(chunk({"content": "a"})), 1.0)
    scanner.feed(b"data: " + chunk({"content": "b"}), 2.0)
    assert scanner.content == ["a"]
    scanner.flush()
    assert scanner.content == ["a", "b"] and scanner.times == [1.0, 2.0]


@impl
@pytest.mark.parametrize("ending", [b"\r", b"\n", b"\r\n"], ids=["cr", "lf", "crlf"])
def test_every_sse_line_ending_ends_a_line_even_split_across_reads(mod, ending):
    """CR, LF and CRLF all end lines (the SSE grammar); a CRLF split between two reads
    is one line end, not an empty line between two (which would end an event)."""
    stream = (
        b"event: message" + ending
        + b"data: " + chunk({"content": "He"}) + ending + ending
        + b"data: " + chunk({"content": "llo"}) + ending + ending
        + b"data: " + chunk(usage=USAGE) + ending + ending
        + b"data: [DONE]" + ending + ending
    )  # fmt: skip
    for cut in range(1, len(stream)):
        scanner = mod.SseScanner()
        scanner.feed(stream[:cut], 1.0)
        scanner.feed(stream[cut:], 2.0)
        scanner.flush()
        assert (scanner.chunks, scanner.content, scanner.usage, scanner.done) == (
            3,
            ["He", "llo"],
            USAGE,
            True,
        ), cut
    scanner = mod.SseScanner()
    scanner.feed(b"data: " + chunk({"content": "a"}) + b"\r", 1.0)
    assert scanner.content == ["a"]  # a CR ends the line at once: no wait for an LF


@impl
def test_a_long_line_in_many_reads_is_joined_once(mod):
    """A line that arrives in many reads waits in pieces: scanning it costs its length,
    not its length times the reads (the old carry copied itself on every read)."""
    text = "x" * 200_000
    payload = b"data: " + chunk({"content": text}) + b"\n\n"
    scanner = mod.SseScanner()
    for start in range(0, len(payload), 7):
        scanner.feed(payload[start : start + 7], 1.0)
    assert scanner.content == [text] and scanner.chunks == 1


@impl
@pytest.mark.parametrize(
    ("stream", "message"),
    [
        (b'event: error\ndata: {"error":{"message":"overloaded","code":503}}\n\n', "overloaded"),
        (b'data: {"error":{"message":"context too long"}}\n\n', "context too long"),
        (b'data: {"error":"plain words"}\n\n', "plain words"),
        (b"event: error\ndata: not json at all\n\n", "not json at all"),
        (b"event: error\n\n", ""),
    ],
    ids=["event", "error-object", "error-string", "event-text", "event-no-data"],
)
def test_a_server_error_in_the_stream_is_kept_whatever_follows(mod, stream, message):
    scanner = mod.SseScanner()
    scanner.feed(event(chunk({"content": "a"})) + stream, 1.0)
    scanner.feed(event(chunk(usage=USAGE)) + b"data: [DONE]\n\n", 2.0)
    scanner.flush()
    assert scanner.error == message
    assert scanner.usage == USAGE and scanner.content == ["a"]


@impl
def test_after_an_error_event_ends_data_lines_count_again(mod):
    scanner = mod.SseScanner()
    scanner.feed(b"event: ping\ndata: " + chunk({"content": "a"}) + b"\n\n", 1.0)
    assert scanner.error is None and scanner.content == ["a"]


@impl
def test_the_first_bytes_of_a_stream_are_kept(mod):
    scanner = mod.SseScanner()
    scanner.feed(b"<html>" + b"x" * 300, 1.0)
    scanner.feed(b"more", 2.0)
    assert scanner.head == b"<html>" + b"x" * 250


@impl
def test_invalid_json_raises_bad_chunk(mod):
    scanner = mod.SseScanner()
    with pytest.raises(ResponseError) as caught:
        scanner.feed(b'data: {"choices":\n\n', 1.0)
    assert str(caught.value) == BAD_CHUNK


@impl
def test_learn_finds_the_only_string_value_of_the_key(mod):
    payload = b'{"a":"content","choices":[{"delta":{"content" : "xyz"}}]}'
    prefix, suffix = mod.learn(payload, 0)
    assert prefix == b'{"a":"content","choices":[{"delta":{"content" : "'
    assert suffix == b'"}}]}'
    assert mod.learn(payload, 1) is None  # no reasoning_content key
    assert mod.learn(b'{"content":"a\\"b"}', 0) is None  # a backslash
    assert mod.learn(b'{"content":null}', 0) is None
    assert mod.learn(b'{"x":{"content":"a"},"content":"b"}', 0) is None  # duplicate key
    assert mod.learn(b'{"reasoning_content":"r","content":"c"}', 1) == (
        b'{"reasoning_content":"',
        b'","content":"c"}',
    )


def test_assembler_runs_on_the_selected_scanner():
    assert issubclass(StreamAssembler, sse.SseScanner)
    expected = "python" if sse.SseScanner is _sse_py.SseScanner else "native"
    assert expected == sse.IMPLEMENTATION


# ---------------------------------------------------------------------------------------
# Fuzzing: any read boundaries, any texts, any bytes in a templated chunk

texts = st.text(
    alphabet=st.sampled_from(list('ab "\\\n\t\x01é漢😀{}:,'))
    | st.characters(exclude_categories=("Cs",)),
    max_size=6,
)
events = st.lists(
    st.one_of(
        texts.map(lambda t: event(chunk({"content": t}))),
        texts.map(lambda t: event(chunk({"reasoning_content": t}), b"\r\n\r\n")),
        st.just(b": keep-alive\n\n"),
        st.just(event(chunk(usage=USAGE))),
        st.just(b"data: [DONE]\n\n"),
        st.just(event(chunk({"role": "assistant", "content": ""}))),
    ),
    max_size=12,
)


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    edges = [0, *points, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(edges)]


@impl
@settings(max_examples=300, deadline=None)
@given(stream=events, cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=8))
def test_any_read_boundaries_give_the_oracle_result(mod, stream, cuts):
    data = b"".join(stream)
    reads = split(data, cuts)
    whole = outcome(mod.SseScanner, [data])
    assert whole == outcome(Oracle, [data])
    # Times differ by read; everything else must not, and times must be the oracle's.
    assert outcome(mod.SseScanner, reads) == outcome(Oracle, reads)
    if whole[0] != "error":
        assert outcome(mod.SseScanner, reads)[:3] == whole[:3]


@impl
@settings(max_examples=300, deadline=None)
@given(middle=st.binary(max_size=8), cuts=st.lists(st.integers(0, 10_000), max_size=4))
def test_any_bytes_in_a_templated_chunk_match_the_full_parse(mod, middle, cuts):
    good = event(chunk({"content": "ab"}))
    at = good.index(b'"ab"') + 1
    mutated = good[:at] + middle + good[at + 2 :]
    data = good + good + mutated + event(chunk(usage=USAGE))
    assert outcome(mod.SseScanner, split(data, cuts)) == outcome(Oracle, split(data, cuts))


@pytest.mark.skipif(len(IMPLS) < 2, reason="the compiled scanner is not built")
@settings(max_examples=200, deadline=None)
@given(stream=events, cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=8))
def test_native_and_twin_agree_on_parsed_counts(stream, cuts):
    native, twin = (p.values[0] for p in IMPLS)
    reads = split(b"".join(stream), cuts)
    a, b = run(native.SseScanner, reads), run(twin.SseScanner, reads)
    assert (a[0], a[1].parsed if a[0] != "error" else None) == (
        b[0],
        b[1].parsed if b[0] != "error" else None,
    )
