"""A capacity search from Python: ``run_capacity(config, output_dir, ...)`` runs the steps
(or reads back the ones an earlier run of the same search finished), keeps every step's
results JSON and ``capacity.json`` in ``output_dir``, and returns the answer.

With ``config.sim`` the simulator is started once, when the first step needs it, and
serves every step (as a real deployment would); each step's results JSON then names the
simulator's loopback URL as its host.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from batchbench import __version__
from batchbench.capacity.document import CapacityDocument, SearchSettings
from batchbench.capacity.outdir import OutputDirectory
from batchbench.capacity.render import Answer, answer
from batchbench.capacity.search import Bounds, Search, StepFunction, StepRecord, run_search
from batchbench.capacity.steps import ResumedSteps, StepRunner, WindowPlan
from batchbench.config import RunConfig
from batchbench.errors import UsageError
from batchbench.plan.manifest import hash_manifest
from batchbench.results.documents import ManifestSection
from batchbench.results.slo import SPEED_METRICS
from batchbench.stages.prepare import calibrate_ahead
from batchbench.stages.target import sim_chat_template, start_sim

Listener = Callable[[StepRecord, Search, bool], None]
StartListener = Callable[[int, int, float | None], None]  # agents, extension, seconds


@dataclass(frozen=True)
class CapacityResult:
    """A finished (or stopped) search: its steps, the answer and the document written."""

    search: Search
    answer: Answer
    document: dict[str, Any]
    path: str  # capacity.json
    resumed_steps: int  # steps read back from an earlier run instead of measured


def search_settings(bounds: Bounds, window: WindowPlan, max_extensions: int) -> SearchSettings:
    """The capacity document's "search" object."""
    return SearchSettings(
        min_agents=bounds.min_agents,
        max_agents=bounds.max_agents,
        resolution=bounds.resolution,
        warmup_seconds=window.warmup,
        window_seconds=window.seconds,
        window_trajectories=window.trajectories,
        max_extensions=max_extensions,
    )


def check_capacity_config(config: RunConfig) -> None:
    """What a search needs beyond a valid run: objectives, and a live target."""
    if not config.slo:
        raise UsageError(
            "a capacity search needs --slo: the objectives each step must meet, e.g. "
            "--slo ttft_p99=2s (with --stream) or --slo e2e_p95=30s"
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
                config = replace(
                    started, sim=False, sim_args=None, sim_dp_ranks=None, chat_template=template
                )
            self._resolved = asyncio.run(calibrate_ahead(config, _Said(self.say)))
        return self._resolved

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

    def __call__(
        self, agents: int, phase: str, extension: int, previous: StepRecord | None = None
    ) -> StepRecord:
        if self.runner is None:
            self.runner = self.make()
        return self.runner(agents, phase, extension, previous)


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
    """
    bounds = bounds or Bounds()
    window = window or WindowPlan()
    if max_extensions < 0:
        raise UsageError("--max-extensions must be at least 0")
    check_capacity_config(config)
    settings = search_settings(bounds, window, max_extensions)
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
    )
    finished = outdir.open()
    say = warn or (lambda _text: None)
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
        runner_box.append(runner)
        return runner

    search = Search(bounds)
    timestamp = datetime.now(UTC).isoformat(timespec="seconds")

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
        ).to_json()

    pending: list[StepRecord] = []  # an unresolved attempt about to be extended

    def on_step(record: StepRecord, state: Search, final: bool) -> None:
        pending[:] = [] if final else [record]
        outdir.write(document(None if final else record))
        if listener is not None:
            listener(record, state, final)

    steps = ResumedSteps(finished, step if step is not None else _LazyRunner(make_runner))
    try:
        run_search(search, steps, max_extensions, on_step)
    except BaseException:
        # what was measured stays, with a "not concluded" answer
        outdir.write(document(pending[0] if pending else None))
        raise
    finally:
        target.stop()
    final = document()
    path = outdir.write(final)
    resumed = sum(1 for s in search.steps if s.resumed)
    return CapacityResult(search, answer(search, config.slo, workers_available), final, path,
                          resumed)  # fmt: skip


def write_capacity_report(capacity_json: str, path: str) -> None:
    """The HTML report of a capacity document (``batchbench.report``; plotly needed)."""
    from batchbench.report import load_documents, write_report  # lazy: the HTML report

    write_report(load_documents([capacity_json]), path)
