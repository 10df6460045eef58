"""The capacity search as a pure state machine: which active-agent cap to try next, given
the verdicts so far.

Doubling from ``min_agents`` finds a cap that breaks the objectives quickly (a handful of
steps even for thousands of agents); bisection between the highest cap that held and the
lowest that broke then narrows the answer to ``resolution`` agents. A step that could not be
judged (unresolved after its extensions) or that measured the client rather than the server
(client-bound) stops the search where it is: concluding from it would give a number the
measurements do not support.

The step itself is a parameter (``run_search(search, step, ...)``), so the same code drives
real runs, a resumed output directory, or a test's fake server.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeGuard

PASS = "pass"
FAIL = "fail"
UNRESOLVED = "unresolved"
CLIENT_BOUND = "client-bound"
MEASURED = "measured"  # a --sweep step without objectives: figures, no verdict
VERDICTS = (PASS, FAIL, UNRESOLVED, CLIENT_BOUND, MEASURED)
# The note of a step --max-time stopped while it ran: what it measured is kept, but it is
# not judged (it is unresolved whatever its figures say) and a resume measures it again.
OUT_OF_TIME = "stopped by --max-time"

DOUBLING = "doubling"
BISECTION = "bisection"
SWEEP = "sweep"


@dataclass(frozen=True, slots=True)
class Bounds:
    """The search's limits, as ``--min-agents``, ``--max-agents`` and ``--resolution``."""

    min_agents: int = 1
    max_agents: int = 1024
    resolution: int = 1

    def __post_init__(self) -> None:
        if self.min_agents < 1:
            raise ValueError("--min-agents must be at least 1")
        if self.max_agents < self.min_agents:
            raise ValueError(
                f"--max-agents ({self.max_agents}) must be at least --min-agents "
                f"({self.min_agents})"
            )
        if self.resolution < 1:
            raise ValueError("--resolution must be at least 1")


@dataclass(slots=True)
class StepRecord:
    """One finished step (or one attempt of it, before an extension): what ran and how it
    was judged. ``window`` is the step run's results JSON "window" object."""

    agents: int
    phase: str  # doubling or bisection
    verdict: str  # pass, fail, unresolved or client-bound
    extensions: int = 0  # how many times the window was extended
    window: dict[str, Any] | None = None
    results_json: str | None = None  # file name inside the output directory
    note: str | None = None  # why a verdict did not come from the objectives
    resumed: bool = False  # read back from an earlier search, not run now
    # the window this attempt was planned with (seconds, or trajectories); None when read
    # from a document that did not record it
    window_seconds: float | None = None
    window_trajectories: int | None = None

    def as_dict(self) -> dict[str, Any]:
        """The capacity document's step entry."""
        entry: dict[str, Any] = {
            "agents": self.agents,
            "results_json": self.results_json,
            "phase": self.phase,
            "verdict": self.verdict,
            "extensions": self.extensions,
            "window_seconds": self.window_seconds,
            "window_trajectories": self.window_trajectories,
            "window": self.window,
        }
        if self.note is not None:
            entry["note"] = self.note
        return entry

    @classmethod
    def from_dict(cls, entry: dict[str, Any]) -> StepRecord:
        """A step entry of a capacity document (ValueError when it is not one)."""
        agents, verdict = entry.get("agents"), entry.get("verdict")
        extensions = entry.get("extensions", 0)
        if not isinstance(agents, int) or isinstance(agents, bool) or agents < 1:
            raise ValueError("a step without a positive integer agents")
        if verdict not in VERDICTS:
            raise ValueError(f"step {agents}: unknown verdict {verdict!r}")
        if not isinstance(extensions, int) or extensions < 0:
            raise ValueError(f"step {agents}: bad extensions {extensions!r}")
        window = entry.get("window")
        note = entry.get("note")
        name = entry.get("results_json")
        seconds, trajectories = entry.get("window_seconds"), entry.get("window_trajectories")
        phase = entry.get("phase")
        return cls(
            agents=agents,
            phase=phase if phase in (DOUBLING, BISECTION, SWEEP) else DOUBLING,
            verdict=verdict,
            extensions=extensions,
            window=window if isinstance(window, dict) else None,
            results_json=name if isinstance(name, str) else None,
            note=note if isinstance(note, str) else None,
            window_seconds=float(seconds) if _positive(seconds) else None,
            window_trajectories=trajectories
            if _positive(trajectories) and isinstance(trajectories, int)
            else None,
        )


def _positive(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0


@dataclass
class Search:
    """Where the search stands. Feed it verdicts with ``record``; ask ``next_agents``."""

    bounds: Bounds
    steps: list[StepRecord] = field(default_factory=list)
    highest_pass: int | None = None
    lowest_fail: int | None = None
    stopped_by: StepRecord | None = None  # the unresolved or client-bound step
    # why the search ended before its steps said so ("max-time"), and the sentence saying
    # when; None otherwise
    stop_reason: str | None = None
    stop_text: str | None = None
    sweep: tuple[int, ...] | None = None  # --sweep: the caps measured, instead of a search

    def next_agents(self) -> int | None:
        """The cap to try next; None when the search is over."""
        if self.stop_reason is not None or self.stopped_by is not None:
            return None
        if self.sweep is not None:
            done = {s.agents for s in self.steps}
            return next((cap for cap in self.sweep if cap not in done), None)
        low, high = self.highest_pass, self.lowest_fail
        bounds = self.bounds
        if high is None:  # doubling
            if low is None:
                return bounds.min_agents
            if low >= bounds.max_agents:
                return None
            return min(low * 2, bounds.max_agents)
        if low is None:  # the smallest cap already broke the objectives
            return None
        if high - low <= bounds.resolution:
            return None
        return (low + high) // 2

    @property
    def phase(self) -> str:
        """The phase of the next step: doubling until a step fails, then bisection (or
        sweep)."""
        if self.sweep is not None:
            return SWEEP
        return DOUBLING if self.lowest_fail is None else BISECTION

    def record(self, step: StepRecord) -> None:
        """A finished step's verdict moves the bounds, or stops the search."""
        self.steps.append(step)
        if step.verdict == PASS:
            if self.highest_pass is None or step.agents > self.highest_pass:
                self.highest_pass = step.agents
        elif step.verdict == FAIL:
            if self.lowest_fail is None or step.agents < self.lowest_fail:
                self.lowest_fail = step.agents
        elif step.verdict == MEASURED:
            pass
        elif self.sweep is None or step.note == OUT_OF_TIME:
            self.stopped_by = step  # a sweep measures on past what it could not judge

    @property
    def concluded(self) -> bool:
        """True once the steps answer the question (the search ended without a step that
        could not be judged)."""
        return self.stopped_by is None and self.stop_reason is None and self.next_agents() is None

    def step_at(self, agents: int | None) -> StepRecord | None:
        """The last recorded step with this many agents."""
        if agents is None:
            return None
        return next((s for s in reversed(self.steps) if s.agents == agents), None)


StepFunction = Callable[[int, str, int, "StepRecord | None"], StepRecord]
"""``step(agents, phase, extension, previous) -> StepRecord``: run (or read back) one step;
``previous`` is the unresolved attempt that ``extension`` extends (None for extension 0),
whose figures size the longer window. It may return a record with more extensions than
asked (an earlier search already extended it)."""

Listener = Callable[[StepRecord, Search, bool], None]
"""Called after every attempt: the record, the search, and whether the step is final."""


def run_search(
    search: Search, step: StepFunction, max_extensions: int, listener: Listener | None = None
) -> Search:
    """Drive the search (or the sweep, ``search.sweep``) to its end: each step once, an
    unresolved one again with a longer window up to ``max_extensions`` times. Returns
    ``search`` (also updated in place)."""
    while (agents := search.next_agents()) is not None:
        phase = search.phase
        extension = 0
        previous: StepRecord | None = None
        while True:
            record = step(agents, phase, extension, previous)
            final = (
                record.verdict != UNRESOLVED
                or record.extensions >= max_extensions
                or record.note == OUT_OF_TIME
            )
            if final:
                search.record(record)
            if listener is not None:
                listener(record, search, final)
            if final:
                break
            extension = record.extensions + 1
            previous = record
    return search


def sweep_caps(bounds: Bounds, count: int) -> tuple[int, ...]:
    """``--sweep N``: N caps evenly spaced from ``min_agents`` to ``max_agents`` (both
    included, rounded to whole agents; fewer when the range has fewer than N caps)."""
    if count < 1:
        raise ValueError("--sweep must be at least 1")
    low, high = bounds.min_agents, bounds.max_agents
    if count == 1:
        return (low,)
    return tuple(sorted({round(low + i * (high - low) / (count - 1)) for i in range(count)}))
