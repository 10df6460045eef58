"""Distributions of a workload's figures: nearest-rank percentiles and compact histograms.

A chart of a million requests needs a few hundred numbers, not one per request, so the
workload description keeps histograms (bin edges and counts) instead of the values.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise


@dataclass(frozen=True, slots=True)
class Percentiles:
    """Nearest-rank percentiles of ``count`` values (None when there are none).

    The p-th percentile is the ceil(p·n/100)-th smallest of the n values: the smallest value
    with at least p% of the values at or below it. It is always one of the values (nothing
    is interpolated), so percentiles of token counts are token counts.
    """

    count: int
    p50: float | None
    p90: float | None
    p99: float | None
    max: float | None


def percentiles(ordered: Sequence[float]) -> Percentiles:
    """The percentiles of values sorted in ascending order."""
    n = len(ordered)
    if n == 0:
        return Percentiles(0, None, None, None, None)

    def rank(p: int) -> float:
        return ordered[max((p * n + 99) // 100, 1) - 1]

    return Percentiles(n, rank(50), rank(90), rank(99), ordered[-1])


@dataclass(frozen=True, slots=True)
class Histogram:
    """Counts of values in consecutive bins: bin i holds edges[i] <= value < edges[i+1]
    (``len(edges) == len(counts) + 1``; both empty when there were no values)."""

    edges: tuple[float, ...]
    counts: tuple[int, ...]


def nice_width(raw: float) -> int:
    """The smallest of 1, 2, 5, 10, 20, 50, 100, ... that is at least ``raw``: bins a reader
    can add up in their head."""
    decade = 1
    while True:
        for step in (1, 2, 5):
            if decade * step >= raw:
                return decade * step
        decade *= 10


def _counts(ordered: Sequence[float], edges: Sequence[float]) -> tuple[int, ...]:
    cuts = [bisect_left(ordered, edge) for edge in edges]
    return tuple(high - low for low, high in pairwise(cuts))


def linear_histogram(ordered: Sequence[int], bins: int = 60) -> Histogram:
    """Integer values sorted ascending in at most ``bins + 1`` bins of one nice width, the
    first starting at a multiple of the width."""
    if not ordered:
        return Histogram((), ())
    low, high = ordered[0], ordered[-1]
    width = nice_width((high - low) / bins)
    start = low // width * width
    count = (high - start) // width + 1
    edges = tuple(start + i * width for i in range(count + 1))
    return Histogram(edges, _counts(ordered, edges))


def log_histogram(ordered: Sequence[float], per_decade: int = 5) -> Histogram:
    """Positive values sorted ascending in bins of equal width on a log scale, edges at
    10^(i/per_decade) (rounded to six significant digits)."""
    if not ordered:
        return Histogram((), ())
    low, high = ordered[0], ordered[-1]
    if low <= 0:
        raise ValueError("a log histogram takes positive values only")
    i = math.floor(math.log10(low) * per_decade)
    edges = [min(float(f"{10 ** (i / per_decade):.6g}"), low)]
    while edges[-1] <= high:
        i += 1
        edges.append(float(f"{10 ** (i / per_decade):.6g}"))
    return Histogram(tuple(edges), _counts(ordered, edges))
