"""Re-judging a stored step against other objectives (a changed ``--slo`` on the same
``--output-dir``), from what its results JSON holds, without running it again.

A step's results JSON keeps its window's SLO outcomes, its latency statistics, the number
of failed requests and the window's CDFs of TTFT, ITL and request latency
(``distributions``: every sample while the window holds at most 1000 of them, evenly
spaced ranks beyond). An objective is re-judged:

- as stored, when the step was judged against the same objective (same name and limit);
- a TTFT or request-latency limit: from the CDF when it holds every sample (its length
  equals the statistics' count), as the run judges it (a failed request is a sample
  beyond the limit);
- an ITL limit: likewise, when the step was judged on some ITL objective too (which gives
  the number of streamed requests with gaps: the interval counts requests, not gaps);
- goodput: from the window's good requests when their thresholds are the new ones.

Anything else (a speed floor, a CDF that was thinned, goodput under other thresholds)
cannot be re-judged, and the step is measured again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from batchbench.results.confidence import combine_verdicts
from batchbench.results.slo import SPEED_METRICS, Objective
from batchbench.results.window import goodput_outcome, limit_outcome

_DISTRIBUTION_KEYS = {"ttft": "ttft_ms", "itl": "itl_ms", "e2e": "e2e_ms"}


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _same(stored: dict[str, Any], objective: Objective) -> bool:
    if stored.get("objective") != objective.name:
        return False
    if objective.metric == "goodput":
        return stored.get("quantile") == objective.quantile
    if objective.at_least:
        return stored.get("limit_tokens_per_second") == objective.minimum
    return stored.get("limit_ms") == objective.limit_ms


def _exact_values(document: dict[str, Any], key: str) -> list[float] | None:
    """Every window sample of ``key`` (sorted), or None when the CDF is thinned or absent."""
    cdf = _mapping(_mapping(document.get("distributions")).get(key))
    values = cdf.get("values")
    stats = _mapping(_mapping(_mapping(document.get("window")).get("latency")).get(key))
    count = stats.get("count")
    if not isinstance(values, list) or not isinstance(count, int) or len(values) != count:
        return None
    if not all(isinstance(v, int | float) for v in values):
        return None
    return sorted(float(v) for v in values)


def _limit_outcome(
    objective: Objective, document: dict[str, Any], effective: int | None
) -> dict[str, Any] | None:
    window = _mapping(document.get("window"))
    values = _exact_values(document, _DISTRIBUTION_KEYS[objective.metric])
    failed = window.get("failed_requests")
    if values is None or not isinstance(failed, int):
        return None
    if objective.metric != "itl":
        effective = None  # only ITL counts requests instead of samples
    elif effective is None:
        return None
    return asdict(limit_outcome(objective, values, failed, effective))


def _goodput_outcome(
    objective: Objective, window: dict[str, Any], thresholds: Sequence[tuple[str, float]]
) -> dict[str, Any] | None:
    goodput = _mapping(window.get("goodput"))
    stored = {
        **_mapping(goodput.get("thresholds_ms")),
        **_mapping(goodput.get("thresholds_tokens_per_second")),
    }
    good, n = goodput.get("good_requests"), window.get("requests")
    if stored != dict(thresholds) or not isinstance(good, int) or not isinstance(n, int):
        return None
    return asdict(goodput_outcome(objective, good, n))


def rejudged_window(
    document: dict[str, Any],
    objectives: Sequence[Objective],
    goodput_thresholds: Sequence[tuple[str, float]],
) -> dict[str, Any] | None:
    """The step's window (``document["window"]``) judged against ``objectives``: its
    ``slo`` and ``slo_verdict`` replaced; None when one of them cannot be judged from what
    the document holds."""
    window = _mapping(document.get("window"))
    if not window:
        return None
    stored = [o for o in window.get("slo") or [] if isinstance(o, dict)]
    failed = window.get("failed_requests")
    itl = next((o for o in stored if o.get("metric") == "itl"), None)
    effective = None
    if itl is not None and isinstance(itl.get("samples"), int) and isinstance(failed, int):
        effective = itl["samples"] - failed
    outcomes = []
    for objective in objectives:
        same = next((o for o in stored if _same(o, objective)), None)
        if same is not None:
            outcomes.append(same)
            continue
        if objective.metric == "goodput":
            outcome = _goodput_outcome(objective, window, goodput_thresholds)
        elif objective.metric in SPEED_METRICS or objective.metric not in _DISTRIBUTION_KEYS:
            outcome = None
        else:
            outcome = _limit_outcome(objective, document, effective)
        if outcome is None:
            return None
        outcomes.append(outcome)
    verdict = combine_verdicts([str(o.get("verdict")) for o in outcomes])
    return {**window, "slo": outcomes, "slo_verdict": verdict}
