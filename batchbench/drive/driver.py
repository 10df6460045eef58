"""The HTTP agent body: each admitted trajectory's requests against the server.

Requests go through one transport on the running loop (uvloop in ``batchbench-agent``):
the lean keep-alive client of ``batchbench.drive.transport`` for ``http://`` targets,
aiohttp otherwise, with connections capped at the active-agent cap. One loop sends,
retries and records every trajectory's requests; how each next request is made is its
``RequestBuilder``'s business (``batchbench.drive.growth`` for a growing conversation,
``batchbench.drive.blockturns`` for a block trajectory). A request's body is built once and
resent unchanged on retries; the next request is built while the tool delay runs.
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

import aiohttp

from batchbench.drive.blockturns import BlockPrepared, BlockRequests, BlockRun
from batchbench.drive.context import (
    AgentRun,
    DriverSettings,
    Fidelity,
    RequestBuilder,
    RequestSizing,
)
from batchbench.drive.failover import ROUTING_KEY_HEADER, RankFailover, down_code, down_reason
from batchbench.drive.growth import GrowthRequests, Prepared, prepare_growth
from batchbench.drive.shutdown import CANCELLED_IN_FLIGHT, CANCELLED_WAITING, Shutdown, abandon
from batchbench.drive.transport import (
    ConnectError,
    RedirectError,
    ResponseTooLargeError,
    Transport,
    make_transport,
)
from batchbench.drive.wire import (
    ROUTING_KEY_HEADER_ERROR,
    Reply,
    ResponseError,
    StreamAssembler,
    backoff_ms,
    body_fields,
    http_error_text,
    is_retryable_status,
    parse_response,
    parse_retry_after,
    request_headers,
    user_tag,
    valid_header_value,
    verbose_request,
    verbose_response,
)
from batchbench.errors import BatchbenchError
from batchbench.plan.workload import Workload
from batchbench.results.events import RequestEvent, SourcedRequestEvent
from batchbench.results.failures import AttemptError, ErrorKind
from batchbench.results.lifecycle import Outcome
from batchbench.results.recording import AgentFigures, Recorder
from batchbench.text.content import ContentFactory
from batchbench.text.framing import Framing

READ_BUFFER_BYTES = 1 << 20


class _Final(Exception):
    """An HTTP status that is not retried: a 4xx other than 408, 409 and 429."""

    def __init__(self, text: str, status: int) -> None:
        super().__init__(text)
        self.status = status


class _Retry(Exception):
    """An HTTP status that is retried; may carry a Retry-After in seconds."""

    def __init__(
        self, text: str, status: int, retry_after: float | None = None, down: str | None = None
    ) -> None:
        super().__init__(text)
        self.status = status
        self.retry_after = retry_after
        self.down = down  # the gateway's code when it says the rank's worker is unreachable


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
        settings.worker_header,
    )


@dataclass(slots=True)
class AgentIdentity:
    """Who an agent's requests come from: its routing and the headers each one carries."""

    agent: int
    trajectory_id: str
    slot: int
    rank: int | None  # the DP rank its requests go to (its slot's, until a failover)
    tag: str | None  # the user tag in every body
    tag_error: bool  # the tag cannot travel as a header: every request fails unsent
    headers: dict[str, str]
    home_rank: int | None  # the DP rank its routing slot maps to (--dp-ranks)
    # After a move (--rank-failover rehash): whether its replies still count in the rank's
    # placement (only when the rank index is still sent), and whether its next request is
    # the first on the new rank (no cache of its conversation there).
    placed: bool = True
    new_rank: bool = False


@dataclass(slots=True)
class PlannedRequest:
    """One request as it goes out: which one it is and how it was sized."""

    invocation: int  # 1-based within the trajectory
    request: int  # its row in the workload
    planned_output: int
    sizing: RequestSizing
    oracle_seconds: float | None


@dataclass(slots=True)
class Exchange:
    """How one logical request (its attempts and the waits between them) ended."""

    reply: Reply | None  # None unless it succeeded
    attempts: int
    started: float | None  # the first attempt's offset on the benchmark clock
    elapsed: float | None  # first attempt to outcome, retries and backoff included
    errors: list[AttemptError]  # every failed attempt
    status: str  # ok, failed or cancelled (as its request event says)
    ended: Outcome | None = None  # how the agent ends after it; None: it goes on
    moved_attempts: int = 0  # attempts on a rank found down before it moved on (rehash)


class HttpAgentLoop:
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
        self.transport = transport
        self.recorder = recorder
        self.shutdown = shutdown
        self.fidelity = fidelity or Fidelity(Framing(0, 0, learn=False))
        self._run_parts = AgentRun(settings, workload, factory, pool, recorder, self.fidelity)
        self._blocks = BlockRun(self._run_parts) if workload.blocks is not None else None
        self._origin = time.perf_counter()
        self._failover = (
            RankFailover(
                settings.dp_ranks,
                settings.rank_failover,
                settings.dp_rank_header,
                settings.api_key,
                settings.seed,
                settings.user_prefix,
            )
            if settings.dp_ranks
            else None
        )
        self.clock_listeners: list[Callable[[float], None]] = []
        self._stream = settings.body.stream
        self._attempts = settings.max_retries + 1
        self._max_retry_wait_ms = math.ceil(settings.max_retry_wait_seconds * 1000.0)
        self._timeout_text = f"request timed out after {_seconds_text(settings.timeout_seconds)}s"
        self._out = sys.stdout
        self._source_rows = workload.source_rows

    def clock_started(self, origin: float) -> None:
        """The engine started the benchmark clock: offsets and client CPU count from here
        (and whatever the run scheduled from it, such as a --duration stop)."""
        self._origin = origin
        self.recorder.start_clock(origin)
        for listener in self.clock_listeners:
            listener(origin)

    async def prepare(self, agent: int) -> Prepared | BlockPrepared:
        """A trajectory's first request, made before it is admitted."""
        if self.workload.has_blocks(agent):
            assert self._blocks is not None  # a workload with blocks has a BlockRun
            return await self._blocks.prepare(agent)
        return await prepare_growth(self._run_parts, agent)

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
            builder: RequestBuilder
            if isinstance(prepared, BlockPrepared):
                assert self._blocks is not None  # as prepare made it
                builder = BlockRequests(self._blocks, agent, prepared)
            else:
                builder = GrowthRequests(self._run_parts, agent, prepared)
            identity = self._identity(agent, slot)
            outcome = await self._trajectory(identity, builder, figures)
            if identity.home_rank is not None:
                self.recorder.rank_agent_ended(
                    identity.home_rank, identity.rank, outcome == Outcome.FAILED,
                    outcome == Outcome.COMPLETED,
                )  # fmt: skip
            return outcome
        finally:
            # Requests never sent: after a failure, or once a shutdown stopped the agent.
            self.recorder.requests_skipped(figures, planned - figures.settled)

    async def _trajectory(
        self, identity: AgentIdentity, builder: RequestBuilder, figures: AgentFigures
    ) -> Outcome:
        """One trajectory's requests, however they are built. The next request is built
        during the tool delay (or while server counts are awaited), else after it; one
        being built is never left running when the loop ends."""
        workload, shutdown, recorder = self.workload, self.shutdown, self.recorder
        options = self.settings.body
        turns = workload.turns(identity.agent)
        last = len(turns) - 1
        reset, output, latency_ms = (
            workload.reset_before, workload.output_tokens, workload.tool_call_latency_ms
        )  # fmt: skip
        stream_column, cap_column = workload.request_stream, workload.request_max_tokens
        overlap = self.fidelity.oracle is not None  # server counts are worth overlapping
        building: asyncio.Future | None = None
        try:
            for turn, request in enumerate(turns):
                if shutdown.stopped:
                    return Outcome.INTERRUPTED
                fresh = turn == 0 or bool(reset[request])
                if turn:
                    await (building if building is not None else builder.build(turn - 1))
                    building = None
                    if fresh:
                        recorder.conversation_reset(figures)
                planned_output = int(output[request])
                cap = int(cap_column[request]) if cap_column is not None else 0
                stream = int(stream_column[request]) if stream_column is not None else -1
                streamed = options.stream if stream < 0 else bool(stream)
                fields = body_fields(
                    options, planned_output, identity.tag, cap if cap > 0 else None, streamed
                )
                body = builder.body(turn, request, fields)
                sizing = builder.sizing
                if sizing.correction or sizing.note is not None:
                    recorder.request_sized(bool(sizing.correction), sizing.note is not None)
                planned = PlannedRequest(
                    turn + 1, request, planned_output, sizing, builder.oracle_seconds
                )
                exchange = await self._exchange(body, streamed, identity, figures, planned)
                reply = exchange.reply
                if reply is None:
                    assert exchange.ended is not None  # no reply: the agent ends here
                    return exchange.ended
                explainable = builder.served(turn, request, reply)
                served, completion = reply.prompt_tokens, reply.completion_tokens
                started, elapsed = exchange.started, exchange.elapsed
                assert started is not None and elapsed is not None  # it was sent
                recorder.request_succeeded(
                    figures, identity.rank, served, completion, reply.cached_tokens, elapsed,
                    reply.ttft, reply.gaps, reply.tpot, exchange.attempts, exchange.errors,
                    started,
                )  # fmt: skip
                if reply.worker is not None and identity.placed:
                    recorder.request_placed(figures, identity.rank, reply.worker)
                recorder.request_fidelity(
                    figures, turn, sizing.target, served, completion, planned_output,
                    fresh or identity.new_rank, explainable,
                    exchange.attempts - exchange.moved_attempts,
                )  # fmt: skip
                identity.new_rank = False
                recorder.request_done(figures, served, completion)
                rendered = builder.replied(turn, request, reply)
                counting = None  # a long reply's count, made on a worker thread
                if isinstance(rendered, asyncio.Future):
                    counting, rendered = rendered, None
                elif recorder.request_events is not None:
                    self._write_event(identity, planned, exchange, rendered)
                delay = float(latency_ms[request]) / 1000.0
                if turn < last and (delay > 0 or overlap) and not shutdown.stopped:
                    building = asyncio.ensure_future(builder.build(turn))
                if counting is not None:
                    whole = await self._counted_after_delay(
                        identity, planned, exchange, counting, delay
                    )
                else:
                    whole = await self._tool_delay(delay) if delay > 0 else True
                if not whole:
                    return Outcome.INTERRUPTED
        finally:
            await abandon(building)
        return Outcome.COMPLETED

    async def _tool_delay(self, delay: float) -> bool:
        """Sleep the tool call's latency; False when a shutdown cut it short."""
        began = time.perf_counter()
        whole = await self.shutdown.sleep(delay)
        self.recorder.tool_slept(time.perf_counter() - began if not whole else delay)
        return whole

    async def _counted_after_delay(
        self,
        identity: AgentIdentity,
        planned: PlannedRequest,
        exchange: Exchange,
        counting: asyncio.Future,
        delay: float,
    ) -> bool:
        """The tool delay while a long reply is counted on a worker thread; the request's
        event is written once the count is in (without it when cut off during the delay:
        the request itself succeeded and is reported)."""
        rendered = None
        try:
            whole = await self._tool_delay(delay) if delay > 0 else True
            rendered = await counting
        except asyncio.CancelledError:
            self._write_event(identity, planned, exchange, rendered)
            raise
        self._write_event(identity, planned, exchange, rendered)
        return whole

    # -- one logical request ------------------------------------------------------------
    def _identity(self, agent: int, slot: int) -> AgentIdentity:
        settings = self.settings
        rank = slot % settings.dp_ranks if settings.dp_ranks else None
        tag = (
            user_tag(agent, settings.seed, settings.user_prefix) if settings.user_tagging else None
        )
        tag_error = tag is not None and not valid_header_value(tag)
        headers = request_headers(
            settings.api_key, None if tag_error else tag, rank, settings.dp_rank_header
        )
        ident = self.workload.trajectory_ids[agent]
        return AgentIdentity(agent, ident, slot, rank, tag, tag_error, headers, rank)

    def _move(self, identity: AgentIdentity) -> bool:
        """--rank-failover rehash: the agent leaves its down rank for the next live one;
        False when every rank is down (it stays, and its request fails)."""
        failover = self._failover
        assert failover is not None and identity.rank is not None
        target = failover.live_rank_after(identity.rank)
        if target is None:
            return False
        if identity.rank == identity.home_rank:
            self.recorder.rank_agent_moved(identity.rank)
        key = identity.headers.get(ROUTING_KEY_HEADER, identity.tag)
        identity.rank = target
        identity.headers = failover.headers(identity.agent, target, key)
        identity.placed = failover.sends_index
        identity.new_rank = True
        return True

    async def _exchange(
        self,
        body: bytes,
        streamed: bool,
        identity: AgentIdentity,
        figures: AgentFigures,
        planned: PlannedRequest,
    ) -> Exchange:
        """Send one logical request; record and write the event of one that did not
        succeed (the successful one's are the caller's: they need the reply's count)."""
        recorder = self.recorder
        errors: list[AttemptError] = []
        failover = self._failover
        moved_attempts = 0  # attempts on ranks found down; they reached no worker
        if identity.tag_error:
            errors.append(AttemptError(0, ErrorKind.INVALID_REQUEST, ROUTING_KEY_HEADER_ERROR))
            reply, attempts, started, elapsed = None, 0, 0.0, 0.0
        else:
            try:
                if failover is not None and failover.rehash and identity.rank in failover.down:
                    self._move(identity)
                reply, attempts, started, elapsed = await self._send(
                    body, identity.headers, errors, streamed
                )
                while reply is None and self._rank_went_down(identity, errors):
                    # Sent again on the live rank: one request, timed from its first attempt.
                    moved_attempts = attempts
                    first_started = started
                    reply, attempts, started, elapsed = await self._send(
                        body, identity.headers, errors, streamed, attempts
                    )
                    elapsed += started - first_started
                    started = first_started
            except asyncio.CancelledError:
                # Cut off after the grace period: neither successful nor failed.
                attempts = len(errors) + 1
                errors.append(AttemptError(attempts, ErrorKind.CANCELLED, CANCELLED_IN_FLIGHT))
                recorder.request_cancelled(figures, errors, attempts)
                cut = Exchange(None, attempts, None, None, errors, "cancelled")
                self._write_event(identity, planned, cut, None)
                raise
        if reply is not None:
            return Exchange(reply, attempts, started, elapsed, errors, "ok", None, moved_attempts)
        if errors[-1].kind is ErrorKind.CANCELLED:  # the shutdown ended a retry wait
            recorder.request_cancelled(figures, errors, attempts)
            ended = Exchange(
                None, attempts, started, elapsed, errors, "cancelled", Outcome.INTERRUPTED
            )
        else:
            recorder.request_failed(
                figures, identity.rank, identity.agent, identity.trajectory_id,
                planned.invocation, errors, attempts, started, elapsed,
            )  # fmt: skip
            ended = Exchange(None, attempts, started, elapsed, errors, "failed", Outcome.FAILED)
        self._write_event(identity, planned, ended, None)
        return ended

    def _rank_went_down(self, identity: AgentIdentity, errors: list[AttemptError]) -> bool:
        """After a failed request: when its last attempt says the agent's rank is down,
        record that; True when the agent moved on to a live rank (--rank-failover rehash)
        and the request is to be sent again there."""
        failover = self._failover
        rank = identity.rank
        if failover is None or rank is None or not errors:
            return False
        reason = down_reason(errors[-1])
        if reason is None:
            return False
        if failover.mark_down(rank, reason, time.perf_counter() - self._origin):
            self.recorder.rank_down(rank, reason, failover.down[rank].at_seconds)
        if not failover.rehash or self.shutdown.stopped or self._planned_end():
            return False  # no new attempt starts once the run is ending
        return self._move(identity)

    async def _send(
        self,
        body: bytes,
        headers: dict[str, str],
        errors: list[AttemptError],
        stream: bool | None = None,
        attempted: int = 0,
    ):
        """(reply | None, attempts, start offset, latency) after the last attempt; every
        failed attempt is appended to ``errors`` (the last one ``cancelled`` when a shutdown
        ended the wait before a retry). ``attempted``: attempts the request already made on
        a rank that went down; numbering goes on from them, and this rank gets its own
        retries (the summary counts the resend as a retry)."""
        settings = self.settings
        recorder = self.recorder
        start = time.perf_counter()
        started = start - self._origin
        streamed = self._stream if stream is None else stream
        attempt = attempted
        last_attempt = attempted + self._attempts
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
                errors.append(
                    AttemptError(attempt, ErrorKind.HTTP_STATUS, str(exc), exc.status, exc.down)
                )
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
            if attempt >= last_attempt or self._planned_end():
                # After a planned end no retry starts: the attempt that just failed was the
                # request's last, so the request failed (it was not cut short).
                return None, attempt, started, time.perf_counter() - start
            wait = backoff_ms(settings.retry_delay_ms, attempt - attempted - 1, retry_after)
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
        status, raw, retry_after, worker = await self.transport.send(body, headers, None)
        if 200 <= status < 300:
            reply = parse_response(raw)
            reply.worker = worker
            return reply
        _raise_status(status, raw, retry_after)
        raise AssertionError("unreachable")  # pragma: no cover

    async def _post_stream(self, body: bytes, headers: dict[str, str]) -> Reply:
        sent = time.perf_counter()
        assembler = StreamAssembler()
        status, raw, retry_after, worker = await self.transport.send(
            body, headers, assembler.feed, assembler.heard_type
        )
        if not 200 <= status < 300:
            _raise_status(status, raw, retry_after)
        reply = assembler.finish(sent)
        reply.worker = worker
        return reply

    def _write_event(
        self,
        identity: AgentIdentity,
        planned: PlannedRequest,
        exchange: Exchange,
        rendered: int | None,
    ) -> None:
        """The request's line in --request-events-jsonl, when the run writes that file (with
        ``source_row`` when its trajectory has provenance)."""
        sink = self.recorder.request_events
        if sink is None:
            return
        reply = exchange.reply
        errors = exchange.errors
        status = exchange.status
        last = errors[-1] if status != "ok" and errors else None
        sizing = planned.sizing
        planned_output = planned.planned_output
        served = completion = cached = ttft = None
        if reply is not None:
            served, completion = reply.prompt_tokens, reply.completion_tokens
            cached, ttft = reply.cached_tokens, reply.ttft
        rows = self._source_rows
        make: type[RequestEvent]
        source: tuple[int, ...]
        if rows is None or (row := int(rows[planned.request])) < 0:
            make, source = RequestEvent, ()
        else:  # the source row is one more argument: no copy of the other 25 fields
            make, source = SourcedRequestEvent, (row,)
        event = make(
            identity.agent,
            identity.trajectory_id,
            planned.invocation,
            identity.slot,
            identity.rank,
            sizing.target,
            served,
            completion,
            cached,
            exchange.started,
            exchange.elapsed,
            ttft,
            exchange.attempts,
            status,
            last.message if last is not None else None,
            str(last.kind) if last is not None else None,
            last.status if last is not None else None,
            [error.as_dict() for error in errors],
            served - sizing.target if served is not None else None,
            sizing.correction,
            sizing.note,
            planned_output,
            completion - planned_output if completion is not None else None,
            rendered,
            planned.oracle_seconds,
            reply.worker if reply is not None else None,
            *source,
        )
        sink.write_batched(event)


def _raise_status(status: int, raw: bytes, retry_after: str | None) -> None:
    text = http_error_text(status, raw)
    if is_retryable_status(status):
        wait = parse_retry_after(retry_after) if status in (429, 503) else None
        raise _Retry(text, status, wait, down_code(status, raw) if status >= 500 else None)
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
