"""Service-level objectives (``--slo``), per-request goodput thresholds (``--goodput``) and
the percentiles a run reports (``--percentiles``): parsing and their canonical text.

An objective is either a percentile of a latency under a limit (``ttft_p99=2s``: at least
99 % of requests reach their first token within 2 s), a low percentile of output speed
over a floor (``output_speed_p10>=30``: at least 90 % of requests generate at least 30
tokens/s), or a share of good requests (``goodput=95%``: at least 95 % of requests meet
every ``--goodput`` threshold). Durations need a unit so that "100" can never mean the
wrong thing; a speed is a number of output tokens per second.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from batchbench.errors import UsageError

# Latency metrics by name: what --slo and --goodput may name, and what each measures.
LATENCY_METRICS = {
    "ttft": "time to first token (streamed requests)",
    "itl": "gap between content chunks (for --goodput: the request's mean gap)",
    "tpot": "time per output token after the first (streamed requests)",
    "e2e": "request latency, send to last byte",
}
# Speed metrics: judged from below (``output_speed_p10>=30``, ``--goodput output_speed=30``).
SPEED_METRICS = {
    "output_speed": "output tokens / generation time (first to last content chunk), tokens/s",
}
GOODPUT_METRICS = (*LATENCY_METRICS, *SPEED_METRICS)
STREAMED_METRICS = ("ttft", "itl", "tpot", "output_speed")
UNIT_MS = {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60000.0}
DEFAULT_PERCENTILES = (50.0, 90.0, 95.0, 99.0, 99.9)
_DURATION = re.compile(r"^([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)(us|ms|s|m)$")
_OBJECTIVE = re.compile(r"^([a-z0-9_]+?)_p([0-9]*\.?[0-9]+)(>?)$")
_SPEED = re.compile(r"^([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(?:tok/s)?$")


@dataclass(frozen=True, slots=True)
class Objective:
    """One SLO: ``metric``'s ``quantile`` at most ``limit_ms``, (a speed metric) at least
    ``minimum`` tokens/s, or (metric "goodput") the share of good requests at least
    ``quantile``."""

    metric: str
    quantile: float  # 0.99 for p99; the required ratio for goodput
    limit_ms: float | None  # None for goodput and speeds
    minimum: float | None = None  # tokens/s: the floor of a speed objective

    @property
    def at_least(self) -> bool:
        """A lower bound (``output_speed_p10>=30``) rather than a limit."""
        return self.metric in SPEED_METRICS

    @property
    def required(self) -> float:
        """The share of requests that must meet the objective's bound: ``quantile`` for a
        limit (p99 ≤ 2 s: 99 % at most 2 s) and goodput, ``1 - quantile`` for a floor
        (p10 ≥ 30 tok/s: 90 % at least 30 tok/s)."""
        return round(1.0 - self.quantile, 12) if self.at_least else self.quantile

    @property
    def name(self) -> str:
        """``ttft_p99`` / ``goodput``: the objective's key in reports."""
        if self.metric == "goodput":
            return "goodput"
        return f"{self.metric}_{percentile_label(self.quantile * 100.0)}"

    @property
    def text(self) -> str:
        """The objective as --slo spells it (canonical units)."""
        if self.metric == "goodput":
            return f"goodput={_number(self.quantile * 100.0)}%"
        if self.at_least:
            return f"{self.name}>={_number(self.minimum or 0.0)}"
        return f"{self.name}={duration_text(self.limit_ms or 0.0)}"

    @property
    def human(self) -> str:
        """For sentences: ``TTFT p99 ≤ 2 s``, ``goodput ≥ 95%``."""
        if self.metric == "goodput":
            return f"goodput ≥ {_number(self.quantile * 100.0)}%"
        label = percentile_label(self.quantile * 100.0)
        if self.at_least:
            what = self.metric.replace("_", " ")
            return f"{what} {label} ≥ {speed_text(self.minimum or 0.0)}"
        return f"{self.metric.upper()} {label} ≤ {duration_text(self.limit_ms or 0.0, ' ')}"


def percentile_label(percent: float) -> str:
    """``p99``, ``p99.9``: the key a percentile has in the results JSON."""
    return f"p{_number(percent)}"


def _number(value: float) -> str:
    """Shortest text of a number that keeps every digit given (no exponent for these)."""
    if value == int(value):
        return str(int(value))
    return f"{value:.12f}".rstrip("0")


def duration_text(ms: float, separator: str = "") -> str:
    """A limit in its natural unit: ``2s``, ``100ms``, ``250us`` (``2 s`` with a space)."""
    if ms >= 1000.0 and (ms / 1000.0) == round(ms / 1000.0, 3):
        return f"{_number(round(ms / 1000.0, 3))}{separator}s"
    if ms >= 1.0 or ms == 0.0:
        return f"{_number(round(ms, 3))}{separator}ms"
    return f"{_number(round(ms * 1000.0, 3))}{separator}us"


def speed_text(tokens_per_second: float) -> str:
    """``30 tok/s``, ``12.5 tok/s``."""
    return f"{_number(round(tokens_per_second, 3))} tok/s"


def parse_speed(text: str, flag: str, item: str) -> float:
    """A floor in output tokens per second: ``30`` or ``30tok/s``."""
    match = _SPEED.match(text.strip())
    if match is None:
        raise UsageError(
            f'invalid {flag} "{item}": "{text}" needs a number of output tokens per second, '
            "for example 30"
        )
    value = float(match.group(1))
    if not math.isfinite(value):
        raise UsageError(f'invalid {flag} "{item}": the speed must be finite')
    if value <= 0:
        raise UsageError(f'invalid {flag} "{item}": the speed must be greater than zero')
    return value


def parse_duration_ms(text: str, flag: str, item: str) -> float:
    match = _DURATION.match(text.strip())
    if match is None:
        raise UsageError(
            f'invalid {flag} "{item}": "{text}" needs a number and a unit (us, ms, s or m), '
            "for example 2s or 100ms"
        )
    value = float(match.group(1)) * UNIT_MS[match.group(2)]
    if not math.isfinite(value):
        raise UsageError(f'invalid {flag} "{item}": the limit must be a finite duration')
    if value <= 0:
        raise UsageError(f'invalid {flag} "{item}": the limit must be greater than zero')
    return value


def _pairs(text: str, flag: str) -> list[tuple[str, str, str]]:
    items = [part.strip() for part in text.split(",") if part.strip()]
    if not items:
        raise UsageError(f"invalid {flag}: expected name=value[,name=value...]")
    pairs = []
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip() or not value.strip():
            raise UsageError(f'invalid {flag} "{item}": expected name=value')
        pairs.append((name.strip().lower(), value.strip(), item))
    return pairs


def parse_slo(text: str) -> tuple[Objective, ...]:
    """``ttft_p99=2s,itl_p99=100ms,goodput=95%`` -> objectives, in the order given."""
    objectives: list[Objective] = []
    seen: set[str] = set()
    for name, value, item in _pairs(text, "--slo"):
        name = "".join(name.split())  # "output_speed_p10 >= 30"
        if name == "goodput":
            objective = Objective("goodput", _ratio(value, item), None)
        else:
            match = _OBJECTIVE.match(name)
            metric = match.group(1) if match is not None else ""
            if metric not in LATENCY_METRICS and metric not in SPEED_METRICS:
                raise UsageError(
                    f'invalid --slo "{item}": expected METRIC_pPERCENTILE=DURATION with METRIC '
                    f"one of {', '.join(LATENCY_METRICS)} (e.g. ttft_p99=2s), "
                    "output_speed_pPERCENTILE>=TOKENS_PER_SECOND (e.g. output_speed_p10>=30), "
                    "or goodput=PERCENT"
                )
            assert match is not None
            at_least = match.group(3) == ">"
            if metric in SPEED_METRICS and not at_least:
                raise UsageError(
                    f'invalid --slo "{item}": {metric} is a floor: write '
                    f"{metric}_pPERCENTILE>=TOKENS_PER_SECOND (e.g. {metric}_p10>=30)"
                )
            if metric in LATENCY_METRICS and at_least:
                raise UsageError(
                    f'invalid --slo "{item}": {metric} is a limit: write '
                    f"{metric}_pPERCENTILE=DURATION (e.g. {metric}_p99=2s)"
                )
            percent = float(match.group(2))
            if not 0.0 < percent < 100.0:
                raise UsageError(f'invalid --slo "{item}": the percentile must be in (0, 100)')
            quantile = round(percent / 100.0, 12)
            if at_least:
                floor = parse_speed(value, "--slo", item)
                objective = Objective(metric, quantile, None, floor)
            else:
                objective = Objective(metric, quantile, parse_duration_ms(value, "--slo", item))
        if objective.name in seen:
            raise UsageError(f'invalid --slo "{item}": {objective.name} is given twice')
        seen.add(objective.name)
        objectives.append(objective)
    return tuple(objectives)


def _ratio(value: str, item: str) -> float:
    text = value.rstrip("%")
    try:
        number = float(text)
    except ValueError:
        number = math.nan
    ratio = number / 100.0 if value.endswith("%") else number
    if not 0.0 < ratio <= 1.0:
        raise UsageError(
            f'invalid --slo "{item}": goodput is a share of requests, e.g. 95% or 0.95'
        )
    return ratio


def parse_goodput(text: str) -> tuple[tuple[str, float], ...]:
    """``ttft=2s,itl=100ms,output_speed=30`` -> ((metric, limit), ...) in the order given:
    a latency's limit in ms (at most), a speed's floor in tokens/s (at least)."""
    thresholds: dict[str, float] = {}
    for name, value, item in _pairs(text, "--goodput"):
        if name not in GOODPUT_METRICS:
            raise UsageError(
                f'invalid --goodput "{item}": unknown metric "{name}" '
                f"(expected one of {', '.join(GOODPUT_METRICS)})"
            )
        if name in thresholds:
            raise UsageError(f'invalid --goodput "{item}": {name} is given twice')
        if name in SPEED_METRICS:
            thresholds[name] = parse_speed(value, "--goodput", item)
        else:
            thresholds[name] = parse_duration_ms(value, "--goodput", item)
    return tuple(thresholds.items())


def goodput_text(thresholds: tuple[tuple[str, float], ...]) -> str:
    return ",".join(
        f"{name}={_number(limit) if name in SPEED_METRICS else duration_text(limit)}"
        for name, limit in thresholds
    )


def slo_text(objectives: tuple[Objective, ...]) -> str:
    return ",".join(objective.text for objective in objectives)


def parse_percentiles(text: str) -> tuple[float, ...]:
    """``50,90,99.9`` -> sorted unique percentiles in (0, 100]."""
    values: set[float] = set()
    for part in text.split(","):
        part = part.strip().rstrip("%").lstrip("pP")
        if not part:
            continue
        try:
            value = float(part)
        except ValueError:
            raise UsageError(f'invalid --percentiles "{text}": "{part}" is not a number') from None
        if not 0.0 < value <= 100.0:
            raise UsageError(f'invalid --percentiles "{text}": {part} is not in (0, 100]')
        values.add(value)
    if not values:
        raise UsageError(f'invalid --percentiles "{text}": expected e.g. 50,90,95,99,99.9')
    return tuple(sorted(values))
