"""Running one step of the capacity search: the same workload at one active-agent cap, a
warm-up left out, a fixed measured window, judged by the run's own window figures.

A step is an ordinary ``batchbench.api.run`` of the search's configuration with
``max_active_agents`` set to the step's cap and the window options set, writing its results
JSON into the output directory. Its verdict is the window's ``slo_verdict``, except that a
step whose client was the bottleneck is ``client-bound`` (the search will not conclude from
it), and a step whose requests failed beyond ``--max-failure-rate`` is a ``fail``: a
deployment that errors at that load does not hold it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from batchbench.capacity.outdir import OutputDirectory, partial_file
from batchbench.capacity.search import CLIENT_BOUND, FAIL, UNRESOLVED, StepRecord
from batchbench.config import RunConfig
from batchbench.errors import BatchbenchError

EXIT_REQUESTS_FAILED = 3  # batchbench.api: more requests failed than --max-failure-rate allows
REPORTED_PERCENTILES = (50.0, 95.0, 99.0)  # what the table shows, whatever --percentiles says
SAMPLED_MARGIN = 1.25  # trajectories planned beyond the estimated need
MAX_REFILLS = 4  # re-runs of a sampled step whose agents ran out before its window ended


@dataclass(frozen=True, slots=True)
class WindowPlan:
    """A step's measured window: a warm-up, then seconds or a trajectory count (doubled per
    extension)."""

    warmup: float = 5.0
    seconds: float | None = 30.0
    trajectories: int | None = None

    def scaled(self, extension: int) -> tuple[float | None, int | None]:
        factor = 2**extension
        return (
            self.seconds * factor if self.seconds is not None else None,
            self.trajectories * factor if self.trajectories is not None else None,
        )


class StepInterrupted(BatchbenchError):
    """Ctrl+C or SIGTERM stopped a step; ``exit_status`` is 130 or 143."""

    def __init__(self, signal_name: str, exit_status: int) -> None:
        super().__init__(f"interrupted by {signal_name}")
        self.exit_status = exit_status


class _StepOutput:
    """What a step run prints: no banner (the table is the output), warnings once each."""

    def __init__(self, warn: Callable[[str], None]) -> None:
        self.warn = warn
        self.seen: set[str] = set()

    def lines(self, lines) -> None:
        pass

    def warning(self, text: str) -> None:
        if text not in self.seen:
            self.seen.add(text)
            self.warn(text)


def judge(
    window: dict[str, Any], exit_status: int, failed: int, total: int
) -> tuple[str, str | None]:
    """(verdict, note) of a finished step from its window and the run's exit status."""
    if (window.get("client") or {}).get("verdict") == CLIENT_BOUND:
        return CLIENT_BOUND, None
    if exit_status == EXIT_REQUESTS_FAILED:
        return FAIL, f"{failed} of {total} requests failed"
    verdict = window.get("slo_verdict")
    return (verdict if isinstance(verdict, str) else UNRESOLVED), None


class StepRunner:
    """``step(agents, phase, extension)`` for ``run_search``: runs the step for real.

    Sampled workloads (no manifest) need enough trajectories to keep every one of the N
    agents busy through warm-up and window, or the window would measure fewer active
    agents than the step claims. A step plans max(--agents, 4 x N, the need estimated from
    the trajectory rate measured so far x 1.25) trajectories; the first step, which has no
    rate yet, uses the first two. A step whose agents all started before its window ended
    ran short, and runs again with the count its own rate asks for (up to 4 times). A
    manifest runs as given (FIFO admission under the cap); when it runs out early its
    window is simply shorter, and a warning says so.
    """

    def __init__(
        self,
        target: RunConfig,
        window: WindowPlan,
        outdir: OutputDirectory,
        warn: Callable[[str], None],
        run: Callable[..., Any] | None = None,
        started: Callable[[int, int, float | None], None] | None = None,
    ) -> None:
        self.target = target
        self.window = window
        self.outdir = outdir
        self.output = _StepOutput(warn)
        self.warn = warn
        if run is None:
            from batchbench.api import run as api_run

            run = api_run
        self._run = run
        self.started = started  # (agents, extension, expected seconds) before each run
        self.rate: float | None = None  # trajectories per agent-second, the highest seen
        self.result: Any = None  # the last step's RunResult

    def planned_agents(self, agents: int, seconds: float | None, trajectories: int | None) -> int:
        """Sampled trajectories for a step with ``agents`` active (see the class docstring)."""
        count = max(self.target.agents or 0, 4 * agents)
        if self.rate is not None:
            if seconds is not None:
                need = agents * (self.window.warmup + seconds) * self.rate + agents
            else:
                need = (trajectories or 0) + agents * (self.window.warmup * self.rate + 2)
            count = max(count, math.ceil(need * SAMPLED_MARGIN))
        return count

    def config(self, agents: int, extension: int, count: int | None) -> RunConfig:
        """The step's run configuration."""
        seconds, trajectories = self.window.scaled(extension)
        percentiles = tuple(sorted(set(self.target.percentiles) | set(REPORTED_PERCENTILES)))
        return replace(
            self.target,
            max_active_agents=agents,
            agents=count,
            warmup=self.window.warmup,
            duration=self.window.warmup + seconds if seconds is not None else None,
            window_trajectories=trajectories,
            percentiles=percentiles,
            results_json=self.outdir.file(partial_file(agents)),
            results_csv=None,
            report_html=None,
            progress=False,
            agent_events_jsonl=None,
            request_events_jsonl=None,
            server_metrics_jsonl=None,
        )

    def __call__(self, agents: int, phase: str, extension: int) -> StepRecord:
        seconds, trajectories = self.window.scaled(extension)
        sampled = not self.target.replay
        count = self.planned_agents(agents, seconds, trajectories) if sampled else None
        for refill in range(MAX_REFILLS + 1):
            if self.started is not None:
                expected = self.window.warmup + seconds if seconds is not None else None
                self.started(agents, extension, expected)
            result = self._run(self.config(agents, extension, count), output=self.output)
            self.result = result
            if result.interrupted_by:  # a part of a step is not a step: its files go
                self.outdir.discard_partial(agents)
                raise StepInterrupted(result.interrupted_by, result.exit_status)
            self._learn(result, agents)
            if not self._ran_short(result):
                break
            if not sampled:
                self.warn(
                    f"note: the manifest ran out at {result.engine.total_duration:.1f} s, "
                    f"before the window of the step at {agents} agents ended; its window is "
                    "shorter"
                )
                break
            if refill == MAX_REFILLS:
                self.warn(
                    f"warning: the step at {agents} agents ran out of sampled trajectories "
                    "before its window ended; its window is shorter"
                )
                break
            assert count is not None
            count = max(2 * count, self.planned_agents(agents, seconds, trajectories))
        if result.window is None:
            raise BatchbenchError(f"the step at {agents} agents measured no window")
        window = result.window.as_dict()
        summary = result.summary
        verdict, note = judge(
            window, result.exit_status, summary.failed_requests, summary.total_requests
        )
        name = self.outdir.finish_step(agents)
        return StepRecord(
            agents=agents,
            phase=phase,
            verdict=verdict,
            extensions=extension,
            window=window,
            results_json=name,
            note=note,
        )

    @staticmethod
    def _ran_short(result: Any) -> bool:
        """Every planned trajectory was admitted before the planned end: the last part of
        the window may have run fewer agents than the cap."""
        return len(result.engine.records) >= len(result.workload)

    def _learn(self, result: Any, agents: int) -> None:
        """Trajectories started per agent-second: while the pool lasted, or over the run."""
        engine = result.engine
        started = len(engine.records)
        if self._ran_short(result):
            seconds = engine.last_agent_admitted_at
        else:
            seconds = engine.total_duration
        if started and seconds > 0:
            rate = started / (agents * seconds)
            self.rate = rate if self.rate is None else max(self.rate, rate)


class ResumedSteps:
    """A step function that first looks for the step in an earlier run of the same search
    (``finished``, from ``OutputDirectory.open``), and runs it only when it is not there or
    needs more extensions than were done."""

    def __init__(
        self,
        finished: dict[int, StepRecord],
        step: Callable[[int, str, int], StepRecord],
    ) -> None:
        self.finished = dict(finished)
        self.step = step

    def __call__(self, agents: int, phase: str, extension: int) -> StepRecord:
        known = self.finished.get(agents)
        if known is not None and known.extensions >= extension:
            known.phase = phase
            return known
        record = self.step(agents, phase, extension)
        self.finished.pop(agents, None)
        return record
