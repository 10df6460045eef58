"""The live part of stage 4: the agents against the server, from the clock's start to the
last request in flight, with the run's planned end, its progress bar, its server-metrics
scraper and its signal handlers around them."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import IO

import aiohttp

from batchbench.config import RunConfig
from batchbench.drive.driver import (
    DriverSettings,
    Fidelity,
    HttpAgentLoop,
    make_session,
    raise_open_file_limit,
    run_transport,
)
from batchbench.drive.oracle import PromptOracle, server_root
from batchbench.drive.shutdown import Shutdown
from batchbench.drive.wire import request_headers
from batchbench.errors import UsageError
from batchbench.results.events import JsonlFile, LifecycleWriter
from batchbench.results.lifecycle import EngineResult, TrajectoryRecord
from batchbench.results.progress import Progress, progress_wanted
from batchbench.results.promendpoints import combined_document
from batchbench.results.recording import Recorder
from batchbench.results.scrape import ServerMetricsScraper
from batchbench.stages.admission import Sink, admit, planned_counts, stoppable
from batchbench.stages.console import RunOutput
from batchbench.stages.hosting import Hosting
from batchbench.stages.liverun import LiveRun
from batchbench.stages.prepare import Prepared
from batchbench.stages.target import body_options
from batchbench.text.framing import Framing


async def drive_live(
    prepared: Prepared,
    events: LifecycleWriter,
    pool: ThreadPoolExecutor,
    out: RunOutput,
    hosting: Hosting,
) -> LiveRun:
    """Run the prepared workload against the server; what it measured."""
    config, workload = prepared.config, prepared.workload
    settings = driver_settings(config)
    shutdown = Shutdown(config.grace_seconds)
    gate = stoppable(hosting.gate, shutdown) if hosting.gate is not None else None
    recorder = Recorder(dp_ranks=config.dp_ranks, goodput=config.goodput_thresholds)
    if config.request_events_jsonl:
        recorder.request_events = JsonlFile(config.request_events_jsonl)
    planned = planned_counts(workload, prepared.share)
    show_progress = config.progress and progress_wanted()
    progress = Progress(planned[0], planned[1], recorder) if show_progress else None
    background = [asyncio.ensure_future(recorder.sample_lag())]
    if progress is not None:
        background.append(asyncio.ensure_future(progress.refresh()))
    if hosting.monitor is not None:
        background.append(asyncio.ensure_future(hosting.monitor(recorder, planned, prepared.setup)))
    end = PlannedEnd(config, shutdown)
    clock = WallClock()
    max_connections = connection_cap(config, len(workload))
    warning = raise_open_file_limit(max_connections or len(workload))
    if warning:
        out.warning(warning)
    session = make_session(settings, max_connections)
    transport = run_transport(settings, max_connections, session)
    installed = False
    scraping: MetricsScraping | None = None
    try:
        fidelity = await run_fidelity(prepared, session, settings)
        agents = HttpAgentLoop(
            settings, workload, prepared.factory, pool, transport, recorder, shutdown, fidelity
        )
        agents.clock_listeners.append(clock.note_origin)
        agents.clock_listeners.append(end.schedule)
        if config.server_metrics:
            scraping = MetricsScraping(config)
            await scraping.take_baselines()
            agents.clock_listeners.append(scraping.start)
        if hosting.handle_signals:
            shutdown.install()  # after the oracle's detection, which Ctrl+C interrupts as usual
            installed = True
        sink = trajectory_sink(events, recorder, progress, end)
        engine = await admit(
            config, workload, prepared.factory.root_seed, prepared.share, agents, sink,
            shutdown, gate,
        )  # fmt: skip
        recorder.stop_clock()
        if scraping is not None:
            await scraping.finish()
    finally:
        if scraping is not None:
            await scraping.close()
        await stop_background(background)
        recorder.totals.resent_requests = getattr(transport, "resent", 0)
        await transport.close()
        await session.close()
        if installed:
            shutdown.uninstall()
        if progress is not None:
            progress.close()
        if recorder.request_events is not None:
            recorder.request_events.close()
    return live_run(config, engine, recorder, shutdown, agents.fidelity.framing, scraping,
                    clock.wall_origin)  # fmt: skip


def driver_settings(config: RunConfig) -> DriverSettings:
    """The HTTP driver's settings from the run's configuration."""
    url = config.endpoint_url
    assert url is not None  # validated: a live run has a target
    return DriverSettings(
        url=url,
        body=body_options(config),
        api_key=config.resolved_api_key(),
        user_tagging=config.user_tagging,
        user_prefix=config.user_prefix,
        seed=config.seed,
        dp_ranks=config.dp_ranks,
        dp_rank_header=config.dp_rank_header,
        rank_failover=config.rank_failover,
        worker_header=config.routed_worker_header,
        timeout_seconds=float(config.request_timeout_secs),
        max_retries=config.max_retries,
        retry_delay_ms=config.retry_delay_ms,
        max_retry_wait_seconds=config.max_retry_wait,
        max_response_bytes=config.max_response_bytes,
        verbose=config.verbose,
    )


def connection_cap(config: RunConfig, trajectories: int) -> int | None:
    """The most connections the run opens at once (None: as many as open-loop needs)."""
    if config.admission_mode == "closed-loop":
        return min(config.max_active_agents or trajectories, trajectories)
    return config.max_active_agents


async def run_fidelity(
    prepared: Prepared, session: aiohttp.ClientSession, settings: DriverSettings
) -> Fidelity:
    """How the run keeps its prompts exact: the framing it learns, the reply accounting,
    the block counter, and the server's own count (``--prompt-oracle server``)."""
    config, setup = prepared.config, prepared.setup
    fidelity = Fidelity(
        Framing(
            setup.framing_initial,
            setup.framing_turn,
            learn=config.prompt_correction,
            measured=setup.framing_measured,
        ),
        prepared.replies if config.prompt_correction else None,
        prompt_counter=prepared.counter,
        keep_reasoning=config.replay_reasoning == "keep",
    )
    if config.prompt_oracle == "server":
        headers = request_headers(settings.api_key, None, None)
        oracle = PromptOracle(session, server_root(settings.url), headers)
        await oracle.detect()
        fidelity = replace(fidelity, oracle=oracle)
    return fidelity


class PlannedEnd:
    """The run's planned end: ``--duration`` after the clock starts, or once the window's
    trajectories finished (``--window-trajectories``). Requests in flight then get up to
    one request timeout to finish."""

    def __init__(self, config: RunConfig, shutdown: Shutdown) -> None:
        self.shutdown = shutdown
        self.grace = float(config.request_timeout_secs) + 1.0
        self.duration = config.duration
        self.warmup = config.warmup
        # A shard (or worker) ends after its even part of the window, ceil(T / N): the
        # parts together measure about the trajectories one run would.
        self.window_trajectories = config.window_trajectories
        shard = config.shard_spec()
        if self.window_trajectories is not None and shard is not None:
            self.window_trajectories = -(-self.window_trajectories // shard.count)
        self.counted = 0

    def trajectory_finished(self, record: TrajectoryRecord) -> None:
        if self.window_trajectories is not None and record.admitted_at >= self.warmup:
            self.counted += 1
            if self.counted >= self.window_trajectories:
                self.shutdown.finish("window", self.grace)

    def schedule(self, origin: float) -> None:
        """On the clock's start: the end of ``--duration``."""
        if self.duration is not None:
            delay = origin + self.duration - time.perf_counter()
            asyncio.get_running_loop().call_later(
                max(delay, 0.0), self.shutdown.finish, "duration", self.grace
            )


class WallClock:
    """The Unix time of the benchmark clock's start."""

    wall_origin: float | None = None

    def note_origin(self, origin: float) -> None:
        self.wall_origin = time.time() - (time.perf_counter() - origin)


def trajectory_sink(
    events: LifecycleWriter, recorder: Recorder, progress: Progress | None, end: PlannedEnd
) -> Sink:
    """What happens when a trajectory finishes: its lifecycle record with its figures, the
    progress bar, and the window count."""

    def sink(record: TrajectoryRecord) -> None:
        figures = recorder.take_agent(record.agent_id)
        events.write(
            record,
            figures.as_fields() | figures.placement_fields() if figures is not None else None,
        )
        if progress is not None:
            progress.trajectory_finished()
        end.trajectory_finished(record)

    return sink


class MetricsScraping:
    """The ``--server-metrics`` scrapers (one per endpoint), on the benchmark clock: their
    baselines are fetched before the first request and stored once the clock runs."""

    def __init__(self, config: RunConfig) -> None:
        assert config.server_metrics
        urls, path = config.server_metrics, config.server_metrics_jsonl
        self.sink: IO[bytes] | None = None
        if path is not None and len(urls) > 1:  # one file, each line naming its URL
            try:
                self.sink = Path(path).open("wb")  # noqa: SIM115 - closed by close()
            except OSError as exc:
                raise UsageError(f"--server-metrics-jsonl {path}: {exc.strerror or exc}") from None
        interval = config.server_metrics_interval
        self.scrapers = [ServerMetricsScraper(u, interval, path, sink=self.sink) for u in urls]
        if config.warmup > 0:  # the counts' baseline: a scrape where the window starts
            for scraper in self.scrapers:
                scraper.marks = (config.warmup,)
        self.task: asyncio.Future | None = None

    async def take_baselines(self) -> None:
        """Every endpoint's page before the first request (see ``take_baseline``)."""
        await asyncio.gather(*(scraper.take_baseline() for scraper in self.scrapers))

    def start(self, origin: float) -> None:
        for scraper in self.scrapers:
            scraper.origin = origin
        self.task = asyncio.gather(*(scraper.start() for scraper in self.scrapers))

    async def finish(self) -> None:
        """After the last request: the last scrape of every endpoint."""
        if self.task is not None:
            await self.task
        await asyncio.gather(*(scraper.stop() for scraper in self.scrapers))

    async def close(self) -> None:
        if self.task is not None and not self.task.done():
            self.task.cancel()
        for scraper in self.scrapers:
            await scraper.close()
        if self.sink is not None:
            sink, self.sink = self.sink, None
            with contextlib.suppress(OSError):
                sink.close()

    def document(self, start: float, end: float) -> dict:
        """The results JSON ``server_metrics`` section (``promendpoints``)."""
        return combined_document([s.document(start, end) for s in self.scrapers])


async def stop_background(tasks: Sequence[asyncio.Future]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def live_run(
    config: RunConfig,
    engine: EngineResult,
    recorder: Recorder,
    shutdown: Shutdown,
    framing: Framing,
    scraping: MetricsScraping | None,
    wall_origin: float | None,
) -> LiveRun:
    """What the run measured, with the end of its measured window."""
    origin = recorder.origin
    window_end = (
        shutdown.finished_at - origin
        if shutdown.finished_at is not None and origin is not None
        else engine.total_duration
    )
    metrics = None
    if scraping is not None:
        metrics = scraping.document(min(config.warmup, window_end), window_end)
    return LiveRun(
        engine,
        recorder,
        shutdown.signal_name,
        shutdown.exit_status if shutdown.stopped else 0,
        framing,
        finished_by=shutdown.finished_by,
        window_end=window_end,
        server_metrics=metrics,
        wall_origin=wall_origin,
    )
