"""The simulator's HTTP server: OpenAI-compatible chat completions on aiohttp + uvloop.

Endpoints: ``POST /v1/chat/completions`` (JSON or SSE), ``GET /v1/models``,
``GET /health``, ``POST /tokenize`` (vLLM's and llama.cpp's forms), ``POST /apply-template``
(llama.cpp's) and ``GET /metrics`` (Prometheus text).
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import orjson
from aiohttp import web
from tokenizers import Tokenizer

from batchbench import __version__
from batchbench.sim.faults import FAULT_ORDER, Fault, FaultPlan
from batchbench.sim.replies import (
    THINKING,
    ModelReplyText,
    OutputPlan,
    Replies,
    ReplyText,
    RequestError,
    plan_output,
    reasoning_tokens,
)
from batchbench.sim.routing import RoutingError, choose_rank
from batchbench.sim.serving import Rank, ServingModel
from batchbench.text.chat_templates import TemplateError
from batchbench.text.promptcount import JinjaCounter, SegmentCounter, load_counter
from batchbench.text.synth import Synthesizer
from batchbench.text.tokenizer import LoadedTokenizer

JSON = "application/json"
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
MALFORMED_BODY = b'{"id": "chatcmpl-malformed", "choices": [{"message": '
MAX_REQUEST_BYTES = 1 << 30  # whole conversations are posted each turn; allow long ones
# vLLM's time-to-first-token buckets (seconds), so scrapers read the sim as they read vLLM.
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
# Request storage key: perf_counter() when the handler began (typed keys need aiohttp 3.12).
ARRIVED: Any = (
    web.RequestKey("batchbench_sim_arrived", float)
    if hasattr(web, "RequestKey")
    else "batchbench_sim_arrived"
)


@dataclass
class SimConfig:
    """Everything ``batchbench sim`` was asked for (units and help: ``batchbench.cli.sim``)."""

    host: str = "127.0.0.1"
    port: int = 8000
    model_name: str = "batchbench-sim"
    dp_ranks: int = 1
    chat_template: str = "chatml"
    reply_text: str = "model"  # "model": token ids decoded; "exact": text of exactly n tokens
    reasoning_share: float = 0.0  # share of replies that start with reasoning
    reasoning_field: str = "reasoning_content"  # or "reasoning", as vLLM names it since 0.17
    default_max_tokens: int = 256
    max_model_len: int = 262_144
    stream_chunk_tokens: int = 1
    close_after_stream: bool = False  # llama.cpp's server: a finished stream ends its connection
    serving: ServingModel = field(default_factory=ServingModel)
    faults: FaultPlan = field(default_factory=FaultPlan)


@dataclass(slots=True)
class Job:
    """One admitted chat completion: where it runs and what it must produce."""

    rank: Rank
    prompt: int
    cached: int
    output: OutputPlan
    fault: Fault | None
    store: Callable[[], None]  # caches the prompt's prefixes once it is prefilled


class Histogram:
    """A Prometheus histogram without the library: per-bucket counts, rendered cumulative."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1  # le: value <= bound
        self.sum += value

    def cumulative(self) -> list[tuple[str, int]]:
        """(le label value, observations at or below it), ``+Inf`` last."""
        les = [repr(float(bound)) for bound in self.bounds] + ["+Inf"]
        return list(zip(les, itertools.accumulate(self.counts), strict=True))


def _error(status: int, message: str, kind: str = "invalid_request_error") -> web.Response:
    body = {"error": {"message": message, "type": kind, "code": status}}
    return web.Response(status=status, body=orjson.dumps(body), content_type=JSON)


class SimServer:
    """State shared by the handlers: tokenizer, counters, ranks, faults and metrics."""

    def __init__(self, config: SimConfig, loaded: LoadedTokenizer, warn=None) -> None:
        self.config = config
        self.loaded = loaded
        self.counter: SegmentCounter | JinjaCounter = load_counter(
            loaded, config.chat_template, config.serving.block_tokens, warn
        )
        self.replies: Replies = (
            ModelReplyText(loaded)
            if config.reply_text == "model"
            else ReplyText(Synthesizer.prepare(loaded))
        )
        self.ranks = [Rank(i, config.serving) for i in range(config.dp_ranks)]
        self.ttft = [Histogram(TTFT_BUCKETS) for _ in self.ranks]  # per rank, for /metrics
        self.faults = config.faults
        self.fault_counts = dict.fromkeys(Fault, 0)
        self.spikes = 0
        self.arrivals = itertools.count()
        self.rejected = 0  # 400s: bad bodies, bad rank headers
        self.started = time.time()
        self._ids = itertools.count(1)
        self._least_loaded_turns = itertools.count()  # rotates ties among idle ranks
        self._plain: Tokenizer | None = None  # built on the first parse_special=false

    # --- the application -----------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_REQUEST_BYTES)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        app.router.add_post("/tokenize", self.tokenize)
        app.router.add_post("/apply-template", self.apply_template)
        app.router.add_get("/metrics", self.metrics)
        return app

    def runner(self) -> web.AppRunner:
        """The runner ``batchbench sim`` serves with (tests use the same one).

        ``handler_cancellation``: a client that goes away cancels its handler, which frees
        its batch slot and queue place instead of leaving the request running unseen.
        """
        return web.AppRunner(
            self.app(), access_log=None, handle_signals=False, handler_cancellation=True
        )

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(body=b'{"status":"ok"}', content_type=JSON)

    async def models(self, request: web.Request) -> web.Response:
        body = {
            "object": "list",
            "data": [
                {
                    "id": self.config.model_name,
                    "object": "model",
                    "created": int(self.started),
                    "owned_by": "batchbench-sim",
                }
            ],
        }
        return web.Response(body=orjson.dumps(body), content_type=JSON)

    async def tokenize(self, request: web.Request) -> web.Response:
        """``/tokenize`` in vLLM's forms (``messages``: the rendered chat prompt's ids and
        count; ``prompt``: a text's) and in llama.cpp's (``content``: ``tokens``)."""
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError:
            return _error(400, "request body is not valid JSON")
        if not isinstance(body, dict):
            return _error(400, "request body must be a JSON object")
        loop = asyncio.get_running_loop()
        try:  # one-pass encodes of whole prompts: on a worker thread, off the event loop
            if "messages" in body:
                messages = _messages(body)
                generation = body.get("add_generation_prompt", True) is not False
                ids = await loop.run_in_executor(
                    None, self.counter.encode_ids, messages, generation, body.get("tools")
                )
            elif isinstance(body.get("prompt"), str):
                encoding = await loop.run_in_executor(
                    None,
                    partial(self.counter.tokenizer.encode, add_special_tokens=False),
                    body["prompt"],
                )
                ids = encoding.ids
            elif isinstance(body.get("content"), str):
                # llama.cpp's form: {"content", "add_special", "parse_special"} -> {"tokens"}
                tokens = await loop.run_in_executor(
                    None,
                    self._llama_cpp_tokens,
                    body["content"],
                    body.get("add_special") is True,
                    body.get("parse_special", True) is not False,
                )
                return web.Response(body=orjson.dumps({"tokens": tokens}), content_type=JSON)
            else:
                return _error(400, "tokenize needs messages, a prompt or a content string")
        except (RequestError, TemplateError) as exc:
            return _error(400, str(exc))
        limit = self.config.max_model_len
        return web.Response(
            body=orjson.dumps({"count": len(ids), "max_model_len": limit, "tokens": ids}),
            content_type=JSON,
        )

    def _llama_cpp_tokens(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        """llama.cpp's tokenization: with ``add_special`` the template's leading BOS (the
        text ``/apply-template`` leaves out) is added back; without ``parse_special``
        special-token text is encoded as plain text."""
        prefix = self.counter.template.prefix
        ids: list[int] = []
        if add_special and prefix and not (parse_special and text.startswith(prefix)):
            ids = self.counter.tokenizer.encode(prefix, add_special_tokens=False).ids
        tokenizer = self.counter.tokenizer if parse_special else self._plain_tokenizer()
        return ids + tokenizer.encode(text, add_special_tokens=False).ids

    def _plain_tokenizer(self) -> Tokenizer:
        """A copy of the counting tokenizer that encodes special-token text as text."""
        if self._plain is None:
            plain = Tokenizer.from_str(self.counter.tokenizer.to_str())
            plain.encode_special_tokens = True
            self._plain = plain
        return self._plain

    async def apply_template(self, request: web.Request) -> web.Response:
        """llama.cpp-style ``/apply-template``: the rendered prompt (with the generation
        prompt, without the template's leading BOS marker, which ``/tokenize`` with
        ``add_special`` adds back)."""
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError:
            return _error(400, "request body is not valid JSON")
        if not isinstance(body, dict):
            return _error(400, "request body must be a JSON object")
        try:
            text = self.counter.render(_messages(body), True, body.get("tools"))
        except (RequestError, TemplateError) as exc:
            return _error(400, str(exc))
        prefix = self.counter.template.prefix
        if prefix and text.startswith(prefix):
            text = text[len(prefix) :]
        return web.Response(body=orjson.dumps({"prompt": text}), content_type=JSON)

    # --- chat completions ----------------------------------------------------------------

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        request[ARRIVED] = time.perf_counter()
        raw = await request.read()
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            self.rejected += 1
            return _error(400, "request body is not valid JSON")
        if not isinstance(body, dict):
            self.rejected += 1
            return _error(400, "request body must be a JSON object")
        try:
            messages = _messages(body)
            rank = self.ranks[
                choose_rank(
                    request.headers,
                    len(self.ranks),
                    lambda i: self.ranks[i].load,
                    next(self._least_loaded_turns),
                )
            ]
        except (RequestError, RoutingError) as exc:
            self.rejected += 1
            return _error(400, str(exc))

        try:
            counted = await self.counter.count_async(messages, tools=body.get("tools"))
            tag = body.get("user") or request.headers.get("x-smg-routing-key") or ""
            output = plan_output(
                body, counted.prompt_tokens, self.config.default_max_tokens, str(tag)
            )
            limit = self.config.max_model_len
            if counted.prompt_tokens + output.cap > limit:
                raise RequestError(
                    f"This model's maximum context length is {limit} tokens. However, you "
                    f"requested {counted.prompt_tokens + output.cap} tokens "
                    f"({counted.prompt_tokens} in the messages, {output.cap} in the completion)."
                )
        except (RequestError, TemplateError) as exc:
            self.rejected += 1
            return _error(400, str(exc))
        stream = body.get("stream") is True

        # Faults hit valid requests only, each valid request taking the next draw.
        decision = self.faults.decide(next(self.arrivals))
        fault = decision.fault
        if fault is Fault.TRUNCATE and not stream:
            fault = None  # a stream-only fault: non-streamed replies are unaffected
        if fault is not None:
            self.fault_counts[fault] += 1
        rank.in_flight += 1
        try:
            if decision.spike_ms:
                self.spikes += 1
                await asyncio.sleep(decision.spike_ms / 1000.0)
            if fault is Fault.ERROR:
                return _error(decision.status, "simulated failure", "server_error")
            if fault is Fault.RATE_LIMIT:
                response = _error(429, "simulated rate limit", "rate_limit_error")
                response.headers["Retry-After"] = str(self.faults.retry_after_seconds)
                return response
            # Credit what is cached now; the prompt's own blocks join the cache when its
            # prefill is done (at once with --speed 0), as in a paged KV cache.
            cached = rank.cache.lookup(counted.prefix_ends)
            store = partial(rank.cache.store, counted.prefix_ends)
            if self.config.serving.speed == 0:
                store()  # no modelled prefill: the blocks exist at once
            job = Job(rank, counted.prompt_tokens, cached, output, fault, store)
            if stream:
                return await self._stream(request, job, _include_usage(body))
            return await self._complete(request, job)
        finally:
            rank.in_flight -= 1

    def _message(self, output: OutputPlan) -> dict[str, Any]:
        thinking = reasoning_tokens(output, self.config.reasoning_share)
        message = {
            "role": "assistant",
            "content": self.replies.whole(output.tokens - thinking, output.seed),
        }
        if thinking:
            message[self.config.reasoning_field] = self.replies.whole(
                thinking, output.seed ^ THINKING
            )
        return message

    def _usage(self, prompt: int, cached: int, completion: int) -> dict[str, Any]:
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
        }

    async def _run_model(self, request: web.Request, job: Job) -> None:
        if self.config.serving.speed > 0:
            sequence = job.rank.submit(
                job.prompt - job.cached, job.output.tokens, job.store, job.prompt
            )
            try:
                await sequence.wait_beyond(0)  # the first token: vLLM's TTFT, streamed or not
                self._first_token(request, job.rank)
                await sequence.done
            finally:
                job.rank.cancel(sequence)

    async def _complete(self, request: web.Request, job: Job) -> web.StreamResponse:
        await self._run_model(request, job)
        self._first_token(request, job.rank)  # --speed 0: no modelled first token
        output, fault = job.output, job.fault
        if fault is not Fault.DROP:  # a dropped reply never reached the client
            job.rank.account(job.prompt, job.cached, output.tokens)
        if fault is Fault.MALFORMED:
            return web.Response(body=MALFORMED_BODY, content_type=JSON)
        body: dict[str, Any] = {
            "id": f"chatcmpl-{next(self._ids)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.config.model_name,
            "choices": [
                {
                    "index": 0,
                    "message": self._message(output),
                    "finish_reason": output.finish_reason,
                }
            ],
        }
        if fault is not Fault.MISSING_USAGE:
            body["usage"] = self._usage(job.prompt, job.cached, output.tokens)
        data = orjson.dumps(body)
        if fault is Fault.DROP:
            return await _drop(request, data, headers={"Content-Type": JSON})
        return web.Response(body=data, content_type=JSON)

    async def _stream(
        self, request: web.Request, job: Job, include_usage: bool
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers=SSE_HEADERS)
        try:
            return await self._write_stream(request, response, job, include_usage)
        except ConnectionResetError:  # the client went away mid-stream: nothing to report
            return response

    async def _write_stream(
        self, request: web.Request, response: web.StreamResponse, job: Job, include_usage: bool
    ) -> web.StreamResponse:
        rank, output, fault = job.rank, job.output, job.fault
        per_chunk = self.config.stream_chunk_tokens
        thinking = reasoning_tokens(output, self.config.reasoning_share)
        chunks = self.replies.chunks(output.tokens - thinking, output.seed, per_chunk)
        # Reasoning comes first, as its own deltas; each chunk still stands for per_chunk
        # tokens (the last of each part may hold fewer).
        thoughts = (
            self.replies.chunks(thinking, output.seed ^ THINKING, per_chunk) if thinking else []
        )
        chunks = thoughts + chunks
        head = {
            "id": f"chatcmpl-{next(self._ids)}",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": self.config.model_name,
        }
        # Content events differ only in their text: build them from fixed byte halves.
        opening = orjson.dumps(dict(head, choices=[{"index": 0, "delta": {"content": ""}}]))
        before = b"data: " + opening[: opening.rindex(b'""')]
        field = orjson.dumps(self.config.reasoning_field)
        thinking_opening = opening.replace(b'"content":', field + b":")
        thinking_before = b"data: " + thinking_opening[: thinking_opening.rindex(b'""')]
        after = b'},"finish_reason":null}]}\n\n'
        last_after = b'},"finish_reason":' + orjson.dumps(output.finish_reason) + b"}]}\n\n"
        await response.prepare(request)
        cut = len(chunks) // 2 if fault in (Fault.DROP, Fault.TRUNCATE) else len(chunks)
        sequence = None
        if self.config.serving.speed > 0:
            sequence = rank.submit(job.prompt - job.cached, output.tokens, job.store, job.prompt)
        try:
            first = dict(head, choices=[{"index": 0, "delta": {"role": "assistant"}}])
            await response.write(_event(first))
            sent_tokens = 0
            for index in range(cut):
                thought = index < len(thoughts)
                sent_tokens = _tokens_through(
                    index, len(thoughts), thinking, per_chunk, output.tokens
                )
                if sequence is not None:
                    while sequence.generated < sent_tokens and not sequence.done.done():
                        await sequence.wait_beyond(sequence.generated)
                if index == 0:
                    self._first_token(request, rank)
                if fault is Fault.MALFORMED and index == cut // 2:
                    await response.write(b"data: {not json\n\n")
                last = index == len(chunks) - 1
                if not chunks[index] and not last:
                    continue  # an empty cut inside a multi-token character: nothing to send
                text = orjson.dumps(chunks[index])
                start = thinking_before if thought else before
                await response.write(start + text + (last_after if last else after))
            if fault is Fault.DROP:
                _close(request)
                return response
            if fault is Fault.TRUNCATE:
                rank.account(job.prompt, job.cached, sent_tokens)
                await response.write_eof()
                return response
            rank.account(job.prompt, job.cached, output.tokens)
            if include_usage and fault is not Fault.MISSING_USAGE:
                usage = self._usage(job.prompt, job.cached, output.tokens)
                await response.write(_event(dict(head, choices=[], usage=usage)))
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
            if self.config.close_after_stream and request.transport is not None:
                request.transport.close()  # after the last bytes, though keep-alive was implied
            return response
        finally:
            if sequence is not None:
                rank.cancel(sequence)

    # --- metrics -------------------------------------------------------------------------

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=self.metrics_text(), content_type="text/plain")

    def metrics_text(self) -> str:
        """Prometheus exposition text: per-rank counters and gauges, faults by kind."""
        lines: list[str] = []

        def family(name: str, kind: str, help_text: str, samples: Sequence[tuple[str, float]]):
            lines.append(f"# HELP {name} {help_text}")
            lines.append(f"# TYPE {name} {kind}")
            lines.extend(f"{name}{labels} {value}" for labels, value in samples)

        def per_rank(attribute: str) -> list[tuple[str, float]]:
            return [(f'{{rank="{r.index}"}}', getattr(r, attribute)) for r in self.ranks]

        family(
            "batchbench_sim_requests_total",
            "counter",
            "Chat completions served per rank.",
            per_rank("requests"),
        )
        family(
            "batchbench_sim_prompt_tokens_total",
            "counter",
            "Prompt tokens per rank.",
            per_rank("prompt_tokens"),
        )
        family(
            "batchbench_sim_completion_tokens_total",
            "counter",
            "Completion tokens per rank.",
            per_rank("completion_tokens"),
        )
        family(
            "batchbench_sim_cached_tokens_total",
            "counter",
            "Prompt tokens served from the prefix cache per rank.",
            per_rank("cached_tokens"),
        )
        family(
            "batchbench_sim_queue_depth",
            "gauge",
            "Sequences waiting for a batch slot per rank.",
            [(f'{{rank="{r.index}"}}', len(r.waiting)) for r in self.ranks],
        )
        family(
            "batchbench_sim_running",
            "gauge",
            "Sequences in the running batch per rank.",
            [(f'{{rank="{r.index}"}}', len(r.running)) for r in self.ranks],
        )
        family(
            "batchbench_sim_in_flight",
            "gauge",
            "Requests routed to a rank and not yet answered.",
            per_rank("in_flight"),
        )
        family(
            "batchbench_sim_kv_cache_used_tokens",
            "gauge",
            "Tokens held in the prefix cache per rank.",
            [(f'{{rank="{r.index}"}}', r.cache.used_tokens) for r in self.ranks],
        )
        family(
            "batchbench_sim_kv_running_tokens",
            "gauge",
            "KV tokens claimed by running sequences per rank.",
            per_rank("kv_running"),
        )
        family(
            "batchbench_sim_faults_total",
            "counter",
            "Injected faults by kind.",
            [(f'{{kind="{kind.value}"}}', self.fault_counts[kind]) for kind in FAULT_ORDER]
            + [('{kind="latency_spike"}', self.spikes)],
        )
        family(
            "batchbench_sim_rejected_total",
            "counter",
            "Requests answered with 400 (bad body or rank header).",
            [("", self.rejected)],
        )
        family(
            "batchbench_sim_encoded_messages_total",
            "counter",
            "Messages tokenized (the rest were counted from the message cache).",
            [("", self.counter.encoded_messages)],
        )
        lines.append(f'batchbench_sim_info{{version="{__version__}"}} 1')
        self._vllm_families(lines)
        return "\n".join(lines) + "\n"

    def _first_token(self, request: web.Request, rank: Rank) -> None:
        """Observe the request's time to first token, once (streams: when the first content
        chunk is written; whole replies: when the first token is generated)."""
        arrived = request.pop(ARRIVED, None)
        if arrived is not None:
            self.ttft[rank.index].observe(time.perf_counter() - arrived)

    def _vllm_families(self, lines: list[str]) -> None:
        """vLLM's names, labels (``engine``, ``model_name``) and layout, as prometheus_client
        writes them, so that scrapers are tested on a real vLLM-shaped page."""
        model = _label_value(self.config.model_name)
        labels = [f'engine="{r.index}",model_name="{model}"' for r in self.ranks]
        instant = self.config.serving.speed == 0
        capacity = self.config.serving.kv_cache_tokens

        def family(name: str, kind: str, help_text: str, values: list[float]) -> None:
            lines.append(f"# HELP {name} {help_text}")
            lines.append(f"# TYPE {name} {kind}")
            lines.extend(
                f"{name}{{{label}}} {float(value)!r}"
                for label, value in zip(labels, values, strict=True)
            )

        ranks = self.ranks
        family(
            "vllm:num_requests_running",
            "gauge",
            "Number of requests in model execution batches.",
            # No modelled batch at --speed 0: every request being answered is running.
            [r.in_flight if instant else len(r.running) for r in ranks],
        )
        family(
            "vllm:num_requests_waiting",
            "gauge",
            "Number of requests waiting to be processed.",
            [len(r.waiting) for r in ranks],
        )
        family(
            "vllm:kv_cache_usage_perc",
            "gauge",
            "KV-cache usage. 1 means 100 percent usage.",
            [min(1.0, r.kv_running / capacity) if capacity else 0.0 for r in ranks],
        )
        for name, help_text, attribute in (
            ("prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.",
             "prompt_tokens"),
            ("prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
             "cached_tokens"),
            ("prompt_tokens", "Number of prefill tokens processed.", "prompt_tokens"),
            ("generation_tokens", "Number of generation tokens processed.", "completion_tokens"),
            ("request_success", "Count of successfully processed requests.", "requests"),
        ):  # fmt: skip
            family(
                f"vllm:{name}_total",
                "counter",
                help_text,
                [getattr(r, attribute) for r in ranks],
            )
        name = "vllm:time_to_first_token_seconds"
        lines.append(f"# HELP {name} Histogram of time to first token in seconds.")
        lines.append(f"# TYPE {name} histogram")
        for rank, histogram in zip(ranks, self.ttft, strict=True):
            engine = f'engine="{rank.index}"'
            for le, count in histogram.cumulative():
                lines.append(f'{name}_bucket{{{engine},le="{le}",model_name="{model}"}} {count}.0')
            total = sum(histogram.counts)
            lines.append(f'{name}_count{{{engine},model_name="{model}"}} {float(total)!r}')
            lines.append(f'{name}_sum{{{engine},model_name="{model}"}} {histogram.sum!r}')


def _label_value(text: str) -> str:
    """A label value escaped as the exposition format wants (backslash, quote, newline)."""
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _messages(body: dict[str, Any]) -> list[Any]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty list")
    return messages


def _include_usage(body: dict[str, Any]) -> bool:
    options = body.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


def _tokens_through(index: int, thoughts: int, thinking: int, per_chunk: int, total: int) -> int:
    """Tokens generated once chunk ``index`` is sent: ``thoughts`` reasoning chunks (of
    ``thinking`` tokens) first, then the content's."""
    if index < thoughts:
        return min((index + 1) * per_chunk, thinking)
    return min(thinking + (index - thoughts + 1) * per_chunk, total)


def _event(payload: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def _close(request: web.Request) -> None:
    """Cut the connection under the response, as a crashed server would."""
    transport = request.transport
    if transport is not None:
        transport.abort()


async def _drop(request: web.Request, data: bytes, headers: dict[str, str]) -> web.StreamResponse:
    """Promise the whole body, send half of it, then cut the connection."""
    response = web.StreamResponse(headers=headers)
    response.content_length = len(data)
    await response.prepare(request)
    await response.write(data[: len(data) // 2])
    _close(request)
    return response
