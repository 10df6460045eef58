"""What goes over the wire: request bodies as bytes, headers, and response parsing.

Bodies are assembled from serialized pieces. A conversation keeps the bytes of
``{"model":…,"messages":[m1,m2,…`` and each turn appends only the new messages' JSON, so a
long history is never serialized twice. Every JSON object has a fixed key order, so equal runs send
equal bytes.
"""

from __future__ import annotations

import datetime
import email.utils
import hashlib
import http
import itertools
import math
import time
import uuid
from dataclasses import dataclass

import orjson

from batchbench.drive.replyerror import (
    BAD_CHUNK,  # noqa: F401 - one of the stream messages below, named here as before
    ERROR_BODY_LIMIT,
    ResponseError,
    server_error_text,
)
from batchbench.drive.sse import SseScanner
from batchbench.results.failures import ErrorKind
from batchbench.secrets import redact
from batchbench.text.replycount import environment_calls

_DUMPS = orjson.dumps
_LOADS = orjson.loads

# The messages of a stream that cannot be assembled.
NO_CHUNKS = "streamed response contained no chunks"
NO_STREAM_USAGE = (
    "streamed response missing usage; the backend must honor stream_options.include_usage"
)
TRUNCATED_STREAM = "streamed response ended before [DONE] and usage after {chunks} chunks"
MISSING_USAGE = "response missing usage field"
BAD_PROMPT_TOKENS = "usage.prompt_tokens missing or not an integer"
# Token counts a server may report: integers in [0, 2^31).
USAGE_LIMIT = 1 << 31
OUT_OF_RANGE = "usage.{field} {value} out of range (an integer from 0 to 2147483647 expected)"
CACHED_ABOVE_PROMPT = (
    "usage.prompt_tokens_details.cached_tokens {cached} exceeds usage.prompt_tokens {prompt}"
)
SERVER_ERROR = "server error in response: {message}"
STREAM_SERVER_ERROR = "server error in streamed response: {message}"
NOT_AN_EVENT_STREAM = "streamed request answered with {content_type}, not an event stream: {head}"
MISSING_MESSAGE = "response missing choices[0].message"
MESSAGE_NOT_OBJECT = "choices[0].message is not an object"
ROUTING_KEY_HEADER_ERROR = "failed to build X-SMG-Routing-Key header from user tag"

RETRYABLE_STATUSES = frozenset({408, 409, 429})
BACKOFF_CEILING_MS = 60_000
_U64_MAX = (1 << 64) - 1
# Largest delta-seconds honoured (RFC 9110's 2^31); longer values saturate to it.
_RETRY_AFTER_MAX_S = float(1 << 31)


# ---------------------------------------------------------------------------------------
# User tags and headers


def user_tag(agent_id: int, seed: int | None, prefix: str | None) -> str:
    """The user tag: ``<prefix>-<agent>``, else a UUIDv4 derived from the seed and agent (so
    a seeded run repeats its tags), else a random UUIDv4."""
    if prefix is not None:
        return f"{prefix}-{agent_id}"
    if seed is None:
        return str(uuid.uuid4())
    digest = bytearray(hashlib.sha256(f"batchbench-user-tag:{seed}:{agent_id}".encode()).digest())
    digest[6] = (digest[6] & 0x0F) | 0x40
    digest[8] = (digest[8] & 0x3F) | 0x80
    return str(uuid.UUID(bytes=bytes(digest[:16])))


def valid_header_value(value: str) -> bool:
    """True when ``value`` can travel as an HTTP header value (visible ASCII, spaces, tabs)."""
    if not value.isascii():
        return False
    return all(ch == "\t" or 32 <= ord(ch) < 127 for ch in value)


# The header(s) that name a request's DP rank (--dp-rank-header): smg's gateway picks its
# i-th worker by X-SMG-Target-Worker; vLLM and SGLang pin a request to their own DP rank by
# X-data-parallel-rank; "both" serves a gateway in front of such engines.
DP_RANK_HEADERS: dict[str, tuple[str, ...]] = {
    "smg": ("x-smg-target-worker",),
    "vllm": ("x-data-parallel-rank",),
    "both": ("x-smg-target-worker", "x-data-parallel-rank"),
}
DEFAULT_DP_RANK_HEADER = "smg"


def request_headers(
    api_key: str | None,
    tag: str | None,
    target_worker: int | None,
    rank_header: str = DEFAULT_DP_RANK_HEADER,
) -> dict[str, str]:
    """One agent's headers, lowercase (content type, bearer key, routing key, the rank
    header(s) of ``rank_header`` naming the target worker); built once per agent."""
    headers = {"content-type": "application/json"}
    if api_key:
        headers["authorization"] = f"Bearer {api_key}"
    if tag is not None:
        headers["x-smg-routing-key"] = tag
    if target_worker is not None:
        for name in DP_RANK_HEADERS[rank_header]:
            headers[name] = str(target_worker)
    return headers


# ---------------------------------------------------------------------------------------
# Bodies


@dataclass(frozen=True)
class BodyOptions:
    """Run-wide body settings."""

    model: str
    sglang: bool = False
    ignore_eos: bool = False
    stream: bool = False


def body_tail(
    options: BodyOptions,
    output_tokens: int,
    tag: str | None,
    cap: int | None = None,
    stream: bool | None = None,
) -> bytes:
    """Everything after the messages array: ``],<token fields>,…}`` in a fixed order."""
    return b"]," + body_fields(options, output_tokens, tag, cap, stream)


def body_fields(
    options: BodyOptions,
    output_tokens: int,
    tag: str | None,
    cap: int | None = None,
    stream: bool | None = None,
) -> bytes:
    """The fields after ``messages`` (and ``tools``): ``<token fields>,…}``.

    The cap is the request's own ``max_tokens`` when it has one, else the planned output;
    the floor is min(planned output, cap). A request's own ``stream`` wins over the run's.
    """
    cap = output_tokens if cap is None else cap
    floor = min(output_tokens, cap)
    names = (
        (b"max_new_tokens", b"min_new_tokens") if options.sglang else (b"max_tokens", b"min_tokens")
    )
    parts = [
        b'"',
        names[0],
        b'":',
        str(cap).encode(),
        b',"',
        names[1],
        b'":',
        str(floor).encode(),
    ]
    if options.ignore_eos:
        parts.append(b',"ignore_eos":true')
    if options.stream if stream is None else stream:
        parts.append(b',"stream":true,"stream_options":{"include_usage":true}')
    if tag is not None:
        parts += [b',"user":', _DUMPS(tag)]
    parts.append(b"}")
    return b"".join(parts)


def user_message(content: str) -> bytes:
    return b'{"role":"user","content":' + _DUMPS(content) + b"}"


# Digits of the agent id and of the invocation number inside a tool-call id.
CALL_ID_AGENT_DIGITS = 8
CALL_ID_INVOCATION_DIGITS = 6


def tool_call_id(agent_id: int, invocation: int) -> str:
    """``call_batchbench_<agent, 8 digits>_<invocation, 6 digits>``, zero-padded.

    Templates that render call ids (in the assistant's tool call and in the tool message
    answering it) would otherwise charge agent 10 one token more than agent 9: with a fixed
    width every id costs the same number of tokens for every agent and turn, so the
    framing overhead does not depend on who sends it. Ids stay unique; agents beyond
    10^8 - 1 or invocations beyond 10^6 - 1 get wider (and dearer) ids.
    """
    return (
        f"call_batchbench_{agent_id:0{CALL_ID_AGENT_DIGITS}d}"
        f"_{invocation:0{CALL_ID_INVOCATION_DIGITS}d}"
    )


def tool_message(call_id: str, content: str) -> bytes:
    return (
        b'{"role":"tool","tool_call_id":'
        + _DUMPS(call_id)
        + b',"content":'
        + _DUMPS(content)
        + b"}"
    )


# vLLM named a reply's reasoning ``reasoning_content`` until 0.17, ``reasoning`` since;
# SGLang and llama.cpp use ``reasoning_content``. A reply is replayed under its own name.
REASONING_KEYS = ("reasoning_content", "reasoning")
_NORMALIZED_KEYS = (*REASONING_KEYS, "name", "refusal")
_REPLAYED_TEXT_KEYS = ("content", *_NORMALIZED_KEYS)


_KEEP = object()


def reasoning_of(message: dict) -> object:
    """A reply's reasoning, under either name (None when it has none)."""
    reasoning = message.get("reasoning_content")
    return message.get("reasoning") if reasoning is None else reasoning


def normalized_assistant(message: dict, content=_KEEP, reasoning=_KEEP) -> dict:
    """The reply as it is replayed: role, content (null when absent) and the present
    reasoning/name/refusal fields; the model's own tool calls are dropped.

    ``content`` and ``reasoning`` replace the reply's content and reasoning (the driver
    sends them trimmed, the way the prompt correction counted them); a reasoning replaced
    by nothing ("" or None) is left out, so that the server renders what was counted (a
    template may tell an empty reasoning from none)."""
    normalized = {"role": "assistant", "content": message.get("content")}
    for key in _NORMALIZED_KEYS:
        if key in message:
            normalized[key] = message[key]
    if content is not _KEEP:
        normalized["content"] = content
    if reasoning is not _KEEP:
        for key in REASONING_KEYS:
            if key in normalized:
                if reasoning:
                    normalized[key] = reasoning
                else:
                    del normalized[key]
    return normalized


def without_reasoning(message: dict) -> dict:
    """The reply without its reasoning (``--replay-reasoning drop``)."""
    if not any(key in message for key in REASONING_KEYS):
        return message
    return {key: value for key, value in message.items() if key not in REASONING_KEYS}


def assistant_with_tool_call(message: dict, call_id: str, content=_KEEP, reasoning=_KEEP) -> bytes:
    """The normalized reply (see ``normalized_assistant``) carrying the synthetic
    ``environment`` tool call."""
    normalized = normalized_assistant(message, content, reasoning)
    normalized["tool_calls"] = environment_calls(call_id)
    return _DUMPS(normalized)


class Conversation:
    """One agent's growing message list, kept as the serialized prefix of its body."""

    __slots__ = ("_head", "_prefix", "messages")

    def __init__(self, model: str) -> None:
        self._head = b'{"model":' + _DUMPS(model) + b',"messages":['
        self._prefix = bytearray()
        self.messages = 0

    def reset(self, prompt: str) -> None:
        """Start over with a single user message (the first request, or a compaction)."""
        self._prefix = bytearray(self._head)
        self._prefix += user_message(prompt)
        self.messages = 1

    def append(self, *serialized: bytes) -> None:
        """Append already-serialized messages."""
        prefix = self._prefix
        for message in serialized:
            prefix += b","
            prefix += message
        self.messages += len(serialized)

    def body(self, tail: bytes) -> bytes:
        """The complete body of this turn; retries send these same bytes (one copy of the
        prefix: ``bytes(prefix) + tail`` would make two)."""
        return b"".join((self._prefix, tail))

    def tokenize_body(self, *pending: bytes) -> bytes:
        """``{"model":…,"messages":[…, *pending],"add_generation_prompt":true}``: the body
        that asks a server to count this conversation (plus messages not appended yet)
        through its chat template, as the next chat request would render it."""
        parts = [bytes(self._prefix)]
        for message in pending:
            parts.append(b"," if self.messages or len(parts) > 1 else b"")
            parts.append(message)
        parts.append(b'],"add_generation_prompt":true}')
        return b"".join(parts)

    @property
    def size(self) -> int:
        return len(self._prefix)


# ---------------------------------------------------------------------------------------
# Responses


@dataclass(slots=True)
class Reply:
    """The parts of a successful response that the run uses."""

    message: dict
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int | None
    usage: dict
    ttft: float | None = None
    gaps: list[float] | None = None
    tpot: float | None = None
    worker: str | None = None  # the worker that served it, when the response said so


def _usage_counts(usage) -> tuple[int, int, int | None]:
    """(prompt, completion, cached) of a usage object; a count outside [0, 2^31), or
    cached tokens above the prompt, is ``malformed_usage`` (a run's totals and its cache
    percentages are sums and ratios of these)."""
    if not isinstance(usage, dict):
        raise ResponseError(MISSING_USAGE, ErrorKind.MISSING_USAGE)
    prompt = usage.get("prompt_tokens")
    if type(prompt) is not int:
        raise ResponseError(BAD_PROMPT_TOKENS, ErrorKind.MALFORMED_USAGE)
    if not 0 <= prompt < USAGE_LIMIT:
        raise _out_of_range("prompt_tokens", prompt)
    completion = usage.get("completion_tokens")
    if type(completion) is not int:
        completion = 0
    elif not 0 <= completion < USAGE_LIMIT:
        raise _out_of_range("completion_tokens", completion)
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    if type(cached) is not int:
        cached = None
    elif not 0 <= cached < USAGE_LIMIT:
        raise _out_of_range("prompt_tokens_details.cached_tokens", cached)
    elif cached > prompt:
        raise ResponseError(
            CACHED_ABOVE_PROMPT.format(cached=cached, prompt=prompt), ErrorKind.MALFORMED_USAGE
        )
    return prompt, completion, cached


def _out_of_range(field: str, value: int) -> ResponseError:
    return ResponseError(OUT_OF_RANGE.format(field=field, value=value), ErrorKind.MALFORMED_USAGE)


def parse_response(raw: bytes) -> Reply:
    """The reply and usage of a non-streamed 2xx body; ``ResponseError`` when it cannot be
    used (not JSON, an error object, no usage, counts out of range, no message object)."""
    try:
        document = _LOADS(raw)
    except orjson.JSONDecodeError as exc:
        raise ResponseError(f"invalid JSON in response body: {exc}") from None
    if not isinstance(document, dict):
        raise ResponseError("response body is not a JSON object")
    if document.get("error") is not None:
        raise ResponseError(
            SERVER_ERROR.format(message=server_error_text(document)), ErrorKind.SERVER_ERROR
        )
    if "usage" not in document or document["usage"] is None:
        raise ResponseError(MISSING_USAGE, ErrorKind.MISSING_USAGE)
    prompt, completion, cached = _usage_counts(document["usage"])
    choices = document.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise ResponseError(MISSING_MESSAGE)
    if "message" not in choices[0]:
        raise ResponseError(MISSING_MESSAGE)
    message = choices[0]["message"]
    if not isinstance(message, dict):
        raise ResponseError(MESSAGE_NOT_OBJECT)
    for key in _REPLAYED_TEXT_KEYS:  # what the next request replays must be text
        value = message.get(key)
        if value is not None and not isinstance(value, str):
            raise ResponseError(f"choices[0].message.{key} is not a string")
    return Reply(message, prompt, completion, cached, document["usage"])


class StreamAssembler(SseScanner):
    """SSE parsing with streaming timings (TTFT, gaps between content chunks, time per output
    token); ``feed(data, arrived)`` network reads as they arrive, then ``finish``.

    The scanning is ``batchbench.drive.sse.SseScanner`` (compiled when built): lines split
    across reads are reassembled; ``\\r\\n`` endings, comments, ``event:`` lines are
    ignored, and ``[DONE]`` is noted: a stream without usage that never sent it was cut
    off (a truncated stream). Arrival times are those of the read that completed the line.
    """

    __slots__ = ("content_type",)

    def __init__(self) -> None:
        super().__init__()
        self.content_type: str | None = None  # of the response, when the transport said

    def heard_type(self, content_type: str | None) -> None:
        """The transport's word on the response's Content-Type."""
        self.content_type = content_type

    def finish(self, sent: float) -> Reply:
        """The assembled reply, with TTFT/ITL/TPOT measured from ``sent``; an error the
        server sent in the stream fails it even when usage followed."""
        self.flush()
        if self.error is not None:
            raise ResponseError(
                STREAM_SERVER_ERROR.format(message=self.error or "(no message)"),
                ErrorKind.SERVER_ERROR,
            )
        chunks = self.chunks
        usage = self.usage
        if chunks == 0:
            content_type = self.content_type
            if content_type and not content_type.lower().startswith("text/event-stream"):
                raise ResponseError(
                    NOT_AN_EVENT_STREAM.format(content_type=content_type, head=self._head_text())
                )
            if not self.done:
                raise ResponseError(TRUNCATED_STREAM.format(chunks=0), ErrorKind.TRUNCATED_STREAM)
            raise ResponseError(NO_CHUNKS, ErrorKind.MISSING_USAGE)
        if usage is None:
            if not self.done:
                raise ResponseError(
                    TRUNCATED_STREAM.format(chunks=chunks), ErrorKind.TRUNCATED_STREAM
                )
            raise ResponseError(NO_STREAM_USAGE, ErrorKind.MISSING_USAGE)
        prompt, completion, cached = _usage_counts(usage)
        message: dict = {"role": "assistant", "content": "".join(self.content)}
        if self.reasoning:
            message[self.reasoning_key] = "".join(self.reasoning)
        reply = Reply(message, prompt, completion, cached, usage)
        times = self.times
        if times:
            reply.ttft = times[0] - sent
            reply.gaps = [b - a for a, b in itertools.pairwise(times)]
            if completion >= 2:
                reply.tpot = (times[-1] - times[0]) / (completion - 1)
        return reply

    def _head_text(self) -> str:
        """The stream's first bytes as text on one line (empty body: ``(empty)``)."""
        head = self.head or b""
        text = " ".join(head.decode("utf-8", "replace").split())
        if not text:
            return "(empty)"
        return text + "..." if len(head) >= 256 else text


# ---------------------------------------------------------------------------------------
# Errors and retries


def status_text(status: int) -> str:
    try:
        return f"{status} {http.HTTPStatus(status).phrase}"
    except ValueError:
        return str(status)


def http_error_text(status: int, body: bytes) -> str:
    """``request failed (<status> <reason>) <body, trimmed, cut at 500 chars>``."""
    text = redact(body.decode("utf-8", errors="replace")).strip()  # a server may echo the key
    if len(text) > ERROR_BODY_LIMIT:
        text = text[:ERROR_BODY_LIMIT] + "..."
    return f"request failed ({status_text(status)}) {text}"


def is_retryable_status(status: int) -> bool:
    """408, 409, 429 and every 5xx are retried; other statuses are final."""
    return status in RETRYABLE_STATUSES or 500 <= status <= 599


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds from a ``Retry-After`` value (delta-seconds or an HTTP-date); None if invalid."""
    if value is None:
        return None
    value = value.strip()
    if not value.isascii():
        return None
    if value.isdigit():
        digits = value.lstrip("0")
        if len(digits) > 10:
            return _RETRY_AFTER_MAX_S
        return min(float(int(digits or "0")), _RETRY_AFTER_MAX_S)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when is None:
        return None
    if when.tzinfo is None:
        # The asctime form carries no zone; HTTP-dates are always GMT (RFC 9110 §5.6.7).
        when = when.replace(tzinfo=datetime.UTC)
    seconds = when.timestamp() - (time.time() if now is None else now)
    return max(seconds, 0.0)


def backoff_ms(base_ms: int, attempt: int, retry_after_s: float | None = None) -> int:
    """Backoff: base × 2^attempt (exponent ≤ 31, saturating) under the ceiling, or a valid
    Retry-After when that is longer (honoured as sent; the driver bounds it with
    --max-retry-wait and says so)."""
    if base_ms == 0 and retry_after_s is None:
        return 0
    computed = min(base_ms * (1 << min(attempt, 31)), _U64_MAX)
    ceiling = max(BACKOFF_CEILING_MS, base_ms)
    delay = min(computed, ceiling)
    if retry_after_s is not None:
        delay = max(math.ceil(retry_after_s * 1000.0), delay)
    return delay


# ---------------------------------------------------------------------------------------
# Verbose views (--verbose): request and response JSON with long strings cut

VERBOSE_LIMIT = 50


def _cut(text):
    if not isinstance(text, str):
        return text
    text = text.strip()
    return text[:VERBOSE_LIMIT] + "..." if len(text) > VERBOSE_LIMIT else text


def verbose_request(body: bytes) -> str:
    """The body with message contents, tool-call arguments and descriptions cut to 50 chars."""
    document = _LOADS(body)
    for message in document.get("messages", ()):
        if "content" in message:
            message["content"] = _cut(message["content"])
        for call in message.get("tool_calls") or ():
            function = call.get("function", {})
            if "arguments" in function:
                function["arguments"] = _cut(function["arguments"])
    for tool in document.get("tools", ()) or ():
        function = tool.get("function", {})
        if "description" in function:
            function["description"] = _cut(function["description"])
    return _DUMPS(document).decode()


def verbose_response(reply: Reply) -> str:
    message = dict(reply.message)
    if "content" in message:
        message["content"] = _cut(message["content"])
    document = {"choices": [{"message": message}], "usage": reply.usage}
    try:
        return _DUMPS(document).decode()
    except TypeError:  # usage nested deeper than orjson writes: shown as what it is
        document["usage"] = "(nested too deeply to show)"
        return _DUMPS(document).decode()
