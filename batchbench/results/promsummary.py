"""Server metrics: Prometheus exposition text read into known concepts, summarized per window.

Pages are parsed with prometheus_client's own text parser, fed only the lines of the
families this module knows (vLLM, SGLang, llama.cpp, the smg gateway's ``smg_*`` and the
simulator's ``batchbench_sim_*`` names; see ``KEPT_LINES``).
Each kept sample is one series per label set, its samples stored as two float arrays.

A window ``[start, end]`` (seconds since the run began) is summarized as follows:

- gauges: the scrapes taken inside the window (or the one nearest its middle when none is)
  give min, mean, p50, p99 and max, percentiles by the rule of docs/metrics.md;
- counters: the increase between the scrapes that enclose the window (the last at or
  before ``start``, the first at or after ``end``: the scraper's first scrape precedes the
  run and its final scrape follows it, so a whole run is counted exactly), corrected for
  server restarts (a value below the previous one means the counter began again from
  zero, so the new value is all increase); a series first seen after the start scrape (a
  label set created later, or a restarted server) counts from zero;
- histograms: each bucket's increase, as for counters, summed per rank; quantiles p50, p90
  and p99 interpolate linearly inside the bucket that holds them, as PromQL's
  ``histogram_quantile`` does (a quantile in the ``+Inf`` bucket is the largest finite bound).

The rank of a series is its first label among ``engine``, ``dp_rank``, ``rank`` and
``worker`` (smg labels its per-worker families with the worker's URL), else ``"all"``.
smg's policy branch counters (``smg_<policy>_policy_branch_total{branch=...}``, e.g.
consistent hashing's ``target_worker_hit`` and ``target_worker_miss``) are the concept
``policy_branches``, one increase per ``"<policy> <branch>"``.
Series of one rank that differ in other labels (vLLM's ``finished_reason``) are
added up; ratio gauges (KV-cache usage, hit rates) are averaged instead.
"""

from __future__ import annotations

import bisect
import math
import re
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from batchbench.results.formatting import rank_order
from batchbench.results.metrics import percentile

MAX_SERIES_POINTS = 1000
RANK_LABELS = ("engine", "dp_rank", "rank", "worker")
QUANTILES = (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))

# concept -> (candidate names, most preferred first; how series of one rank combine)
GAUGES: dict[str, tuple[tuple[str, ...], str]] = {
    "kv_cache_usage": (
        (
            "vllm:kv_cache_usage_perc",
            "vllm:gpu_cache_usage_perc",
            "sglang:token_usage",
            "llamacpp:kv_cache_usage_ratio",
        ),
        "mean",
    ),
    "running_requests": (
        (
            "vllm:num_requests_running",
            "sglang:num_running_reqs",
            "llamacpp:requests_processing",
            "batchbench_sim_running",
            "smg_worker_requests_active",
        ),
        "sum",
    ),
    "waiting_requests": (
        (
            "vllm:num_requests_waiting",
            "sglang:num_queue_reqs",
            "llamacpp:requests_deferred",
            "batchbench_sim_queue_depth",
        ),
        "sum",
    ),
}
# Hit-rate gauges (fractions 0..1), used when no hits/queries counter pair is exposed.
HIT_RATE_GAUGES = ("vllm:gpu_prefix_cache_hit_rate", "sglang:cache_hit_rate")
# Counters, named without the ``_total`` suffix the parser strips from counter families.
COUNTERS: dict[str, tuple[str, ...]] = {
    "requests": (
        "vllm:request_success",
        "sglang:num_requests",
        "batchbench_sim_requests",
        "smg_worker_requests",
    ),
    "prompt_tokens": (
        "vllm:prompt_tokens",
        "sglang:prompt_tokens",
        "llamacpp:prompt_tokens",
        "batchbench_sim_prompt_tokens",
    ),
    "generation_tokens": (
        "vllm:generation_tokens",
        "sglang:generation_tokens",
        "llamacpp:tokens_predicted",
        "batchbench_sim_completion_tokens",
    ),
}
# (cached tokens, prompt tokens, whether the prompt counter leaves the cached ones out)
# counter pairs: the prefix-cache hit rate. llama.cpp counts processed prompt tokens
# "excluding cached tokens" and the reused ones in a counter of their own.
HIT_COUNTERS = (
    ("vllm:prefix_cache_hits", "vllm:prefix_cache_queries", False),
    ("sglang:cached_tokens", "sglang:prompt_tokens", False),
    ("llamacpp:prompt_tokens_cached", "llamacpp:prompt_tokens", True),
    ("batchbench_sim_cached_tokens", "batchbench_sim_prompt_tokens", False),
)
HISTOGRAMS: dict[str, tuple[str, ...]] = {
    "ttft_seconds": ("vllm:time_to_first_token_seconds", "sglang:time_to_first_token_seconds"),
}
DIALECTS = (  # the first whose prefix a kept series carries names the server
    ("batchbench_sim_", "batchbench-sim"),
    ("vllm:", "vllm"),
    ("sglang:", "sglang"),
    ("llamacpp:", "llamacpp"),
    ("smg_", "smg"),
)
# smg's per-policy branch counters: the policy is part of the family's name.
POLICY_BRANCH = re.compile(r"smg_(\w+?)_policy_branch(?:_total)?")
CONCEPTS = (
    "kv_cache_usage",
    "running_requests",
    "waiting_requests",
    "prefix_cache_hit_percent",
    "prefix_cache_hit_tokens",
    "prefix_cache_queried_tokens",
    "requests",
    "prompt_tokens",
    "generation_tokens",
    "ttft_seconds",
    "policy_branches",
)


def _sample_names() -> dict[str, tuple[str, str]]:
    """Sample name -> (base name, kind) for every name this module reads."""
    names: dict[str, tuple[str, str]] = {}
    for candidates, _ in GAUGES.values():
        names.update((name, (name, "gauge")) for name in candidates)
    names.update((name, (name, "gauge")) for name in HIT_RATE_GAUGES)
    counters = {name for group in COUNTERS.values() for name in group}
    counters.update(name for *pair, _ in HIT_COUNTERS for name in pair)
    for name in counters:  # typed counters carry _total; an untyped page may not
        names[name + "_total"] = names[name] = (name, "counter")
    for group in HISTOGRAMS.values():
        names.update((name + "_bucket", (name, "histogram")) for name in group)
    return names


SAMPLE_NAMES = _sample_names()


def _kept_lines() -> re.Pattern[str]:
    """Lines of the families read here (samples, ``_sum``/``_count``, HELP and TYPE).

    The official parser costs about 17 us a sample; a real vLLM page holds hundreds of
    samples batchbench never reads (other histograms, process metrics). Only these lines
    reach the parser, which keeps a scrape near a millisecond of CPU whatever the page.
    """
    bases = sorted({base for base, _ in SAMPLE_NAMES.values()}, key=len, reverse=True)
    names = "|".join([*(re.escape(base) for base in bases), r"smg_\w+?_policy_branch"])
    return re.compile(
        rf"^(?:# (?:HELP|TYPE) )?(?:{names})(?:_total|_bucket|_count|_sum)?[ {{].*\n?", re.M
    )


KEPT_LINES = _kept_lines()


def known_sample(name: str) -> tuple[str, str] | None:
    """(base name, kind) of a sample this module reads; None for any other."""
    found = SAMPLE_NAMES.get(name)
    if found is None and POLICY_BRANCH.fullmatch(name):
        return name.removesuffix("_total"), "counter"
    return found


def sample_key(name: str, labels: dict[str, str]) -> str:
    """``name{label="value",...}`` as in the exposition text (the JSONL and series key)."""
    if not labels:
        return name
    parts = ",".join(f'{key}="{_escape(value)}"' for key, value in labels.items())
    return f"{name}{{{parts}}}"


def _escape(value: str) -> str:
    if "\\" in value or '"' in value or "\n" in value:
        return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return value


def rank_of(labels: dict[str, str]) -> str:
    """The DP rank a series belongs to: its first rank label, else ``"all"``."""
    for label in RANK_LABELS:
        value = labels.get(label)
        if value is not None:
            return value
    return "all"


@dataclass(slots=True)
class Series:
    """One label set of a known metric: what it means and its samples."""

    base: str
    kind: str  # gauge | counter | histogram
    rank: str
    le: float | None  # a histogram bucket's upper bound
    times: array = field(default_factory=lambda: array("d"))
    values: array = field(default_factory=lambda: array("d"))


def parse_page(
    text: str, keep_all: bool = False
) -> tuple[list[tuple[str, str, dict[str, str], float]], dict[str, float] | None]:
    """Parse one page's known families: (the samples read, as (key, sample name, labels,
    value); with ``keep_all`` also every sample of those families by key, ``_sum`` and
    ``_count`` included). Raises ValueError on text the parser rejects."""
    known: list[tuple[str, str, dict[str, str], float]] = []
    everything: dict[str, float] | None = {} if keep_all else None
    kept = "".join(KEPT_LINES.findall(text))
    for family in text_string_to_metric_families(kept):
        for sample in family.samples:
            name, labels, value = sample.name, sample.labels, sample.value
            if everything is not None:
                key = sample_key(name, labels)
                everything[key] = value
                if known_sample(name) is not None:
                    known.append((key, name, labels, value))
            elif known_sample(name) is not None:
                known.append((sample_key(name, labels), name, labels, value))
    return known, everything


class Timeline:
    """The scraped time series of the known metrics, and its summary over a window."""

    def __init__(self) -> None:
        self.times = array("d")  # every successful scrape, ascending
        self.series: dict[str, Series] = {}

    def ingest(self, t: float, text: str, keep_all: bool = False) -> dict[str, float] | None:
        """Add one scrape taken at ``t``; returns every sample by key when ``keep_all``.
        A page the parser rejects raises ValueError and adds nothing."""
        known, everything = parse_page(text, keep_all)
        if self.times and t <= self.times[-1]:
            raise ValueError(f"scrape time {t} is not after the previous one")
        self.times.append(t)
        series = self.series
        for key, name, labels, value in known:
            entry = series.get(key)
            if entry is None:
                found = known_sample(name)
                assert found is not None  # parse_page keeps only these
                base, kind = found
                le = _bound(labels.get("le")) if kind == "histogram" else None
                if kind == "histogram" and le is None:
                    continue  # a bucket without a readable bound cannot be placed
                policy = POLICY_BRANCH.fullmatch(base)
                rank = (
                    f"{policy.group(1)} {labels.get('branch', '')}".rstrip()
                    if policy is not None
                    else rank_of(labels)
                )
                entry = series[key] = Series(base, kind, rank, le)
            entry.times.append(t)
            entry.values.append(value)
        return everything

    # --- the summary ---------------------------------------------------------------------

    def dialect(self) -> str:
        bases = {entry.base for entry in self.series.values()}
        for prefix, dialect in DIALECTS:
            if any(base.startswith(prefix) for base in bases):
                return dialect
        return "unknown"

    def summary(self, start: float, end: float) -> dict[str, Any]:
        """``dialect``, ``concepts`` and ``series`` of the window ``[start, end]``."""
        end = max(start, end)
        concepts: dict[str, dict[str, Any]] = {name: {} for name in CONCEPTS}
        gauge_times = self._gauge_times(start, end)
        series_out: dict[str, Any] = {"t": [], **{name: {} for name in GAUGES}}
        picks = _downsample(len(gauge_times), MAX_SERIES_POINTS)
        series_out["t"] = [round(gauge_times[i], 6) for i in picks]
        for concept, (candidates, how) in GAUGES.items():
            columns = self._gauge_columns(candidates, how, gauge_times)
            concepts[concept] = {
                rank: gauge_stats([v for v in column if v is not None])
                for rank, column in columns.items()
            }
            series_out[concept] = {
                rank: [_round(column[i]) for i in picks] for rank, column in columns.items()
            }
        bounds = self._counter_bounds(start, end)
        for concept, candidates in COUNTERS.items():
            concepts[concept] = self._increases(candidates, bounds) or {}
        concepts["prefix_cache_hit_percent"] = self._hit_percent(bounds, gauge_times)
        hit_tokens = self._hit_tokens(bounds)
        if hit_tokens is not None:
            cached, queried = hit_tokens
            concepts["prefix_cache_hit_tokens"] = cached
            concepts["prefix_cache_queried_tokens"] = queried
        for concept, candidates in HISTOGRAMS.items():
            concepts[concept] = self._quantiles(candidates, bounds)
        concepts["policy_branches"] = self._policy_branches(bounds)
        return {
            "dialect": self.dialect(),
            "concepts": concepts,
            "series": series_out,
            "counter_bounds": bounds,  # the scrapes whose difference the counters are
        }

    def _chosen(self, candidates: Iterable[str], kind: str) -> list[Series]:
        """The series of the first candidate name the server exposes."""
        for name in candidates:
            found = [s for s in self.series.values() if s.base == name and s.kind == kind]
            if found:
                return found
        return []

    def _gauge_times(self, start: float, end: float) -> list[float]:
        """Scrape times inside the window, or the one nearest its middle."""
        times = self.times
        inside = list(times[bisect.bisect_left(times, start) : bisect.bisect_right(times, end)])
        if inside or not times:
            return inside
        return [times[_nearest(times, (start + end) / 2)]]

    def _gauge_columns(
        self, candidates: Sequence[str], how: str, times: list[float]
    ) -> dict[str, list[float | None]]:
        """Per rank, the combined gauge value at each scrape time (None where absent)."""
        found = self._chosen(candidates, "gauge")
        if not found or not times:
            return {}
        position = {t: i for i, t in enumerate(times)}
        parts: dict[str, list[list[float]]] = {}
        for entry in found:
            slots = parts.setdefault(entry.rank, [[] for _ in times])
            low = bisect.bisect_left(entry.times, times[0])
            high = bisect.bisect_right(entry.times, times[-1])
            for index in range(low, high):
                slot = position.get(entry.times[index])
                if slot is not None:
                    slots[slot].append(entry.values[index])
        combine = _mean if how == "mean" else math.fsum
        return {
            rank: [combine(values) if values else None for values in slots]
            for rank, slots in sorted(parts.items(), key=_by_rank)
        }

    def _counter_bounds(self, start: float, end: float) -> tuple[float, float] | None:
        """The scrapes that enclose the window: the last at or before ``start`` (else the
        first) and the first at or after ``end`` (else the last); None before any scrape."""
        times = self.times
        if not times:
            return None
        low = bisect.bisect_right(times, start) - 1
        high = bisect.bisect_left(times, end)
        return times[max(low, 0)], times[min(high, len(times) - 1)]

    def _increase(self, entry: Series, bounds: tuple[float, float]) -> float:
        first, last = bounds
        low = bisect.bisect_left(entry.times, first)
        high = bisect.bisect_right(entry.times, last)
        values = list(entry.values[low:high])
        if not values:
            return 0.0
        if entry.times[low] != first:
            values.insert(0, 0.0)  # born after the start scrape: it counted from zero
        return counter_increase(values)

    def _increases(
        self, candidates: Sequence[str], bounds: tuple[float, float] | None
    ) -> dict[str, float] | None:
        """Per-rank increase of the first candidate counter exposed (None: none is)."""
        found = self._chosen(candidates, "counter")
        if not found or bounds is None:
            return None
        totals: dict[str, float] = {}
        for entry in found:
            totals[entry.rank] = totals.get(entry.rank, 0.0) + self._increase(entry, bounds)
        return dict(sorted(totals.items(), key=_by_rank))

    def _policy_branches(self, bounds: tuple[float, float] | None) -> dict[str, float]:
        """Increase of every smg policy branch counter, by ``"<policy> <branch>"``."""
        if bounds is None:
            return {}
        totals: dict[str, float] = {}
        for entry in self.series.values():
            if entry.kind == "counter" and POLICY_BRANCH.fullmatch(entry.base):
                totals[entry.rank] = totals.get(entry.rank, 0.0) + self._increase(entry, bounds)
        return dict(sorted(totals.items()))

    def _hit_tokens(
        self, bounds: tuple[float, float] | None
    ) -> tuple[dict[str, float], dict[str, float]] | None:
        """Per rank, prompt tokens served from the prefix cache and prompt tokens looked up
        in it (cached ones included), from the first hits/queries counter pair exposed;
        None when the server exposes none."""
        for hits_name, queries_name, queries_exclude_hits in HIT_COUNTERS:
            hits = self._increases((hits_name,), bounds)
            queries = self._increases((queries_name,), bounds)
            if hits is not None and queries is not None:
                cached = {rank: hits.get(rank, 0.0) for rank in queries}
                queried = {
                    rank: queried + cached[rank] if queries_exclude_hits else queried
                    for rank, queried in queries.items()
                }
                return cached, queried
        return None

    def _hit_percent(
        self, bounds: tuple[float, float] | None, times: list[float]
    ) -> dict[str, float | None]:
        found = self._hit_tokens(bounds)
        if found is not None:
            cached, queried = found
            return {
                rank: _round(100.0 * cached[rank] / total) if total > 0 else None
                for rank, total in queried.items()
            }
        columns = self._gauge_columns(HIT_RATE_GAUGES, "mean", times)
        out: dict[str, float | None] = {}
        for rank, column in columns.items():
            values = [v for v in column if v is not None]
            out[rank] = _round(100.0 * _mean(values)) if values else None
        return out

    def _quantiles(
        self, candidates: Sequence[str], bounds: tuple[float, float] | None
    ) -> dict[str, dict[str, float | None]]:
        found = self._chosen(candidates, "histogram")
        if not found or bounds is None:
            return {}
        buckets: dict[str, dict[float, float]] = {}
        for entry in found:
            per_le = buckets.setdefault(entry.rank, {})
            assert entry.le is not None
            per_le[entry.le] = per_le.get(entry.le, 0.0) + self._increase(entry, bounds)
        out = {}
        for rank, per_le in sorted(buckets.items(), key=_by_rank):
            ordered = sorted(per_le.items())
            out[rank] = {name: _round(histogram_quantile(q, ordered)) for name, q in QUANTILES}
        return out


# --- the arithmetic ----------------------------------------------------------------------


def counter_increase(values: Sequence[float]) -> float:
    """Increase across successive samples of a counter; a drop is a restart from zero."""
    total = 0.0
    previous = values[0] if values else 0.0
    for value in values[1:]:
        total += value - previous if value >= previous else value
        previous = value
    return total


def histogram_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """The q-quantile of cumulative buckets ``(upper bound, count)`` sorted by bound and
    ending with ``+Inf``, interpolated linearly inside its bucket (PromQL's rule); None
    when there are no observations or no ``+Inf`` bucket."""
    if not buckets or buckets[-1][0] != math.inf:
        return None
    counts: list[float] = []
    for _, count in buckets:  # bucket increases can come out unordered; restore the order
        counts.append(max(count, counts[-1]) if counts else count)
    total = counts[-1]
    if total <= 0 or not 0.0 <= q <= 1.0:
        return None
    rank = q * total
    index = bisect.bisect_left(counts, rank)
    if index == len(buckets) - 1:  # in +Inf: the largest finite bound is all we know
        return buckets[-2][0] if len(buckets) > 1 else None
    upper = buckets[index][0]
    lower = buckets[index - 1][0] if index > 0 else 0.0
    if index == 0 and upper <= 0:
        return upper
    below = counts[index - 1] if index > 0 else 0.0
    inside = counts[index] - below
    if inside <= 0:
        return upper
    return lower + (upper - lower) * (rank - below) / inside


def gauge_stats(values: Sequence[float]) -> dict[str, float | None]:
    """mean, p50, p99, max and min of gauge samples (percentiles: docs/metrics.md's rule)."""
    if not values:
        return {"mean": None, "p50": None, "p99": None, "max": None, "min": None}
    ordered = sorted(values)
    return {
        "mean": _round(_mean(ordered)),
        "p50": _round(percentile(ordered, 0.5)),
        "p99": _round(percentile(ordered, 0.99)),
        "max": _round(ordered[-1]),
        "min": _round(ordered[0]),
    }


def _mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values)


def _round(value: float | None) -> float | None:
    if value is None or not math.isfinite(value):
        return None
    return round(value, 6)


def _bound(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        return None


def _nearest(times: Sequence[float], t: float) -> int:
    """Index of the time nearest ``t`` (the earlier one on a tie)."""
    index = bisect.bisect_left(times, t)
    if index == 0:
        return 0
    if index == len(times):
        return index - 1
    return index - 1 if t - times[index - 1] <= times[index] - t else index


def _downsample(count: int, limit: int) -> list[int]:
    """At most ``limit`` evenly spread indices of ``count`` points, first and last kept."""
    if count <= limit:
        return list(range(count))
    step = (count - 1) / (limit - 1)
    return [round(i * step) for i in range(limit)]


def _by_rank(item: tuple[str, Any]) -> tuple[int, int, str]:
    return rank_order(item[0])
