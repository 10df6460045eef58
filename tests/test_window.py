"""The measured window: figures over hand-built samples (warm-up exclusion, rates, cache hits,
statistics, goodput per request and per trajectory, SLO outcomes, verdicts), its console
lines and CSV cells, the time series, and runs against the real simulator stopped by
--duration and --window-trajectories whose window is checked against the request events."""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import io
import json
import math
import re
from array import array
from pathlib import Path
from statistics import NormalDist

import pytest

from batchbench import RunConfig, run
from batchbench.cli.agent import main
from batchbench.drive.simlaunch import SimProcess, sim_command
from batchbench.results.failures import AttemptError, ErrorKind
from batchbench.results.lifecycle import TrajectoryRecord
from batchbench.results.progress import Progress
from batchbench.results.recording import ClientHealth, Recorder
from batchbench.results.samples import NAN, RequestSamples, TimeSeries
from batchbench.results.slo import parse_slo
from batchbench.results.window import (
    GoodputFigures,
    MetricStats,
    ObjectiveOutcome,
    PeakOutput,
    Verdict,
    WindowFigures,
    WindowInputs,
    client_verdict,
    distribution,
    server_verdict,
    window_figures,
)
from batchbench.results.windowreport import (
    latency_table,
    outcome_text,
    peak_line,
    server_metrics_lines,
    window_csv,
    window_lines,
)

Z = NormalDist().inv_cdf(0.975)
PERCENTS = (25.0, 50.0, 90.0, 99.9)


def wilson(x: int, n: int) -> tuple[float, float]:
    """(x + z²/2 ± z √(x(n-x)/n + z²/4)) / (n + z²), clamped at 0 and 1 at the ends."""
    z2 = Z * Z
    half = Z * math.sqrt(x * (n - x) / n + z2 / 4.0)
    low, high = (x + z2 / 2.0 - half) / (n + z2), (x + z2 / 2.0 + half) / (n + z2)
    return (0.0 if x == 0 else low), (1.0 if x == n else high)


def population_std(values: list[float]) -> float:
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))


# -- hand-built inputs -----------------------------------------------------------------
def hand_samples() -> tuple[RequestSamples, array]:
    """Seven requests; the window [1, 4] holds rows 1-5 (row 0 is in the warm-up, row 6
    after the end). Goodput threshold ttft <= 500 ms: row 3 failed, row 4 is too slow."""
    gaps = array("d", [10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 5.0, 5.0])
    samples = RequestSamples()
    rows = [
        # start, latency, ttft, itl mean, tpot, ok, good, agent, in, out, cached, first, count
        (0.2, 100.0, 50.0, 15.0, 10.0, True, True, 0, 100, 3, 0, 0, 2),
        (1.0, 200.0, 80.0, 40.0, 40.0, True, True, 1, 200, 4, 100, 2, 3),
        (1.5, 300.0, 120.0, 60.0, 60.0, True, True, 1, 300, 2, 200, 5, 1),
        (2.0, 400.0, NAN, NAN, NAN, False, False, 2, 0, 0, -1, 6, 0),
        (2.5, 1000.0, 900.0, NAN, NAN, True, False, 3, 400, 1, -1, 6, 0),
        (3.0, 50.0, 20.0, 5.0, 5.0, True, True, 4, 50, 3, 50, 6, 2),
        (4.5, 10.0, 5.0, NAN, NAN, True, True, 5, 10, 1, 10, 8, 0),
    ]
    for start, lat, ttft, itl, tpot, ok, good, agent, inp, out, cached, first, count in rows:
        samples.add(
            start, lat, ttft, itl, tpot, ok, good, -1, agent, inp, out, cached, first, count
        )
    return samples, gaps


def hand_records() -> list[TrajectoryRecord]:
    def record(agent: int, admitted: float, loop: float, completed: bool) -> TrajectoryRecord:
        return TrajectoryRecord(
            agent, agent, 0.0, admitted, admitted + loop, loop_seconds=loop, completed=completed
        )

    return [
        record(0, 0.1, 0.75, True),  # admitted in the warm-up
        record(1, 1.0, 0.5, True),  # every request good
        record(2, 1.9, 0.1, False),  # its request failed
        record(3, 2.4, 1.25, True),  # completed, one request too slow
        record(4, 3.0, 0.25, True),  # every request good
        record(5, 4.25, 0.125, True),  # admitted after the end
    ]


def hand_series() -> TimeSeries:
    series = TimeSeries(interval=0.5)
    agents = [1, 2, 3, 4, 4, 4, 3, 2, 1]
    flight = [0, 1, 2, 3, 5, 2, 1, 0, 7]
    for i in range(9):
        series.add(0.5 * (i + 1), agents[i], flight[i], 10 * i, 100 * i)
    return series


def hand_inputs(**changes) -> WindowInputs:
    samples, gaps = hand_samples()
    values = dict(
        samples=samples,
        gaps_ms=gaps,
        records=hand_records(),
        series=hand_series(),
        health=ClientHealth(lag_p50_ms=1.0, lag_p99_ms=5.0, lag_max_ms=9.0, cpu_seconds=1.0),
        wall_seconds=10.0,
        goodput=(("ttft", 500.0),),
        objectives=parse_slo("ttft_p50=100ms,e2e_p10=2s,itl_p50=1ms,goodput=50%"),
        percents=PERCENTS,
    )
    values.update(changes)
    return WindowInputs(**values)


def test_window_tokens_per_request():
    """Input and output tokens of each successful request in the window (rows 1, 2, 4, 5):
    their mean, p50, p90 and max (the report's workload summary, the console's length
    lines)."""
    w = window_figures(hand_inputs(), 1.0, 4.0)
    assert w.request_tokens == {
        "input": {"mean": 237.5, "p50": 300, "p90": 400, "max": 400},  # 50, 200, 300, 400
        "output": {"mean": 2.5, "p50": 3, "p90": 4, "max": 4},  # 1, 2, 3, 4
    }
    assert w.as_dict()["request_tokens"] == w.request_tokens
    assert window_figures(hand_inputs(), 5.0, 6.0).request_tokens is None  # no request


def test_peak_output_rate_counts_tokens_as_their_chunks_arrive():
    """The window [1, 4]: row 1's 4 tokens arrive in 4 chunks at 1.08-1.20 s, row 2's 2 at
    1.62 and 1.68 s (6 in the bin from 1 s); row 4's 1 at 3.40 s and row 5's 3 at
    3.02-3.03 s (4 in the bin from 3 s)."""
    w = window_figures(hand_inputs(), 1.0, 4.0)
    assert w.peak_output == PeakOutput(6.0, 1.0, 1.0, "chunks")
    assert w.as_dict()["peak_output"] == {
        "tokens_per_second": 6.0,
        "bin_start_seconds": 1.0,
        "bin_seconds": 1.0,
        "counted_at": "chunks",
    }
    assert window_figures(hand_inputs(), 5.0, 6.0).peak_output is None  # no request


def test_a_window_shorter_than_a_bin_is_its_own_bin():
    """The window [1, 1.5]: rows 1 and 2 (6 tokens) in half a second are 12 tokens/s, the
    window's own output rate, not 6 (a full second's rate of half a second's tokens)."""
    w = window_figures(hand_inputs(), 1.0, 1.5)
    assert w.peak_output == PeakOutput(12.0, 1.0, 0.5, "chunks")
    assert w.output_tokens_per_second == 12.0
    assert peak_line(w, "Peak output tokens/s") == [
        "Peak output tokens/s: 12 (the whole 0.50-second window from 1.00s; tokens counted "
        "as their chunks arrived)"
    ]


def test_peak_output_rate_of_streamed_and_unstreamed_replies():
    """Streamed: 7 tokens over 3 chunks (2, 2, 3 at 0.9, 1.2 and 1.7 s); unstreamed: all
    tokens at completion (10 at 1.5 s, 15 at 2.1 s); a failed request counts nothing. The
    bins from 1 s and 2 s both hold 15: the earlier is the peak."""
    samples = RequestSamples()
    # start, latency, ttft, itl, tpot, ok, good, rank, agent, in, out, cached, first, count
    samples.add(0.5, 2000.0, 400.0, 400.0, 10.0, True, True, -1, 0, 10, 7, -1, 0, 2)
    samples.add(0.2, 1300.0, NAN, NAN, NAN, True, True, -1, 1, 10, 10, -1, 2, 0)
    samples.add(2.0, 100.0, NAN, NAN, NAN, True, True, -1, 2, 10, 15, -1, 2, 0)
    samples.add(1.0, 10.0, NAN, NAN, NAN, False, False, -1, 3, 0, 0, -1, 2, 0)
    inputs = hand_inputs(samples=samples, gaps_ms=array("d", [300.0, 500.0]))
    w = window_figures(inputs, 0.0, 3.0)
    assert w.peak_output == PeakOutput(15.0, 1.0, 1.0, "chunks and completions")
    unstreamed = window_figures(inputs, 0.6, 3.0)  # rows 0 and 1 start in the warm-up
    assert unstreamed.peak_output == PeakOutput(15.0, 1.6, 1.0, "completions")


def test_window_counts_rates_and_cache_hits():
    w = window_figures(hand_inputs(), 1.0, 4.0)
    assert (w.start_seconds, w.end_seconds, w.duration_seconds) == (1.0, 4.0, 3.0)
    assert (w.requests, w.successful_requests, w.failed_requests) == (5, 4, 1)
    assert w.requests_per_second == 5 / 3
    # tokens of the successful rows 1, 2, 4 and 5
    assert (w.input_tokens, w.output_tokens) == (950, 10)
    assert w.input_tokens_per_second == 950 / 3 and w.output_tokens_per_second == 10 / 3
    assert w.cached_tokens == 350  # rows that reported: 100 + 200 + 50
    assert w.cache_hit_percent == 100.0 * 350 / 950
    # Time-weighted from admissions and finishes: agents 1-4 run 0.5 + 0.1 + 1.25 + 0.25 s
    # of the 3 s window (agent 0 ended before it, agent 5 started after it).
    assert w.mean_active_agents == pytest.approx(2.1 / 3, abs=1e-12)
    # From send times and latencies: rows 4 (2.5-3.5 s) and 5 (3.0-3.05 s) overlap.
    assert w.peak_in_flight == 2
    assert w.client == Verdict(
        "ok", "the client kept up (event-loop lag p99 5.0 ms, 10% of one core)"
    )
    assert w.server == Verdict(None, None)


def test_window_statistics_follow_the_percentile_rule():
    """Index round((n-1)q) (half away from zero) of the sorted values; population std."""
    w = window_figures(hand_inputs(), 1.0, 4.0)
    expected = {
        "ttft_ms": ([20.0, 80.0, 120.0, 900.0], (80.0, 120.0, 900.0, 900.0)),
        "itl_ms": ([5.0, 5.0, 30.0, 40.0, 50.0, 60.0], (5.0, 40.0, 60.0, 60.0)),
        "tpot_ms": ([5.0, 40.0, 60.0], (40.0, 40.0, 60.0, 60.0)),
        "e2e_ms": ([50.0, 200.0, 300.0, 1000.0], (200.0, 300.0, 1000.0, 1000.0)),
        "agent_e2e_ms": ([250.0, 500.0, 1250.0], (500.0, 500.0, 1250.0, 1250.0)),
    }
    assert set(w.latency) == set(expected)
    for key, (values, (p25, p50, p90, p999)) in expected.items():
        stats = w.latency[key]
        assert stats.count == len(values), key
        assert stats.mean == pytest.approx(sum(values) / len(values), rel=1e-15), key
        assert (stats.min, stats.max) == (values[0], values[-1]), key
        assert stats.std == pytest.approx(population_std(values), rel=1e-12), key
        assert stats.percentiles == {"p25": p25, "p50": p50, "p90": p90, "p99.9": p999}, key
        assert stats.get(50.0) == p50 and stats.get(75.0) is None
    # by hand: TTFT mean 280, squared deviations 67600 + 40000 + 25600 + 384400
    assert w.latency["ttft_ms"].std == pytest.approx(math.sqrt(517600 / 4), rel=1e-15)
    assert w.latency["e2e_ms"].std == pytest.approx(math.sqrt(531875 / 4), rel=1e-15)


def test_goodput_per_request_and_per_trajectory():
    w = window_figures(hand_inputs(), 1.0, 4.0)
    assert w.goodput == GoodputFigures(
        thresholds_ms={"ttft": 500.0},
        good_requests=3,  # rows 1, 2 and 5; row 3 failed, row 4 was slow
        good_requests_per_second=1.0,
        goodput_ratio=0.6,
        trajectories=4,  # agents 1-4 were admitted in [1, 4]
        good_trajectories=2,  # agent 2 failed a request, agent 3 had a slow one
        good_trajectories_per_minute=40.0,
    )
    assert window_figures(hand_inputs(goodput=()), 1.0, 4.0).goodput is None


def test_one_trajectory_with_a_slow_and_a_failed_request_counts_once():
    samples = RequestSamples()
    for start, latency, ttft, ok, good, agent in [
        (1.0, 100.0, 50.0, True, True, 7),
        (1.1, 100.0, 50.0, True, True, 8),
        (1.2, 900.0, 800.0, True, False, 7),  # too slow
        (1.3, 100.0, 50.0, True, True, 8),
        (1.4, 300.0, NAN, False, False, 7),  # failed: the trajectory ends there
    ]:
        samples.add(start, latency, ttft, NAN, NAN, ok, good, -1, agent, 10, 2, -1, 0, 0)
    records = [
        TrajectoryRecord(8, 1, 0.0, 1.0, 1.5, loop_seconds=0.5, completed=True),
        TrajectoryRecord(7, 0, 0.0, 1.0, 1.7, loop_seconds=0.7, completed=False),
    ]
    inputs = hand_inputs(samples=samples, gaps_ms=array("d"), records=records, objectives=())
    g = window_figures(inputs, 0.0, 2.0).goodput
    assert (g.good_requests, g.goodput_ratio, g.good_requests_per_second) == (3, 0.6, 1.5)
    assert (g.trajectories, g.good_trajectories, g.good_trajectories_per_minute) == (2, 1, 30.0)


def test_recorder_rows_and_good_flags():
    recorder = Recorder(dp_ranks=2, goodput=(("ttft", 100.0), ("e2e", 500.0)))
    figures = recorder.agent_started(3, 1)
    recorder.request_succeeded(
        figures, 1, 50, 4, 16, 0.25, 0.05, [0.01, 0.02, 0.03], 0.02, started=0.5
    )
    recorder.request_succeeded(figures, 1, 60, 4, None, 0.625, 0.05, [0.01], 0.01, started=1.0)
    recorder.request_succeeded(figures, 0, 10, 2, 0, 0.125, started=2.0)  # not streamed
    error = AttemptError(1, ErrorKind.HTTP_STATUS, "HTTP 500", 500)
    recorder.request_failed(figures, 0, 3, "t3", 4, [error], 1, started=2.5, elapsed=0.375)
    s = recorder.samples
    assert len(s) == 4
    assert list(s.start_s) == [0.5, 1.0, 2.0, 2.5]
    assert list(s.latency_ms) == [250.0, 625.0, 125.0, 375.0]
    assert list(s.ttft_ms)[:2] == [0.05 * 1000.0] * 2 and math.isnan(s.ttft_ms[2])
    assert s.itl_mean_ms[0] == pytest.approx(20.0) and s.itl_mean_ms[1] == pytest.approx(10.0)
    assert math.isnan(s.itl_mean_ms[2]) and math.isnan(s.itl_mean_ms[3])
    assert s.tpot_ms[0] == pytest.approx(20.0) and math.isnan(s.tpot_ms[3])
    # good: TTFT 50 ms <= 100 and 250 ms <= 500; then 625 ms > 500; then no TTFT; failed
    assert list(s.ok) == [1, 1, 1, 0] and list(s.good) == [1, 0, 0, 0]
    assert list(s.rank) == [1, 1, 0, 0] and list(s.agent) == [3, 3, 3, 3]
    assert list(s.input_tokens) == [50, 60, 10, 0] and list(s.output_tokens) == [4, 4, 2, 0]
    assert list(s.cached_tokens) == [16, -1, 0, -1]
    assert list(s.gap_first) == [0, 3, 4, 4] and list(s.gap_count) == [3, 1, 0, 0]
    assert list(recorder.stream.itl_ms) == pytest.approx([10.0, 20.0, 30.0, 10.0])


def test_slo_outcomes_with_their_confidence():
    w = window_figures(hand_inputs(), 1.0, 4.0)
    ttft, e2e, itl, goodput = w.slo
    # The failed request (row 3) met no limit: it is a sample of every latency objective.
    # TTFT: 80 and 20 of [80, 120, 900, 20] are within 100 ms, plus the failure: 2 of 5.
    assert ttft == ObjectiveOutcome(
        objective="ttft_p50", metric="ttft", quantile=0.5, limit_ms=100.0, value_ms=120.0,
        samples=5, within=2, attainment=0.4, attainment_low=pytest.approx(wilson(2, 5)[0]),
        attainment_high=pytest.approx(wilson(2, 5)[1]), value_low_ms=None,
        value_high_ms=None, verdict="unresolved", required=0.5,
    )  # fmt: skip
    # ranks floor(0.4 - 1.176) = -1 (none) and ceil(1.576) + 1 = 3 of [50, 200, 300, 1000]
    assert e2e == ObjectiveOutcome(
        objective="e2e_p10", metric="e2e", quantile=0.1, limit_ms=2000.0, value_ms=50.0,
        samples=5, within=4, attainment=0.8, attainment_low=pytest.approx(wilson(4, 5)[0]),
        attainment_high=pytest.approx(wilson(4, 5)[1]), value_low_ms=None, value_high_ms=300.0,
        verdict="pass", required=0.1,
    )  # fmt: skip
    # ITL counts requests, not gaps (gaps of one request are correlated): the three
    # successful requests with gaps and the failed one; none of the 6 gaps is within 1 ms.
    assert itl == ObjectiveOutcome(
        objective="itl_p50", metric="itl", quantile=0.5, limit_ms=1.0, value_ms=40.0,
        samples=4, within=0, attainment=0.0, attainment_low=0.0,
        attainment_high=pytest.approx(Z * Z / (4 + Z * Z)), value_low_ms=None,
        value_high_ms=None, verdict="fail", required=0.5,
    )  # fmt: skip
    assert goodput == ObjectiveOutcome(
        objective="goodput", metric="goodput", quantile=0.5, limit_ms=None, value_ms=None,
        samples=5, within=3, attainment=0.6, attainment_low=pytest.approx(wilson(3, 5)[0]),
        attainment_high=pytest.approx(wilson(3, 5)[1]), value_low_ms=None,
        value_high_ms=None, verdict="unresolved", required=0.5,
    )  # fmt: skip
    assert w.slo_verdict == "fail"
    assert w.outcome("e2e_p10") is e2e and w.outcome("tpot_p99") is None
    assert window_figures(hand_inputs(objectives=()), 1.0, 4.0).slo_verdict is None
    document = w.as_dict()
    assert document["slo"][1]["verdict"] == "pass" and document["slo"][1]["value_high_ms"] == 300.0
    assert document["latency"]["ttft_ms"]["percentiles"]["p99.9"] == 900.0
    assert json.loads(json.dumps(document)) == document


def test_warmup_exclusion_and_empty_windows():
    whole = window_figures(hand_inputs(), 0.0, 5.0)
    assert (whole.requests, whole.successful_requests, whole.failed_requests) == (7, 6, 1)
    assert whole.goodput.trajectories == 6 and whole.goodput.good_trajectories == 4
    assert whole.latency["ttft_ms"].count == 6
    late = window_figures(hand_inputs(), 1.01, 4.0)  # the row at exactly 1.0 drops out
    assert late.requests == 4 and late.latency["ttft_ms"].count == 3
    empty = window_figures(hand_inputs(), 10.0, 12.0)
    assert (empty.requests, empty.requests_per_second, empty.input_tokens) == (0, 0.0, 0)
    assert (empty.cached_tokens, empty.cache_hit_percent, empty.mean_active_agents) == (
        None, None, 0.0,
    )  # fmt: skip
    assert all(stats is None for stats in empty.latency.values())
    assert empty.goodput.goodput_ratio is None and empty.peak_in_flight == 0
    assert [o.verdict for o in empty.slo] == ["unresolved"] * 4
    assert [o.attainment for o in empty.slo] == [None] * 4
    zero = window_figures(hand_inputs(), 2.0, 2.0)
    assert (zero.duration_seconds, zero.requests, zero.requests_per_second) == (0.0, 1, 0.0)


def test_cache_hits_need_a_reported_count():
    samples = RequestSamples()
    samples.add(1.0, 5.0, NAN, NAN, NAN, True, True, -1, 0, 100, 2, -1, 0, 0)
    inputs = hand_inputs(samples=samples, gaps_ms=array("d"), records=[], objectives=())
    w = window_figures(inputs, 0.0, 2.0)
    assert (w.input_tokens, w.cached_tokens, w.cache_hit_percent) == (100, None, None)
    assert w.latency["ttft_ms"] is None and w.latency["e2e_ms"].count == 1


def test_client_verdict_thresholds():
    def health(lag: float | None, cpu: float) -> ClientHealth:
        return ClientHealth(lag_p99_ms=lag, cpu_seconds=cpu)

    advice = (
        ": latencies include its own delay; run fewer agents per client process, or fewer "
        "stream chunks"
    )
    assert client_verdict(None, 10.0) == Verdict(None, None)
    assert client_verdict(health(None, 1.0), 10.0) == Verdict(None, None)
    assert client_verdict(health(20.0, 9.0), 10.0) == Verdict(
        "ok", "the client kept up (event-loop lag p99 20.0 ms, 90% of one core)"
    )
    # Late wake-ups with little CPU of its own: the machine was busy, not the client.
    assert client_verdict(health(20.5, 1.0), 10.0) == Verdict(
        "client-bound",
        "the client's event loop woke late (event-loop lag p99 20.5 ms, 10% of one core) "
        "although it used little CPU: other processes on this machine took it; latencies "
        "include that delay",
    )
    # Late wake-ups while the client itself used half its core or more: its own work.
    assert client_verdict(health(36.2, 8.1), 10.0) == Verdict(
        "client-bound",
        f"the client was the bottleneck (event-loop lag p99 36.2 ms, 81% of one core){advice}",
    )
    assert client_verdict(health(36.2, 4.9), 10.0).reason.startswith(
        "the client's event loop woke late"
    )
    assert client_verdict(health(1.25, 9.5), 10.0) == Verdict(
        "client-bound",
        f"the client was the bottleneck (event-loop lag p99 1.2 ms, 95% of one core){advice}",
    )
    assert client_verdict(health(3.0, 2.0), 0.0) == Verdict(
        "ok", "the client kept up (event-loop lag p99 3.0 ms, 0% of one core)"
    )


def test_server_verdict_from_the_waiting_queue():
    """Server-bound when at least one request waited on average (summed over ranks)."""
    assert server_verdict(None) == Verdict(None, None)
    assert server_verdict({"kv_cache_usage": {"0": {"mean": 0.5}}}) == Verdict(None, None)
    queued = {
        "waiting_requests": {
            "0": {"mean": 0.5, "p50": 0.0, "p99": 2.0, "max": 2.0, "min": 0.0},
            "1": {"mean": 1.0, "p50": 1.0, "p99": 1.0, "max": 1.0, "min": 0.0},
        }
    }
    assert server_verdict(queued) == Verdict(
        "server-bound",
        "requests queued at the server (waiting mean 1.5, max 2): it ran at its batch or "
        "KV-cache limit, so latency grew with load",
    )
    queued["waiting_requests"]["1"]["max"] = 2.5
    assert server_verdict(queued).reason.startswith(
        "requests queued at the server (waiting mean 1.5, max 2.5): "
    )
    queued["waiting_requests"]["1"]["mean"] = 0.5  # a mean of exactly one is server-bound
    assert server_verdict(queued).verdict == "server-bound"
    queued["waiting_requests"]["1"]["mean"] = 0.25
    assert server_verdict(queued) == Verdict(
        "ok", "requests waited at the server only briefly (waiting mean 0.8, max 2.5)"
    )
    idle = {"waiting_requests": {"all": {"mean": 0.0, "max": 0.0}}}
    assert server_verdict(idle) == Verdict("ok", "no request waited in the server's queue")


def test_server_metrics_console_line():
    assert server_metrics_lines(None) == [] and server_metrics_lines({}) == []
    document = {
        "dialect": "vllm",
        "scrapes": 13,
        "failed_scrapes": 0,
        "interval_seconds": 1.0,
        "concepts": {
            "kv_cache_usage": {"0": {"mean": 0.25, "max": 0.5}, "1": {"mean": 0.125, "max": 0.75}},
            "running_requests": {"0": {"mean": 3.0, "max": 5.0}, "1": {"mean": 2.5, "max": 4.0}},
            "waiting_requests": {"0": {"mean": 0.5, "max": 2.0}},
            "prefix_cache_hit_percent": {"0": 40.5, "1": 60.0, "2": None},
        },
    }
    assert server_metrics_lines(document) == [
        "Server metrics (vllm, 13 scrapes every 1s): KV cache use mean 25.0%, max 75.0% "
        "(busiest rank); running mean 5.5 over all ranks (peak 5 on one rank); waiting mean "
        "0.5 over all ranks (peak 2 on one rank); prefix cache hits 40.5–60.0% per rank"
    ]
    # With hits/queries counters: the tokens and their share once, then the ranks' spread.
    counted = {
        **document,
        "concepts": {
            "prefix_cache_hit_percent": {"0": 40.5, "1": 60.0},
            "prefix_cache_hit_tokens": {"0": 405.0, "1": 1200.0},
            "prefix_cache_queried_tokens": {"0": 1000.0, "1": 2000.0},
        },
    }
    assert server_metrics_lines(counted) == [
        "Server metrics (vllm, 13 scrapes every 1s): prefix cache hits 1605 of 3000 prompt "
        "tokens (53.5%; 40.5–60.0% per rank)"
    ]
    one_rank = {**counted, "concepts": {
        "prefix_cache_hit_percent": {"all": 36.6},
        "prefix_cache_hit_tokens": {"all": 1664.0},
        "prefix_cache_queried_tokens": {"all": 4544.0},
    }}  # fmt: skip
    assert server_metrics_lines(one_rank)[0].endswith(
        "prefix cache hits 1664 of 4544 prompt tokens (36.6%)"
    )
    failing = {**document, "failed_scrapes": 2, "last_error": "connection refused"}
    assert server_metrics_lines(failing)[0].startswith(
        "Server metrics (vllm, 13 scrapes every 1s, 2 failed: connection refused): KV cache"
    )
    unknown = {"dialect": "unknown", "scrapes": 3, "interval_seconds": 0.5, "concepts": {}}
    assert server_metrics_lines(unknown) == [
        "Server metrics (unknown, 3 scrapes every 0.5s): no known metric found"
    ]


def test_distribution_points():
    assert distribution([]) is None
    assert distribution([3.0, 1.0, 2.0], points=5) == {
        "values": [1.0, 2.0, 3.0],
        "fractions": [0.333333, 0.666667, 1.0],
    }
    assert distribution([1.23456, 2.0], points=2) == {
        "values": [1.2346, 2.0],
        "fractions": [0.5, 1.0],
    }
    # 10 values, 4 points: ranks round(2.5) = 2, 5, round(7.5) = 8 and 10 (half to even)
    tens = [10.0 * i for i in range(10, 0, -1)]
    assert distribution(tens, points=4) == {
        "values": [20.0, 50.0, 80.0, 100.0],
        "fractions": [0.2, 0.5, 0.8, 1.0],
    }
    # 7 values, 3 points: ranks round(2.33) = 2, round(4.67) = 5 and 7
    assert distribution([float(i) for i in range(1, 8)], points=3) == {
        "values": [2.0, 5.0, 7.0],
        "fractions": [0.285714, 0.714286, 1.0],
    }
    many = distribution([float(i) for i in range(1, 2501)])  # the default 1000 points
    assert len(many["values"]) == len(many["fractions"]) == 1000
    assert many["values"][:3] == [2.0, 5.0, 8.0]  # round(2.5), round(5.0), round(7.5)
    assert many["values"][-1] == 2500.0 and many["fractions"][-1] == 1.0
    assert many["fractions"][0] == 0.0008


def test_time_series_document_merges_to_max_points():
    series = TimeSeries(interval=0.5)
    for i, (agents, flight) in enumerate([(2, 1), (4, 2), (6, 3), (8, 4), (10, 5)]):
        series.add(0.5 * (i + 1), agents, flight, [10, 30, 60, 100, 150][i], 100 * (i + 1) ** 2)
    # outputs 100, 400, 900, 1600, 2500
    assert series.document() == {
        "interval_seconds": 0.5,
        "t": [0.5, 1.0, 1.5, 2.0, 2.5],
        "active_agents": [2.0, 4.0, 6.0, 8.0, 10.0],
        "in_flight": [1.0, 2.0, 3.0, 4.0, 5.0],
        "requests_per_second": [20.0, 40.0, 60.0, 80.0, 100.0],
        "output_tokens_per_second": [200.0, 600.0, 1000.0, 1400.0, 1800.0],
    }
    # two points: samples 1-3 (t 1.5, 60 settled, 900 tokens) and 4-5 (t 2.5)
    assert series.document(max_points=2) == {
        "interval_seconds": 1.5,
        "t": [1.5, 2.5],
        "active_agents": [4.0, 9.0],
        "in_flight": [2.0, 4.5],
        "requests_per_second": [40.0, 90.0],
        "output_tokens_per_second": [600.0, 1600.0],
    }
    assert series.document(max_points=1) == {
        "interval_seconds": 2.5,
        "t": [2.5],
        "active_agents": [6.0],
        "in_flight": [3.0],
        "requests_per_second": [60.0],
        "output_tokens_per_second": [1000.0],
    }
    thirds = TimeSeries(interval=1 / 3)
    thirds.add(1 / 3, 1, 1, 1, 1)
    thirds.add(2 / 3, 2, 1, 2, 2)
    thirds.add(1.0, 2, 2, 3, 3)
    document = thirds.document()
    assert document["t"] == [0.333, 0.667, 1.0]
    assert document["active_agents"] == [1.0, 2.0, 2.0]
    assert document["interval_seconds"] == 0.333333
    assert TimeSeries().document()["t"] == []


def test_progress_counts_requests(capsys):
    recorder = Recorder()
    progress = Progress(3, 10, recorder)
    recorder.totals.successful_requests = 4
    recorder.totals.failed_requests = 1
    recorder.totals.cancelled_requests = 2
    progress.trajectory_finished()
    progress.draw()
    assert (progress._bar.n, progress._bar.total) == (7, 10)
    progress.close()
    assert "traj=1/3" in capsys.readouterr().err


def test_a_one_chunk_reply_has_no_gap_over_the_itl_threshold():
    """BUG (recording.py `request_succeeded`): a streamed reply that arrives in one content
    chunk (one output token, or a server that sends the text at once) has no gap between
    chunks, so its mean ITL is NaN, and NaN counts as not good: with --goodput itl=100ms
    every such request is bad although no gap exceeded 100 ms."""
    recorder = Recorder(goodput=(("ttft", 1000.0), ("itl", 100.0)))
    figures = recorder.agent_started(0, 0)
    recorder.request_succeeded(figures, None, 10, 1, None, 0.05, 0.04, [], None, started=0.0)
    recorder.request_succeeded(figures, None, 10, 3, None, 0.3, 0.04, [0.2, 0.05], 0.125, started=1)
    assert math.isnan(recorder.samples.itl_mean_ms[0])
    assert recorder.samples.itl_mean_ms[1] == pytest.approx(125.0)
    assert recorder.samples.good[1] == 0  # a mean gap of 125 ms is over 100 ms
    assert recorder.samples.good[0] == 1


# -- console lines and CSV cells ---------------------------------------------------------
def stats(count, mean, low, high, std, p50, p99) -> MetricStats:
    return MetricStats(count, mean, low, high, std, {"p50": p50, "p99": p99})


def known_window(**changes) -> WindowFigures:
    values = dict(
        start_seconds=5.0,
        end_seconds=35.25,
        duration_seconds=30.25,
        requests=500,
        successful_requests=498,
        failed_requests=2,
        requests_per_second=16.5,
        input_tokens_per_second=330.5,
        output_tokens_per_second=1234.5,
        input_tokens=10000,
        output_tokens=37345,
        cached_tokens=4130,
        cache_hit_percent=41.3,
        mean_active_agents=7.5,
        peak_in_flight=8,
        latency={
            "ttft_ms": stats(500, 812.5, 100.0, 2500.5, 300.25, 800.0, 1830.0),
            "itl_ms": None,
            "tpot_ms": None,
            "e2e_ms": stats(500, 1500.0, 200.0, 30000.0, 1000.0, 1400.0, 9000.5),
            "agent_e2e_ms": None,
        },
        goodput=GoodputFigures({"ttft": 2000.0, "itl": 100.0}, 450, 15.0, 0.9, 12, 10, 20.0),
        slo=(
            ObjectiveOutcome(
                "ttft_p99",
                "ttft",
                0.99,
                2000.0,
                1830.0,
                500,
                497,
                0.994,
                0.982,
                0.998,
                1700.0,
                1950.0,
                "pass",
            ),
            ObjectiveOutcome(
                "itl_p99",
                "itl",
                0.99,
                100.0,
                250.5,
                3,
                1,
                1 / 3,
                0.061,
                0.792,
                None,
                None,
                "unresolved",
            ),
            ObjectiveOutcome(
                "e2e_p95",
                "e2e",
                0.95,
                30000.0,
                None,
                0,
                0,
                None,
                0.0,
                1.0,
                None,
                None,
                "unresolved",
            ),
            ObjectiveOutcome(
                "goodput",
                "goodput",
                0.95,
                None,
                None,
                500,
                450,
                0.9,
                0.871,
                0.924,
                None,
                None,
                "fail",
            ),
        ),
        slo_verdict="fail",
        client=Verdict("ok", "the client kept up (event-loop lag p99 1.5 ms, 12% of one core)"),
        server=Verdict("server-bound", "requests queued at the server (waiting mean 1.5, max 2)"),
    )
    values.update(changes)
    return WindowFigures(**values)


TABLE = [
    # widths 15, 5, 7, 6, 8, 7, 7, 7: the widest cell or header of each column
    "  (ms)             count     mean     min       max      std      p50      p99",
    "  TTFT               500   812.50  100.00   2500.50   300.25   800.00  1830.00",
    "  Request latency    500  1500.00  200.00  30000.00  1000.00  1400.00  9000.50",
]


def test_latency_table_alignment():
    assert latency_table(known_window(), (50.0, 99.0)) == TABLE
    for line in TABLE:
        assert len(line) == 2 + 15 + 5 + 7 + 6 + 8 + 7 + 7 + 7 + 2 * 7
    # a percentile not computed is shown as n/a; no metric at all: no table
    assert latency_table(known_window(), (50.0, 90.0))[1].endswith("   800.00  n/a")
    nothing = {key: None for key in known_window().latency}
    assert latency_table(known_window(latency=nothing), (50.0,)) == []


def test_window_console_lines():
    lines = window_lines(known_window(), (50.0, 99.0), 5.0, "duration")
    assert lines == [
        "Measured window: 5.00s to 35.25s (warm-up 5s excluded; stopped: --duration reached): "
        "500 requests (2 failed), 16.50 req/s, output 1234.50 tok/s",
        "Server-reported cached input tokens in the measured window: 4130 of 10000 "
        "(41.3% of input tokens)",
        "Latency in the measured window (not the whole run's p50/p90/p99 lines above):",
        *TABLE,
        "Goodput (ttft ≤ 2 s, itl ≤ 100 ms): 450/500 requests good (90.0%), 15.00 good req/s; "
        "trajectory goodput 10/12 finished trajectories all good (20.00 per minute)",
        "SLO ttft_p99 ≤ 2 s: pass (1.83 s, 95% CI 1.70 s–1.95 s; 99.4% within [98.2, 99.8], "
        "500 samples)",
        "SLO itl_p99 ≤ 100 ms: unresolved (250.5 ms, 95% CI unbounded; 33.3% within [6.1, 79.2], "
        "3 samples)",
        "SLO e2e_p95 ≤ 30 s: unresolved (n/a; n/a within [0.0, 100.0], 0 samples)",
        "SLO goodput ≥ 95%: fail (90.0% good [87.1, 92.4], 500 samples)",
        "SLO verdict: fail",
        "Client: ok: the client kept up (event-loop lag p99 1.5 ms, 12% of one core)",
        "Server: server-bound: requests queued at the server (waiting mean 1.5, max 2)",
    ]
    assert outcome_text(known_window().slo[0]) == lines[7].removeprefix("SLO ")
    # An interval open on one side reads as a bound, not "614.6 ms–?".
    ttft = known_window().slo[0]
    assert outcome_text(dataclasses.replace(ttft, value_high_ms=None)) == (
        "ttft_p99 ≤ 2 s: pass (1.83 s, 95% CI ≥ 1.70 s; 99.4% within [98.2, 99.8], 500 samples)"
    )
    assert outcome_text(dataclasses.replace(ttft, value_low_ms=None)).startswith(
        "ttft_p99 ≤ 2 s: pass (1.83 s, 95% CI ≤ 1.95 s; "
    )
    none_failed = dataclasses.replace(known_window(), failed_requests=0, successful_requests=500)
    assert window_lines(none_failed, (50.0,), 5.0, None)[0] == (
        "Measured window: 5.00s to 35.25s (warm-up 5s excluded): 500 requests, "
        "16.50 req/s, output 1234.50 tok/s"
    )
    bare = known_window(
        cache_hit_percent=None, cached_tokens=None, latency={}, goodput=None, slo=(),
        slo_verdict=None, client=Verdict(None, None), server=Verdict(None, None),
        start_seconds=0.0,
    )  # fmt: skip
    assert window_lines(bare, (50.0,), 0.0, None) == [
        "Measured window: the whole run (0.00s to 35.25s, no warm-up): its requests, rates, "
        "cached tokens and p50/p90/p99 are the lines above"
    ]
    assert window_lines(bare, (50.0,), 0.25, "window")[0].startswith(
        "Measured window: 0.00s to 35.25s (warm-up 0.25s excluded; stopped: "
        "--window-trajectories reached): "
    )
    no_share = known_window(goodput=GoodputFigures({"e2e": 500.0}, 0, 0.0, None, 0, 0, None))
    assert (
        "Goodput (e2e ≤ 500 ms): 0/500 requests good (n/a), 0.00 good req/s; trajectory "
        "goodput n/a (no trajectory admitted in the window finished)"
    ) in window_lines(no_share, (50.0,), 5.0, None)


def test_whole_run_window_prints_each_figure_once():
    """No warm-up and no planned stop: the window is the whole run. Its requests, rates and
    cache hits, and the table's p50/p90/p99, are the whole-run lines' own: not repeated.
    The lengths and the peak rate are printed once, without a window label."""
    whole = known_window(
        start_seconds=0.0,
        request_tokens={
            "input": {"mean": 649.142857, "p50": 512, "p90": 896, "max": 1280},
            "output": {"mean": 96.0, "p50": 96, "p90": 128, "max": 128},
        },
        peak_output=PeakOutput(256.0, 3.0, 1.0, "completions"),
        goodput=None, slo=(), slo_verdict=None,
    )  # fmt: skip
    assert window_lines(whole, (50.0, 90.0, 95.0, 99.0, 99.9), 0.0, None) == [
        "Measured window: the whole run (0.00s to 35.25s, no warm-up): its requests, rates, "
        "cached tokens and p50/p90/p99 are the lines above",
        "Input tokens per request: mean 649.14, p50 512, p90 896, max 1280 (498 successful "
        "requests)",
        "Output tokens per request: mean 96.00, p50 96, p90 128, max 128",
        "Peak output tokens/s: 256 (the 1-second bin from 3.00s; tokens counted at each "
        "reply's completion: not streamed)",
        "Latency over the whole run (p50, p90, p99 in the lines above):",
        "  (ms)             count     mean     min       max      std  p95  p99.9",
        "  TTFT               500   812.50  100.00   2500.50   300.25  n/a    n/a",
        "  Request latency    500  1500.00  200.00  30000.00  1000.00  n/a    n/a",
        "Client: ok: the client kept up (event-loop lag p99 1.5 ms, 12% of one core)",
        "Server: server-bound: requests queued at the server (waiting mean 1.5, max 2)",
    ]
    # Only the summary's percentiles asked for: the table keeps its other columns.
    assert window_lines(whole, (50.0,), 0.0, None)[4:6] == [
        "Latency over the whole run (p50 in the lines above):",
        "  (ms)             count     mean     min       max      std",
    ]
    # A warm-up (or a planned stop) makes the window other figures: labelled as such.
    warm = dataclasses.replace(whole, start_seconds=5.0)
    lines = window_lines(warm, (50.0, 99.0), 5.0, None)
    assert lines[:6] == [
        "Measured window: 5.00s to 35.25s (warm-up 5s excluded): 500 requests (2 failed), "
        "16.50 req/s, output 1234.50 tok/s",
        "Server-reported cached input tokens in the measured window: 4130 of 10000 "
        "(41.3% of input tokens)",
        "Input tokens per request in the measured window: mean 649.14, p50 512, p90 896, "
        "max 1280 (498 successful requests)",
        "Output tokens per request in the measured window: mean 96.00, p50 96, p90 128, max 128",
        "Peak output tokens/s in the measured window: 256 (the 1-second bin from 3.00s; tokens "
        "counted at each reply's completion: not streamed)",
        "Latency in the measured window (not the whole run's p50/p90/p99 lines above):",
    ]
    assert lines[6:9] == TABLE
    stopped = window_lines(whole, (50.0,), 0.0, "duration")
    assert stopped[0].startswith("Measured window: 0.00s to 35.25s (warm-up 0s excluded; ")


def test_window_csv_columns_and_cells():
    cells = window_csv(known_window(), (50.0, 99.9))
    ttft = [("mean", "812.5"), ("min", "100.0"), ("max", "2500.5"), ("std", "300.25"),
            ("p50", "800.0"), ("p99_9", "")]  # fmt: skip
    e2e = [("mean", "1500.0"), ("min", "200.0"), ("max", "30000.0"), ("std", "1000.0"),
           ("p50", "1400.0"), ("p99_9", "")]  # fmt: skip
    empty = [(name, "") for name in ("mean", "min", "max", "std", "p50", "p99_9")]
    assert cells == [
        ("window_start_seconds", "5.0"),
        ("window_end_seconds", "35.25"),
        ("window_requests", "500"),
        ("window_requests_per_second", "16.5"),
        ("window_output_tokens_per_second", "1234.5"),
        ("cache_hit_percent", "41.3"),
        ("good_requests", "450"),
        ("good_requests_per_second", "15.0"),
        ("goodput_ratio", "0.9"),
        ("good_trajectories", "10"),
        ("good_trajectories_per_minute", "20.0"),
        ("slo_verdict", "fail"),
        ("client_verdict", "ok"),
        ("server_verdict", "server-bound"),
        *((f"window_ttft_{name}_ms", cell) for name, cell in ttft),
        *((f"window_itl_{name}_ms", cell) for name, cell in empty),
        *((f"window_tpot_{name}_ms", cell) for name, cell in empty),
        *((f"window_e2e_{name}_ms", cell) for name, cell in e2e),
    ]
    assert window_csv(None, (50.0,)) == []
    bare = dict(window_csv(known_window(goodput=None, cache_hit_percent=None), (50.0,)))
    assert [bare[c] for c in ("good_requests", "goodput_ratio", "cache_hit_percent")] == [""] * 3


# -- against the real simulator ----------------------------------------------------------
COMMON = ["--tokenizer-model", "deepseek-v3", "--no-progress", "--no-preflight",
          "--model", "batchbench-sim", "--seed", "5"]  # fmt: skip


@pytest.fixture(scope="module")
def sim_url():
    """One zero-latency simulator for the small runs (each run salts its own content)."""
    with SimProcess(sim_command("deepseek-v3", None, "--speed 0")) as sim:
        yield sim.url


def jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def in_window(events: list[dict], start: float, end: float) -> list[dict]:
    """Requests with an outcome (not cancelled) that started in [start, end]."""
    return [
        e
        for e in events
        if e["status"] in ("ok", "failed") and start <= e["start_offset_seconds"] <= end
    ]


def cli(url: str, argv: list[str]) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = main([*COMMON, "--host", url, *argv])
    return status, out.getvalue()


@pytest.fixture(scope="module")
def duration_run(tmp_path_factory):
    """Many agents with tool delays, stopped by --duration 2 after a 0.5 s warm-up."""
    tmp = tmp_path_factory.mktemp("duration")
    config = RunConfig.from_args(
        [*COMMON, "--sim", "--stream", "--duration", "2", "--warmup", "0.5", "--agents", "300",
         "--max-active-agents", "24", "--tool-call-latency-ms", "100", "--tool-invocations", "4",
         "--input-tokens", "64", "--output-tokens", "8", "--sim-args", "--speed 0",
         "--slo", "ttft_p50=10s,e2e_p99=1us", "--goodput", "ttft=10s",
         "--percentiles", "50,99.9",
         "--results-json", str(tmp / "r.json"), "--results-csv", str(tmp / "r.csv"),
         "--request-events-jsonl", str(tmp / "req.jsonl")]
    )  # fmt: skip
    result = run(config)
    document = json.loads((tmp / "r.json").read_text())
    with open(tmp / "r.csv", newline="") as handle:
        row = next(csv.DictReader(handle))
    return result, document, row, jsonl(tmp / "req.jsonl")


def test_duration_stops_the_run_without_interrupting_it(duration_run):
    result, document, _row, events = duration_run
    w = result.window
    assert result.exit_status == 0 and result.interrupted_by is None
    assert result.finished_by == "duration" and document["finished_by"] == "duration"
    assert document["interrupted"] is False and document["kind"] == "run"
    assert w.start_seconds == 0.5
    # the event loop's timers may fire up to a millisecond early
    assert 1.995 <= w.end_seconds < 2.3 and w.duration_seconds == w.end_seconds - 0.5
    assert result.summary.total_duration_seconds < 3.0
    assert result.summary.completed_agents < 300  # admission stopped
    assert result.summary.cancelled_requests == 0  # requests in flight finished
    assert {e["status"] for e in events} == {"ok"}
    assert max(e["start_offset_seconds"] for e in events) <= w.end_seconds
    warmup = [e for e in events if e["start_offset_seconds"] < 0.5]
    assert warmup  # the warm-up had requests, and they are all that the window left out
    assert w.requests == len(events) - len(warmup)


def test_window_counts_equal_the_request_events(duration_run):
    result, _document, _row, events = duration_run
    w = result.window
    chosen = in_window(events, 0.5, w.end_seconds)
    ok = [e for e in chosen if e["status"] == "ok"]
    assert w.requests == len(chosen) > 50
    assert (w.successful_requests, w.failed_requests) == (len(ok), 0)
    assert w.input_tokens == sum(e["prompt_tokens"] for e in ok)
    assert w.output_tokens == sum(e["completion_tokens"] for e in ok) == 8 * len(ok)
    assert w.cached_tokens == sum(e["cached_tokens"] for e in ok)
    assert w.cache_hit_percent == 100.0 * w.cached_tokens / w.input_tokens
    assert w.requests_per_second == len(chosen) / w.duration_seconds
    ttft = sorted(e["ttft_seconds"] * 1000.0 for e in ok)
    latency = sorted(e["latency_seconds"] * 1000.0 for e in ok)
    for key, values in (("ttft_ms", ttft), ("e2e_ms", latency)):
        stats = w.latency[key]
        n = len(values)
        assert (stats.count, stats.min, stats.max) == (n, values[0], values[-1])
        assert stats.mean == math.fsum(values) / n
        assert stats.percentiles == {
            "p50": values[math.floor((n - 1) * 0.5 + 0.5)],
            "p99.9": values[math.floor((n - 1) * 0.999 + 0.5)],
        }
    # goodput: TTFT under 10 s for every request; SLOs: p50 passes, e2e within 1 us fails
    assert (w.goodput.good_requests, w.goodput.goodput_ratio) == (len(ok), 1.0)
    ttft_p50, e2e_p99 = w.slo
    assert (ttft_p50.verdict, ttft_p50.samples, ttft_p50.within) == ("pass", len(ok), len(ok))
    p99 = latency[math.floor((len(latency) - 1) * 0.99 + 0.5)]
    assert (e2e_p99.verdict, e2e_p99.within, e2e_p99.value_ms) == ("fail", 0, p99)
    assert w.slo_verdict == "fail"


SCHEMA_WINDOW = {
    "start_seconds", "end_seconds", "duration_seconds", "requests", "successful_requests",
    "failed_requests", "requests_per_second", "input_tokens_per_second",
    "output_tokens_per_second", "input_tokens", "output_tokens", "cached_tokens",
    "cache_hit_percent", "mean_active_agents", "peak_in_flight", "latency", "goodput", "slo",
    "slo_verdict", "client", "server", "output_speed", "request_tokens", "peak_output",
}  # fmt: skip
SCHEMA_GOODPUT = {
    "thresholds_ms", "good_requests", "good_requests_per_second", "goodput_ratio",
    "trajectories", "good_trajectories", "good_trajectories_per_minute",
    "thresholds_tokens_per_second",
}  # fmt: skip
SCHEMA_OUTCOME = {
    "objective", "metric", "quantile", "limit_ms", "value_ms", "samples", "within",
    "attainment", "attainment_low", "attainment_high", "value_low_ms", "value_high_ms",
    "verdict", "required", "limit_tokens_per_second", "value_tokens_per_second",
    "value_low_tokens_per_second", "value_high_tokens_per_second",
}  # fmt: skip


def test_results_json_sections(duration_run):
    result, document, _row, _events = duration_run
    window = document["window"]
    assert set(window) == SCHEMA_WINDOW
    assert window == json.loads(json.dumps(result.window.as_dict()))
    assert set(window["latency"]) == {"ttft_ms", "itl_ms", "tpot_ms", "e2e_ms", "agent_e2e_ms"}
    for stats in window["latency"].values():
        assert set(stats) == {"count", "mean", "min", "max", "std", "percentiles"}
        assert set(stats["percentiles"]) == {"p50", "p99.9"}
    assert set(window["goodput"]) == SCHEMA_GOODPUT
    assert window["goodput"]["thresholds_ms"] == {"ttft": 10000.0}
    assert [set(outcome) for outcome in window["slo"]] == [SCHEMA_OUTCOME] * 2
    assert [o["objective"] for o in window["slo"]] == ["ttft_p50", "e2e_p99"]
    assert set(window["client"]) == set(window["server"]) == {"verdict", "reason"}
    assert window["client"]["verdict"] in ("ok", "client-bound")
    assert window["server"] == {"verdict": None, "reason": None}
    assert set(document["distributions"]) == {"ttft_ms", "itl_ms", "e2e_ms"}
    for key, cdf in document["distributions"].items():
        values, fractions = cdf["values"], cdf["fractions"]
        assert len(values) == len(fractions) <= 1000 and values == sorted(values)
        assert fractions[-1] == 1.0 and fractions == sorted(fractions) and fractions[0] > 0
        if window["latency"][key]["count"] <= 1000:
            assert len(values) == window["latency"][key]["count"]
    series = document["timeseries"]
    assert set(series) == {
        "interval_seconds", "t", "active_agents", "in_flight", "requests_per_second",
        "output_tokens_per_second",
    }  # fmt: skip
    assert series["interval_seconds"] == 0.5
    assert len({len(v) for k, v in series.items() if k != "interval_seconds"}) == 1
    assert len(series["t"]) >= 4 and series["t"] == sorted(series["t"])
    assert (document["ranks"], document["ranks_source"], document["server_metrics"]) == (
        [], None, None,
    )  # fmt: skip


def test_csv_window_columns_equal_the_json(duration_run):
    _result, document, row, _events = duration_run
    w = document["window"]
    expected = {
        "window_start_seconds": w["start_seconds"],
        "window_end_seconds": w["end_seconds"],
        "window_requests": w["requests"],
        "window_requests_per_second": w["requests_per_second"],
        "window_output_tokens_per_second": w["output_tokens_per_second"],
        "cache_hit_percent": w["cache_hit_percent"],
        "good_requests": w["goodput"]["good_requests"],
        "good_requests_per_second": w["goodput"]["good_requests_per_second"],
        "goodput_ratio": w["goodput"]["goodput_ratio"],
        "good_trajectories": w["goodput"]["good_trajectories"],
        "good_trajectories_per_minute": w["goodput"]["good_trajectories_per_minute"],
        "slo_verdict": w["slo_verdict"],
        "client_verdict": w["client"]["verdict"],
        "server_verdict": w["server"]["verdict"],
    }
    for name in ("ttft", "itl", "tpot", "e2e"):
        stats = w["latency"][f"{name}_ms"]
        for field in ("mean", "min", "max", "std"):
            expected[f"window_{name}_{field}_ms"] = stats[field]
        expected[f"window_{name}_p50_ms"] = stats["percentiles"]["p50"]
        expected[f"window_{name}_p99_9_ms"] = stats["percentiles"]["p99.9"]
    columns = list(row)
    assert columns[-len(expected) :] == list(expected)
    for column, value in expected.items():
        cell = "" if value is None else repr(value) if isinstance(value, float) else str(value)
        assert row[column] == cell, column
    assert row["server_verdict"] == ""


def test_window_trajectories_stop_the_run(tmp_path, sim_url):
    events = tmp_path / "agents.jsonl"
    argv = [
        *COMMON, "--host", sim_url, "--window-trajectories", "3", "--warmup", "0.1",
        "--agents", "40", "--max-active-agents", "4", "--tool-invocations", "2",
        "--tool-call-latency-ms", "150", "--input-tokens", "32", "--output-tokens", "4",
        "--agent-events-jsonl", str(events),
    ]  # fmt: skip
    result = run(RunConfig.from_args(argv))
    assert result.exit_status == 0 and result.interrupted_by is None
    assert result.finished_by == "window"
    assert result.summary.completed_agents < 40
    records = jsonl(events)  # in finish order
    counted = [r for r in records if r["admitted_at_seconds"] >= 0.1]
    assert len(counted) >= 3
    third = counted[2]
    w = result.window
    assert w.start_seconds == 0.1
    assert third["finished_at_seconds"] <= w.end_seconds < third["finished_at_seconds"] + 0.2
    assert result.summary.total_duration_seconds < w.end_seconds + 0.5
    # the window holds the trajectories admitted after the warm-up
    assert w.latency["agent_e2e_ms"].count == sum(
        1 for r in records if r["completed"] and 0.1 <= r["admitted_at_seconds"] <= w.end_seconds
    )


@pytest.mark.parametrize(("thresholds", "good"), [("ttft=1us", False), ("ttft=30s,e2e=30s", True)])
def test_goodput_and_slo_verdicts_decided_by_the_samples(tmp_path, sim_url, thresholds, good):
    limit = thresholds.split(",")[0].split("=")[1]
    path = tmp_path / "r.json"
    status, out = cli(
        sim_url,
        ["--stream", "--agents", "4", "--max-active-agents", "4", "--tool-invocations", "2",
         "--input-tokens", "32", "--output-tokens", "4",
         "--goodput", thresholds, "--slo", f"goodput=50%,ttft_p50={limit}",
         "--results-json", str(path)]
    )  # fmt: skip
    assert status == 0
    w = json.loads(path.read_text())["window"]
    g = w["goodput"]
    assert w["requests"] == 8
    assert (g["good_requests"], g["trajectories"], g["good_trajectories"]) == (
        (8, 4, 4) if good else (0, 4, 0)
    )
    assert g["goodput_ratio"] == (1.0 if good else 0.0)
    goodput, ttft = w["slo"]
    # 8 samples decide a p50 objective: Wilson bounds 8/(8+z²) = 0.676 and z²/(8+z²) = 0.324
    verdict = "pass" if good else "fail"
    assert (goodput["verdict"], ttft["verdict"], w["slo_verdict"]) == (verdict,) * 3
    assert (goodput["samples"], goodput["within"]) == (8, 8 if good else 0)
    assert (ttft["samples"], ttft["within"]) == (8, 8 if good else 0)
    bound = 8 / (8 + Z * Z) if good else Z * Z / (8 + Z * Z)
    assert (ttft["attainment_low"] if good else ttft["attainment_high"]) == pytest.approx(bound)
    values = sorted(json.loads(path.read_text())["distributions"]["ttft_ms"]["values"])
    assert len(values) == 8
    # p50: index round(7 * 0.5) = 4; interval ranks floor(4 - 2.77) = 1, ceil(6.77) + 1 = 8
    assert ttft["value_ms"] == pytest.approx(values[4], abs=1e-4)
    assert ttft["value_low_ms"] == pytest.approx(values[0], abs=1e-4)
    assert ttft["value_high_ms"] == pytest.approx(values[7], abs=1e-4)
    lines = out.splitlines()
    limits = "ttft ≤ 30 s, e2e ≤ 30 s" if good else "ttft ≤ 1 us"
    assert (
        f"Goodput ({limits}): {g['good_requests']}/8 requests good "
        f"({g['goodput_ratio'] * 100:.1f}%), {g['good_requests_per_second']:.2f} good req/s; "
        f"trajectory goodput {g['good_trajectories']}/4 finished trajectories all good "
        f"({g['good_trajectories_per_minute']:.2f} per minute)"
    ) in lines
    assert f"SLO verdict: {verdict}" in lines
    assert [line for line in lines if line.startswith("SLO goodput ≥ 50%: ")] == [
        f"SLO goodput ≥ 50%: {verdict} ({100.0 if good else 0.0:.1f}% good "
        f"[{goodput['attainment_low'] * 100:.1f}, {goodput['attainment_high'] * 100:.1f}], "
        "8 samples)"
    ]


@pytest.fixture(scope="module")
def plain_run(tmp_path_factory, sim_url):
    """A small closed-loop run with --no-stream: 2 agents, 6 requests."""
    path = tmp_path_factory.mktemp("plain") / "r.json"
    status, out = cli(
        sim_url,
        ["--agents", "2", "--max-active-agents", "2", "--tool-invocations", "3",
         "--input-tokens", "32", "--output-tokens", "4",
         "--results-json", str(path), "--no-stream", "--no-calibrate"]
    )  # fmt: skip
    return status, out, json.loads(path.read_text())


def test_console_of_a_small_unstreamed_closed_loop_run(plain_run):
    status, out, document = plain_run
    assert status == 0
    lines = out.splitlines()
    w = document["window"]
    assert (
        "Time to first token, inter-token latency, TPOT: not measured (--no-stream: replies "
        "were not streamed)"
    ) in lines
    assert not [line for line in lines if "Open-loop admission" in line]
    health = [line for line in lines if line.startswith("Client health: ")]
    assert len(health) == 1
    assert re.search(
        r"; client CPU \d+\.\d\ds \(\d+\.\d\d ms per request over 6 requests\); ", health[0]
    )
    assert "per 1000 requests" not in out
    # The window is the whole run: its requests, rates and p50/p90/p99 are not repeated.
    assert (
        f"Measured window: the whole run (0.00s to {w['end_seconds']:.2f}s, no warm-up): its "
        "requests, rates, cached tokens and p50/p90/p99 are the lines above"
    ) in lines
    assert [line for line in lines if line.startswith("Measured window")] == [
        line for line in lines if "Measured window" in line
    ]  # no "Prefix cache hit rate" or window-labelled line either
    assert not [line for line in lines if "cache hit rate" in line]
    assert document["metrics"]["total_input_tokens"] == 864  # 6 requests: a mean of 144
    assert (
        "Input tokens per request: mean 144.00, p50 144, p90 247, max 247 (6 successful requests)"
    ) in lines
    assert "Output tokens per request: mean 4.00, p50 4, p90 4, max 4" in lines
    peak = w["peak_output"]
    counted = {  # unstreamed replies count at completion (streamed ones: as chunks arrive)
        "completions": "tokens counted at each reply's completion: not streamed",
        "chunks": "tokens counted as their chunks arrived",
    }
    streamed = document["configuration"]["stream"]
    assert peak["counted_at"] == ("chunks" if streamed else "completions")
    duration = w["end_seconds"] - w["start_seconds"]
    (peak_text,) = [line for line in lines if line.startswith("Peak output tokens/s: ")]
    if duration < 1.0:  # a run shorter than a bin is one bin: its own output rate
        assert peak["bin_seconds"] == pytest.approx(duration)
        assert peak["tokens_per_second"] == pytest.approx(24 / duration)
        span = f"the whole {peak['bin_seconds']:.2f}-second window"
    else:
        assert peak["bin_seconds"] == 1.0 and 1 <= peak["tokens_per_second"] <= 24
        span = "the 1-second bin"
    assert peak_text.endswith(
        f" ({span} from {peak['bin_start_seconds']:.2f}s; {counted[peak['counted_at']]})"
    )
    title = "Latency over the whole run (p50, p90, p99 in the lines above):"
    table = lines[lines.index(title) + 1 :][:3]
    assert table[0].split() == ["(ms)", "count", "mean", "min", "max", "std", "p95", "p99.9"]
    assert table[1].split()[:3] == ["Request", "latency", "6"]
    assert table[2].split()[:4] == [
        "Agent",
        "end-to-end",
        "2",
        f"{w['latency']['agent_e2e_ms']['mean']:.2f}",
    ]
    assert not [line for line in lines if line.startswith(("  TTFT", "  ITL", "Goodput", "SLO"))]
    client = [line for line in lines if line.startswith("Client: ")]
    if w["client"]["verdict"] is None:  # no event-loop lag sample in so short a run
        assert client == [] and document["client_health"]["lag_p99_ms"] is None
    else:
        assert client == [f"Client: {w['client']['verdict']}: {w['client']['reason']}"]
    assert not [line for line in lines if line.startswith("Server: ")]
    assert w["latency"]["ttft_ms"] is None and w["goodput"] is None and w["slo"] == []
    assert document["distributions"]["ttft_ms"] is None


def test_window_peak_in_flight_is_the_peak(plain_run):
    """The window's peak in flight comes from each request's send time and latency, not from
    the 0.5 s time series: a run shorter than one sampling interval still shows it."""
    _status, _out, document = plain_run
    assert document["client_health"]["peak_in_flight"] == 2
    assert document["window"]["start_seconds"] == 0.0  # the window is the whole run
    assert document["window"]["peak_in_flight"] == document["client_health"]["peak_in_flight"]


def test_open_loop_line_only_in_open_loop_runs(capsys):
    dry = ["--dry-run", "--tokenizer-model", "deepseek-v3", "--agents", "3", "--no-progress"]
    assert main([*dry, "--arrival-rate", "1000"]) == 0
    assert "Open-loop admission: " in capsys.readouterr().out
    assert main(dry) == 0
    assert "Open-loop admission" not in capsys.readouterr().out


def test_a_planned_end_fails_a_request_waiting_to_retry(tmp_path):
    """After --duration no retry starts: a request whose attempt failed and that waits to
    retry has failed (it was not cut short by a signal), so it stays in the window and its
    failure counts against --max-failure-rate."""
    path = tmp_path / "r.json"
    config = RunConfig.from_args(
        [*COMMON, "--sim", "--sim-args", "--speed 0 --fault-error-rate 1 --fault-error-statuses 503",
         "--agents", "2", "--max-active-agents", "2", "--tool-invocations", "2",
         "--retry-delay-ms", "20000", "--duration", "0.5", "--results-json", str(path)]
    )  # fmt: skip
    result = run(config)
    summary = result.summary
    assert (summary.failed_requests, summary.cancelled_requests) == (2, 0)
    assert result.finished_by == "duration" and result.interrupted_by is None
    assert result.exit_status == 3  # failures beyond --max-failure-rate 0
    assert list(summary.errors_by_kind) == ["http_status"]
    assert summary.errors_by_kind["http_status"]["count"] == 2
    assert (result.window.requests, result.window.failed_requests) == (2, 2)
    assert result.summary.total_duration_seconds < 5.0  # the 20 s retry wait ended at once


def test_the_options_file_keeps_server_metrics_sim(tmp_path):
    path = tmp_path / "r.json"
    argv = [
        *COMMON, "--sim", "--sim-args", "--speed 0", "--agents", "1", "--tool-invocations", "1",
        "--server-metrics", "sim", "--server-metrics-interval", "0.1",
        "--results-json", str(path),
    ]  # fmt: skip
    run(RunConfig.from_args(argv))
    options = (tmp_path / "r.config.toml").read_text().splitlines()
    assert 'server-metrics = ["sim"]' in options
    document = json.loads(path.read_text())
    assert document["server_metrics"]["url"].endswith("/metrics")
    assert document["server_metrics"]["failed_scrapes"] == 0
    # The baseline scrape is taken once the benchmark clock runs: no time before it.
    assert document["server_metrics"]["scrapes"] >= 2


def test_server_verdict_compares_the_client_and_server_ttft():
    concepts = {
        "ttft_seconds": {"0": {"p50": 0.004, "p90": 0.01, "p99": 0.02}},
        "waiting_requests": {"0": {"mean": 0.0, "max": 0.0}},
    }
    # 2 x 4 ms + 50 ms = 58 ms: beyond it the time went before the server's accounting.
    assert server_verdict(concepts, 58.0) == Verdict(
        "ok", "no request waited in the server's queue"
    )
    assert server_verdict(concepts, 2060.0) == Verdict(
        "server-bound",
        "first tokens reached the client after 2060.0 ms (p50) but the server counts 4.0 ms: "
        "requests waited before its own accounting (a saturated HTTP front end or server "
        "process)",
    )
    assert server_verdict(concepts, None).verdict == "ok"
