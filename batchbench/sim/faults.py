"""Deterministic fault injection: which fault (if any) hits the n-th request.

Request n (counted from 0 in arrival order over the whole server) draws two uniforms from
a counter-based stream of ``--fault-seed``: the first picks at most one failure kind, by
laying the kinds' rates end to end on [0, 1) in a fixed order; the second decides an
independent latency spike. The same seed and the same arrival order give the same faults,
so a failing run can be replayed exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from batchbench.rng import MASK64, mix_seed

_FAULT_STREAM = 0xFA017
_SPIKE_STREAM = 0x5B1CE


class Fault(Enum):
    """A failure kind, named as in ``/metrics`` (``batchbench_sim_faults_total{kind=...}``)."""

    ERROR = "error"  # an HTTP error status from --fault-error-statuses
    RATE_LIMIT = "rate_limit"  # 429 with Retry-After
    DROP = "drop"  # the connection is closed mid-response
    TRUNCATE = "truncate"  # a stream ends early: no usage chunk, no [DONE]
    MALFORMED = "malformed"  # a 200 whose body (or a stream chunk) is not JSON
    MISSING_USAGE = "missing_usage"  # a 200 without usage (streams: no usage chunk)


FAULT_ORDER = (
    Fault.ERROR,
    Fault.RATE_LIMIT,
    Fault.DROP,
    Fault.TRUNCATE,
    Fault.MALFORMED,
    Fault.MISSING_USAGE,
)


def _uniform(seed: int, stream: int, n: int) -> float:
    """Draw n of a stream, in [0, 1): splitmix64 of a counter, top 53 bits."""
    z = (mix_seed(seed, n, stream) + 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    z ^= z >> 31
    return (z >> 11) / float(1 << 53)


@dataclass(frozen=True)
class FaultDecision:
    """What happens to one request: a failure kind (or None) and extra latency in ms."""

    fault: Fault | None
    status: int = 0
    spike_ms: float = 0.0


@dataclass
class FaultPlan:
    """Rates per kind (each in [0, 1], summing to at most 1) and the fault parameters."""

    seed: int = 0
    rates: dict[Fault, float] = field(default_factory=dict)
    error_statuses: tuple[int, ...] = (500, 503)
    retry_after_seconds: int = 1
    spike_rate: float = 0.0
    spike_ms: float = 0.0

    def __post_init__(self) -> None:
        total = sum(self.rates.values())
        if total > 1.0 + 1e-12:
            raise ValueError(f"fault rates add up to {total:g}; their sum must be at most 1")
        for kind, rate in self.rates.items():
            if not 0.0 <= rate <= 1.0:
                raise ValueError(f"fault rate for {kind.value} must be in [0, 1], got {rate:g}")
        if not 0.0 <= self.spike_rate <= 1.0:
            raise ValueError(f"latency spike rate must be in [0, 1], got {self.spike_rate:g}")
        if not self.error_statuses:
            raise ValueError("at least one error status is needed")

    @property
    def active(self) -> bool:
        return any(self.rates.values()) or (self.spike_rate > 0 and self.spike_ms > 0)

    def decide(self, n: int) -> FaultDecision:
        """The fault of request ``n`` (0-based arrival index)."""
        if not self.active:
            return _NONE
        spike = 0.0
        if self.spike_rate > 0 and _uniform(self.seed, _SPIKE_STREAM, n) < self.spike_rate:
            spike = self.spike_ms
        draw = _uniform(self.seed, _FAULT_STREAM, n)
        edge = 0.0
        for kind in FAULT_ORDER:
            edge += self.rates.get(kind, 0.0)
            if draw < edge:
                status = 0
                if kind is Fault.ERROR:
                    pick = int(_uniform(self.seed, _FAULT_STREAM + 1, n) * len(self.error_statuses))
                    status = self.error_statuses[pick]
                elif kind is Fault.RATE_LIMIT:
                    status = 429
                return FaultDecision(kind, status, spike)
        return FaultDecision(None, 0, spike) if spike else _NONE


_NONE = FaultDecision(None)
