"""The measured window of a live run: figures over the requests that started after the
warm-up, goodput, SLO outcomes with their confidence, and verdicts on the client and the
server (docs/metrics.md, "Measured window").

Whole-run figures (the CSV's original columns) stay as they were; everything that judges a
deployment (goodput, SLOs, a capacity step) is computed here, from per-request samples, so
that a warm-up can be left out and a percentile can carry its confidence interval.
"""

from __future__ import annotations

import bisect
import math
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

from batchbench.results.confidence import (
    attainment_verdict,
    combine_verdicts,
    percentile_interval,
    wilson_interval,
)
from batchbench.results.lifecycle import TrajectoryRecord
from batchbench.results.metrics import percentile
from batchbench.results.recording import ClientHealth
from batchbench.results.samples import RequestSamples, TimeSeries, output_speed
from batchbench.results.slo import SPEED_METRICS, Objective, percentile_label

# The client is the bottleneck when its event loop wakes this late (p99), or when it used
# this share of its one core: past either, latencies measure the client, not the server.
CLIENT_LAG_P99_LIMIT_MS = 20.0
CLIENT_CPU_LIMIT = 0.9
# Late wake-ups while the client used less than this share of its core: the machine was
# busy with other processes (the client's own work did not delay it).
CLIENT_BUSY_SHARE = 0.5
FRONT_END_SLACK_MS = 50.0  # client TTFT beyond 2x the server's own + this: lost before it
SERVER_WAITING_LIMIT = 1.0  # mean requests waiting at the server (all ranks) over the window
DISTRIBUTION_POINTS = 1000
PEAK_BIN_SECONDS = 1.0  # the bin of the peak output rate
LATENCY_KEYS = ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms", "agent_e2e_ms")


@dataclass(frozen=True, slots=True)
class MetricStats:
    count: int
    mean: float
    min: float
    max: float
    std: float  # population standard deviation
    percentiles: dict[str, float]  # "p50" -> value, for every --percentiles entry

    def get(self, percent: float) -> float | None:
        return self.percentiles.get(percentile_label(percent))


@dataclass(frozen=True, slots=True)
class ObjectiveOutcome:
    objective: str  # "ttft_p99", "goodput"
    metric: str
    quantile: float
    limit_ms: float | None
    value_ms: float | None  # the measured percentile; None for goodput
    samples: int
    within: int  # samples within the limit (good requests for goodput)
    attainment: float | None
    attainment_low: float
    attainment_high: float
    value_low_ms: float | None
    value_high_ms: float | None
    verdict: str  # pass, fail or unresolved
    # The share of samples that must meet the bound: quantile for a limit and goodput,
    # 1 - quantile for a speed floor (output_speed_p10>=30: 90 % at least 30 tok/s).
    required: float = 0.0
    # A speed objective's floor, measured percentile and its interval (None otherwise).
    limit_tokens_per_second: float | None = None
    value_tokens_per_second: float | None = None
    value_low_tokens_per_second: float | None = None
    value_high_tokens_per_second: float | None = None


@dataclass(frozen=True, slots=True)
class GoodputFigures:
    thresholds_ms: dict[str, float]  # latency limits (at most)
    good_requests: int
    good_requests_per_second: float
    goodput_ratio: float | None
    trajectories: int  # finished trajectories admitted in the window
    good_trajectories: int
    good_trajectories_per_minute: float | None  # None when no trajectory finished in it
    thresholds_tokens_per_second: dict[str, float] | None = None  # speed floors (at least)


@dataclass(frozen=True, slots=True)
class OutputSpeed:
    """Output speed in tokens/s (docs/metrics.md, "Output speed"): per request (its output
    tokens over its generation time) and per agent (its output tokens over its generation
    time, summed over its requests), with low percentiles: the slow side of a speed is the
    one that matters, so each --percentiles entry p becomes p(100 - p) (p99 -> p1)."""

    unit: str  # "tokens/s"
    requests: MetricStats | None
    agents: MetricStats | None


@dataclass(frozen=True, slots=True)
class PeakOutput:
    """The highest output-token rate over any ``bin_seconds`` bin of the window (bins from
    its start), tokens counted when they arrived (docs/metrics.md, "Peak output tokens/s")."""

    tokens_per_second: float
    bin_start_seconds: float  # the busiest bin's start, seconds from the run's start
    bin_seconds: float
    counted_at: str  # "chunks" (streamed), "completions" (not streamed), or both


@dataclass(frozen=True, slots=True)
class Verdict:
    verdict: str | None
    reason: str | None


@dataclass(frozen=True, slots=True)
class WindowFigures:
    """Figures of the requests that started in [start, end] (the results JSON ``window``)."""

    start_seconds: float
    end_seconds: float
    duration_seconds: float
    requests: int
    successful_requests: int
    failed_requests: int
    requests_per_second: float
    input_tokens_per_second: float
    output_tokens_per_second: float
    input_tokens: int
    output_tokens: int
    cached_tokens: int | None
    cache_hit_percent: float | None
    mean_active_agents: float | None
    peak_in_flight: int
    latency: dict[str, MetricStats | None]
    goodput: GoodputFigures | None
    slo: tuple[ObjectiveOutcome, ...]
    slo_verdict: str | None
    client: Verdict
    server: Verdict
    output_speed: OutputSpeed | None = None
    # per successful request: {"input"|"output": {"mean", "p50", "p90", "max"}}; None when none
    request_tokens: dict[str, dict[str, float]] | None = None
    peak_output: PeakOutput | None = None  # None: no output token in the window

    def as_dict(self) -> dict:
        document = asdict(self)
        document["slo"] = [asdict(outcome) for outcome in self.slo]
        return document

    def outcome(self, name: str) -> ObjectiveOutcome | None:
        return next((o for o in self.slo if o.objective == name), None)


def _stats(values: Sequence[float], percents: Sequence[float]) -> MetricStats | None:
    ordered = sorted(values)
    n = len(ordered)
    if n == 0:
        return None
    mean = math.fsum(ordered) / n
    variance = math.fsum((v - mean) * (v - mean) for v in ordered) / n
    return MetricStats(
        count=n,
        mean=mean,
        min=ordered[0],
        max=ordered[-1],
        std=math.sqrt(variance),
        # percentile is None only for no samples, and there are some
        percentiles={percentile_label(p): percentile(ordered, p / 100.0) for p in percents},  # type: ignore[misc]
    )


def request_tokens(samples: RequestSamples, rows: Sequence[int]) -> dict | None:
    """Input and output tokens per successful request of the window: mean, p50, p90 and
    max (the console's length lines, the report's workload summary); None when the window
    has no successful request."""
    if not rows:
        return None
    out = {}
    for side, column in (("input", samples.input_tokens), ("output", samples.output_tokens)):
        ordered = sorted(column[i] for i in rows)
        out[side] = {
            "mean": math.fsum(ordered) / len(ordered),
            "p50": percentile(ordered, 0.5),
            "p90": percentile(ordered, 0.9),
            "max": ordered[-1],
        }
    return out


def peak_output(
    samples: RequestSamples,
    gaps_ms: Sequence[float],
    rows: Sequence[int],
    start: float,
    end: float | None = None,
) -> PeakOutput | None:
    """The most output tokens that arrived in one PEAK_BIN_SECONDS bin (bins from
    ``start``), over the successful requests ``rows``, per second. A streamed reply's
    tokens arrive with its content chunks (first at the TTFT, then after each gap), spread
    evenly over them in whole tokens; an unstreamed reply's all arrive at its completion.
    A window shorter than one bin (``end - start``) is one bin of its own length, so that
    its peak is not a full second's rate of a fraction of a second's tokens. None when no
    token arrived."""
    bins: dict[int, int] = {}
    kinds: set[str] = set()
    width = PEAK_BIN_SECONDS
    if end is not None and 0 < end - start < PEAK_BIN_SECONDS:
        width = end - start

    def add(t: float, tokens: int) -> None:
        if tokens:
            index = math.floor((t - start) / width) if width == PEAK_BIN_SECONDS else 0
            bins[index] = bins.get(index, 0) + tokens

    for i in rows:
        tokens = samples.output_tokens[i]
        if tokens <= 0:
            continue
        sent = samples.start_s[i]
        ttft = samples.ttft_ms[i]
        if math.isnan(ttft):
            kinds.add("completions")
            add(sent + samples.latency_ms[i] / 1000.0, tokens)
            continue
        kinds.add("chunks")
        first, count = samples.gap_first[i], samples.gap_count[i]
        chunks = count + 1
        t = sent + ttft / 1000.0
        for k in range(chunks):
            if k:
                t += gaps_ms[first + k - 1] / 1000.0
            add(t, (k + 1) * tokens // chunks - k * tokens // chunks)
    if not bins:
        return None
    index = max(sorted(bins), key=lambda b: bins[b])  # the earliest of equal bins
    return PeakOutput(
        tokens_per_second=bins[index] / width,
        bin_start_seconds=start + index * width,
        bin_seconds=width,
        counted_at=" and ".join(sorted(kinds)),
    )


def distribution(values: Iterable[float], points: int = DISTRIBUTION_POINTS) -> dict | None:
    """A CDF of at most ``points`` points: sorted values and the share of samples at or
    below each (evenly spaced ranks, always the largest)."""
    ordered = sorted(values)
    n = len(ordered)
    if n == 0:
        return None
    if n <= points:
        ranks: Sequence[int] = range(1, n + 1)
    else:
        ranks = sorted({max(1, round(n * (i + 1) / points)) for i in range(points)})
    return {
        "values": [round(ordered[r - 1], 4) for r in ranks],
        "fractions": [round(r / n, 6) for r in ranks],
    }


@dataclass
class WindowInputs:
    """What the window is computed from (one live run's recordings)."""

    samples: RequestSamples
    gaps_ms: array  # every streamed request's gaps between content chunks, in order
    records: Sequence[TrajectoryRecord]
    series: TimeSeries
    health: ClientHealth | None
    wall_seconds: float
    goodput: tuple[tuple[str, float], ...]
    objectives: tuple[Objective, ...]
    percents: tuple[float, ...]


class Window:
    """Rows of one window and the values each metric took there."""

    def __init__(self, inputs: WindowInputs, start: float, end: float) -> None:
        self.inputs = inputs
        self.start, self.end = start, end
        samples = inputs.samples
        starts = samples.start_s
        self.rows = [i for i in range(len(samples)) if start <= starts[i] <= end]
        ok = samples.ok
        self.ok_rows = [i for i in self.rows if ok[i]]

    def values(self, key: str) -> list[float]:
        samples = self.inputs.samples
        if key == "itl_ms":
            gaps = self.inputs.gaps_ms
            out: list[float] = []
            for i in self.ok_rows:
                first = samples.gap_first[i]
                out.extend(gaps[first : first + samples.gap_count[i]])
            return out
        if key == "agent_e2e_ms":
            return [r.loop_seconds * 1000.0 for r in self.finished_trajectories() if r.completed]
        if key == "output_speed":
            return [v for v in (self.speed(i) for i in self.ok_rows) if v is not None]
        column = {"ttft_ms": samples.ttft_ms, "tpot_ms": samples.tpot_ms}.get(key)
        if column is None:
            column = samples.latency_ms
        return [column[i] for i in self.ok_rows if not math.isnan(column[i])]

    def generation_ms(self, i: int) -> float | None:
        """Row ``i``'s generation time, first to last content chunk (ms); None when not
        streamed, or when it has no speed (see ``output_speed``)."""
        samples = self.inputs.samples
        if math.isnan(samples.ttft_ms[i]):
            return None
        first = samples.gap_first[i]
        gaps = self.inputs.gaps_ms[first : first + samples.gap_count[i]]
        if output_speed(samples.output_tokens[i], gaps) is None:
            return None
        return math.fsum(gaps)

    def speed(self, i: int) -> float | None:
        """Row ``i``'s output speed, tokens/s (None: not streamed, one token or one chunk)."""
        generation = self.generation_ms(i)
        if generation is None:
            return None
        return self.inputs.samples.output_tokens[i] * 1000.0 / generation

    def agent_speeds(self) -> list[float]:
        """Each agent's output speed over its requests of the window that have one: its
        output tokens over its generation time, both summed over those requests."""
        samples = self.inputs.samples
        tokens: dict[int, int] = {}
        generation: dict[int, list[float]] = {}
        for i in self.ok_rows:
            ms = self.generation_ms(i)
            if ms is None:
                continue
            agent = samples.agent[i]
            tokens[agent] = tokens.get(agent, 0) + samples.output_tokens[i]
            generation.setdefault(agent, []).append(ms)
        return [tokens[a] * 1000.0 / math.fsum(generation[a]) for a in sorted(tokens)]

    def finished_trajectories(self) -> list[TrajectoryRecord]:
        """Trajectories admitted in the window (records exist only once one finished)."""
        return [r for r in self.inputs.records if self.start <= r.admitted_at <= self.end]


def window_figures(inputs: WindowInputs, start: float, end: float) -> WindowFigures:
    """Every window figure; ``end`` is where measurement stopped (the run's end, or the
    time a --duration or --window-trajectories stop took effect)."""
    window = Window(inputs, start, end)
    samples = inputs.samples
    rows, ok_rows = window.rows, window.ok_rows
    duration = max(end - start, 0.0)
    input_tokens = sum(samples.input_tokens[i] for i in ok_rows)
    output_tokens = sum(samples.output_tokens[i] for i in ok_rows)
    reported = [samples.cached_tokens[i] for i in ok_rows if samples.cached_tokens[i] >= 0]
    cached = sum(reported) if reported else None
    cache_hit = 100.0 * cached / input_tokens if cached is not None and input_tokens else None
    latency = {key: _stats(window.values(key), inputs.percents) for key in LATENCY_KEYS}
    goodput = _goodput(inputs, window, duration)
    outcomes = tuple(_outcome(o, window) for o in inputs.objectives)
    low = speed_percents(inputs.percents)
    return WindowFigures(
        start_seconds=start,
        end_seconds=end,
        duration_seconds=duration,
        requests=len(rows),
        successful_requests=len(ok_rows),
        failed_requests=len(rows) - len(ok_rows),
        requests_per_second=_per(len(rows), duration),
        input_tokens_per_second=_per(input_tokens, duration),
        output_tokens_per_second=_per(output_tokens, duration),
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        cached_tokens=cached,
        cache_hit_percent=cache_hit,
        mean_active_agents=mean_active_agents(inputs.records, start, end),
        peak_in_flight=peak_in_flight(samples, start, end),
        latency=latency,
        goodput=goodput,
        slo=outcomes,
        slo_verdict=combine_verdicts([o.verdict for o in outcomes]),
        client=client_verdict(inputs.health, inputs.wall_seconds),
        server=Verdict(None, None),
        output_speed=OutputSpeed(
            unit="tokens/s",
            requests=_stats(window.values("output_speed"), low),
            agents=_stats(window.agent_speeds(), low),
        ),
        request_tokens=request_tokens(samples, ok_rows),
        peak_output=peak_output(samples, inputs.gaps_ms, ok_rows, start, end),
    )


def speed_percents(percents: Sequence[float]) -> tuple[float, ...]:
    """The low percentiles a speed reports, highest first: p50 and p10 (the console's),
    and 100 - p for each --percentiles entry p below 100 (50, 90, 99 -> 50, 10, 1)."""
    low = {50.0, 10.0} | {round(100.0 - p, 9) for p in percents if p < 100.0}
    return tuple(sorted(low, reverse=True))


def mean_active_agents(records: Sequence[TrajectoryRecord], start: float, end: float):
    """Time-weighted mean of agents running during [start, end], from each trajectory's
    admission and finish (exact, not sampled); None for an empty window."""
    if end <= start:
        return None
    busy = 0.0
    for record in records:
        overlap = min(record.finished_at, end) - max(record.admitted_at, start)
        if overlap > 0:
            busy += overlap
    return busy / (end - start)


def peak_in_flight(samples: RequestSamples, start: float, end: float) -> int:
    """The most requests in flight at one moment during [start, end] (settled requests,
    from their send times and latencies; a request is in flight from its first send to its
    last byte)."""
    events: list[tuple[float, int]] = []
    for i in range(len(samples)):
        sent = samples.start_s[i]
        done = sent + samples.latency_ms[i] / 1000.0
        if done >= start and sent <= end:
            events.append((max(sent, start), 1))
            events.append((done, -1))
    events.sort(key=lambda event: (event[0], event[1]))  # an end before a start at a tie
    peak = current = 0
    for _, step in events:
        current += step
        peak = max(peak, current)
    return peak


def _per(total: float, seconds: float) -> float:
    return total / seconds if seconds > 0 else 0.0


def _goodput(inputs: WindowInputs, window: Window, duration: float) -> GoodputFigures | None:
    if not inputs.goodput:
        return None
    samples = inputs.samples
    good = sum(1 for i in window.rows if samples.good[i])
    bad_agents = {samples.agent[i] for i in range(len(samples)) if not samples.good[i]}
    # Trajectories a planned stop or a signal cut short are neither good nor bad.
    finished = [r for r in window.finished_trajectories() if not r.interrupted]
    good_trajectories = sum(1 for r in finished if r.completed and r.agent_id not in bad_agents)
    speeds = {m: v for m, v in inputs.goodput if m in SPEED_METRICS}
    return GoodputFigures(
        thresholds_ms={m: v for m, v in inputs.goodput if m not in SPEED_METRICS},
        good_requests=good,
        good_requests_per_second=_per(good, duration),
        goodput_ratio=good / len(window.rows) if window.rows else None,
        trajectories=len(finished),
        good_trajectories=good_trajectories,
        good_trajectories_per_minute=(
            _per(good_trajectories * 60.0, duration) if finished else None
        ),
        thresholds_tokens_per_second=speeds or None,
    )


def _outcome(objective: Objective, window: Window) -> ObjectiveOutcome:
    if objective.metric == "goodput":
        samples = window.inputs.samples
        within = sum(1 for i in window.rows if samples.good[i])
        return goodput_outcome(objective, within, len(window.rows))
    if objective.at_least:
        return _floor_outcome(objective, window)
    values = sorted(window.values(f"{objective.metric}_ms"))
    failed = len(window.rows) - len(window.ok_rows)  # a failed request met no limit
    effective = None
    if objective.metric == "itl":
        # Gaps of one request are correlated: the interval counts requests, not gaps.
        samples = window.inputs.samples
        effective = sum(1 for i in window.ok_rows if samples.gap_count[i] > 0)
    return limit_outcome(objective, values, failed, effective)


def goodput_outcome(objective: Objective, within: int, n: int) -> ObjectiveOutcome:
    """Goodput (``goodput=95%``): ``within`` of the window's ``n`` requests were good."""
    low, high = wilson_interval(within, n)
    return ObjectiveOutcome(
        objective=objective.name,
        metric="goodput",
        quantile=objective.quantile,
        limit_ms=None,
        value_ms=None,
        samples=n,
        within=within,
        attainment=within / n if n else None,
        attainment_low=low,
        attainment_high=high,
        value_low_ms=None,
        value_high_ms=None,
        verdict=attainment_verdict(within, n, objective.quantile),
        required=objective.quantile,
    )


def limit_outcome(
    objective: Objective, values: list[float], failed: int, effective: int | None
) -> ObjectiveOutcome:
    """A latency limit (``ttft_p99=2s``) judged on the window's ``values`` (sorted) and its
    ``failed`` requests (each a sample beyond the limit). For ITL, ``effective`` is the
    number of requests with gaps: the gaps of one request are correlated, so the interval
    counts requests, not gaps (the share of gaps within the limit, applied to them)."""
    n = len(values)
    limit = objective.limit_ms or 0.0
    within = _count_at_most(values, limit)
    if effective is not None:
        share = within / n if n else 0.0
        trials, met = effective + failed, share * effective
    else:
        trials, met = n + failed, float(within)
    low, high = wilson_interval(met, trials)
    value_low, value_high = percentile_interval(values, objective.quantile, effective=effective)
    return ObjectiveOutcome(
        objective=objective.name,
        metric=objective.metric,
        quantile=objective.quantile,
        limit_ms=limit,
        value_ms=percentile(values, objective.quantile),
        samples=trials,
        within=round(met),
        attainment=met / trials if trials else None,
        attainment_low=low,
        attainment_high=high,
        value_low_ms=value_low,
        value_high_ms=value_high,
        verdict=attainment_verdict(met, trials, objective.quantile),
        required=objective.quantile,
    )


def _floor_outcome(objective: Objective, window: Window) -> ObjectiveOutcome:
    """A speed floor, ``output_speed_p10>=30``: the 10th percentile of speed is at least
    30 tok/s exactly when at least 90 % of requests reach 30 tok/s, so the objective is
    judged like a limit, on the share of samples at or above the floor with 1 - quantile
    the share required. A failed request met no floor; a request without a speed (not
    streamed, one token, one chunk) is no sample."""
    values = sorted(window.values(objective.metric))
    n = len(values)
    floor = objective.minimum or 0.0
    within = n - bisect.bisect_left(values, floor)
    trials = n + len(window.rows) - len(window.ok_rows)
    required = objective.required
    low, high = wilson_interval(within, trials)
    value_low, value_high = percentile_interval(values, objective.quantile)
    return ObjectiveOutcome(
        objective=objective.name,
        metric=objective.metric,
        quantile=objective.quantile,
        limit_ms=None,
        value_ms=None,
        samples=trials,
        within=within,
        attainment=within / trials if trials else None,
        attainment_low=low,
        attainment_high=high,
        value_low_ms=None,
        value_high_ms=None,
        verdict=attainment_verdict(within, trials, required),
        required=required,
        limit_tokens_per_second=floor,
        value_tokens_per_second=percentile(values, objective.quantile),
        value_low_tokens_per_second=value_low,
        value_high_tokens_per_second=value_high,
    )


def _count_at_most(ordered: list[float], limit: float) -> int:
    return bisect.bisect_right(ordered, limit)


def client_verdict(health: ClientHealth | None, wall_seconds: float) -> Verdict:
    """One sentence: was the client the bottleneck? (event-loop lag and CPU share)."""
    if health is None or health.lag_p99_ms is None:
        return Verdict(None, None)
    processes = max(health.processes, 1)
    share = health.cpu_seconds / processes / wall_seconds if wall_seconds > 0 else 0.0
    core = "one core" if processes == 1 else f"a core in each of {processes} processes"
    figures = f"event-loop lag p99 {health.lag_p99_ms:.1f} ms, {share * 100.0:.0f}% of {core}"
    lagging = health.lag_p99_ms > CLIENT_LAG_P99_LIMIT_MS
    if share > CLIENT_CPU_LIMIT or (lagging and share >= CLIENT_BUSY_SHARE):
        return Verdict(
            "client-bound",
            f"the client was the bottleneck ({figures}): latencies include its own delay; "
            "run fewer agents per client process, or fewer stream chunks",
        )
    if lagging:
        return Verdict(
            "client-bound",
            f"the client's event loop woke late ({figures}) although it used little CPU: "
            "other processes on this machine took it; latencies include that delay",
        )
    return Verdict("ok", f"the client kept up ({figures})")


def server_verdict(concepts: dict | None, client_ttft_p50_ms: float | None = None) -> Verdict:
    """From the server's own metrics: did requests queue there? Server-bound when, summed
    over ranks, at least one request waited on average over the window (a request waiting
    now and then is the normal edge of continuous batching), or when the client saw first
    tokens much later than the server's own TTFT histogram says: the requests then waited
    before the server's accounting, in its HTTP front end or a saturated process (as a
    zero-latency simulator does when its CPU runs out)."""
    concepts = concepts or {}
    server_ttft = [
        v["p50"] * 1000.0
        for v in (concepts.get("ttft_seconds") or {}).values()
        if isinstance(v, dict) and isinstance(v.get("p50"), int | float)
    ]
    if server_ttft and client_ttft_p50_ms is not None:
        seen = max(server_ttft)
        if client_ttft_p50_ms > 2.0 * seen + FRONT_END_SLACK_MS:
            return Verdict(
                "server-bound",
                f"first tokens reached the client after {client_ttft_p50_ms:.1f} ms (p50) but "
                f"the server counts {seen:.1f} ms: requests waited before its own accounting "
                "(a saturated HTTP front end or server process)",
            )
    waiting = concepts.get("waiting_requests")
    if not waiting:
        return Verdict(None, None)
    means = [v.get("mean") or 0.0 for v in waiting.values() if isinstance(v, dict)]
    peaks = [v.get("max") or 0.0 for v in waiting.values() if isinstance(v, dict)]
    mean, peak = sum(means), max(peaks, default=0.0)
    figures = f"waiting mean {mean:.1f}, max {peak:g}"
    if mean >= SERVER_WAITING_LIMIT:
        return Verdict(
            "server-bound",
            f"requests queued at the server ({figures}): it ran at its batch or KV-cache "
            "limit, so latency grew with load",
        )
    if peak > 0:
        return Verdict("ok", f"requests waited at the server only briefly ({figures})")
    return Verdict("ok", "no request waited in the server's queue")
