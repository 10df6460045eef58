"""Size and latency specs for the sampled workload mode (fixed or log-normal, per flag family)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from batchbench.errors import UsageError
from batchbench.plan.limits import MAX_REQUEST_TOKENS
from batchbench.rng import standard_normal


@dataclass(frozen=True)
class FixedSpec:
    """Every draw returns ``value``."""

    value: int

    def describe(self, unit: str = "") -> str:
        return f"{self.value}{unit} (fixed)"


@dataclass(frozen=True)
class LogNormalSpec:
    """exp(N(mu, sigma)), rounded half away from zero, floored at 1, capped at ``cap``."""

    mu: float
    sigma: float
    cap: int | None = None

    def describe(self, unit: str = "") -> str:
        cap = "" if self.cap is None else f", max={self.cap}{unit}"
        median = f"{math.exp(self.mu):.0f}"
        return (
            f"lognormal(median≈{median}{unit}, σ={short_float(self.sigma)}{cap}; μ={self.mu:.3f})"
        )


SizeSpec = FixedSpec | LogNormalSpec


def short_float(value: float) -> str:
    """Shortest decimal form without a trailing ``.0``, as the banner prints it: 1, 0.5, 1000."""
    text = repr(float(value))
    if text.endswith(".0"):
        text = text[:-2]
    return text


def sample_sizes(spec: SizeSpec, seed: int, count: int, label: str) -> np.ndarray:
    """``count`` draws of ``spec`` from the stream ``seed`` as int64 (draw k is fixed by k)."""
    if isinstance(spec, FixedSpec):
        values = np.full(count, spec.value, dtype=np.int64)
    else:
        with np.errstate(over="ignore"):
            drawn = np.exp(spec.mu + spec.sigma * standard_normal(seed, count))
        if count and not np.all(np.isfinite(drawn)):
            raise UsageError(f"{label} log-normal distribution produced a non-finite sample")
        values = round_samples(drawn, spec.cap)
    if label != "tool-invocations" and count and int(values.max()) > MAX_REQUEST_TOKENS:
        advice = (
            f"lower --{label}-tokens"
            if isinstance(spec, FixedSpec)
            else f"cap it with --{label}-lognorm-max"
        )
        raise UsageError(
            f"{label} size {int(values.max())} tokens is more than one request can hold "
            f"(at most {MAX_REQUEST_TOKENS}); {advice}"
        )
    return values


def round_samples(values: np.ndarray, cap: int | None) -> np.ndarray:
    """Round half away from zero (not to even), floor at 1, cap at ``cap``, as int64."""
    rounded = np.maximum(np.floor(values + 0.5), 1.0)
    if cap is not None:
        rounded = np.minimum(rounded, float(cap))
    # Values beyond int64 are capped there: such a sample is unusable either way.
    return np.minimum(rounded, float(2**62)).astype(np.int64)


@dataclass(frozen=True)
class FamilyFlags:
    """What the user typed for one size family (None = flag not given)."""

    fixed: int | None = None
    mu: float | None = None
    median: float | None = None
    sigma: float | None = None
    cap: int | None = None

    @property
    def any_lognormal(self) -> bool:
        return any(v is not None for v in (self.mu, self.median, self.sigma, self.cap))


def _lognormal(
    mu: float | None, median: float | None, sigma: float, cap: int | None
) -> LogNormalSpec:
    if median is not None:
        if not math.isfinite(median) or median <= 0:
            raise UsageError("log-normal median must be greater than zero")
        mu = math.log(median)
    assert mu is not None
    if not math.isfinite(mu):
        raise UsageError("sample log-normal mu must be finite")
    if not math.isfinite(sigma) or sigma <= 0:
        raise UsageError("sample log-normal sigma must be greater than zero")
    if cap is not None and cap == 0:
        raise UsageError("sample log-normal max must be greater than zero")
    return LogNormalSpec(mu=mu, sigma=sigma, cap=cap)


def resolve_size_spec(label: str, flags: FamilyFlags, default: int) -> SizeSpec:
    """Resolve one flag family, checking conflicts first, then fixed, default, log-normal;
    messages use the primary flag names."""
    fixed_flag = "--tool-invocations" if label == "tool-invocations" else f"--{label}-tokens"
    if flags.fixed is not None and flags.any_lognormal:
        raise UsageError(f"{fixed_flag} cannot be combined with --{label}-lognorm-* flags")
    if flags.mu is not None and flags.median is not None:
        raise UsageError(
            f"provide either --{label}-lognorm-mu or --{label}-lognorm-median, not both"
        )
    if flags.fixed is not None:
        if flags.fixed <= 0:
            raise UsageError(f"invalid fixed {label} value: sample must be greater than zero")
        return FixedSpec(flags.fixed)
    if not flags.any_lognormal:
        return FixedSpec(default)
    if flags.sigma is None:
        raise UsageError(f"--{label}-lognorm-sigma is required for log-normal sampling")
    if flags.mu is None and flags.median is None:
        raise UsageError(
            f"--{label}-lognorm-median or --{label}-lognorm-mu is required for log-normal sampling"
        )
    return _lognormal(flags.mu, flags.median, flags.sigma, flags.cap)


def resolve_latency_spec(flags: FamilyFlags) -> SizeSpec | None:
    """The tool-call latency spec; None means disabled (no flag, or an explicit 0)."""
    if flags.fixed is not None and flags.any_lognormal:
        raise UsageError(
            "--tool-call-latency-ms cannot be combined with --tool-call-latency-lognorm-* flags"
        )
    if flags.mu is not None and flags.median is not None:
        raise UsageError(
            "provide either --tool-call-latency-lognorm-mu or "
            "--tool-call-latency-lognorm-median-ms, not both"
        )
    if flags.fixed is not None:
        return FixedSpec(flags.fixed) if flags.fixed > 0 else None
    if not flags.any_lognormal:
        return None
    if flags.sigma is None:
        raise UsageError(
            "--tool-call-latency-lognorm-sigma is required for log-normal latency sampling"
        )
    if flags.mu is None and flags.median is None:
        raise UsageError(
            "--tool-call-latency-lognorm-median-ms or --tool-call-latency-lognorm-mu "
            "is required for log-normal latency sampling"
        )
    return _lognormal(flags.mu, flags.median, flags.sigma, flags.cap)


def describe_latency(spec: SizeSpec | None) -> str:
    """The banner's ``Tool-call latency:`` value."""
    return "0 ms (fixed)" if spec is None else spec.describe(" ms")
