"""How sure a measured window is: a binomial interval on the share of samples within a limit,
and a distribution-free interval on a percentile.

An objective such as "TTFT p99 <= 2 s" holds exactly when at least 99 % of requests have a
TTFT of at most 2 s, so both kinds of objective (a percentile under a limit, or a share of
good requests above a ratio) are judged the same way: the Wilson score interval on the share
of samples that met the limit. Only when the whole interval lies on one side of the
required share is the verdict pass or fail; otherwise the window was too short to decide.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

Z_95 = 1.959963984540054  # two-sided 95 %

PASS = "pass"
FAIL = "fail"
UNRESOLVED = "unresolved"


def wilson_interval(successes: float, trials: int, z: float = Z_95) -> tuple[float, float]:
    """(low, high) of the Wilson score interval of a binomial proportion; (0, 1) for no
    trials. Unlike the normal approximation it stays inside [0, 1] and is honest near 0 and
    1, where SLO attainment lives."""
    if trials <= 0:
        return 0.0, 1.0
    p = successes / trials
    z2 = z * z
    denominator = 1.0 + z2 / trials
    centre = (p + z2 / (2.0 * trials)) / denominator
    half = z * math.sqrt(p * (1.0 - p) / trials + z2 / (4.0 * trials * trials)) / denominator
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == trials else min(1.0, centre + half)
    return low, high


def attainment_verdict(within: float, samples: int, required: float, z: float = Z_95) -> str:
    """pass when the whole interval on the share of samples within the limit is at or above
    ``required``; fail when it is wholly below; unresolved otherwise (or without samples)."""
    if samples <= 0:
        return UNRESOLVED
    low, high = wilson_interval(within, samples, z)
    if low >= required:
        return PASS
    if high < required:
        return FAIL
    return UNRESOLVED


def percentile_interval(
    sorted_values: Sequence[float], q: float, z: float = Z_95, effective: int | None = None
) -> tuple[float | None, float | None]:
    """A distribution-free confidence interval of the q-quantile: the order statistics whose
    ranks bound the binomial count of samples below it (normal approximation of the
    binomial). None for a bound that lies beyond the samples: too few to bound that side.
    ``effective``: the number of independent samples when values come in correlated groups
    (gaps of one request); the rank spread widens by n / effective."""
    n = len(sorted_values)
    if n == 0:
        return None, None
    m = n if effective is None or effective <= 0 else min(effective, n)
    spread = z * math.sqrt(m * q * (1.0 - q)) * (n / m)
    low_rank = math.floor(n * q - spread)  # 1-based ranks
    high_rank = math.ceil(n * q + spread) + 1
    low = sorted_values[low_rank - 1] if low_rank >= 1 else None
    high = sorted_values[high_rank - 1] if high_rank <= n else None
    return low, high


def combine_verdicts(verdicts: Sequence[str]) -> str | None:
    """fail when any objective failed, else unresolved when any is undecided, else pass;
    None without objectives."""
    if not verdicts:
        return None
    if FAIL in verdicts:
        return FAIL
    if UNRESOLVED in verdicts:
        return UNRESOLVED
    return PASS
