"""What a live run measures, as it happens: totals, streaming samples, per-rank figures,
per-trajectory figures and the client's own health (docs/metrics.md).

The driver calls ``request_succeeded`` / ``request_failed`` once per logical request; the
report reads the result. Nothing here does I/O except the optional request-events file.
"""

from __future__ import annotations

import asyncio
import resource
import time
from array import array
from dataclasses import dataclass, field
from typing import Any

from batchbench.results.events import JsonlFile
from batchbench.results.failures import AttemptError
from batchbench.results.metrics import RunTotals, StreamSamples, median_seconds, percentile
from batchbench.results.samples import NAN, RequestSamples, TimeSeries, output_speed

LAG_INTERVAL_SECONDS = 0.010


@dataclass(slots=True)
class AgentFigures:
    """Per-trajectory figures appended to its lifecycle record."""

    requests: int = 0
    successful_requests: int = 0
    failed_requests: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int | None = None
    ttfts: list[float] | None = None
    error: str | None = None
    previous_prompt: int = 0
    previous_completion: int = 0
    prompt_exact: int = 0
    output_exact: int = 0
    cancelled: int = 0
    skipped: int = 0
    agent_id: int = -1
    worker: str | None = None  # the worker that served its last request, when told
    worker_switches: int = 0  # requests served by another worker than the one before

    @property
    def settled(self) -> int:
        """Requests with an outcome: succeeded, failed or cancelled (the rest were skipped)."""
        return self.requests + self.cancelled

    def as_fields(self) -> dict[str, Any]:
        ttft = median_seconds(self.ttfts) if self.ttfts else None
        return {
            "requests": self.requests,
            "successful_requests": self.successful_requests,
            "failed_requests": self.failed_requests,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cached_tokens": self.cached_tokens,
            "ttft_p50_seconds": ttft,
            "error": self.error,
            "prompt_exact_requests": self.prompt_exact,
            "output_exact_requests": self.output_exact,
            "cancelled_requests": self.cancelled,
            "skipped_requests": self.skipped,
        }

    def placement_fields(self) -> dict[str, Any]:
        """Where its requests were served, for its lifecycle record: only when a reply
        named the worker (otherwise the client cannot know)."""
        if self.worker is None:
            return {}
        return {"last_worker": self.worker, "worker_switches": self.worker_switches}


@dataclass(slots=True)
class DriftFigures:
    """How far served token counts were from their targets, over successful requests."""

    requests: int = 0
    exact: int = 0
    abs_sum: int = 0
    max_abs: int = 0
    histogram: dict[int, int] = field(default_factory=dict)  # drift -> requests

    def add(self, drift: int) -> None:
        self.requests += 1
        if drift == 0:
            self.exact += 1
        else:
            size = -drift if drift < 0 else drift
            self.abs_sum += size
            if size > self.max_abs:
                self.max_abs = size
        histogram = self.histogram
        histogram[drift] = histogram.get(drift, 0) + 1

    @property
    def exact_percent(self) -> float | None:
        return 100.0 * self.exact / self.requests if self.requests else None

    @property
    def mean_abs(self) -> float | None:
        return self.abs_sum / self.requests if self.requests else None


@dataclass
class FidelityFigures:
    """Prompt and output fidelity of a live run, and what the client did to reach it."""

    prompt: DriftFigures = field(default_factory=DriftFigures)
    output: DriftFigures = field(default_factory=DriftFigures)
    prompt_by_turn: dict[int, DriftFigures] = field(default_factory=dict)
    corrected_requests: int = 0  # requests whose new content was resized from the plan
    limited_requests: int = 0  # requests the correction could not bring to the target
    oracle_queries: int = 0
    oracle_seconds: list[float] = field(default_factory=list)
    explainable_cached_tokens: int = 0  # cache hits perfect caching of this run can explain
    inexact_tool_blocks: int = 0  # tool blocks sent at the closest size (exact impossible)


@dataclass(slots=True)
class RankFigures:
    """Load that one DP rank received (perfect routing only)."""

    trajectories: int = 0
    requests: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    # Where its successful requests were served, when the replies said so: requests per
    # worker (the server's name for it); how often one of its agents' requests reached
    # another worker than that agent's request before; how many of its agents did so.
    workers: dict[str, int] = field(default_factory=dict)
    switches: int = 0
    switching_agents: int = 0
    # Its health (see ``batchbench.drive.failover``): when it was first seen down and why
    # (-1.0 and "" while up); its agents that failed (counted where they failed); its agents
    # that left it for a live rank (--rank-failover rehash), and how many of those completed.
    down_at_seconds: float = -1.0
    down_reason: str = ""
    failed_agents: int = 0
    moved_agents: int = 0
    moved_completed: int = 0

    def add(self, other: RankFigures) -> None:
        """Count another process's figures for the same rank in (merged shards)."""
        self.trajectories += other.trajectories
        self.requests += other.requests
        self.input_tokens += other.input_tokens
        self.output_tokens += other.output_tokens
        self.cached_tokens += other.cached_tokens
        for worker, count in other.workers.items():
            self.workers[worker] = self.workers.get(worker, 0) + count
        self.switches += other.switches
        self.switching_agents += other.switching_agents
        if other.down_reason and (
            not self.down_reason or other.down_at_seconds < self.down_at_seconds
        ):
            self.down_at_seconds, self.down_reason = other.down_at_seconds, other.down_reason
        self.failed_agents += other.failed_agents
        self.moved_agents += other.moved_agents
        self.moved_completed += other.moved_completed

    def as_row(self) -> dict[str, Any]:
        """Its fields and its placement figures, as the results JSON's ``ranks`` rows."""
        return {
            "trajectories": self.trajectories,
            "requests": self.requests,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cached_tokens": self.cached_tokens,
            "workers": dict(self.workers),
            "usual_worker": self.usual_worker,
            "misplaced": self.misplaced,
            "switches": self.switches,
            "switching_agents": self.switching_agents,
            "down": bool(self.down_reason),
            "down_at_seconds": self.down_at_seconds if self.down_reason else None,
            "down_reason": self.down_reason or None,
            "failed_agents": self.failed_agents,
            "moved_agents": self.moved_agents,
            "moved_completed": self.moved_completed,
        }

    @classmethod
    def from_json(cls, document: dict[str, Any]) -> RankFigures:
        """The figures as ``dataclasses.asdict`` wrote them (a shard's document)."""
        workers = document.get("workers") or {}
        counts = {
            name: int(value)
            for name, value in document.items()
            if name not in ("workers", "down_at_seconds", "down_reason")
        }
        return cls(
            **counts,
            workers={str(w): int(n) for w, n in workers.items()},
            down_at_seconds=float(document.get("down_at_seconds", -1.0)),
            down_reason=str(document.get("down_reason") or ""),
        )

    @property
    def placed(self) -> int:
        """Successful requests whose reply named the worker that served them."""
        return sum(self.workers.values())

    @property
    def usual_worker(self) -> str | None:
        """The worker that served most of its requests (the first named, on a tie)."""
        return max(self.workers, key=self.workers.__getitem__) if self.workers else None

    @property
    def misplaced(self) -> int:
        """Requests served by a worker other than its usual one."""
        return self.placed - max(self.workers.values(), default=0)


@dataclass
class ClientHealth:
    """Evidence that the client was not the bottleneck."""

    lag_p50_ms: float | None = None
    lag_p99_ms: float | None = None
    lag_max_ms: float | None = None
    cpu_seconds: float = 0.0
    cpu_seconds_per_1000_requests: float | None = None
    peak_in_flight: int = 0
    processes: int = 1  # client processes (--workers, merged shards): CPU adds up over them


@dataclass
class Recorder:
    """Accumulates one live run's measurements."""

    dp_ranks: int | None = None
    totals: RunTotals = field(default_factory=RunTotals)
    stream: StreamSamples = field(default_factory=StreamSamples)
    server_cached_tokens: int | None = None
    ranks: list[RankFigures] = field(default_factory=list)
    agents: dict[int, AgentFigures] = field(default_factory=dict)
    started_agents: set[int] = field(default_factory=set)
    request_events: JsonlFile | None = None
    in_flight: int = 0
    peak_in_flight: int = 0
    fidelity: FidelityFigures = field(default_factory=FidelityFigures)
    latencies_ms: array = field(default_factory=lambda: array("d"))
    lag_ms: array = field(default_factory=lambda: array("d"))
    _cpu_start: float = 0.0
    cpu_seconds: float = 0.0
    # --goodput thresholds: ((metric, limit ms), ...); a request meeting all of them is good
    goodput: tuple[tuple[str, float], ...] = ()
    samples: RequestSamples = field(default_factory=RequestSamples)
    series: TimeSeries = field(default_factory=TimeSeries)
    origin: float | None = None  # the benchmark clock's start (perf_counter)
    wall_seconds: float = 0.0

    def __post_init__(self) -> None:
        if self.dp_ranks:
            self.ranks = [RankFigures() for _ in range(self.dp_ranks)]
        self.totals.request_latencies_ms = self.latencies_ms

    # -- trajectories ---------------------------------------------------------------
    def agent_started(self, agent: int, slot: int) -> AgentFigures:
        figures = AgentFigures(agent_id=agent)
        self.started_agents.add(agent)
        self.agents[agent] = figures
        if self.dp_ranks:
            self.ranks[slot % self.dp_ranks].trajectories += 1
        return figures

    def take_agent(self, agent: int) -> AgentFigures | None:
        return self.agents.pop(agent, None)

    # -- requests -------------------------------------------------------------------
    def request_succeeded(
        self,
        figures: AgentFigures,
        rank: int | None,
        prompt: int,
        completion: int,
        cached: int | None,
        latency: float,
        ttft: float | None = None,
        gaps: list[float] | None = None,
        tpot: float | None = None,
        attempts: int = 1,
        errors: list[AttemptError] | None = None,
        started: float = NAN,
    ) -> None:
        """A request succeeded: the server's usage counts, its latency and, when streamed,
        its time to first token, gaps between content chunks and time per output token;
        ``errors`` are its attempts that failed before; ``started`` its send time on the
        benchmark clock."""
        totals = self.totals
        totals.successful_requests += 1
        totals.attempts += attempts
        if errors:
            for error in errors:
                totals.errors.add(error)
        totals.total_input_tokens += prompt
        totals.total_output_tokens += completion
        totals.estimated_cached_input_tokens += min(figures.previous_prompt, prompt)
        self.latencies_ms.append(latency * 1000.0)
        figures.requests += 1
        figures.successful_requests += 1
        figures.input_tokens += prompt
        figures.output_tokens += completion
        if cached is not None:
            figures.cached_tokens = (figures.cached_tokens or 0) + cached
            self.server_cached_tokens = (self.server_cached_tokens or 0) + cached
        gap_first = len(self.stream.itl_ms)
        if ttft is not None:
            if figures.ttfts is None:
                figures.ttfts = []
            figures.ttfts.append(ttft)
            self.stream.add(ttft, gaps, tpot)  # gaps and TPOT exist only when a content chunk did
        if rank is not None:
            load = self.ranks[rank]
            load.requests += 1
            load.input_tokens += prompt
            load.output_tokens += completion
            load.cached_tokens += cached or 0
        latency_ms = latency * 1000.0
        ttft_ms = ttft * 1000.0 if ttft is not None else NAN
        itl_ms = sum(gaps) * 1000.0 / len(gaps) if gaps else NAN
        tpot_ms = tpot * 1000.0 if tpot is not None else NAN
        good = True
        for metric, limit in self.goodput:
            if metric == "output_speed":
                if ttft is None:
                    good = False  # not streamed: no speed to meet the floor
                    break
                speed = output_speed(completion, gaps)
                if speed is None:
                    continue  # one token, or one chunk: no generation time to judge
                if speed < limit:
                    good = False
                    break
                continue
            value = (
                ttft_ms
                if metric == "ttft"
                else itl_ms
                if metric == "itl"
                else tpot_ms
                if metric == "tpot"
                else latency_ms
            )
            if value != value:  # NaN: not measured
                if metric in ("itl", "tpot") and ttft is not None:
                    continue  # a streamed reply in one chunk has no gap to exceed a limit
                good = False
                break
            if value > limit:
                good = False
                break
        self.samples.add(
            started, latency_ms, ttft_ms, itl_ms, tpot_ms, True, good,
            -1 if rank is None else rank, figures.agent_id, prompt, completion,
            -1 if cached is None else cached, gap_first, len(self.stream.itl_ms) - gap_first,
        )  # fmt: skip

    def request_placed(self, figures: AgentFigures, rank: int | None, worker: str) -> None:
        """A successful request's reply named the worker that served it."""
        previous = figures.worker
        figures.worker = worker
        switched = previous is not None and previous != worker
        if switched:
            figures.worker_switches += 1
        if rank is None:
            return
        load = self.ranks[rank]
        load.workers[worker] = load.workers.get(worker, 0) + 1
        if switched:
            load.switches += 1
            if figures.worker_switches == 1:
                load.switching_agents += 1

    def rank_down(self, rank: int, reason: str, at_seconds: float) -> None:
        """A request's last attempt said no worker behind ``rank`` answers."""
        load = self.ranks[rank]
        if not load.down_reason:
            load.down_at_seconds, load.down_reason = at_seconds, reason

    def rank_agent_moved(self, rank: int) -> None:
        """An agent of ``rank`` (by its slot) left it for a live rank."""
        self.ranks[rank].moved_agents += 1

    def rank_agent_ended(self, home: int, rank: int | None, failed: bool, completed: bool) -> None:
        """An agent admitted on rank ``home`` ended on ``rank``: failed, completed, or
        neither (a shutdown stopped it)."""
        if failed:
            self.ranks[home if rank is None else rank].failed_agents += 1
        elif completed and rank != home:
            self.ranks[home].moved_completed += 1

    def request_fidelity(
        self,
        figures: AgentFigures,
        turn: int,
        target: int,
        prompt: int,
        completion: int,
        planned_output: int,
        fresh: bool,
        framing_initial: int,
        attempts: int = 1,
    ) -> int:
        """Compare a successful request's usage with its targets; returns the prompt drift.

        ``fresh`` marks a first or reset request: there perfect caching can only explain the
        template's leading framing; otherwise the whole previous prompt plus its reply.
        """
        fidelity = self.fidelity
        served = prompt
        drift = served - target
        fidelity.prompt.add(drift)
        by_turn = fidelity.prompt_by_turn.get(turn)
        if by_turn is None:
            by_turn = fidelity.prompt_by_turn[turn] = DriftFigures()
        by_turn.add(drift)
        output_drift = completion - planned_output
        fidelity.output.add(output_drift)
        if drift == 0:
            figures.prompt_exact += 1
        if output_drift == 0:
            figures.output_exact += 1
        if fresh:
            explainable = min(max(framing_initial, 0), served)
        else:
            explainable = min(figures.previous_prompt + figures.previous_completion, served)
        # An attempt retried after the server had processed it leaves the whole prompt in
        # the cache for the next attempt.
        explainable += (attempts - 1) * served
        fidelity.explainable_cached_tokens += explainable
        return drift

    def request_failed(
        self,
        figures: AgentFigures,
        rank: int | None,
        agent: int,
        trajectory_id: str,
        invocation: int,
        errors: list[AttemptError],
        attempts: int,
        started: float = NAN,
        elapsed: float = 0.0,
    ) -> None:
        """A request failed after its last attempt; ``errors`` holds every failed attempt."""
        totals = self.totals
        totals.failed_requests += 1
        totals.attempts += attempts
        for attempt_error in errors:
            totals.errors.add(attempt_error)
        error = errors[-1].message
        totals.failures.append((agent, trajectory_id, invocation, error))
        figures.requests += 1
        figures.failed_requests += 1
        figures.error = error
        if rank is not None:
            self.ranks[rank].requests += 1
        self.samples.add(
            started, elapsed * 1000.0, NAN, NAN, NAN, False, False,
            -1 if rank is None else rank, figures.agent_id, 0, 0, -1,
            len(self.stream.itl_ms), 0,
        )  # fmt: skip

    def request_cancelled(
        self, figures: AgentFigures, errors: list[AttemptError], attempts: int
    ) -> None:
        """A shutdown cut the request short: in flight, or waiting to retry."""
        totals = self.totals
        totals.cancelled_requests += 1
        totals.attempts += attempts
        for error in errors:
            totals.errors.add(error)
        figures.cancelled += 1

    def requests_skipped(self, figures: AgentFigures | None, count: int) -> None:
        """Planned requests that were never sent (the agent stopped, or never started)."""
        self.totals.skipped_requests += count
        if figures is not None:
            figures.skipped = count

    def retry_wait_capped(self) -> None:
        """A Retry-After longer than --max-retry-wait was shortened to it."""
        self.totals.retry_waits_capped += 1

    def conversation_reset(self, figures: AgentFigures) -> None:
        """A reset: the next request starts a new conversation, with nothing to reuse."""
        figures.previous_prompt = 0
        figures.previous_completion = 0

    def request_done(self, figures: AgentFigures, prompt: int, completion: int) -> None:
        """After the request's figures are recorded: it becomes the agent's previous one."""
        figures.previous_prompt = prompt
        figures.previous_completion = completion

    def tool_blocks_inexact(self, count: int) -> None:
        """Tool blocks whose JSON could not reach their planned count were sent closest."""
        self.fidelity.inexact_tool_blocks += count

    def live_blocks_fell_back(self, count: int) -> None:
        """Live blocks generated from their seed because no previous reply existed."""
        self.totals.live_block_fallbacks += count

    def request_sized(self, corrected: bool, limited: bool) -> None:
        """A request's new content was resized from the plan, or could not reach its target."""
        if corrected:
            self.fidelity.corrected_requests += 1
        if limited:
            self.fidelity.limited_requests += 1

    def oracle_counted(self, seconds: float, queries: int) -> None:
        """The server counted a request before it was sent; ``queries`` so far in the run."""
        self.fidelity.oracle_seconds.append(seconds)
        self.fidelity.oracle_queries = queries

    def attempt_started(self) -> None:
        self.in_flight += 1
        if self.in_flight > self.peak_in_flight:
            self.peak_in_flight = self.in_flight

    def attempt_ended(self) -> None:
        self.in_flight -= 1

    def tool_slept(self, seconds: float) -> None:
        self.totals.total_tool_call_latency_seconds += seconds

    # -- client health --------------------------------------------------------------
    def start_clock(self, origin: float | None = None) -> None:
        self._cpu_start = _cpu_now()
        self.origin = time.perf_counter() if origin is None else origin

    def stop_clock(self) -> None:
        self.cpu_seconds = _cpu_now() - self._cpu_start
        if self.origin is not None:
            self.wall_seconds = time.perf_counter() - self.origin
            series = self.series
            # A last point closes the series unless one was just taken (a rate over a few
            # milliseconds would be noise).
            if not series.t or self.wall_seconds - series.t[-1] >= series.interval / 2:
                self.sample_series()

    def sample_series(self) -> None:
        """One time-series point: agents running, requests in flight, cumulative counts."""
        if self.origin is None:
            return
        totals = self.totals
        self.series.add(
            time.perf_counter() - self.origin,
            len(self.agents),
            self.in_flight,
            totals.successful_requests + totals.failed_requests,
            totals.total_output_tokens,
        )

    async def sample_lag(self) -> None:
        """Event-loop lag every 10 ms: how late each wake-up came. Also flushes request
        events that waited long enough."""
        clock = time.perf_counter
        interval = LAG_INTERVAL_SECONDS
        lag = self.lag_ms
        ticks = 0
        next_series = self.series.interval
        while True:
            expected = clock() + interval
            await asyncio.sleep(interval)
            now = clock()
            lag.append(max(now - expected, 0.0) * 1000.0)
            ticks += 1
            if self.request_events is not None and ticks % 25 == 0:
                self.request_events.flush()
            if self.origin is not None and now - self.origin >= next_series:
                # On the series' own grid, so points stay evenly spaced whatever the lag.
                while now - self.origin >= next_series:
                    next_series += self.series.interval
                self.sample_series()

    def health(self) -> ClientHealth:
        lag = sorted(self.lag_ms)
        requests = self.totals.total_requests
        return ClientHealth(
            lag_p50_ms=percentile(lag, 0.5),
            lag_p99_ms=percentile(lag, 0.99),
            lag_max_ms=lag[-1] if lag else None,
            cpu_seconds=self.cpu_seconds,
            cpu_seconds_per_1000_requests=(
                self.cpu_seconds * 1000.0 / requests if requests else None
            ),
            peak_in_flight=self.peak_in_flight,
        )


def _cpu_now() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime
