"""Percentiles, run totals and streaming samples, as docs/metrics.md defines them."""

from __future__ import annotations

import math
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field

from batchbench.results.failures import ErrorTally

QUANTILES = (0.50, 0.90, 0.99)


def percentile(sorted_values: Sequence[float], q: float) -> float | None:
    """Element at index round((n-1)q), rounding half away from zero; None for no samples."""
    n = len(sorted_values)
    if n == 0:
        return None
    q = min(max(q, 0.0), 1.0)
    return sorted_values[math.floor((n - 1) * q + 0.5)]


def percentiles(values: Sequence[float]) -> tuple[float | None, float | None, float | None]:
    """(p50, p90, p99) of unsorted samples."""
    ordered = sorted(values)
    p50, p90, p99 = (percentile(ordered, q) for q in QUANTILES)
    return p50, p90, p99


@dataclass
class RunTotals:
    """The counters of one run that the summary, CSV and JSON report."""

    agents: int = 0
    completed_agents: int = 0
    planned_tool_invocations: int = 0
    successful_requests: int = 0
    failed_requests: int = 0
    total_input_tokens: int = 0
    total_output_tokens: int = 0
    estimated_cached_input_tokens: int = 0
    total_tool_call_latency_seconds: float = 0.0
    live_block_fallbacks: int = 0
    cancelled_requests: int = 0  # cut short by a shutdown (in flight or waiting to retry)
    skipped_requests: int = 0  # planned but never sent
    lost_requests: int = 0  # a dead worker's share that no file recorded (--workers)
    attempts: int = 0  # HTTP attempts of every sent request
    retry_waits_capped: int = 0  # Retry-After waits shortened to --max-retry-wait
    # Sent again on a new connection: the server closed the kept-alive one under them.
    resent_requests: int = 0
    errors: ErrorTally = field(default_factory=ErrorTally)  # failed attempts by kind
    # a live run's is the recorder's ``latencies_ms`` array
    request_latencies_ms: Sequence[float] = field(default_factory=list)
    agent_latencies_ms: list[float] = field(default_factory=list)
    failures: list[tuple[int, str, int, str]] = field(default_factory=list)

    @property
    def total_requests(self) -> int:
        return self.successful_requests + self.failed_requests


@dataclass
class StreamSamples:
    """Latency samples of successful streamed requests, in milliseconds: time to first token,
    every gap between content chunks, and time per output token after the first."""

    # Compact arrays of doubles: a long streamed run keeps one sample per content chunk.
    ttft_ms: array = field(default_factory=lambda: array("d"))
    itl_ms: array = field(default_factory=lambda: array("d"))
    tpot_ms: array = field(default_factory=lambda: array("d"))

    def add(self, ttft: float | None, gaps: list[float] | None, tpot: float | None) -> None:
        """One request's figures in seconds."""
        if ttft is not None:
            self.ttft_ms.append(ttft * 1000.0)
        if gaps:
            self.itl_ms.extend(gap * 1000.0 for gap in gaps)
        if tpot is not None:
            self.tpot_ms.append(tpot * 1000.0)


def median_seconds(values: list[float]) -> float | None:
    """p50 of unsorted seconds by the percentile rule above (the per-trajectory TTFT)."""
    return percentile(sorted(values), 0.5)
