"""The measured window on the console and in the CSV: one table of latency statistics,
goodput, SLO verdicts with their confidence, and one-sentence verdicts on the client and
the server."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from batchbench.results.formatting import (
    MISSING,
    csv_cell,
    fixed,
    measured_latency,
    ratio_percent,
)
from batchbench.results.slo import (
    SPEED_METRICS,
    Objective,
    duration_text,
    percentile_label,
    speed_text,
)
from batchbench.results.window import PEAK_BIN_SECONDS, MetricStats, ObjectiveOutcome, WindowFigures

LATENCY_ROWS = (
    ("ttft_ms", "TTFT"),
    ("itl_ms", "ITL"),
    ("tpot_ms", "TPOT"),
    ("e2e_ms", "Request latency"),
    ("agent_e2e_ms", "Agent end-to-end"),
)
CSV_METRICS = (("ttft_ms", "ttft"), ("itl_ms", "itl"), ("tpot_ms", "tpot"), ("e2e_ms", "e2e"))


def latency_table(
    window: WindowFigures, percents: Sequence[float], shown: Sequence[float] = ()
) -> list[str]:
    """count, mean, min, max, std and every --percentiles entry per latency metric, less the
    percentiles in ``shown`` (already printed for the same requests)."""
    labels = [percentile_label(p) for p in percents if p not in shown]
    header = ["(ms)", "count", "mean", "min", "max", "std", *labels]
    rows = []
    for key, label in LATENCY_ROWS:
        stats: MetricStats | None = window.latency.get(key)
        if stats is None:
            continue
        rows.append(
            [
                label,
                str(stats.count),
                fixed(stats.mean),
                fixed(stats.min),
                fixed(stats.max),
                fixed(stats.std),
                *(fixed(stats.percentiles.get(name)) for name in labels),
            ]
        )
    if not rows:
        return []
    widths = [max(len(header[c]), *(len(r[c]) for r in rows)) for c in range(len(header))]

    def line(cells: list[str]) -> str:
        first = cells[0].ljust(widths[0])
        rest = (cell.rjust(width) for cell, width in zip(cells[1:], widths[1:], strict=True))
        return "  " + "  ".join((first, *rest))

    return [line(header), *(line(r) for r in rows)]


# The percentiles the whole-run lines print (Request latency (ms): p50=.. p90=.. p99=..).
SUMMARY_PERCENTS = (50.0, 90.0, 99.0)


def whole_run(window: WindowFigures, finished_by: str | None) -> bool:
    """Whether the window is the whole run: no warm-up and no planned stop, so its requests,
    rates, cached tokens and p50/p90/p99 are the whole-run lines' own."""
    return window.start_seconds <= 0.0 and finished_by is None


def count_text(value: float | None) -> str:
    """A token count: whole numbers as integers, anything else with two decimals."""
    if value is None:
        return MISSING
    return str(int(value)) if float(value).is_integer() else f"{value:.2f}"


def length_lines(window: WindowFigures, scope: str = "") -> list[str]:
    """``Input tokens per request: mean 649.14, p50 642, p90 1010, max 1204 (7 successful
    requests)`` and the same for output tokens (``scope`` follows ``request``); none without
    a successful request."""
    tokens = window.request_tokens
    if not tokens:
        return []
    lines = []
    for side, label in (("input", "Input"), ("output", "Output")):
        stats = tokens[side]
        lines.append(
            f"{label} tokens per request{scope}: mean {fixed(stats['mean'])}, "
            f"p50 {count_text(stats['p50'])}, p90 {count_text(stats['p90'])}, "
            f"max {count_text(stats.get('max'))}"
            + (f" ({window.successful_requests} successful requests)" if side == "input" else "")
        )
    return lines


COUNTED_AT = {
    "chunks": "tokens counted as their chunks arrived",
    "completions": "tokens counted at each reply's completion: not streamed",
    "chunks and completions": "streamed tokens counted as their chunks arrived, others at "
    "their reply's completion",
}


def peak_line(window: WindowFigures, label: str) -> list[str]:
    """``Peak output tokens/s: 412 (the 1-second bin from 2.00s; tokens counted as their
    chunks arrived)``; none when no output token arrived."""
    peak = window.peak_output
    if peak is None:
        return []
    span = f"the {peak.bin_seconds:g}-second bin"
    if peak.bin_seconds < PEAK_BIN_SECONDS:  # a window shorter than one bin
        span = f"the whole {peak.bin_seconds:.2f}-second window"
    return [
        f"{label}: {count_text(peak.tokens_per_second)} ({span} "
        f"from {peak.bin_start_seconds:.2f}s; {COUNTED_AT[peak.counted_at]})"
    ]


def outcome_text(outcome: ObjectiveOutcome, objective: Objective | None = None) -> str:
    """``ttft_p99 ≤ 2 s: pass (1.83 s, 95% CI 1.70–1.95 s; 99.6% within [99.1, 99.8])``."""
    if outcome.metric == "goodput":
        target = f"goodput ≥ {outcome.quantile * 100.0:g}%"
        measured = f"{ratio_percent(outcome.attainment)} good"
    elif outcome.metric in SPEED_METRICS:
        target = f"{outcome.objective} ≥ {speed_text(outcome.limit_tokens_per_second or 0.0)}"
        speed = outcome.value_tokens_per_second
        shown = MISSING if speed is None else measured_speed(speed)
        low, high = outcome.value_low_tokens_per_second, outcome.value_high_tokens_per_second
        interval = f", 95% CI {_interval(low, high, measured_speed)}" if outcome.samples else ""
        measured = f"{shown}{interval}; {ratio_percent(outcome.attainment)} at least"
    else:
        target = f"{outcome.objective} ≤ {duration_text(outcome.limit_ms or 0.0, ' ')}"
        value = MISSING if outcome.value_ms is None else measured_latency(outcome.value_ms)
        low, high = outcome.value_low_ms, outcome.value_high_ms
        interval = f", 95% CI {_interval(low, high)}" if outcome.samples else ""
        measured = f"{value}{interval}; {ratio_percent(outcome.attainment)} within"
    return (
        f"{target}: {outcome.verdict} ({measured} "
        f"[{outcome.attainment_low * 100.0:.1f}, {outcome.attainment_high * 100.0:.1f}], "
        f"{outcome.samples} samples)"
    )


def _interval(
    low: float | None, high: float | None, fmt: Callable[[float], str] = measured_latency
) -> str:
    """``1.70 s–1.95 s``; an open side (too few samples to bound it) as ``≥ 1.70 s``,
    ``≤ 1.95 s`` or ``unbounded``."""
    if low is not None and high is not None:
        return f"{fmt(low)}–{fmt(high)}"
    if low is not None:
        return f"≥ {fmt(low)}"
    if high is not None:
        return f"≤ {fmt(high)}"
    return "unbounded"


def measured_speed(tokens_per_second: float) -> str:
    """``54.73 tok/s``: a measured speed, two decimals."""
    return f"{tokens_per_second:.2f} tok/s"


def agent_speed_line(window: WindowFigures) -> str | None:
    """``Output speed per agent: p50 45.20 tok/s, p10 31.07 tok/s (8 agents; per request
    p50 45.90, p10 30.12)``: each agent's output tokens over its generation time (first to
    last content chunk, summed over its requests); None without a streamed speed."""
    speed = window.output_speed
    if speed is None or speed.agents is None or speed.requests is None:
        return None
    agents, requests = speed.agents, speed.requests
    return (
        f"Output speed per agent: p50 {fixed(agents.get(50.0))} tok/s, "
        f"p10 {fixed(agents.get(10.0))} tok/s ({agents.count} agents; per request "
        f"p50 {fixed(requests.get(50.0))}, p10 {fixed(requests.get(10.0))})"
    )


def window_lines(
    window: WindowFigures, percents: Sequence[float], warmup: float, finished_by: str | None
) -> list[str]:
    """The console's measured-window section (after the live-run lines)."""
    w = window
    why = {"duration": "--duration reached", "window": "--window-trajectories reached"}
    end_note = f"; stopped: {why[finished_by]}" if finished_by in why else ""
    if whole_run(w, finished_by):
        # Everything the window would repeat is in the whole-run lines above: print the rest.
        lines = [
            f"Measured window: the whole run ({w.start_seconds:.2f}s to {w.end_seconds:.2f}s, "
            "no warm-up): its requests, rates, cached tokens and p50/p90/p99 are the lines above"
        ]
        lines += length_lines(w)
        lines += peak_line(w, "Peak output tokens/s")
        shown = [p for p in percents if p in SUMMARY_PERCENTS]
        table = latency_table(w, percents, shown)
        if table:
            omitted = ", ".join(percentile_label(p) for p in shown)
            lines.append(
                f"Latency over the whole run ({omitted} in the lines above):"
                if omitted
                else "Latency over the whole run:"
            )
            lines += table
    else:
        lines = [
            f"Measured window: {w.start_seconds:.2f}s to {w.end_seconds:.2f}s "
            f"(warm-up {warmup:g}s excluded{end_note}): {w.requests} requests"
            f"{f' ({w.failed_requests} failed)' if w.failed_requests else ''}, "
            f"{w.requests_per_second:.2f} req/s, output {w.output_tokens_per_second:.2f} tok/s",
        ]
        if w.cache_hit_percent is not None:
            lines.append(
                f"Server-reported cached input tokens in the measured window: {w.cached_tokens} "
                f"of {w.input_tokens} ({w.cache_hit_percent:.1f}% of input tokens)"
            )
        lines += length_lines(w, " in the measured window")
        lines += peak_line(w, "Peak output tokens/s in the measured window")
        table = latency_table(w, percents)
        if table:
            lines.append(
                "Latency in the measured window (not the whole run's p50/p90/p99 lines above):"
            )
            lines += table
    speed = agent_speed_line(w)
    if speed:
        lines.append(speed)
    goodput = w.goodput
    if goodput is not None:
        limits = ", ".join(
            [f"{metric} ≤ {duration_text(ms, ' ')}" for metric, ms in goodput.thresholds_ms.items()]
            + [
                f"{metric} ≥ {speed_text(floor)}"
                for metric, floor in (goodput.thresholds_tokens_per_second or {}).items()
            ]
        )
        good_share = ratio_percent(goodput.goodput_ratio)
        lines.append(
            f"Goodput ({limits}): {goodput.good_requests}/{w.requests} requests good "
            f"({good_share}), {goodput.good_requests_per_second:.2f} good req/s; "
            + trajectory_goodput_text(goodput)
        )
    for outcome in w.slo:
        lines.append(f"SLO {outcome_text(outcome)}")
    if w.slo_verdict is not None:
        lines.append(f"SLO verdict: {w.slo_verdict}")
    if w.client.verdict is not None:
        lines.append(f"Client: {w.client.verdict}: {w.client.reason}")
    if w.server.verdict is not None:
        lines.append(f"Server: {w.server.verdict}: {w.server.reason}")
    return lines


def server_metrics_lines(document: dict | None) -> list[str]:
    """What the server's own metrics said over the window, summed or averaged over ranks:
    one line per ``--server-metrics`` endpoint, named by its URL when there are several."""
    if not document:
        return []
    endpoints = document.get("endpoints")
    if isinstance(endpoints, list):
        return [line for e in endpoints for line in _endpoint_lines(e, e.get("url"))]
    return _endpoint_lines(document, None)


def _endpoint_lines(document: dict, url: str | None) -> list[str]:
    scrapes, failed = document.get("scrapes", 0), document.get("failed_scrapes", 0)
    head = (
        ("Server metrics" if url is None else f"Server metrics of {url}")
        + f" ({document.get('dialect')}, {scrapes} scrapes every "
        f"{document.get('interval_seconds'):g}s"
        + (f", {failed} failed: {document.get('last_error')}" if failed else "")
        + ")"
    )
    concepts = document.get("concepts") or {}
    parts = []

    def gauges(name: str) -> list[dict]:
        return [v for v in (concepts.get(name) or {}).values() if isinstance(v, dict)]

    usage = gauges("kv_cache_usage")
    if usage:
        parts.append(
            f"KV cache use mean {100.0 * max(g['mean'] for g in usage):.1f}%, "
            f"max {100.0 * max(g['max'] for g in usage):.1f}% (busiest rank)"
        )
    for name, label in (("running_requests", "running"), ("waiting_requests", "waiting")):
        found = gauges(name)
        if found:
            parts.append(
                f"{label} mean {sum(g['mean'] for g in found):.1f} over all ranks "
                f"(peak {max(g['max'] for g in found):g} on one rank)"
            )
    hits = [v for v in (concepts.get("prefix_cache_hit_percent") or {}).values() if v is not None]
    cached = (concepts.get("prefix_cache_hit_tokens") or {}).values()
    queried = sum((concepts.get("prefix_cache_queried_tokens") or {}).values())
    if cached and queried > 0:  # counters: tokens and their share, then the ranks' spread
        spread = f"; {min(hits):.1f}–{max(hits):.1f}% per rank" if len(hits) > 1 else ""
        parts.append(
            f"prefix cache hits {sum(cached):.0f} of {queried:.0f} prompt tokens "
            f"({100.0 * sum(cached) / queried:.1f}%{spread})"
        )
    elif hits:  # hit-rate gauges only: no token counts
        parts.append(f"prefix cache hits {min(hits):.1f}–{max(hits):.1f}% per rank")
    requests = concepts.get("requests") or {}
    if document.get("dialect") == "smg" and requests:  # the gateway's count per worker
        listed = ", ".join(f"{worker} {count:g}" for worker, count in requests.items())
        parts.append(f"requests per worker: {listed}")
    branches = concepts.get("policy_branches") or {}
    if branches:
        listed = ", ".join(f"{name} {count:g}" for name, count in branches.items())
        parts.append(f"policy branches: {listed}")
    if not parts:
        return [f"{head}: no known metric found"]
    return [f"{head}: " + "; ".join(parts)]


def trajectory_goodput_text(goodput) -> str:
    """Trajectories all of whose requests were good, of those that finished in the window
    (one cut short by the run's end is neither; long ones may not finish in a short window)."""
    if not goodput.trajectories:
        return f"trajectory goodput {MISSING} (no trajectory admitted in the window finished)"
    return (
        f"trajectory goodput {goodput.good_trajectories}/{goodput.trajectories} finished "
        f"trajectories all good ({goodput.good_trajectories_per_minute:.2f} per minute)"
    )


def window_csv(window: WindowFigures | None, percents: Sequence[float]) -> list[tuple[str, str]]:
    """(column, cell) pairs appended to the CSV row: window bounds, goodput, SLO verdict,
    verdicts, and mean/min/max/std plus each --percentiles entry of every latency metric."""
    if window is None:
        return []
    w = window
    g = w.goodput
    cells: list[tuple[str, object]] = [
        ("window_start_seconds", w.start_seconds),
        ("window_end_seconds", w.end_seconds),
        ("window_requests", w.requests),
        ("window_requests_per_second", w.requests_per_second),
        ("window_output_tokens_per_second", w.output_tokens_per_second),
        ("cache_hit_percent", w.cache_hit_percent),
        ("good_requests", g.good_requests if g else None),
        ("good_requests_per_second", g.good_requests_per_second if g else None),
        ("goodput_ratio", g.goodput_ratio if g else None),
        ("good_trajectories", g.good_trajectories if g else None),
        ("good_trajectories_per_minute", g.good_trajectories_per_minute if g else None),
        ("slo_verdict", w.slo_verdict),
        ("client_verdict", w.client.verdict),
        ("server_verdict", w.server.verdict),
    ]
    for key, name in CSV_METRICS:
        stats = w.latency.get(key)
        for field in ("mean", "min", "max", "std"):
            cells.append((f"window_{name}_{field}_ms", getattr(stats, field) if stats else None))
        for p in percents:
            label = percentile_label(p).replace(".", "_")
            cells.append((f"window_{name}_{label}_ms", stats.get(p) if stats else None))
    return [(column, csv_cell(value)) for column, value in cells]
