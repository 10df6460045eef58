"""A capacity search from Python: ``run_capacity(config, output_dir, ...)`` runs the steps
(or reads back the ones an earlier run of the same search finished), keeps every step's
results JSON and ``capacity.json`` in ``output_dir``, and returns the answer.

With ``config.sim`` the simulator is started once, when the first step needs it, and
serves every step (as a real deployment would); each step's results JSON then names the
simulator's loopback URL as its host.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from batchbench import __version__
from batchbench.capacity.document import CapacityDocument, SearchSettings
from batchbench.capacity.estimate import ObjectiveEstimate, duration_words, estimate
from batchbench.capacity.outdir import OutputDirectory
from batchbench.capacity.render import Answer, answer
from batchbench.capacity.search import (
    OUT_OF_TIME,
    Bounds,
    Search,
    StepFunction,
    StepRecord,
    run_search,
    sweep_caps,
)
from batchbench.capacity.steps import ResumedSteps, StepRunner, WindowPlan
from batchbench.config import RunConfig
from batchbench.errors import UsageError
from batchbench.options.simulator import sim_model_name
from batchbench.plan.manifest import hash_manifest
from batchbench.results.documents import ManifestSection
from batchbench.results.slo import SPEED_METRICS, parse_slo
from batchbench.stages.prepare import calibrate_ahead
from batchbench.stages.target import check_target, sim_chat_template, start_sim

Listener = Callable[[StepRecord, Search, bool], None]
StartListener = Callable[[int, int, float | None], None]  # agents, extension, seconds
EstimateListener = Callable[[Sequence[ObjectiveEstimate], float], None]  # and probe seconds
ProbeFunction = Callable[[int, float], "dict[str, Any] | None"]  # agents, seconds -> window
DEFAULT_PROBE_SECONDS = 5.0  # the probe before the first step (at most the --window)
MAX_TIME = "max-time"  # the capacity document's stop_reason when --max-time ended it


class OutOfTime(Exception):
    """--max-time: the next attempt cannot finish in the time left."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


@dataclass(frozen=True)
class CapacityResult:
    """A finished (or stopped) search: its steps, the answer and the document written."""

    search: Search
    answer: Answer
    document: dict[str, Any]
    path: str  # capacity.json
    resumed_steps: int  # steps read back from an earlier run instead of measured


def search_settings(
    bounds: Bounds, window: WindowPlan, max_extensions: int, sweep: int | None = None
) -> SearchSettings:
    """The capacity document's "search" object."""
    return SearchSettings(
        sweep=sweep,
        min_agents=bounds.min_agents,
        max_agents=bounds.max_agents,
        resolution=bounds.resolution,
        warmup_seconds=window.warmup,
        window_seconds=window.seconds,
        window_trajectories=window.trajectories,
        max_extensions=max_extensions,
    )


def check_capacity_config(config: RunConfig, sweep: int | None = None) -> None:
    """What a search needs beyond a valid run: objectives (optional for a sweep), and a
    live target."""
    if not config.slo and sweep is None:
        raise UsageError(
            "a capacity search needs --slo: the objectives each step must meet, e.g. "
            "--slo ttft_p99=2s or --slo e2e_p95=30s"
        )
    if config.dry_run:
        raise UsageError("a capacity search needs a live server (not --dry-run)")
    config.check()


class _Target:
    """The run configuration steps use: the simulator started on first use, and the
    server calibrated then, once for every step (the steps send no probes of their own)."""

    def __init__(self, config: RunConfig, say: Callable[[str], None]) -> None:
        self.config = config
        self.say = say
        self.sim: Any = None
        self._resolved: RunConfig | None = None

    def get(self) -> RunConfig:
        if self._resolved is None:
            config = self.config
            if config.sim:
                template = sim_chat_template(config)
                self.sim, started = start_sim(config)
                # The simulator's one model, named here: no step notes that it was chosen.
                model = config.model or sim_model_name(config.sim_child_command())
                config = replace(
                    started,
                    sim=False,
                    sim_args=None,
                    sim_dp_ranks=None,
                    chat_template=template,
                    model=model,
                )
            self._resolved = asyncio.run(self._calibrated(config))
        return self._resolved

    async def _calibrated(self, config: RunConfig) -> RunConfig:
        """The preflight the steps would run (the model, and so the tokenizer, the probes
        need, when --model is not given), then the calibration."""
        if not config.calibrates:
            return config
        said = _Said(self.say)
        return await calibrate_ahead(await check_target(config, said), said)

    def stop(self) -> None:
        if self.sim is not None:
            self.sim.stop()
            self.sim = None


class _Said:
    """The calibration's lines and notes, through the search's own note channel."""

    def __init__(self, say: Callable[[str], None]) -> None:
        self.say = say

    def lines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.say(line)

    def warning(self, text: str) -> None:
        self.say(text)


class _LazyRunner:
    """A StepRunner built when the first step really runs (so that a search read back in
    full needs no server)."""

    def __init__(self, make: Callable[[], StepRunner]) -> None:
        self.make = make
        self.runner: StepRunner | None = None

    def get(self) -> StepRunner:
        if self.runner is None:
            self.runner = self.make()
        return self.runner

    def __call__(
        self, agents: int, phase: str, extension: int, previous: StepRecord | None = None
    ) -> StepRecord:
        return self.get()(agents, phase, extension, previous)


def run_capacity(
    config: RunConfig,
    output_dir: str,
    bounds: Bounds | None = None,
    window: WindowPlan | None = None,
    max_extensions: int = 2,
    *,
    restart: bool = False,
    listener: Listener | None = None,
    started: StartListener | None = None,
    warn: Callable[[str], None] | None = None,
    workers_available: bool = False,
    step: StepFunction | None = None,
    sweep: int | None = None,
    max_time: float | None = None,
    probe_seconds: float = DEFAULT_PROBE_SECONDS,
    probe: ProbeFunction | None = None,
    estimated: EstimateListener | None = None,
    probing: Callable[[int, float], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> CapacityResult:
    """Search the highest active-agent cap whose measured window meets ``config.slo``.

    Raises UsageError for a config a search cannot use or an output directory that holds
    another search; StepInterrupted after Ctrl+C/SIGTERM (capacity.json then holds the
    steps measured so far); BatchbenchError when a step cannot run. ``step`` replaces the
    benchmark run of each step (``step(agents, phase, extension, previous) -> StepRecord``,
    writing the record's ``results_json`` into ``output_dir``): for tests and custom runners.

    An output directory whose search had other bounds or another window (``--min-agents``,
    ``--max-agents``, ``--resolution``, ``--window``, ``--window-trajectories``,
    ``--max-extensions``) is resumed: its decided steps are kept (a verdict at N agents does
    not depend on which caps the search tries, and was decided at 95 % confidence however
    long its window), and with another window its unresolved steps are measured again.
    One with another ``slo`` re-judges its stored steps from their results JSON (those it
    cannot are measured again); any other difference is refused.

    ``sweep``: measure that many caps evenly spaced from ``min_agents`` to ``max_agents``
    instead of searching (``config.slo`` then optional). ``max_time`` (seconds) bounds the
    whole search: an attempt that cannot finish in the time left is not started, a step
    still running when it runs out is stopped and not judged, and the answer gives the
    bracket found so far. Before the first step a probe of ``probe_seconds`` (at most the
    window; 0: none) at ``min_agents`` measures each objective's sample rate, and
    ``estimated(estimates, seconds)`` receives the estimate (``step`` given: only with a
    ``probe(agents, seconds) -> window`` too); ``probing(agents, seconds)`` is called as
    the probe starts.
    """
    bounds = bounds or Bounds()
    window = window or WindowPlan()
    if max_extensions < 0:
        raise UsageError("--max-extensions must be at least 0")
    if sweep is not None and sweep < 1:
        raise UsageError("--sweep must be at least 1")
    if max_time is not None and not max_time > 0:
        raise UsageError("--max-time must be greater than zero")
    if probe_seconds < 0:
        raise UsageError("--probe must be at least 0")
    began = clock()
    deadline = began + max_time if max_time is not None else None
    check_capacity_config(config, sweep)
    settings = search_settings(bounds, window, max_extensions, sweep)
    manifest: ManifestSection | None = None
    if config.replay:
        assert config.agent_plans_jsonl is not None
        manifest = ManifestSection(
            path=config.agent_plans_jsonl,
            sha256=hash_manifest(config.agent_plans_jsonl),
            schema_version=None,
            sources=None,
        )
    outdir = OutputDirectory(
        output_dir,
        config.options(),
        settings.to_json(),
        manifest_sha256=manifest.sha256 if manifest else None,
        restart=restart,
        objectives=config.slo,
        goodput_thresholds=config.goodput_thresholds,
    )
    finished = outdir.open()
    say = warn or (lambda _text: None)
    if outdir.slo_changed is not None:
        count = outdir.rejudged
        again = ""
        if outdir.remeasured:
            caps = ", ".join(str(a) for a in sorted(outdir.remeasured))
            again = (
                f"; measured again (their results cannot judge the new objectives): the "
                f"step{'s' if len(outdir.remeasured) != 1 else ''} at {caps} agents"
            )
        say(
            f"note: {outdir.slo_changed}: {count} stored step{'s' if count != 1 else ''} "
            f"re-judged from {'their' if count != 1 else 'its'} results JSON, not re-run" + again
        )
    if outdir.changed:
        again = (
            "; its unresolved steps are measured again with the new window"
            if outdir.window_changed
            else ""
        )
        say(
            f"note: resuming {output_dir} with other search settings ("
            + "; ".join(outdir.changed)
            + f"): its decided steps are kept{again}"
        )
    target = _Target(config, say)
    runner_box: list[StepRunner] = []

    def make_runner() -> StepRunner:
        runner = StepRunner(target.get(), window, outdir, say, started=started)
        runner.deadline = None if deadline is None else time.monotonic() + (deadline - clock())
        runner_box.append(runner)
        return runner

    search = Search(bounds)
    if sweep is not None:
        search.sweep = sweep_caps(bounds, sweep)
    timestamp = datetime.now(UTC).isoformat(timespec="seconds")
    estimates: list[ObjectiveEstimate] = []
    probed: dict[str, Any] = {}

    def document(pending: StepRecord | None = None) -> dict[str, Any]:
        nonlocal manifest
        if manifest is not None and runner_box and runner_box[0].result is not None:
            setup = runner_box[0].result.setup
            manifest = replace(manifest, schema_version=setup.schema_version, sources=setup.sources)
        steps = (*search.steps, pending) if pending is not None else tuple(search.steps)
        return CapacityDocument(
            batchbench_version=__version__,
            timestamp=timestamp,
            slo=tuple(objective.text for objective in config.slo),
            goodput_thresholds_ms={
                m: v for m, v in config.goodput_thresholds if m not in SPEED_METRICS
            }
            or None,
            goodput_thresholds_tokens_per_second={
                m: v for m, v in config.goodput_thresholds if m in SPEED_METRICS
            }
            or None,
            configuration=config.options(),
            manifest=manifest,
            search=settings,
            steps=steps,
            answer=answer(search, config.slo, workers_available),
            stop_reason=search.stop_reason,
            estimate=(
                {**probed, "objectives": [e.as_dict() for e in estimates]} if probed else None
            ),
        ).to_json()

    pending: list[StepRecord] = []  # an unresolved attempt about to be extended

    def on_step(record: StepRecord, state: Search, final: bool) -> None:
        pending[:] = [] if final else [record]
        outdir.write(document(None if final else record))
        if listener is not None:
            listener(record, state, final)

    lazy = _LazyRunner(make_runner)
    inner: StepFunction = step if step is not None else lazy
    if probe is None and step is None:
        probe = lambda agents, seconds: lazy.get().probe(agents, seconds)  # noqa: E731
    overhead = [0.0]  # the most a step took beyond its warm-up and window (start, drain)
    # a trajectory window's length is not known beforehand: the last attempt's seconds per
    # trajectory (wall time, warm-up included) estimate the next one's
    per_trajectory: list[float] = []

    def timed(
        agents: int, phase: str, extension: int, previous: StepRecord | None = None
    ) -> StepRecord:
        if deadline is None:
            return inner(agents, phase, extension, previous)
        if step is None:
            # once: the simulator's start and the calibration, before the fit is judged
            # and outside the step's time (they are no per-step overhead)
            lazy.get()
        seconds, trajectories = window.attempt(extension, previous)
        planned = window.warmup + seconds if seconds is not None else None
        estimated_seconds = planned
        if planned is None and trajectories is not None and per_trajectory:
            estimated_seconds = per_trajectory[-1] * trajectories
        left = deadline - clock()
        what = f"the step at {agents} active agent{'s' if agents != 1 else ''}" + (
            f" (extension {extension})" if extension else ""
        )
        limit = f"--max-time {duration_words(max_time or 0.0)}"
        if left <= 0:
            raise OutOfTime(f"{limit} was used up before {what}")
        if planned is not None:
            estimated_seconds = planned + overhead[0]
        if estimated_seconds is not None and estimated_seconds > left:
            raise OutOfTime(
                f"{limit} ran out before {what}: it would take "
                f"~{duration_words(estimated_seconds)}, ~{duration_words(left)} were left"
            )
        start = clock()
        record = inner(agents, phase, extension, previous)
        took = clock() - start
        if planned is not None:
            overhead[0] = max(overhead[0], took - planned)
        elif trajectories and record.note != OUT_OF_TIME:
            per_trajectory.append(took / trajectories)
        return record

    steps = ResumedSteps(finished, timed)
    try:
        if not finished and probe is not None and probe_seconds > 0 and config.slo:
            seconds = probe_seconds
            if window.seconds is not None:
                seconds = min(seconds, window.seconds)
            if deadline is None or deadline - clock() > seconds:
                if probing is not None:
                    probing(bounds.min_agents, seconds)
                measured = probe(bounds.min_agents, seconds)
                duration = (measured or {}).get("duration_seconds")
                if not isinstance(duration, int | float) or duration <= 0:
                    duration = seconds
                estimates[:] = estimate(
                    measured,
                    config.slo,
                    float(duration),
                    bounds.min_agents,
                    bounds,
                    window,
                    search.sweep,
                )
                probed.update(probe_seconds=seconds, agents=bounds.min_agents)
                if estimated is not None:
                    estimated(estimates, seconds)
        run_search(search, steps, max_extensions, on_step)
    except OutOfTime as stop:
        search.stop_reason, search.stop_text = MAX_TIME, stop.text
    except BaseException:
        # what was measured stays, with a "not concluded" answer
        outdir.write(document(pending[0] if pending else None))
        raise
    finally:
        target.stop()
    stopped = search.stopped_by
    if stopped is not None and stopped.note == OUT_OF_TIME:
        measured_for = (stopped.window or {}).get("duration_seconds")
        after = f" after {measured_for:.1f} s of its window" if measured_for else ""
        search.stop_reason = MAX_TIME
        search.stop_text = (
            f"--max-time {duration_words(max_time or 0.0)} ran out during the step at "
            f"{stopped.agents} active agent{'s' if stopped.agents != 1 else ''} (stopped"
            f"{after}, not judged)"
        )
    # an unresolved attempt whose extension --max-time did not start stays, as after an
    # interruption: a resume extends it
    final = document(pending[0] if pending and search.stop_reason is not None else None)
    path = outdir.write(final)
    resumed = sum(1 for s in search.steps if s.resumed)
    return CapacityResult(search, answer(search, config.slo, workers_available), final, path,
                          resumed)  # fmt: skip


def capacity(
    config: RunConfig,
    slo: str | None = None,
    output_dir: str | None = None,
    *,
    min_agents: int = 1,
    max_agents: int = 1024,
    resolution: int = 1,
    warmup: float = 5.0,
    window: float | None = None,
    window_trajectories: int | None = None,
    max_extensions: int = 2,
    sweep: int | None = None,
    max_time: float | None = None,
    probe: float = DEFAULT_PROBE_SECONDS,
    restart: bool = False,
    warn: Callable[[str], None] | None = None,
) -> CapacityResult:
    """``batchbench.capacity(config, slo="ttft_p99=2s", output_dir="cap")``: the capacity
    search (``batchbench capacity``) from Python, with the command's search options as
    keywords (``max_time`` in seconds); ``slo`` is --slo's text and replaces
    ``config.slo``. Returns the CapacityResult (``.answer``, ``.search``, ``.document``).

    Called while this thread runs an event loop (a Jupyter notebook, an async program) it
    raises UsageError before anything starts: run it in a thread there,
    ``await asyncio.to_thread(batchbench.capacity, config, ...)``."""
    from batchbench.api import _loop_running  # lazy: as batchbench.run

    if _loop_running():
        raise UsageError(
            "capacity() cannot run a search while an event loop is running in this thread "
            "(as in a Jupyter notebook): use `await asyncio.to_thread(batchbench.capacity, "
            "config, ...)` instead"
        )
    if output_dir is None:
        raise UsageError("capacity() needs output_dir: where every step's results JSON and "
                         "capacity.json are kept")  # fmt: skip
    if window is not None and window_trajectories is not None:
        raise UsageError("give window or window_trajectories, not both")
    if slo is not None:
        config = replace(config, slo=parse_slo(slo))
    try:
        bounds = Bounds(min_agents, max_agents, resolution)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    seconds = window if window is not None or window_trajectories is not None else 30.0
    plan = WindowPlan(warmup=warmup, seconds=seconds, trajectories=window_trajectories)
    return run_capacity(
        config,
        output_dir,
        bounds,
        plan,
        max_extensions,
        restart=restart,
        warn=warn,
        sweep=sweep,
        max_time=max_time,
        probe_seconds=probe,
    )


def write_capacity_report(capacity_json: str, path: str) -> None:
    """The HTML report of a capacity document (``batchbench.report``; plotly needed)."""
    from batchbench.report import load_documents, write_report  # lazy: the HTML report

    write_report(load_documents([capacity_json]), path)
