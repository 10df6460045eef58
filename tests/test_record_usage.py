"""Usage read from replies as they pass: SSE events found across any chunking, the
usage-only event taken out only when the proxy asked for it."""

from __future__ import annotations

import pytest

from batchbench.record.usage import StreamUsage, json_usage

# No compiled module serves this code, and the simulator's are covered elsewhere: the
# pure-twin pass would repeat it as is.
pytestmark = pytest.mark.native_pass_only

CONTENT = b'data: {"choices":[{"index":0,"delta":{"content":"Hi"}}]}'
USAGE_ONLY = b'data: {"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":4}}'
DONE = b"data: [DONE]"


def stream(newline: bytes) -> tuple[bytes, bytes]:
    """A stream with its usage-only event, and the same stream without it."""
    end = newline * 2
    whole = CONTENT + end + b": keep-alive" + end + USAGE_ONLY + end + DONE + end
    return whole, CONTENT + end + b": keep-alive" + end + DONE + end


@pytest.mark.parametrize("newline", [b"\n", b"\r\n"])
@pytest.mark.parametrize("size", [1, 2, 7, 1000])
def test_usage_only_event_is_stripped_however_the_stream_is_cut(newline, size):
    whole, stripped = stream(newline)
    watcher = StreamUsage(strip_usage_only=True)
    out = b"".join(watcher.feed(whole[i : i + size]) for i in range(0, len(whole), size))
    assert out + watcher.finish() == stripped
    assert watcher.usage == {"prompt_tokens": 9, "completion_tokens": 4}


@pytest.mark.parametrize("size", [1, 5, 1000])
def test_without_stripping_every_chunk_passes_at_once(size):
    whole, _ = stream(b"\n")
    watcher = StreamUsage(strip_usage_only=False)
    chunks = [whole[i : i + size] for i in range(0, len(whole), size)]
    assert [watcher.feed(chunk) for chunk in chunks] == chunks
    assert watcher.finish() == b""
    assert watcher.usage == {"prompt_tokens": 9, "completion_tokens": 4}


def test_usage_in_a_content_chunk_is_read_and_kept():
    """Some servers send usage with the last choice: that chunk is the client's reply."""
    last = b'data: {"choices":[{"index":0,"delta":{}}],"usage":{"completion_tokens":3}}\n\n'
    watcher = StreamUsage(strip_usage_only=True)
    assert watcher.feed(last) == last
    assert watcher.usage == {"completion_tokens": 3}


def test_a_cut_stream_keeps_its_tail_and_a_null_usage_is_none():
    watcher = StreamUsage(strip_usage_only=True)
    assert watcher.feed(CONTENT + b'\n\ndata: {"choi') == CONTENT + b"\n\n"
    assert watcher.finish() == b'data: {"choi'
    assert watcher.usage is None
    nulls = StreamUsage(strip_usage_only=True)
    event = b'data: {"choices":[],"usage":null}\n\n'
    assert nulls.feed(event) == event
    assert nulls.usage is None


def test_json_usage():
    assert json_usage(b'{"usage":{"prompt_tokens":1,"completion_tokens":2}}') == {
        "prompt_tokens": 1,
        "completion_tokens": 2,
    }
    assert json_usage(b'{"choices":[]}') is None
    assert json_usage(b"not json") is None
    assert json_usage(b"[1]") is None
