"""Per-request samples and the run's time series, kept in compact columns.

The whole-run summary needs only totals and latency lists; a measured window (after a
warm-up, for goodput, SLOs and capacity steps), per-rank latencies and the report's charts
need each request's times. One row per sent request costs about 60 bytes: a million
requests fit in 60 MB, and nothing here allocates a Python object per request beyond the
array slots.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field

NAN = math.nan
SERIES_INTERVAL_SECONDS = 0.5  # how often the time series samples the run


def output_speed(output_tokens: int, gaps: Sequence[float] | None) -> float | None:
    """A streamed request's output speed, tokens/s: its output tokens over its generation
    time, from its first content chunk to its last (the sum of the gaps between chunks,
    in seconds or ms, giving tokens/s or tokens/ms). None when it has no generation
    time: a reply of one token, or one that came in a single content chunk."""
    if output_tokens < 2 or not gaps:
        return None
    generation = math.fsum(gaps)
    return output_tokens / generation if generation > 0.0 else None


@dataclass
class RequestSamples:
    """One row per settled request (succeeded or failed), in the order they ended. Times
    are seconds on the benchmark clock; latencies milliseconds; NaN where a figure does not
    exist (TTFT of a non-streamed request, the gaps of a one-chunk reply)."""

    start_s: array = field(default_factory=lambda: array("d"))
    latency_ms: array = field(default_factory=lambda: array("d"))
    ttft_ms: array = field(default_factory=lambda: array("d"))
    itl_mean_ms: array = field(default_factory=lambda: array("d"))
    tpot_ms: array = field(default_factory=lambda: array("d"))
    ok: bytearray = field(default_factory=bytearray)  # 1 succeeded, 0 failed
    good: bytearray = field(default_factory=bytearray)  # met every --goodput threshold
    rank: array = field(default_factory=lambda: array("i"))  # -1 without client routing
    agent: array = field(default_factory=lambda: array("i"))
    input_tokens: array = field(default_factory=lambda: array("q"))
    output_tokens: array = field(default_factory=lambda: array("q"))
    cached_tokens: array = field(default_factory=lambda: array("q"))  # -1: not reported
    gap_first: array = field(default_factory=lambda: array("q"))  # index into the ITL samples
    gap_count: array = field(default_factory=lambda: array("i"))

    def __len__(self) -> int:
        return len(self.start_s)

    def add(
        self,
        start: float,
        latency_ms: float,
        ttft_ms: float,
        itl_mean_ms: float,
        tpot_ms: float,
        ok: bool,
        good: bool,
        rank: int,
        agent: int,
        input_tokens: int,
        output_tokens: int,
        cached_tokens: int,
        gap_first: int,
        gap_count: int,
    ) -> None:
        self.start_s.append(start)
        self.latency_ms.append(latency_ms)
        self.ttft_ms.append(ttft_ms)
        self.itl_mean_ms.append(itl_mean_ms)
        self.tpot_ms.append(tpot_ms)
        self.ok.append(1 if ok else 0)
        self.good.append(1 if good else 0)
        self.rank.append(rank)
        self.agent.append(agent)
        self.input_tokens.append(input_tokens)
        self.output_tokens.append(output_tokens)
        self.cached_tokens.append(cached_tokens)
        self.gap_first.append(gap_first)
        self.gap_count.append(gap_count)


@dataclass
class TimeSeries:
    """The run sampled every ``interval`` seconds: agents running, requests in flight, and
    cumulative requests settled and output tokens (rates are their differences)."""

    interval: float = SERIES_INTERVAL_SECONDS
    t: array = field(default_factory=lambda: array("d"))
    active_agents: array = field(default_factory=lambda: array("i"))
    in_flight: array = field(default_factory=lambda: array("i"))
    settled: array = field(default_factory=lambda: array("q"))
    output_tokens: array = field(default_factory=lambda: array("q"))

    def add(self, t: float, agents: int, in_flight: int, settled: int, output: int) -> None:
        self.t.append(t)
        self.active_agents.append(agents)
        self.in_flight.append(in_flight)
        self.settled.append(settled)
        self.output_tokens.append(output)

    def document(self, max_points: int = 1000) -> dict:
        """The results JSON ``timeseries``: at most ``max_points`` points (consecutive
        samples merged: the last time, the mean of the gauges, rates over the merged span)."""
        n = len(self.t)
        step = max(1, math.ceil(n / max_points))
        t: list[float] = []
        agents: list[float] = []
        flight: list[float] = []
        rps: list[float] = []
        tps: list[float] = []
        previous_t, previous_settled, previous_output = 0.0, 0, 0
        for begin in range(0, n, step):
            end = min(begin + step, n)
            now = self.t[end - 1]
            span = now - previous_t
            t.append(round(now, 3))
            agents.append(round(sum(self.active_agents[begin:end]) / (end - begin), 3))
            flight.append(round(sum(self.in_flight[begin:end]) / (end - begin), 3))
            settled, output = self.settled[end - 1], self.output_tokens[end - 1]
            rps.append(round((settled - previous_settled) / span, 3) if span > 0 else 0.0)
            tps.append(round((output - previous_output) / span, 3) if span > 0 else 0.0)
            previous_t, previous_settled, previous_output = now, settled, output
        return {
            "interval_seconds": round(self.interval * step, 6),
            "t": t,
            "active_agents": agents,
            "in_flight": flight,
            "requests_per_second": rps,
            "output_tokens_per_second": tps,
        }
