"""The estimate printed before a search's first step: how many samples each objective
needs per step (``least_samples``, docs/capacity.md "How many samples an objective needs"),
the rate at which a short probe at ``--min-agents`` measured them, and so how long a step
and the search's doubling steps take, with a cheaper alternative when a step needs more
than its window: a lower percentile, or a larger ``--min-agents``.

Pure functions of the probe's window, so tests check the arithmetic exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from batchbench.capacity.search import Bounds
from batchbench.capacity.steps import WindowPlan, least_samples
from batchbench.results.documents import WindowView
from batchbench.results.slo import Objective

# Lower shares offered as a cheaper objective (p99, p95, p90, p50 for a limit; p1, p5, p10,
# p50 for a floor): the highest that needs at most a tenth of the samples (p99.9 -> p99,
# p99 -> p90, p95 and p90 -> p50).
CHEAPER_SHARES = (0.99, 0.95, 0.90, 0.50)
CHEAPER_FACTOR = 10


def duration_words(seconds: float) -> str:
    """``2.5 s``, ``35 s``, ``16 min``, ``1.6 min``, ``1 h 20 min``: a rough duration."""
    if seconds < 9.95:
        return f"{seconds:.1f} s"
    if seconds < 60.0:
        return f"{seconds:.0f} s"
    minutes = seconds / 60.0
    if minutes < 10.0:
        return f"{minutes:.1f} min"
    if minutes < 60.0:
        return f"{minutes:.0f} min"
    hours, rest = divmod(round(minutes), 60)
    return f"{hours} h {rest} min" if rest else f"{hours} h"


@dataclass(frozen=True, slots=True)
class ObjectiveEstimate:
    """One objective's estimate (the capacity document's ``estimate`` entries)."""

    objective: str  # ttft_p99
    samples_needed: int  # per step, to pass (all within the limit)
    samples_per_second: float  # measured by the probe at ``agents``
    agents: int
    step_seconds: float | None  # warm-up + the window that holds the samples (None: no rate)
    search_seconds: float | None  # the doubling steps to --max-agents, rate growing with agents
    doubling_steps: int  # the steps search_seconds counts (a sweep's caps)
    cheaper_objective: str | None = None
    cheaper_samples: int | None = None
    cheaper_step_seconds: float | None = None
    cheaper_min_agents: int | None = None
    cheaper_min_agents_step_seconds: float | None = None
    sweep: bool = False  # the steps are a --sweep's caps, not the doubling phase

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}

    def text(self, probe_seconds: float) -> str:
        """``Estimate: ttft_p99 needs 381 samples per step; at ~0.40 samples/s (1 agent) a
        step takes ~16 min, the search's 11 doubling steps ~35 min if the rate grows with
        the agents. Cheaper: ...``"""
        head = f"Estimate: {self.objective} needs {self.samples_needed} samples per step; "
        plural = "s" if self.agents != 1 else ""
        if self.step_seconds is None or self.search_seconds is None:
            return head + (
                f"the {probe_seconds:g} s probe at {self.agents} agent{plural} measured none, "
                "so a step may take far longer than its window"
            )
        steps = f"{self.doubling_steps} {'' if self.sweep else 'doubling '}step" + (
            "s" if self.doubling_steps != 1 else ""
        )
        text = head + (
            f"at ~{self.samples_per_second:.2f} samples/s ({self.agents} agent{plural}) a step "
            f"takes ~{duration_words(self.step_seconds)}, the {'sweep' if self.sweep else 'search'}"
            f"'s {steps} ~{duration_words(self.search_seconds)} if the rate grows with the "
            "agents"
        )
        cheaper = []
        if self.cheaper_objective is not None:
            assert self.cheaper_step_seconds is not None
            cheaper.append(
                f"{self.cheaper_objective} ({self.cheaper_samples} samples, "
                f"~{duration_words(self.cheaper_step_seconds)}/step)"
            )
        if self.cheaper_min_agents is not None:
            assert self.cheaper_min_agents_step_seconds is not None
            cheaper.append(
                f"--min-agents {self.cheaper_min_agents} "
                f"(~{duration_words(self.cheaper_min_agents_step_seconds)}/step)"
            )
        return text + (". Cheaper: " + " or ".join(cheaper) if cheaper else "")


def doubling_caps(bounds: Bounds) -> list[int]:
    """The caps of the doubling phase when every step passes: min, 2 x min, ..., max."""
    caps = [bounds.min_agents]
    while caps[-1] < bounds.max_agents:
        caps.append(min(caps[-1] * 2, bounds.max_agents))
    return caps


def _step_seconds(needed: int, rate: float, plan: WindowPlan) -> float:
    """A step's time: its warm-up, then its window or, when that holds fewer samples than
    needed at ``rate``, the window that holds them (an extension's length)."""
    window = needed / rate
    if plan.seconds is not None:
        window = max(window, plan.seconds)
    return plan.warmup + window


def _fits(needed: int, rate: float, plan: WindowPlan) -> bool:
    return plan.seconds is None or needed / rate <= plan.seconds


def estimate_objective(
    objective: Objective,
    samples: int,
    probe_seconds: float,
    agents: int,
    bounds: Bounds,
    plan: WindowPlan,
    sweep: tuple[int, ...] | None = None,
) -> ObjectiveEstimate:
    """The estimate for one objective from its ``samples`` in the probe; ``sweep``: the
    caps of a --sweep, whose steps are the search."""
    needed = least_samples(objective.required)
    caps = list(sweep) if sweep is not None else doubling_caps(bounds)
    rate = samples / probe_seconds if probe_seconds > 0 else 0.0
    if rate <= 0.0:
        return ObjectiveEstimate(
            objective.name, needed, 0.0, agents, None, None, len(caps), sweep=sweep is not None
        )
    step = _step_seconds(needed, rate, plan)
    per_agent = rate / agents
    search = sum(_step_seconds(needed, per_agent * cap, plan) for cap in caps)
    result = ObjectiveEstimate(
        objective.name, needed, rate, agents, step, search, len(caps), sweep=sweep is not None
    )
    if _fits(needed, rate, plan):
        return result
    changes: dict[str, Any] = {}
    if objective.metric != "goodput":
        share = next(
            (
                share
                for share in CHEAPER_SHARES
                if share < objective.required and least_samples(share) * CHEAPER_FACTOR <= needed
            ),
            None,
        )
        if share is not None:
            quantile = round(1.0 - share, 12) if objective.at_least else share
            cheaper = replace(objective, quantile=quantile)
            cheaper_needed = least_samples(share)
            changes.update(
                cheaper_objective=cheaper.name,
                cheaper_samples=cheaper_needed,
                cheaper_step_seconds=_step_seconds(cheaper_needed, rate, plan),
            )
    # the smallest doubling cap whose samples fit in the window, if the rate grows with it
    larger = next(
        (cap for cap in doubling_caps(bounds)[1:] if _fits(needed, per_agent * cap, plan)),
        None,
    )
    if larger is not None:
        changes.update(
            cheaper_min_agents=larger,
            cheaper_min_agents_step_seconds=_step_seconds(needed, per_agent * larger, plan),
        )
    return replace(result, **changes)


def estimate(
    window: dict[str, Any] | None,
    objectives: tuple[Objective, ...],
    probe_seconds: float,
    agents: int,
    bounds: Bounds,
    plan: WindowPlan,
    sweep: tuple[int, ...] | None = None,
) -> list[ObjectiveEstimate]:
    """Every objective's estimate from the probe's window (its ``slo`` outcomes count the
    samples; an objective the window does not list measured none)."""
    outcomes = {str(o.objective): o for o in WindowView.read(window).slo}
    found = []
    for objective in objectives:
        outcome = outcomes.get(objective.name)
        samples = outcome.samples if outcome is not None else None
        count = int(samples) if isinstance(samples, int | float) and math.isfinite(samples) else 0
        found.append(
            estimate_objective(objective, count, probe_seconds, agents, bounds, plan, sweep)
        )
    return found
