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
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from batchbench.api import run as api_run
from batchbench.capacity.outdir import OutputDirectory, partial_file
from batchbench.capacity.search import (
    CLIENT_BOUND,
    FAIL,
    MEASURED,
    OUT_OF_TIME,
    UNRESOLVED,
    StepFunction,
    StepRecord,
)
from batchbench.config import RunConfig
from batchbench.errors import BatchbenchError
from batchbench.results.confidence import attainment_verdict
from batchbench.results.documents import OutcomeView, WindowView
from batchbench.results.slo import duration_text

EXIT_REQUESTS_FAILED = 3  # batchbench.api: more requests failed than --max-failure-rate allows
REPORTED_PERCENTILES = (50.0, 95.0, 99.0)  # what the table shows, whatever --percentiles says
SAMPLED_MARGIN = 1.25  # trajectories planned beyond the estimated need
MAX_REFILLS = 4  # re-runs of a sampled step whose agents ran out before its window ended


MIN_EXTENSION_FACTOR = 2.0  # an extension at least doubles the window ...
MAX_EXTENSION_FACTOR = 8.0  # ... and at most multiplies it by 8
SAMPLES_MARGIN = 1.25  # an extension plans for this many times the samples needed
_MOST_SAMPLES = 1 << 40  # beyond this, an objective is taken as never decided


def samples_needed(attainment: float, required: float) -> int | None:
    """The fewest samples at which a share ``attainment`` of them within the limit decides
    an objective that needs the share ``required``: the 95 % Wilson interval then lies wholly
    on one side of it. None when no count does (the share equals the requirement).

    With every sample within the limit this is the least a pass needs: n / (n + z^2) >=
    required, so 381 samples for a p99 objective, 73 for p95, 35 for p90, 4 for p50."""
    if not (0.0 <= attainment <= 1.0 and 0.0 <= required <= 1.0):
        return None

    def decided(n: int) -> bool:
        return attainment_verdict(attainment * n, n, required) != UNRESOLVED

    high = 1
    while not decided(high):  # the interval narrows as n grows: search by doubling ...
        if high >= _MOST_SAMPLES:
            return None
        high *= 2
    low = high // 2  # ... then bisect: low is undecided (or 0), high decided
    while high - low > 1:
        middle = (low + high) // 2
        if decided(middle):
            high = middle
        else:
            low = middle
    return high


def least_samples(quantile: float) -> int:
    """Samples a pNN objective needs at least to pass (all of them within the limit)."""
    needed = samples_needed(1.0, quantile)
    assert needed is not None
    return needed


@dataclass(frozen=True, slots=True)
class Extension:
    """The window of an unresolved step's next attempt, and why that long."""

    seconds: float | None
    trajectories: int | None
    reason: str

    def text(self) -> str:
        """``240 s``, ``400 trajectories``."""
        if self.seconds is not None:
            return duration_text(self.seconds * 1000.0, " ")
        return f"{self.trajectories} trajectories"


@dataclass(frozen=True, slots=True)
class WindowPlan:
    """A step's measured window: a warm-up, then seconds or a trajectory count; an
    unresolved step's next attempt is sized by ``extend``."""

    warmup: float = 5.0
    seconds: float | None = 30.0
    trajectories: int | None = None

    def scaled(self, extension: int) -> tuple[float | None, int | None]:
        """The window doubled ``extension`` times: what an attempt used when its record
        does not say (an older capacity document)."""
        factor = 2**extension
        return (
            self.seconds * factor if self.seconds is not None else None,
            self.trajectories * factor if self.trajectories is not None else None,
        )

    def attempt(
        self, extension: int, previous: StepRecord | None
    ) -> tuple[float | None, int | None]:
        """(seconds, trajectories) of an attempt: the plan's window for the first one, else
        sized from the unresolved attempt it extends."""
        if extension == 0:
            return self.seconds, self.trajectories
        if previous is None:
            return self.scaled(extension)
        extension_window = self.extend(previous)
        return extension_window.seconds, extension_window.trajectories

    def used_by(self, record: StepRecord) -> tuple[float | None, int | None]:
        """The window an attempt was planned with."""
        if record.window_seconds is not None or record.window_trajectories is not None:
            return record.window_seconds, record.window_trajectories
        return self.scaled(record.extensions)

    def extend(self, record: StepRecord) -> Extension:
        """The next attempt's window for an unresolved ``record``: long enough for the
        samples its undecided objectives would need if their attainment stayed where it is
        (``samples_needed`` x 1.25), from the sample rate the attempt measured; at least
        twice and at most 8 times its window."""
        seconds, trajectories = self.used_by(record)
        window = WindowView.read(record.window)
        duration = float(window.duration_seconds or 0.0)
        factor, reason = _needed_factor(window.slo, seconds, trajectories, duration)
        if factor > MAX_EXTENSION_FACTOR:
            reason += f"; capped at {MAX_EXTENSION_FACTOR:g}×"
        elif factor < MIN_EXTENSION_FACTOR:
            reason += "; at least doubled"
        factor = min(MAX_EXTENSION_FACTOR, max(MIN_EXTENSION_FACTOR, factor))
        if seconds is not None:
            longer = math.ceil(round(seconds * factor * 10.0, 6)) / 10.0  # to 0.1 s up
            return Extension(longer, None, reason)
        assert trajectories is not None
        return Extension(None, math.ceil(round(trajectories * factor, 6)), reason)


def _needed_factor(
    outcomes: Sequence[OutcomeView],
    seconds: float | None,
    trajectories: int | None,
    duration: float,
) -> tuple[float, str]:
    """(factor, reason): how much longer the window must be for the undecided objective
    that needs the most, and one clause saying so (factor inf when no length would do)."""
    worst: tuple[float, str] | None = None
    for outcome in outcomes:
        if outcome.verdict != UNRESOLVED:
            continue
        name = str(outcome.objective)
        samples, attainment, required = outcome.samples, outcome.attainment, outcome.required
        if not isinstance(samples, int) or samples <= 0 or attainment is None:
            candidate = (math.inf, f"no {name} samples in the window")
        elif required is None:
            continue
        else:
            needed = samples_needed(float(attainment), float(required))
            share = f"{attainment * 100.0:.1f}%"
            if needed is None:
                candidate = (math.inf, f"{name} attainment {share} is the share needed")
            elif seconds is not None and duration > 0.0:
                rate = samples / duration
                factor = needed * SAMPLES_MARGIN / rate / seconds
                candidate = (
                    factor,
                    f"{name} needs {needed} samples at {share} attainment, {samples} in "
                    f"{duration:.1f} s ({rate:.2f}/s)",
                )
            else:
                factor = needed * SAMPLES_MARGIN / samples
                measured = f"{trajectories} trajectories" if trajectories else "the window"
                candidate = (
                    factor,
                    f"{name} needs {needed} samples at {share} attainment, {samples} in {measured}",
                )
        if worst is None or candidate[0] > worst[0]:
            worst = candidate
    if worst is None:
        return math.inf, "no undecided objective with figures"
    return worst


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
    window: dict[str, Any], exit_status: int, failed: int, total: int, judged: bool = True
) -> tuple[str, str | None]:
    """(verdict, note) of a finished step from its window and the run's exit status;
    ``judged`` False (a --sweep without --slo): ``measured`` unless the client was the
    bottleneck or requests failed."""
    view = WindowView.read(window)
    if view.client_verdict == CLIENT_BOUND:
        return CLIENT_BOUND, None
    if exit_status == EXIT_REQUESTS_FAILED:
        return FAIL, f"{failed} of {total} requests failed"
    if not judged:
        return MEASURED, None
    return (view.slo_verdict if view.slo_verdict is not None else UNRESOLVED), None


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
            run = api_run
        self._run = run
        self.started = started  # (agents, extension, expected seconds) before each run
        self.rate: float | None = None  # trajectories per agent-second, the highest seen
        self.result: Any = None  # the last step's RunResult
        # --max-time: the time.monotonic() by which a step must have stopped (a step still
        # running then is stopped with what it measured, and not judged)
        self.deadline: float | None = None

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

    def config(
        self, agents: int, seconds: float | None, trajectories: int | None, count: int | None
    ) -> RunConfig:
        """The step's run configuration, with its window of ``seconds`` or ``trajectories``."""
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

    def __call__(
        self, agents: int, phase: str, extension: int, previous: StepRecord | None = None
    ) -> StepRecord:
        seconds, trajectories = self.window.attempt(extension, previous)
        sampled = not self.target.replay
        count = self.planned_agents(agents, seconds, trajectories) if sampled else None
        cut = False  # --max-time stopped the step before its window ended
        for refill in range(MAX_REFILLS + 1):
            if self.started is not None:
                expected = self.window.warmup + seconds if seconds is not None else None
                self.started(agents, extension, expected)
            step_config = self.config(agents, seconds, trajectories, count)
            planned = step_config.duration
            if self.deadline is not None:
                left = max(self.deadline - time.monotonic(), 0.001)
                if planned is None or left < planned:
                    step_config = replace(step_config, duration=left)
            result = self._run(step_config, output=self.output)
            self.result = result
            if result.interrupted_by:  # a part of a step is not a step: its files go
                self.outdir.discard_partial(agents)
                raise StepInterrupted(result.interrupted_by, result.exit_status)
            cut = step_config.duration != planned and result.finished_by == "duration"
            if cut:
                break
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
        if result.window is None and not cut:
            raise BatchbenchError(f"the step at {agents} agents measured no window")
        # a step --max-time stopped in its warm-up has no window: it measured nothing
        window = result.window.as_dict() if result.window is not None else {}
        summary = result.summary
        verdict, note = judge(
            window,
            result.exit_status,
            summary.failed_requests,
            summary.total_requests,
            judged=bool(self.target.slo),
        )
        if cut:  # what it measured is kept, but a part of a window is not judged
            verdict, note = UNRESOLVED, OUT_OF_TIME
        name = self.outdir.finish_step(agents)
        return StepRecord(
            agents=agents,
            phase=phase,
            verdict=verdict,
            extensions=extension,
            window=window,
            results_json=name,
            note=note,
            window_seconds=seconds,
            window_trajectories=trajectories,
        )

    def probe(self, agents: int, seconds: float) -> dict[str, Any] | None:
        """A short run at ``agents`` with no warm-up, to measure the objectives' sample
        rates before the first step (the estimate); its results are not kept. Returns its
        window (None when it measured none)."""
        count = self.planned_agents(agents, seconds, None) if not self.target.replay else None
        probe_config = replace(
            self.config(agents, seconds, None, count),
            warmup=0.0,
            duration=seconds,
            results_json=None,
        )
        result = self._run(probe_config, output=self.output)
        if result.interrupted_by:
            raise StepInterrupted(result.interrupted_by, result.exit_status)
        if not self.target.replay:
            self._learn(result, agents)
        return result.window.as_dict() if result.window is not None else None

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
        step: StepFunction,
    ) -> None:
        self.finished = dict(finished)
        self.step = step

    def __call__(
        self, agents: int, phase: str, extension: int, previous: StepRecord | None = None
    ) -> StepRecord:
        known = self.finished.get(agents)
        if known is not None and known.extensions >= extension:
            known.phase = phase
            return known
        record = self.step(agents, phase, extension, previous)
        self.finished.pop(agents, None)
        return record
