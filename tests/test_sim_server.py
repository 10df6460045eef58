"""``batchbench sim`` over HTTP: a real aiohttp server on loopback, a real client.

Each test builds ``SimServer(SimConfig(...), deepseek)`` (with exact-length replies, so counts
are predictable), serves it with ``web.AppRunner`` and ``TCPSite`` on 127.0.0.1 port 0
(as ``batchbench sim`` does) inside the test's own
event loop, and talks to it with ``aiohttp.ClientSession``. Modelled time is off
(``speed=0``) unless a test says otherwise.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from batchbench import __version__
from batchbench.sim.faults import Fault, FaultPlan
from batchbench.sim.routing import consistent_rank
from batchbench.sim.server import MALFORMED_BODY, SimConfig, SimServer
from batchbench.sim.serving import ServingModel
from batchbench.text import promptcount
from batchbench.text.promptcount import ChatMLCounter
from batchbench.text.synth import Synthesizer
from batchbench.text.tokenizer import LoadedTokenizer

CHAT = "/v1/chat/completions"
INSTANT = ServingModel(speed=0)


@pytest.fixture(scope="module", autouse=True)
def shared_chatml_tokenizer():
    """Every server here copies DeepSeek's tokenizer to add the ChatML markers (~0.5 s);
    make that copy once per module. Each server still builds its own ChatMLCounter (own
    message cache and counters); test_sim_cli.py runs the unpatched path end to end."""
    made: dict[int, Any] = {}
    original = promptcount.chatml_tokenizer

    def once(loaded: LoadedTokenizer):
        if id(loaded) not in made:
            made[id(loaded)] = original(loaded)
        return made[id(loaded)]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(promptcount, "chatml_tokenizer", once)
        yield


@pytest.fixture(scope="module")
def counter(deepseek) -> ChatMLCounter:
    """The reference count: what usage.prompt_tokens must equal."""
    return ChatMLCounter(deepseek)


@pytest.fixture(scope="module")
def synth(deepseek) -> Synthesizer:
    return Synthesizer.prepare(deepseek)


Body = Callable[[aiohttp.ClientSession, SimServer], Awaitable[Any]]


def serve(loaded: LoadedTokenizer, config: SimConfig, body: Body) -> Any:
    """Run ``body(client, server)`` against a live server on 127.0.0.1 (port 0)."""

    async def main() -> Any:
        server = SimServer(config, loaded)
        runner = server.runner()
        await runner.setup()
        try:
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            host, port = runner.addresses[0][:2]
            assert host == "127.0.0.1"
            async with aiohttp.ClientSession(base_url=f"http://127.0.0.1:{port}") as client:
                return await body(client, server)
        finally:
            await runner.cleanup()

    return asyncio.run(main())


def encode_len(loaded: LoadedTokenizer, text: str) -> int:
    return len(loaded.tokenizer.encode(text, add_special_tokens=False).ids)


def user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


LINE = re.compile(r'([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{((?:[a-zA-Z_]\w*="[^"]*",?)*)\})? (\S+)')


def parse_metrics(text: str) -> dict[tuple[str, str], float]:
    """Prometheus text -> {(name, 'k=v,...'): value}; every sample line must be well formed."""
    assert text.endswith("\n")
    samples = {}
    for line in text.splitlines():
        if line.startswith("#"):
            assert re.fullmatch(r"# (HELP|TYPE) [a-z_:]+ .+", line), line
            continue
        match = LINE.fullmatch(line)
        assert match, f"malformed metrics line: {line!r}"
        name, labels, value = match.groups()
        key = (name, ",".join(re.findall(r'(\w+="[^"]*")', labels or "")).replace('"', ""))
        assert key not in samples, line
        samples[key] = float(value)
    return samples


async def metrics(client: aiohttp.ClientSession) -> dict[tuple[str, str], float]:
    async with client.get("/metrics") as response:
        assert response.status == 200
        assert response.content_type == "text/plain"
        return parse_metrics(await response.text())


def per_rank(samples: dict, name: str, ranks: int) -> list[float]:
    return [samples[(f"batchbench_sim_{name}", f"rank={r}")] for r in range(ranks)]


def faults_of(samples: dict) -> dict[str, float]:
    return {
        labels.removeprefix("kind="): value
        for (name, labels), value in samples.items()
        if name == "batchbench_sim_faults_total"
    }


NO_FAULTS = {
    "error": 0,
    "rate_limit": 0,
    "drop": 0,
    "truncate": 0,
    "malformed": 0,
    "missing_usage": 0,
    "latency_spike": 0,
}


def sse_events(raw: bytes) -> list[bytes]:
    """The payloads of an SSE body: every event must be exactly ``data: ...\\n\\n``."""
    assert raw.endswith(b"\n\n"), raw[-80:]
    events = raw[:-2].split(b"\n\n")
    for event in events:
        assert event.startswith(b"data: ") and b"\n" not in event, event
    return [event.removeprefix(b"data: ") for event in events]


# --- plain completions ---------------------------------------------------------------------


def test_non_streamed_reply_exact_usage(deepseek, counter):
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Count to three, please."},
    ]
    prompt = counter.count(messages).prompt_tokens

    async def body(client, server):
        request = {"model": "anything", "messages": messages, "max_tokens": 12, "min_tokens": 12}
        async with client.post(CHAT, json=request) as response:
            assert response.status == 200
            assert response.content_type == "application/json"
            first = await response.json()
        async with client.post(CHAT, json=request) as response:
            second = await response.json()
        async with client.post(CHAT, json={"messages": messages, "max_tokens": 30}) as response:
            free = await response.json()
        return first, second, free, await metrics(client)

    first, second, free, samples = serve(
        deepseek, SimConfig(reply_text="exact", serving=INSTANT), body
    )
    assert prompt == 25
    assert first["object"] == "chat.completion"
    assert first["model"] == "batchbench-sim"
    assert first["id"] == "chatcmpl-1" and second["id"] == "chatcmpl-2"
    assert isinstance(first["created"], int)
    (choice,) = first["choices"]
    assert choice["index"] == 0
    assert choice["message"]["role"] == "assistant"
    assert encode_len(deepseek, choice["message"]["content"]) == 12
    assert choice["finish_reason"] == "length"
    assert first["usage"] == {
        "prompt_tokens": prompt,
        "completion_tokens": 12,
        "total_tokens": prompt + 12,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    # The same prompt again: all but the last token are cached, in whole 16-token blocks.
    assert second["usage"]["prompt_tokens_details"] == {"cached_tokens": 16}
    assert second["choices"][0]["message"]["content"] == choice["message"]["content"]
    # Without min_tokens the model "stops" somewhere in [1, 30].
    tokens = free["usage"]["completion_tokens"]
    assert 1 <= tokens <= 30
    assert encode_len(deepseek, free["choices"][0]["message"]["content"]) == tokens
    assert free["choices"][0]["finish_reason"] == ("length" if tokens == 30 else "stop")
    assert per_rank(samples, "requests_total", 1) == [3]
    assert per_rank(samples, "prompt_tokens_total", 1) == [3 * prompt]
    assert per_rank(samples, "completion_tokens_total", 1) == [24 + tokens]
    assert per_rank(samples, "cached_tokens_total", 1) == [32]


# --- prefix reuse and routing -------------------------------------------------------------

USER_TOKENS = 57  # the first prompt is 57 + 9 = 66 tokens: 2 past a block edge
TOOL_TOKENS = (40, 23, 77)
REPLY_TOKENS = 6


async def converse(
    client: aiohttp.ClientSession,
    synth: Synthesizer,
    seed: int,
    headers: dict[str, str],
    extra: dict[str, Any] | None = None,
):
    """A 4-turn growth conversation, one turn per call of the returned generator."""
    messages: list[dict[str, Any]] = user(synth.text(USER_TOKENS, seed))
    for turn in range(len(TOOL_TOKENS) + 1):
        request = {
            "messages": messages,
            "max_tokens": REPLY_TOKENS,
            "min_tokens": REPLY_TOKENS,
            **(extra or {}),
        }
        async with client.post(CHAT, json=request, headers=headers) as response:
            assert response.status == 200
            reply = await response.json()
        yield [dict(m) for m in messages], reply["usage"]
        if turn == len(TOOL_TOKENS):
            return
        call = {
            "id": f"call_{seed}_{turn}",
            "type": "function",
            "function": {"name": "environment", "arguments": '{"request":"continue"}'},
        }
        messages = [
            *messages,
            {
                "role": "assistant",
                "content": reply["choices"][0]["message"]["content"],
                "tool_calls": [call],
            },
            {
                "role": "tool",
                "tool_call_id": call["id"],
                "content": synth.text(TOOL_TOKENS[turn], seed * 10 + turn),
            },
        ]


async def interleave(client, synth, conversations: list[tuple[int, dict, dict | None]]):
    """Run conversations turn by turn, alternating; returns [(messages, usage)] per one."""
    runs = [converse(client, synth, seed, headers, extra) for seed, headers, extra in conversations]
    out: list[list] = [[] for _ in runs]
    for _ in range(len(TOOL_TOKENS) + 1):
        for index, run in enumerate(runs):
            out[index].append(await run.__anext__())
    return out


def expected_usage(counter: ChatMLCounter, turns) -> list[tuple[int, int]]:
    """(prompt, cached) per turn: the previous turn's whole prompt (its generation prompt
    included) is cached, floored to 16-token blocks, never the whole current prompt."""
    out = []
    for index, (messages, _) in enumerate(turns):
        prompt = counter.count(messages).prompt_tokens
        cached = 0
        if index:
            previous = turns[index - 1][0]
            reused = counter.count(previous).prompt_tokens
            cached = min(reused, prompt - 1) // 16 * 16
        out.append((prompt, cached))
    return out


def usages(turns) -> list[tuple[int, int]]:
    return [(u["prompt_tokens"], u["prompt_tokens_details"]["cached_tokens"]) for _, u in turns]


def test_growth_conversation_reuses_its_prefix_on_one_rank(deepseek, counter, synth):
    async def body(client, server):
        return await interleave(client, synth, [(1, {}, None)]), await metrics(client)

    (turns,), samples = serve(deepseek, SimConfig(reply_text="exact", serving=INSTANT), body)
    expected = expected_usage(counter, turns)
    assert usages(turns) == expected
    prompts = [p for p, _ in expected]
    assert prompts[0] == USER_TOKENS + 9
    for k in range(1, 4):  # each turn adds its reply, its tool result and 35 template tokens
        assert prompts[k] - prompts[k - 1] == REPLY_TOKENS + TOOL_TOKENS[k - 1] + 35
    assert expected == [(66, 0), (147, 64), (211, 144), (329, 208)]
    assert per_rank(samples, "cached_tokens_total", 1) == [64 + 144 + 208]
    assert per_rank(samples, "prompt_tokens_total", 1) == [sum(prompts)]
    # 7 distinct messages, each encoded once however often it was posted.
    assert samples[("batchbench_sim_encoded_messages_total", "")] == 7


def test_growth_conversation_reuses_the_whole_previous_prompt(deepseek, counter, synth):
    async def body(client, server):
        return await interleave(client, synth, [(1, {}, None)])

    (turns,) = serve(deepseek, SimConfig(reply_text="exact", serving=INSTANT), body)
    previous = [counter.count(messages).prompt_tokens for messages, _ in turns]
    # A real paged KV cache holds every token of turn k's prompt ("<|im_start|>assistant\n"
    # included), and turn k+1 starts with exactly those tokens.
    assert [cached for _, cached in usages(turns)][1:] == [p // 16 * 16 for p in previous[:-1]]


def test_growth_reuse_with_target_worker_on_four_ranks(deepseek, counter, synth):
    async def body(client, server):
        runs = await interleave(
            client,
            synth,
            [
                (1, {"x-smg-target-worker": "3"}, None),
                (2, {"x-smg-target-worker": "1"}, None),
                (3, {"x-data-parallel-rank": "1"}, None),
            ],
        )
        return runs, await metrics(client)

    config = SimConfig(reply_text="exact", dp_ranks=4, serving=INSTANT)
    (one, two, three), samples = serve(deepseek, config, body)
    assert (
        usages(one) == expected_usage(counter, one) == [(66, 0), (147, 64), (211, 144), (329, 208)]
    )
    assert usages(two) == expected_usage(counter, two)
    assert usages(three) == expected_usage(counter, three)
    assert per_rank(samples, "requests_total", 4) == [0, 8, 0, 4]
    shared = sum(c for _, c in usages(two) + usages(three))
    assert per_rank(samples, "cached_tokens_total", 4) == [0, shared, 0, 64 + 144 + 208]


def test_growth_without_routing_headers_spreads_round_robin(deepseek, counter, synth):
    """Least-loaded routing: each request is answered before the next arrives, so every
    rank has load 0 and ties rotate; the body's ``user`` is not a routing key. Two
    interleaved conversations on 4 ranks: conversation one lands on ranks 0, 2, 0, 2, so
    each turn reuses only the prompt from two turns before (on the same rank)."""

    async def body(client, server):
        runs = await interleave(client, synth, [(1, {}, None), (2, {}, {"user": "agent-42"})])
        return runs, await metrics(client)

    (one, two), samples = serve(
        deepseek, SimConfig(reply_text="exact", dp_ranks=4, serving=INSTANT), body
    )
    prompts = [counter.count(messages).prompt_tokens for messages, _ in one]
    assert prompts == [66, 147, 211, 329]
    expected = [(66, 0), (147, 0), (211, 66 // 16 * 16), (329, 147 // 16 * 16)]
    assert usages(one) == expected == [(66, 0), (147, 0), (211, 64), (329, 144)]
    assert per_rank(samples, "requests_total", 4) == [2, 2, 2, 2]
    assert per_rank(samples, "in_flight", 4) == [0, 0, 0, 0]
    assert per_rank(samples, "cached_tokens_total", 4) == [
        64,
        usages(two)[2][1],
        144,
        usages(two)[3][1],
    ]


def test_growth_with_routing_key_sticks_to_its_consistent_rank(deepseek, counter, synth):
    keys = {"user-1": 2, "agent-42": 1, "user-0": 0}
    assert {key: consistent_rank(key, 4) for key in keys} == keys

    async def body(client, server):
        runs = await interleave(
            client,
            synth,
            [(seed, {"x-smg-routing-key": key}, None) for seed, key in enumerate(keys, 1)],
        )
        return runs, await metrics(client)

    runs, samples = serve(
        deepseek, SimConfig(reply_text="exact", dp_ranks=4, serving=INSTANT), body
    )
    for turns in runs:
        assert usages(turns) == expected_usage(counter, turns)
    assert usages(runs[0]) == [(66, 0), (147, 64), (211, 144), (329, 208)]
    assert per_rank(samples, "requests_total", 4) == [4, 4, 4, 0]
    cached = [sum(c for _, c in usages(turns)) for turns in runs]
    assert per_rank(samples, "cached_tokens_total", 4) == [cached[2], cached[1], cached[0], 0]
    prompts = [sum(p for p, _ in usages(turns)) for turns in runs]
    assert per_rank(samples, "prompt_tokens_total", 4) == [prompts[2], prompts[1], prompts[0], 0]


def test_cache_capacity_zero_and_block_size(deepseek, counter, synth):
    async def body(client, server):
        return await interleave(client, synth, [(1, {}, None)])

    (turns,) = serve(
        deepseek,
        SimConfig(reply_text="exact", serving=ServingModel(speed=0, kv_cache_tokens=0)),
        body,
    )
    assert usages(turns) == [(66, 0), (147, 0), (211, 0), (329, 0)]
    (turns,) = serve(
        deepseek, SimConfig(reply_text="exact", serving=ServingModel(speed=0, block_tokens=1)), body
    )
    ends = [counter.count(m).prompt_tokens for m, _ in turns]
    assert usages(turns) == [(66, 0), (147, ends[0]), (211, ends[1]), (329, ends[2])]
    assert ends[:3] == [66, 147, 211]


# --- streaming ---------------------------------------------------------------------------


async def stream(client, request: dict, headers: dict | None = None):
    async with client.post(CHAT, json={**request, "stream": True}, headers=headers) as response:
        assert response.status == 200
        assert response.headers["Content-Type"] == "text/event-stream"
        assert response.headers["Cache-Control"] == "no-cache"
        return await response.read()


def split_stream(raw: bytes):
    """(role chunk, content chunks, usage chunk or None, ended with [DONE])."""
    events = sse_events(raw)
    done = events[-1] == b"[DONE]"
    if done:
        events = events[:-1]
    chunks = [json.loads(event) for event in events]
    role, rest = chunks[0], chunks[1:]
    usage = None
    if rest and "usage" in rest[-1]:
        usage = rest.pop()
    return role, rest, usage, done


def test_streaming_one_token_per_chunk(deepseek, counter):
    messages = user("Stream me a reply.")
    prompt = counter.count(messages).prompt_tokens

    async def body(client, server):
        request = {"messages": messages, "max_tokens": 9, "min_tokens": 9}
        with_usage = await stream(client, {**request, "stream_options": {"include_usage": True}})
        without = await stream(client, request)
        return with_usage, without, await metrics(client)

    with_usage, without, samples = serve(
        deepseek, SimConfig(reply_text="exact", serving=INSTANT), body
    )
    role, content, usage, done = split_stream(with_usage)
    assert done
    assert role["object"] == "chat.completion.chunk"
    assert role["model"] == "batchbench-sim"
    assert role["choices"] == [{"index": 0, "delta": {"role": "assistant"}}]
    assert len(content) == 9
    assert all(c["id"] == role["id"] for c in content)
    texts = [c["choices"][0]["delta"]["content"] for c in content]
    assert [encode_len(deepseek, t) for t in texts] == [1] * 9
    assert encode_len(deepseek, "".join(texts)) == 9
    assert [c["choices"][0]["finish_reason"] for c in content] == [None] * 8 + ["length"]
    assert usage["choices"] == []
    assert usage["usage"] == {
        "prompt_tokens": prompt,
        "completion_tokens": 9,
        "total_tokens": prompt + 9,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    role, content_2, usage, done = split_stream(without)
    assert done and usage is None
    assert len(content_2) == 9
    assert per_rank(samples, "completion_tokens_total", 1) == [18]
    assert per_rank(samples, "cached_tokens_total", 1) == [(prompt - 1) // 16 * 16]


def test_streaming_three_tokens_per_chunk(deepseek):
    async def body(client, server):
        request = {"messages": user("Three at a time."), "max_tokens": 10, "ignore_eos": True}
        return await stream(client, {**request, "stream_options": {"include_usage": True}})

    raw = serve(
        deepseek, SimConfig(reply_text="exact", stream_chunk_tokens=3, serving=INSTANT), body
    )
    _, content, usage, done = split_stream(raw)
    assert done
    texts = [c["choices"][0]["delta"]["content"] for c in content]
    assert len(texts) == math.ceil(10 / 3) == 4
    assert [encode_len(deepseek, t) for t in texts] == [3, 3, 3, 1]
    assert encode_len(deepseek, "".join(texts)) == 10
    assert usage["usage"]["completion_tokens"] == 10


# --- faults --------------------------------------------------------------------------------


def fault_config(kind: Fault, **plan: Any) -> SimConfig:
    return SimConfig(
        reply_text="exact", serving=INSTANT, faults=FaultPlan(seed=5, rates={kind: 1.0}, **plan)
    )


REQUEST = {"messages": user("Fault me."), "max_tokens": 8, "min_tokens": 8}
STREAMED = {**REQUEST, "stream": True, "stream_options": {"include_usage": True}}


def test_fault_error_statuses(deepseek):
    plan = FaultPlan(seed=5, rates={Fault.ERROR: 1.0}, error_statuses=(502, 504))
    expected = [plan.decide(n).status for n in range(6)]
    assert set(expected) == {502, 504}

    async def body(client, server):
        seen = []
        for n in range(6):
            async with client.post(CHAT, json=STREAMED if n % 2 else REQUEST) as response:
                assert response.content_type == "application/json"
                seen.append((response.status, await response.json()))
        return seen, await metrics(client)

    config = fault_config(Fault.ERROR, error_statuses=(502, 504))
    seen, samples = serve(deepseek, config, body)
    assert [status for status, _ in seen] == expected
    for status, error in seen:
        assert error == {
            "error": {"message": "simulated failure", "type": "server_error", "code": status}
        }
    assert faults_of(samples) == NO_FAULTS | {"error": 6}
    assert per_rank(samples, "requests_total", 1) == [0]  # failed requests are not served


def test_fault_rate_limit_with_retry_after(deepseek):
    async def body(client, server):
        seen = []
        for request in (REQUEST, STREAMED):
            async with client.post(CHAT, json=request) as response:
                seen.append(
                    (response.status, response.headers["Retry-After"], await response.json())
                )
        return seen, await metrics(client)

    seen, samples = serve(deepseek, fault_config(Fault.RATE_LIMIT, retry_after_seconds=7), body)
    error = {"error": {"message": "simulated rate limit", "type": "rate_limit_error", "code": 429}}
    assert seen == [(429, "7", error), (429, "7", error)]
    assert faults_of(samples) == NO_FAULTS | {"rate_limit": 2}


TRANSPORT_ERRORS = (
    aiohttp.ClientPayloadError,
    aiohttp.ServerDisconnectedError,
    aiohttp.ClientOSError,
)


def test_fault_drop_cuts_the_connection(deepseek):
    async def body(client, server):
        outcomes = []
        for request in (REQUEST, STREAMED):
            with pytest.raises(TRANSPORT_ERRORS) as caught:
                async with client.post(CHAT, json=request) as response:
                    assert response.status == 200
                    await response.read()
            outcomes.append(type(caught.value))
        # The server still answers new connections afterwards.
        async with client.get("/health") as response:
            assert response.status == 200
        return outcomes, await metrics(client)

    outcomes, samples = serve(deepseek, fault_config(Fault.DROP), body)
    assert outcomes == [aiohttp.ClientPayloadError, aiohttp.ClientPayloadError]
    assert faults_of(samples) == NO_FAULTS | {"drop": 2}


def test_fault_truncate_ends_streams_early(deepseek, counter):
    async def body(client, server):
        streamed = await stream(client, STREAMED)
        async with client.post(CHAT, json=REQUEST) as response:
            plain = await response.json()
        return streamed, plain, await metrics(client)

    streamed, plain, samples = serve(deepseek, fault_config(Fault.TRUNCATE), body)
    role, content, usage, done = split_stream(streamed)
    assert role["choices"][0]["delta"] == {"role": "assistant"}
    assert len(content) == 4  # half of the 8 chunks
    assert usage is None and not done
    assert all(c["choices"][0]["finish_reason"] is None for c in content)
    # A non-streamed reply is unaffected (and not counted as a fault).
    assert plain["usage"]["completion_tokens"] == 8
    assert faults_of(samples) == NO_FAULTS | {"truncate": 1}
    assert per_rank(samples, "completion_tokens_total", 1) == [4 + 8]


def test_fault_malformed_json(deepseek):
    async def body(client, server):
        async with client.post(CHAT, json=REQUEST) as response:
            assert response.status == 200
            plain = await response.read()
        return plain, await stream(client, STREAMED), await metrics(client)

    plain, streamed, samples = serve(deepseek, fault_config(Fault.MALFORMED), body)
    assert plain == MALFORMED_BODY
    with pytest.raises(json.JSONDecodeError):
        json.loads(plain)
    events = sse_events(streamed)
    bad = []
    for index, event in enumerate(events[:-1]):
        try:
            json.loads(event)
        except json.JSONDecodeError:
            bad.append(index)
    assert bad == [5]  # role chunk, 4 content chunks, then the broken one
    assert events[-1] == b"[DONE]"
    assert b'"usage"' in events[-2]
    assert faults_of(samples) == NO_FAULTS | {"malformed": 2}


def test_fault_missing_usage(deepseek):
    async def body(client, server):
        async with client.post(CHAT, json=REQUEST) as response:
            plain = await response.json()
        return plain, await stream(client, STREAMED), await metrics(client)

    plain, streamed, samples = serve(deepseek, fault_config(Fault.MISSING_USAGE), body)
    assert "usage" not in plain
    assert encode_len(deepseek, plain["choices"][0]["message"]["content"]) == 8
    _, content, usage, done = split_stream(streamed)
    assert len(content) == 8 and usage is None and done
    assert faults_of(samples) == NO_FAULTS | {"missing_usage": 2}


def test_fault_latency_spike(deepseek):
    async def body(client, server):
        started = time.perf_counter()
        async with client.post(CHAT, json=REQUEST) as response:
            reply = await response.json()
        return time.perf_counter() - started, reply, await metrics(client)

    config = SimConfig(
        reply_text="exact", serving=INSTANT, faults=FaultPlan(spike_rate=1.0, spike_ms=200.0)
    )
    elapsed, reply, samples = serve(deepseek, config, body)
    assert elapsed >= 0.2
    assert reply["usage"]["completion_tokens"] == 8
    assert faults_of(samples) == NO_FAULTS | {"latency_spike": 1}


# --- other endpoints ----------------------------------------------------------------------


def test_models_health_and_tokenize(deepseek, counter):
    messages = [
        {"role": "user", "content": "Tokenize this."},
        {"role": "assistant", "content": "Sure."},
    ]

    async def body(client, server):
        out = {}
        async with client.get("/v1/models") as response:
            out["models"] = await response.json()
        async with client.get("/health") as response:
            out["health"] = (response.status, await response.json())
        async with client.post("/tokenize", json={"messages": messages}) as response:
            out["messages"] = await response.json()
        request = {"messages": messages, "add_generation_prompt": False}
        async with client.post("/tokenize", json=request) as response:
            out["closed"] = await response.json()
        async with client.post("/tokenize", json={"prompt": "<|im_start|>user\nhi"}) as response:
            out["prompt"] = await response.json()
        for name, data in (
            ("bad_json", b"{nope"),
            ("neither", b'{"prompt": 3}'),
            ("bad_message", b'{"messages": [{"content": "x"}]}'),
            ("empty", b'{"messages": []}'),
        ):
            async with client.post("/tokenize", data=data) as response:
                out[name] = (response.status, await response.json())
        return out

    out = serve(
        deepseek, SimConfig(reply_text="exact", model_name="sim-model", serving=INSTANT), body
    )
    (model,) = out["models"]["data"]
    assert out["models"]["object"] == "list"
    assert model == {
        "id": "sim-model",
        "object": "model",
        "created": model["created"],
        "owned_by": "batchbench-sim",
    }
    assert abs(model["created"] - time.time()) < 60
    assert out["health"] == (200, {"status": "ok"})
    full = out["messages"]
    assert full["tokens"] == counter.encode_ids(messages)
    assert full["count"] == len(full["tokens"]) == counter.count(messages).prompt_tokens == 21
    assert full["max_model_len"] == SimConfig().max_model_len == 262_144
    closed = out["closed"]
    assert closed["count"] == len(closed["tokens"]) == 21 - 4
    assert closed["tokens"] == full["tokens"][:17]
    prompt = out["prompt"]
    im_start = counter.tokenizer.token_to_id("<|im_start|>")
    rest = deepseek.tokenizer.encode("user\nhi", add_special_tokens=False).ids
    assert prompt["tokens"] == [im_start, *rest]
    assert prompt["count"] == len(prompt["tokens"]) == 1 + len(rest)
    assert out["bad_json"] == (400, error("request body is not valid JSON"))
    assert out["neither"] == (400, error("tokenize needs messages, a prompt or a content string"))
    assert out["bad_message"] == (400, error("each message needs a non-empty string role"))
    assert out["empty"] == (400, error("messages must be a non-empty list"))


def error(message: str) -> dict:
    return {"error": {"message": message, "type": "invalid_request_error", "code": 400}}


def test_metrics_totals_per_rank(deepseek, counter, synth):
    """Totals past a million tokens are printed exactly (Prometheus reads them as numbers)."""
    long_prompt = user(synth.text(50_000, 99))
    short_prompt = user("short")
    long_tokens = counter.count(long_prompt).prompt_tokens
    short_tokens = counter.count(short_prompt).prompt_tokens
    assert (long_tokens, short_tokens) == (50_009, 10)

    async def body(client, server):
        sent = {0: [], 1: []}
        for rank, messages, repeats in ((1, long_prompt, 21), (0, short_prompt, 3)):
            for _ in range(repeats):
                request = {"messages": messages, "max_tokens": 5, "ignore_eos": True}
                headers = {"x-data-parallel-rank": str(rank)}
                async with client.post(CHAT, json=request, headers=headers) as response:
                    sent[rank].append((await response.json())["usage"])
        async with client.post(CHAT, data=b"[1]") as response:
            assert response.status == 400
        return sent, await metrics(client)

    sent, samples = serve(
        deepseek, SimConfig(reply_text="exact", dp_ranks=2, serving=INSTANT), body
    )
    total = {
        field: [sum(u[field] for u in sent[r]) for r in (0, 1)]
        for field in ("prompt_tokens", "completion_tokens")
    }
    cached = [sum(u["prompt_tokens_details"]["cached_tokens"] for u in sent[r]) for r in (0, 1)]
    assert total["prompt_tokens"] == [3 * 10, 21 * 50_009]
    assert total["completion_tokens"] == [15, 105]
    assert cached == [0, 20 * (50_008 // 16 * 16)]
    assert per_rank(samples, "requests_total", 2) == [3, 21]
    assert per_rank(samples, "prompt_tokens_total", 2) == [30, 1_050_189]
    assert per_rank(samples, "completion_tokens_total", 2) == [15, 105]
    assert per_rank(samples, "cached_tokens_total", 2) == [0, 1_000_000]
    assert per_rank(samples, "kv_cache_used_tokens", 2) == [10, 50_009]
    for gauge in ("queue_depth", "running", "in_flight"):
        assert per_rank(samples, gauge, 2) == [0, 0]
    assert faults_of(samples) == NO_FAULTS
    assert samples[("batchbench_sim_rejected_total", "")] == 1
    assert samples[("batchbench_sim_encoded_messages_total", "")] == 2
    assert samples[("batchbench_sim_info", f"version={__version__}")] == 1


# --- 400s ---------------------------------------------------------------------------------


def test_bad_requests_are_400(deepseek):
    cases = [
        (b"{not json", {}, "request body is not valid JSON"),
        (b'"hello"', {}, "request body must be a JSON object"),
        (b'{"messages": []}', {}, "messages must be a non-empty list"),
        (b'{"max_tokens": 3}', {}, "messages must be a non-empty list"),
        (
            b'{"messages": [{"role": "user", "content": "x"}]}',
            {"x-smg-target-worker": "2"},
            "x-smg-target-worker 2 is out of range: this server has 2 ranks",
        ),
        (
            b'{"messages": [{"role": "user", "content": "x"}]}',
            {"X-Data-Parallel-Rank": "one"},
            "x-data-parallel-rank must be an integer rank, got 'one'",
        ),
        (
            b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}',
            {},
            "max_tokens must be greater than zero",
        ),
        (
            b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": -3}',
            {},
            "max_tokens must be a non-negative integer",
        ),
        (b'{"messages": ["x"]}', {}, "each message must be an object"),
    ]

    async def body(client, server):
        seen = []
        for data, headers, _ in cases:
            headers = {"Content-Type": "application/json", **headers}
            async with client.post(CHAT, data=data, headers=headers) as response:
                seen.append((response.status, await response.json()))
        return seen, await metrics(client)

    seen, samples = serve(
        deepseek, SimConfig(reply_text="exact", dp_ranks=2, serving=INSTANT), body
    )
    assert seen == [(400, error(message)) for _, _, message in cases]
    assert samples[("batchbench_sim_rejected_total", "")] == len(cases)
    assert per_rank(samples, "requests_total", 2) == [0, 0]


# --- modelled time ------------------------------------------------------------------------

TIMED = ServingModel(
    prefill_tokens_per_s=10_000.0,
    decode_step_ms=20.0,
    decode_step_ms_per_seq=0.0,
    max_batch=1,
    speed=1.0,
)


def test_batch_cap_queues_the_second_request(deepseek):
    """max_batch 1: the second request waits for the first's 5 steps of 20 ms, then runs
    its own 5 (prefill of ~10 tokens at 10k tok/s adds ~1 ms a request)."""

    async def body(client, server):
        request = {"messages": user("Queue me."), "max_tokens": 5, "min_tokens": 5}
        started = time.perf_counter()

        async def timed(tag: str) -> tuple[float, dict]:
            async with client.post(CHAT, json={**request, "user": tag}) as response:
                reply = await response.json()
            return time.perf_counter() - started, reply

        tasks = [asyncio.create_task(timed(tag)) for tag in ("a", "b")]
        polled = []
        while not all(task.done() for task in tasks):
            samples = await metrics(client)
            polled.append(
                (
                    samples[("batchbench_sim_queue_depth", "rank=0")],
                    samples[("batchbench_sim_running", "rank=0")],
                )
            )
            await asyncio.sleep(0.01)
        return [task.result() for task in tasks], polled, await metrics(client)

    results, polled, samples = serve(deepseek, SimConfig(reply_text="exact", serving=TIMED), body)
    first, second = sorted(elapsed for elapsed, _ in results)
    assert first >= 0.1 - 0.005
    assert second >= 0.2 - 0.005
    assert second < 3.0
    assert (1, 1) in polled  # one running, one queued
    assert all(queued <= 1 and running <= 1 for queued, running in polled)
    for _, reply in results:
        assert reply["usage"]["completion_tokens"] == 5
    assert per_rank(samples, "queue_depth", 1) == [0]
    assert per_rank(samples, "running", 1) == [0]


def test_streamed_tokens_are_paced_by_decode_steps(deepseek):
    """Token i (0-based) is generated by step i + 1, 20 ms each, and sent only then."""

    async def body(client, server):
        request = {"messages": user("Pace me."), "max_tokens": 5, "min_tokens": 5, "stream": True}
        arrivals = []
        started = time.perf_counter()
        async with client.post(CHAT, json=request) as response:
            async for line in response.content:
                if line.startswith(b"data: {") and b'"content"' in line:
                    arrivals.append(time.perf_counter() - started)
        return arrivals

    arrivals = serve(deepseek, SimConfig(reply_text="exact", serving=TIMED), body)
    assert len(arrivals) == 5
    # Lower bounds hold however slow the machine; the spread only needs the client to
    # have read the first chunk within 40 ms of its arrival.
    for index, arrived in enumerate(arrivals):
        assert arrived >= 0.02 * (index + 1) - 0.005, arrivals
    assert arrivals[-1] - arrivals[0] >= 0.04, arrivals


def test_least_loaded_spreads_concurrent_requests(deepseek):
    async def body(client, server):
        # 10 steps of 20 ms: all three arrive long before the first one finishes.
        request = {"messages": user("Spread me."), "max_tokens": 10, "min_tokens": 10}

        async def post():
            async with client.post(CHAT, json=request) as response:
                return (await response.json())["usage"]["completion_tokens"]

        done = await asyncio.gather(post(), post(), post())
        return done, await metrics(client)

    done, samples = serve(deepseek, SimConfig(reply_text="exact", dp_ranks=2, serving=TIMED), body)
    assert done == [10, 10, 10]
    # Requests 1 and 2 land on ranks 0 and 1; the third sees loads (1, 1) and takes rank 0.
    assert per_rank(samples, "requests_total", 2) == [2, 1]


# --- review follow-ups: tools, context length, floors, chunked prefill, disconnects -------


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "fn_0123456789ab",
            "description": "looks things up",
            "parameters": {"type": "object", "properties": {}},
        },
    }
]


def test_tools_are_prompt_content(deepseek, counter):
    messages = user("hello there")

    async def body(client, server):
        out = []
        for extra in ({}, {"tools": TOOLS}):
            request = {"messages": messages, "max_tokens": 2, **extra}
            async with client.post(CHAT, json=request) as response:
                assert response.status == 200
                out.append((await response.json())["usage"]["prompt_tokens"])
            async with client.post("/tokenize", json={"messages": messages, **extra}) as response:
                out.append((await response.json())["count"])
        async with client.post(CHAT, json={"messages": messages, "tools": {"a": 1}}) as response:
            out.append((response.status, (await response.json())["error"]["message"]))
        return out

    plain, plain_count, with_tools, tools_count, bad = serve(
        deepseek, SimConfig(reply_text="exact", serving=INSTANT), body
    )
    assert plain == plain_count == counter.count(messages).prompt_tokens
    reference = len(counter.encode_ids(messages, tools=TOOLS))
    assert (
        with_tools == tools_count == reference == counter.count(messages, tools=TOOLS).prompt_tokens
    )
    assert with_tools > plain + 20
    assert bad == (400, "tools must be a list of objects")


def test_context_length_limit_is_a_400(deepseek, counter):
    messages = user("hello there")
    prompt = counter.count(messages).prompt_tokens

    async def body(client, server):
        out = []
        for cap in (100 - prompt, 101 - prompt):
            async with client.post(
                CHAT, json={"messages": messages, "max_tokens": cap}
            ) as response:
                out.append((response.status, await response.json()))
        return out

    (ok, _), (status, error) = serve(
        deepseek, SimConfig(reply_text="exact", serving=INSTANT, max_model_len=100), body
    )
    assert ok == 200 and status == 400
    assert error["error"]["message"] == (
        "This model's maximum context length is 100 tokens. However, you requested 101 "
        f"tokens ({prompt} in the messages, {101 - prompt} in the completion)."
    )


def test_a_floor_alone_raises_the_default_cap(deepseek):
    async def body(client, server):
        request = {"messages": user("hi"), "min_tokens": 300}
        async with client.post(CHAT, json=request) as response:
            return (await response.json())["usage"]["completion_tokens"]

    assert (
        serve(
            deepseek, SimConfig(reply_text="exact", serving=INSTANT, default_max_tokens=256), body
        )
        == 300
    )


@pytest.mark.serial
def test_chunked_prefill_spreads_a_long_prompt_over_steps():
    """Budget 100 tokens per step: a 250-token prefill takes three steps (100, 100, 50
    tokens at 10,000 tok/s plus a 10 ms step each: 20 + 20 + 15 ms); the first token comes
    out of the third, then two decode steps of 10 ms: 75 ms in all. Without the budget
    it is one 35 ms prefill step plus two decode steps: 55 ms."""
    from batchbench.sim.serving import Rank

    async def run(budget: int) -> tuple[float, list[int]]:
        model = ServingModel(
            prefill_tokens_per_s=10_000,
            decode_step_ms=10,
            decode_step_ms_per_seq=0,
            max_batch=4,
            max_num_batched_tokens=budget,
        )
        rank = Rank(0, model)
        started = time.perf_counter()
        sequence = rank.submit(250, 3)
        seen = []
        while not sequence.done.done():
            seen.append(sequence.prefill_left)
            await asyncio.sleep(0.005)
        return time.perf_counter() - started, seen

    chunked, left = asyncio.run(run(100))
    whole, whole_left = asyncio.run(run(8192))
    assert 150 in left and 50 in left  # the prefill advanced 100 tokens per step
    assert 150 not in whole_left and 50 not in whole_left  # one step took it all
    assert chunked >= 0.075 and whole >= 0.055


def test_a_client_that_goes_away_frees_its_slot(deepseek):
    """A non-streamed request of 1000 tokens at 10 ms a step, abandoned after 0.3 s: the
    handler is cancelled, so the rank has nothing running or queued and counts nothing."""
    slow = ServingModel(decode_step_ms=10, decode_step_ms_per_seq=0, max_batch=1)

    async def body(client, server):
        request = {"messages": user("hello"), "max_tokens": 1000, "min_tokens": 1000}
        for stream in (False, True):
            timeout = aiohttp.ClientTimeout(total=0.3)
            with pytest.raises(asyncio.TimeoutError):
                async with client.post(
                    CHAT, json={**request, "stream": stream}, timeout=timeout
                ) as response:
                    await response.read()
        await asyncio.sleep(0.3)
        return await metrics(client)

    samples = serve(deepseek, SimConfig(reply_text="exact", serving=slow), body)
    assert per_rank(samples, "running", 1) == [0]
    assert per_rank(samples, "queue_depth", 1) == [0]
    assert per_rank(samples, "in_flight", 1) == [0]
    assert per_rank(samples, "requests_total", 1) == [0]
    assert per_rank(samples, "completion_tokens_total", 1) == [0]


def test_a_prompt_joins_the_cache_only_after_its_prefill(deepseek, synth):
    """Two requests with the same new 500-token prompt, sent together to one rank: the
    second is not credited with blocks the first has not computed yet. A third, sent
    after both finished, is credited with the whole prompt but its last partial block."""
    model = ServingModel(prefill_tokens_per_s=10_000, decode_step_ms=5, max_batch=4)
    messages = user(synth.text(500, 5))

    async def body(client, server):
        async def post():
            request = {"messages": messages, "max_tokens": 3, "min_tokens": 3}
            async with client.post(CHAT, json=request) as response:
                return (await response.json())["usage"]

        together = await asyncio.gather(post(), post())
        return together, await post()

    together, later = serve(deepseek, SimConfig(reply_text="exact", serving=model), body)
    prompt = later["prompt_tokens"]
    assert [u["prompt_tokens_details"]["cached_tokens"] for u in together] == [0, 0]
    assert later["prompt_tokens_details"]["cached_tokens"] == (prompt - 1) // 16 * 16
