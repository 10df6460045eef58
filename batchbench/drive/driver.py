"""The HTTP agent body: each admitted trajectory's turns against the server.

Requests go through one transport on the running loop (uvloop in ``batchbench-agent``):
the lean keep-alive client of ``batchbench.drive.transport`` for ``http://`` targets,
aiohttp otherwise, with connections capped at the active-agent cap. Per turn the body is
the conversation's serialized prefix plus that turn's tail, built once and resent unchanged
on retries.
Texts for the next turn are generated while the request is in flight.
"""

from __future__ import annotations

import asyncio
import math
import resource
import sys
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, replace
from functools import partial

import aiohttp

from batchbench.drive.blockturns import BlockPrepared, BlockTurns
from batchbench.drive.oracle import ORACLE_ROUNDS, PromptOracle
from batchbench.drive.shutdown import CANCELLED_IN_FLIGHT, CANCELLED_WAITING, Shutdown, abandon
from batchbench.drive.sizing import Sizing, TrajectorySizer
from batchbench.drive.transport import (
    DEFAULT_MAX_RESPONSE_BYTES,
    ConnectError,
    RedirectError,
    ResponseTooLargeError,
    Transport,
    make_transport,
)
from batchbench.drive.wire import (
    ROUTING_KEY_HEADER_ERROR,
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
    parse_response,
    parse_retry_after,
    reasoning_of,
    request_headers,
    tool_call_id,
    tool_message,
    user_tag,
    valid_header_value,
    verbose_request,
    verbose_response,
    without_reasoning,
)
from batchbench.errors import BatchbenchError
from batchbench.plan.workload import Workload
from batchbench.results.failures import AttemptError, ErrorKind
from batchbench.results.lifecycle import Outcome
from batchbench.results.recording import Recorder
from batchbench.text.content import ContentFactory
from batchbench.text.framing import Framing, trimmed
from batchbench.text.replycount import ReplyAccounting

# Texts up to this many tokens are assembled on the loop (microseconds with the fast
# method); longer ones, and every text of the repair method, go to the worker pool.
INLINE_TEXT_TOKENS = 4096
# Replies up to this many characters are counted on the loop; longer ones on a worker
# thread (the batched encode releases the GIL).
INLINE_COUNT_CHARACTERS = 1024
READ_BUFFER_BYTES = 1 << 20


@dataclass(frozen=True)
class DriverSettings:
    """Run-wide HTTP settings: target, identity and routing, timeouts and retries."""

    url: str
    body: BodyOptions
    api_key: str | None = None
    user_tagging: bool = True
    user_prefix: str | None = None
    seed: int | None = None
    dp_ranks: int | None = None
    timeout_seconds: float = 60.0
    max_retries: int = 2
    retry_delay_ms: int = 250
    max_retry_wait_seconds: float = 300.0  # the longest wait before a retry (Retry-After)
    max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES
    verbose: bool = False


class _Final(Exception):
    """An HTTP status that is not retried: a 4xx other than 408, 409 and 429."""

    def __init__(self, text: str, status: int) -> None:
        super().__init__(text)
        self.status = status


class _Retry(Exception):
    """An HTTP status that is retried; may carry a Retry-After in seconds."""

    def __init__(self, text: str, status: int, retry_after: float | None = None) -> None:
        super().__init__(text)
        self.status = status
        self.retry_after = retry_after


def raise_open_file_limit(connections: int) -> str | None:
    """Lift the soft open-file limit so every active agent can hold a connection; returns
    a warning when even the hard limit is too low."""
    needed = connections + 256  # files, pipes, the event loop's own descriptors
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    if soft != resource.RLIM_INFINITY and soft < needed:
        return (
            f"warning: the open-file limit ({soft}) is below the {connections} connections "
            "that the active agents may hold; raise it with ulimit -n"
        )
    return None


def make_session(settings: DriverSettings, max_connections: int | None) -> aiohttp.ClientSession:
    """One session for the run: keep-alive reuse, no hidden pool cap, 1 MiB read buffer."""
    limit = max_connections or 0  # 0 = unlimited (open loop without a cap)
    connector = aiohttp.TCPConnector(limit=limit, limit_per_host=limit, ttl_dns_cache=None)
    return aiohttp.ClientSession(
        connector=connector,
        timeout=aiohttp.ClientTimeout(total=settings.timeout_seconds),
        read_bufsize=READ_BUFFER_BYTES,
        auto_decompress=True,
        skip_auto_headers=("User-Agent",),
    )


def run_transport(
    settings: DriverSettings, max_connections: int | None, session: aiohttp.ClientSession
) -> Transport:
    """The run's chat-request transport; ``session`` serves what the lean client hands
    on (https, redirects)."""
    return make_transport(
        settings.url,
        settings.timeout_seconds,
        max_connections or 0,
        session,
        settings.max_response_bytes,
    )


@dataclass(frozen=True)
class Fidelity:
    """How the driver keeps prompts on target (see ``batchbench.drive.sizing``)."""

    framing: Framing
    replies: ReplyAccounting | None = None  # None: replies replayed as received, not counted
    oracle: PromptOracle | None = None
    # Counts a block request in the server's chat template, when the client knows it.
    prompt_counter: Callable[[list, list], int] | None = None
    keep_reasoning: bool = True  # replay the reply's reasoning_content (--replay-reasoning)

    @property
    def correct(self) -> bool:
        return self.replies is not None


@dataclass(slots=True)
class Prepared:
    """A trajectory's first request: its user message and how it was sized."""

    text: str
    sizing: Sizing
    oracle_seconds: float | None = None


class HttpAgentLoop(BlockTurns):
    """Runs one trajectory per ``run`` call; shared by every agent of the run."""

    def __init__(
        self,
        settings: DriverSettings,
        workload: Workload,
        factory: ContentFactory,
        pool: Executor,
        transport: Transport,
        recorder: Recorder,
        shutdown: Shutdown,
        fidelity: Fidelity | None = None,
    ) -> None:
        self.settings = settings
        self.workload = workload
        self.factory = factory
        self.pool = pool
        self.transport = transport
        self.recorder = recorder
        self.shutdown = shutdown
        self.fidelity = fidelity or Fidelity(Framing(0, 0, learn=False))
        self._inline = factory.synth.method == "fast"
        self._origin = time.perf_counter()
        self.clock_listeners: list[Callable[[float], None]] = []
        self._stream = settings.body.stream
        self._attempts = settings.max_retries + 1
        self._max_retry_wait_ms = math.ceil(settings.max_retry_wait_seconds * 1000.0)
        self._timeout_text = f"request timed out after {_seconds_text(settings.timeout_seconds)}s"
        self._out = sys.stdout
        self._setup_blocks()

    def clock_started(self, origin: float) -> None:
        """The engine started the benchmark clock: offsets and client CPU count from here
        (and whatever the run scheduled from it, such as a --duration stop)."""
        self._origin = origin
        self.recorder.start_clock(origin)
        for listener in self.clock_listeners:
            listener(origin)

    # -- text -------------------------------------------------------------------------
    def _cheap(self, tokens: int) -> bool:
        """True when a text of ``tokens`` is cheaper to assemble here than to hand off."""
        return self._inline and tokens <= INLINE_TEXT_TOKENS

    def _text_later(self, make: Callable[..., str], agent: int, turn: int, tokens: int):
        """A future for a planned-size text, or None when it is cheap to make when needed."""
        if self._cheap(tokens):
            return None
        return asyncio.get_running_loop().run_in_executor(self.pool, make, agent, turn, tokens)

    async def _text(
        self, pending, planned: int, make: Callable[..., str], agent: int, turn: int, tokens: int
    ) -> str:
        """The text of ``tokens``: the prefetched one when the size did not change."""
        if pending is not None and tokens == planned:
            return await pending
        if pending is not None:
            pending.cancel()
        if self._cheap(tokens):
            return make(agent, turn, tokens)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.pool, make, agent, turn, tokens)

    def _rendered(self, content, reasoning):
        """The reply as the next prompt renders it (content and reasoning): its token count,
        or a future of it for a long reply (counted on a worker thread during the delay)."""
        replies = self.fidelity.replies
        assert replies is not None  # called when correcting
        size = (len(content) if isinstance(content, str) else 0) + (
            len(reasoning) if isinstance(reasoning, str) else 0
        )
        if size <= INLINE_COUNT_CHARACTERS:
            return replies.count(content, reasoning)
        return asyncio.get_running_loop().run_in_executor(
            self.pool, replies.count, content, reasoning
        )

    async def _make(self, make: Callable[[int], str], tokens: int) -> str:
        """A text of ``tokens``, assembled here when cheap, else on a worker thread."""
        if self._cheap(tokens):
            return make(tokens)
        return await asyncio.get_running_loop().run_in_executor(self.pool, make, tokens)

    async def _oracle_sized(
        self,
        sizer: TrajectorySizer,
        sizing: Sizing,
        build: Callable[[str], bytes],
        make: Callable[[int], str],
        text: str,
    ) -> tuple[str, Sizing, float | None]:
        """With ``--prompt-oracle server``: resize the new content until the server's count
        of the request equals its target (at most three counts). ``build`` turns a content
        text into the tokenize body, ``make`` makes a text of a given size."""
        oracle = self.fidelity.oracle
        if oracle is None:
            return text, sizing, None
        started = time.perf_counter()
        for _ in range(ORACLE_ROUNDS):
            counted = await oracle.count(build(text))
            if counted == sizing.target:
                break
            resized = sizer.resized(sizing, counted)
            if resized.tokens == sizing.tokens:
                sizing = resized
                break
            sizing = resized
            text = await self._make(make, sizing.tokens)
        elapsed = time.perf_counter() - started
        self.recorder.oracle_counted(elapsed, oracle.queries)
        return text, sizing, elapsed

    async def prepare(self, agent: int) -> Prepared | BlockPrepared:
        if self.workload.has_blocks(agent):
            return await self._prepare_block_agent(agent)
        factory = self.factory
        sizer = TrajectorySizer(self.workload, agent, self.fidelity.framing, self.fidelity.correct)
        sizing = sizer.fresh(0)
        if self._cheap(sizing.tokens):
            text = factory.initial_prompt(agent, sizing.tokens)
        else:
            loop = asyncio.get_running_loop()
            text = await loop.run_in_executor(
                self.pool, factory.initial_prompt, agent, sizing.tokens
            )
        if self.fidelity.oracle is None:
            return Prepared(text, sizing)
        text, sizing, seconds = await self._oracle_sized(
            sizer,
            sizing,
            _fresh_body(self.settings.body.model),
            partial(factory.initial_prompt, agent),
            text,
        )
        return Prepared(text, sizing, seconds)

    # -- the agent loop ---------------------------------------------------------------
    async def run(self, agent: int, slot: int, prepared: Prepared | BlockPrepared) -> int:
        """One trajectory; an unexpected error is fatal as "agent worker task failed: …"."""
        try:
            return await self._run(agent, slot, prepared)
        except (BatchbenchError, asyncio.CancelledError):
            raise
        except Exception as exc:
            raise BatchbenchError(f"agent worker task failed: {type(exc).__name__}: {exc}") from exc

    async def _run(self, agent: int, slot: int, prepared: Prepared | BlockPrepared) -> int:
        figures = self.recorder.agent_started(agent, slot)
        planned = len(self.workload.turns(agent))
        try:
            if self.workload.has_blocks(agent):
                assert isinstance(prepared, BlockPrepared)  # as prepare made it
                return await self._block_turns(agent, slot, prepared, figures)
            assert isinstance(prepared, Prepared)
            return await self._turns(agent, slot, prepared, figures)
        finally:
            # Requests never sent: after a failure, or once a shutdown stopped the agent.
            self.recorder.requests_skipped(figures, planned - figures.settled)

    async def _turns(self, agent: int, slot: int, prepared: Prepared, figures) -> int:
        settings = self.settings
        workload = self.workload
        recorder = self.recorder
        shutdown = self.shutdown
        fidelity = self.fidelity
        framing = fidelity.framing
        correct = fidelity.correct
        ident = workload.trajectory_ids[agent]
        turns = workload.turns(agent)
        last = len(turns) - 1
        reset = workload.reset_before
        output = workload.output_tokens
        environment = workload.environment_tokens
        latency_ms = workload.tool_call_latency_ms
        stream_column = workload.request_stream
        cap_column = workload.request_max_tokens
        rank, tag, tag_error, headers = self._identity(agent, slot)
        sizer = TrajectorySizer(workload, agent, framing, correct)
        conversation = Conversation(settings.body.model)
        conversation.reset(prepared.text)
        factory = self.factory
        sizing = prepared.sizing
        oracle_seconds = prepared.oracle_seconds
        fresh = True  # the request holds a single fresh user message
        previous: tuple[int, int, int] | None = None  # (served, rendered reply, tool tokens)

        def event(request, reply, started, elapsed, attempts, status, errors, rendered=None):
            self._request_event(
                agent, ident, invocation, slot, rank, request, reply, started, elapsed,
                attempts, status, errors, sizing, rendered, oracle_seconds,
            )  # fmt: skip

        for turn, request in enumerate(turns):
            if shutdown.stopped:
                return Outcome.INTERRUPTED
            invocation = turn + 1
            following_reset = turn < last and bool(reset[turns[turn + 1]])
            appends = turn < last and not following_reset
            env_planned = int(environment[request])
            env_pending = (
                self._text_later(factory.environment, agent, turn, env_planned) if appends else None
            )
            reset_pending = None
            next_planned = 0
            if following_reset:
                next_planned = int(workload.input_content_tokens[turns[turn + 1]])
                reset_pending = self._text_later(
                    factory.reset_prompt, agent, turn + 1, next_planned
                )
            planned_output = int(output[request])
            cap = int(cap_column[request]) if cap_column is not None else 0
            stream = int(stream_column[request]) if stream_column is not None else -1
            streamed = settings.body.stream if stream < 0 else bool(stream)
            body = conversation.body(
                body_tail(settings.body, planned_output, tag, cap or None, streamed)
            )
            if sizing.correction or sizing.note is not None:
                recorder.request_sized(bool(sizing.correction), sizing.note is not None)

            reply, attempts, started, elapsed, errors, ended = await self._exchange(
                body, headers, streamed, tag_error, figures, rank, agent, ident, invocation,
                partial(event, request),
            )  # fmt: skip
            if ended is not None:
                return ended
            served = reply.prompt_tokens
            if correct:
                if fresh:
                    framing.observe_initial(served - sizing.tokens)
                elif previous is not None:
                    framing.observe_turn(
                        served - previous[0] - previous[1] - previous[2], previous[2] > 0
                    )
            completion = reply.completion_tokens
            recorder.request_succeeded(
                figures, rank, served, completion, reply.cached_tokens, elapsed, reply.ttft,
                reply.gaps, reply.tpot, attempts, errors, started,
            )  # fmt: skip
            recorder.request_fidelity(
                figures, turn, sizing.target, served, completion, planned_output, fresh,
                framing.initial, attempts,
            )  # fmt: skip
            recorder.request_done(figures, served, completion)

            message = reply.message if fidelity.keep_reasoning else without_reasoning(reply.message)
            content = message.get("content")
            reasoning = reasoning_of(message)
            counting = None
            if appends and correct:
                content, reasoning = trimmed(content), trimmed(reasoning)
                counting = self._rendered(content, reasoning)

            async def next_turn(
                turn=turn, served=served, message=message, content=content, reasoning=reasoning,
                counting=counting,
                following_reset=following_reset, reset_pending=reset_pending,
                next_planned=next_planned, env_pending=env_pending, env_planned=env_planned,
            ):  # fmt: skip
                """Size and build the next request (its tool result or its fresh prompt)."""
                counted = await counting if isinstance(counting, asyncio.Future) else counting
                if following_reset:
                    sizing = sizer.fresh(turn + 1)
                    text = await self._text(
                        reset_pending, next_planned, factory.reset_prompt, agent, turn + 1,
                        sizing.tokens,
                    )  # fmt: skip
                    seconds = None
                    if fidelity.oracle is not None:
                        text, sizing, seconds = await self._oracle_sized(
                            sizer, sizing, _fresh_body(settings.body.model),
                            partial(factory.reset_prompt, agent, turn + 1), text,
                        )  # fmt: skip
                    conversation.reset(text)
                    return sizing, seconds, None
                sizing = sizer.appended(turn, served, counted)
                call = tool_call_id(agent, turn + 1)
                env_text = await self._text(
                    env_pending, env_planned, factory.environment, agent, turn, sizing.tokens
                )
                assistant = (
                    assistant_with_tool_call(message, call, content, reasoning)
                    if correct
                    else assistant_with_tool_call(message, call)
                )
                seconds = None
                if fidelity.oracle is not None:

                    def build(candidate: str) -> bytes:
                        return conversation.tokenize_body(assistant, tool_message(call, candidate))

                    env_text, sizing, seconds = await self._oracle_sized(
                        sizer, sizing, build, partial(factory.environment, agent, turn), env_text
                    )
                conversation.append(assistant, tool_message(call, env_text))
                return sizing, seconds, (served, counted or 0, sizing.tokens)

            delay = float(latency_ms[request]) / 1000.0
            # With a tool delay (or server counts to wait for), the next request is built
            # while the delay runs.
            building = None
            if turn < last and (delay > 0 or fidelity.oracle is not None):
                building = asyncio.ensure_future(next_turn())
            whole = True
            rendered = counting if not isinstance(counting, asyncio.Future) else None
            try:
                if delay > 0:
                    began = time.perf_counter()
                    whole = await shutdown.sleep(delay)
                    recorder.tool_slept(time.perf_counter() - began if not whole else delay)
                if isinstance(counting, asyncio.Future):
                    rendered = await counting
            except asyncio.CancelledError:
                # Cut off during the delay: the request itself succeeded and is reported;
                # the next one, half built, is abandoned.
                event(request, reply, started, elapsed, attempts, "ok", errors, rendered)
                await abandon(building)
                raise
            event(request, reply, started, elapsed, attempts, "ok", errors, rendered)
            if not whole:
                await abandon(building)
                return Outcome.INTERRUPTED
            if turn == last:
                break
            sizing, oracle_seconds, previous = (
                await building if building is not None else await next_turn()
            )
            fresh = previous is None
            if fresh:
                recorder.conversation_reset(figures)
        return Outcome.COMPLETED

    # -- one logical request ------------------------------------------------------------
    def _identity(self, agent: int, slot: int):
        """(DP rank, user tag, tag unusable as a header, headers) of one agent."""
        settings = self.settings
        rank = slot % settings.dp_ranks if settings.dp_ranks else None
        tag = (
            user_tag(agent, settings.seed, settings.user_prefix) if settings.user_tagging else None
        )
        tag_error = tag is not None and not valid_header_value(tag)
        return (
            rank,
            tag,
            tag_error,
            request_headers(settings.api_key, None if tag_error else tag, rank),
        )

    async def _exchange(
        self, body, headers, streamed, tag_error, figures, rank, agent, ident, invocation, event
    ):
        """Send one logical request and record how an unsuccessful one ended: (reply,
        attempts, start offset, latency, failed attempts, outcome). The outcome is None on
        success, else how the agent ends (failed, or interrupted by the shutdown).
        ``event(reply, started, elapsed, attempts, status, errors)`` writes its request
        event; the successful one is the caller's to write."""
        recorder = self.recorder
        errors: list[AttemptError] = []
        if tag_error:
            errors.append(AttemptError(0, ErrorKind.INVALID_REQUEST, ROUTING_KEY_HEADER_ERROR))
            reply, attempts, started, elapsed = None, 0, 0.0, 0.0
        else:
            try:
                reply, attempts, started, elapsed = await self._send(
                    body, headers, errors, streamed
                )
            except asyncio.CancelledError:
                # Cut off after the grace period: neither successful nor failed.
                attempts = len(errors) + 1
                errors.append(AttemptError(attempts, ErrorKind.CANCELLED, CANCELLED_IN_FLIGHT))
                recorder.request_cancelled(figures, errors, attempts)
                event(None, None, None, attempts, "cancelled", errors)
                raise
        if reply is not None:
            return reply, attempts, started, elapsed, errors, None
        if errors[-1].kind is ErrorKind.CANCELLED:  # the shutdown ended a retry wait
            recorder.request_cancelled(figures, errors, attempts)
            event(None, started, elapsed, attempts, "cancelled", errors)
            return reply, attempts, started, elapsed, errors, Outcome.INTERRUPTED
        recorder.request_failed(
            figures, rank, agent, ident, invocation, errors, attempts, started, elapsed
        )
        event(None, started, elapsed, attempts, "failed", errors)
        return reply, attempts, started, elapsed, errors, Outcome.FAILED

    async def _send(
        self,
        body: bytes,
        headers: dict[str, str],
        errors: list[AttemptError],
        stream: bool | None = None,
    ):
        """(reply | None, attempts, start offset, latency) after the last attempt; every
        failed attempt is appended to ``errors`` (the last one ``cancelled`` when a shutdown
        ended the wait before a retry)."""
        settings = self.settings
        recorder = self.recorder
        start = time.perf_counter()
        started = start - self._origin
        streamed = self._stream if stream is None else stream
        attempt = 0
        while True:
            attempt += 1
            if settings.verbose:
                self._out.write(f"[AGENT REQUEST] {verbose_request(body)}\n")
            recorder.attempt_started()
            retry_after = None
            try:
                reply = await (
                    self._post_stream(body, headers) if streamed else self._post(body, headers)
                )
                if settings.verbose:
                    self._out.write(f"[AGENT RESPONSE] {verbose_response(reply)}\n")
                return reply, attempt, started, time.perf_counter() - start
            except _Final as exc:
                errors.append(AttemptError(attempt, ErrorKind.HTTP_STATUS, str(exc), exc.status))
                return None, attempt, started, time.perf_counter() - start
            except _Retry as exc:
                errors.append(AttemptError(attempt, ErrorKind.HTTP_STATUS, str(exc), exc.status))
                retry_after = exc.retry_after
            except ResponseError as exc:
                errors.append(AttemptError(attempt, exc.kind, str(exc)))
            except TimeoutError:
                errors.append(AttemptError(attempt, ErrorKind.TIMEOUT, self._timeout_text))
            except ResponseTooLargeError as exc:
                errors.append(AttemptError(attempt, ErrorKind.RESPONSE_TOO_LARGE, str(exc)))
            except RedirectError as exc:
                errors.append(AttemptError(attempt, ErrorKind.INVALID_REDIRECT, str(exc)))
            except (aiohttp.ClientError, OSError) as exc:
                errors.append(AttemptError(attempt, transport_kind(exc), _transport_text(exc)))
            except (asyncio.CancelledError, BatchbenchError):
                raise
            except Exception as exc:
                # Whatever else one exchange raised stays inside it: a failed attempt,
                # retried by the usual rules, never the end of the run.
                text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                errors.append(AttemptError(attempt, ErrorKind.CLIENT_ERROR, text))
            finally:
                recorder.attempt_ended()
            if attempt >= self._attempts or self._planned_end():
                # After a planned end no retry starts: the attempt that just failed was the
                # request's last, so the request failed (it was not cut short).
                return None, attempt, started, time.perf_counter() - start
            wait = backoff_ms(settings.retry_delay_ms, attempt - 1, retry_after)
            if wait > self._max_retry_wait_ms:
                recorder.retry_wait_capped()
                errors[-1] = replace(
                    errors[-1],
                    message=f"{errors[-1].message} (Retry-After {wait / 1000:g}s capped at "
                    f"{self._max_retry_wait_ms / 1000:g}s by --max-retry-wait)",
                )
                wait = self._max_retry_wait_ms
            slept = await self.shutdown.sleep(wait / 1000.0) if wait > 0 else True
            if not slept or self.shutdown.stopped:
                if not self._planned_end():
                    errors.append(AttemptError(attempt, ErrorKind.CANCELLED, CANCELLED_WAITING))
                return None, attempt, started, time.perf_counter() - start

    def _planned_end(self) -> bool:
        """--duration or --window-trajectories stopped the run (not a signal)."""
        shutdown = self.shutdown
        return shutdown.finished_by is not None and shutdown.signal_name is None

    async def _post(self, body: bytes, headers: dict[str, str]) -> Reply:
        status, raw, retry_after = await self.transport.send(body, headers, None)
        if 200 <= status < 300:
            return parse_response(raw)
        _raise_status(status, raw, retry_after)
        raise AssertionError("unreachable")  # pragma: no cover

    async def _post_stream(self, body: bytes, headers: dict[str, str]) -> Reply:
        sent = time.perf_counter()
        assembler = StreamAssembler()
        status, raw, retry_after = await self.transport.send(
            body, headers, assembler.feed, assembler.heard_type
        )
        if not 200 <= status < 300:
            _raise_status(status, raw, retry_after)
        return assembler.finish(sent)

    def _request_event(
        self, agent, ident, invocation, slot, rank, request, reply, started, elapsed, attempts,
        status, errors, sizing, rendered, oracle_seconds,
    ) -> None:  # fmt: skip
        sink = self.recorder.request_events
        if sink is None:
            return
        served = reply.prompt_tokens if reply else None
        planned_output = int(self.workload.output_tokens[request])
        completion = reply.completion_tokens if reply else None
        sink.write_batched(
            {
                "agent_id": agent,
                "trajectory_id": ident,
                "invocation": invocation,
                "routing_slot": slot,
                "dp_rank": rank,
                "target_prompt_tokens": sizing.target,
                "prompt_tokens": served,
                "completion_tokens": completion,
                "cached_tokens": reply.cached_tokens if reply else None,
                "start_offset_seconds": started,
                "latency_seconds": elapsed,
                "ttft_seconds": reply.ttft if reply else None,
                "attempts": attempts,
                "status": status,
                "error": errors[-1].message if status != "ok" and errors else None,
                "error_kind": str(errors[-1].kind) if status != "ok" and errors else None,
                "status_code": errors[-1].status if status != "ok" and errors else None,
                "errors": [error.as_dict() for error in errors],
                "prompt_drift": served - sizing.target if served is not None else None,
                "prompt_correction_tokens": sizing.correction,
                "correction_note": sizing.note,
                "planned_output_tokens": planned_output,
                "output_drift": completion - planned_output if completion is not None else None,
                "reply_rendered_tokens": rendered,
                "oracle_seconds": oracle_seconds,
            }
        )


def _fresh_body(model: str) -> Callable[[str], bytes]:
    """Builds the tokenize body of a conversation that is one user message."""
    conversation = Conversation(model)

    def build(text: str) -> bytes:
        conversation.reset(text)
        return conversation.tokenize_body()

    return build


def _raise_status(status: int, raw: bytes, retry_after: str | None) -> None:
    text = http_error_text(status, raw)
    if is_retryable_status(status):
        wait = parse_retry_after(retry_after) if status in (429, 503) else None
        raise _Retry(text, status, wait)
    raise _Final(text, status)


def transport_kind(exc: Exception) -> ErrorKind:
    """connect when no connection was made; disconnect when it broke during the exchange."""
    if isinstance(exc, ConnectError | aiohttp.ClientConnectorError | ConnectionRefusedError):
        return ErrorKind.CONNECT
    return ErrorKind.DISCONNECT


def _transport_text(exc: Exception) -> str:
    detail = str(exc) or type(exc).__name__
    return f"request failed: {detail}"


def _seconds_text(seconds: float) -> str:
    return str(int(seconds)) if float(seconds).is_integer() else repr(seconds)
