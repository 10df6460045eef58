"""Run a benchmark from Python: ``run(config) -> RunResult`` (``run_async`` inside a loop).

A run goes one way: start the simulator when asked (a new config with its URL), load the
manifest or sample the plans, load the tokenizer, count replies in the server's chat
template, calibrate when asked, compile the workload, then drive it (dry or live) and
record what happened. It prints nothing unless given a ``RunOutput``, and writes files only
where the config names them.
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import os
import secrets
import shlex
import threading
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import aiohttp

from batchbench.config import RunConfig, host_ends_in_v1
from batchbench.drive.calibrate import Calibration, calibrate
from batchbench.drive.driver import (
    DriverSettings,
    Fidelity,
    HttpAgentLoop,
    make_session,
    raise_open_file_limit,
    run_transport,
)
from batchbench.drive.dryrun import DryRunLoop
from batchbench.drive.engine import StartGate, run_closed_loop, run_open_loop
from batchbench.drive.oracle import PromptOracle, server_root
from batchbench.drive.preflight import preflight
from batchbench.drive.shutdown import Shutdown
from batchbench.drive.simlaunch import SimProcess, sim_command
from batchbench.drive.wire import (
    MISSING_USAGE,
    NO_STREAM_USAGE,
    BodyOptions,
    request_headers,
    tool_call_id,
)
from batchbench.errors import BatchbenchError, UsageError
from batchbench.plan.manifest import Manifest, hash_manifest, load_manifest
from batchbench.plan.workload import Workload, compile_manifest, compile_sampled
from batchbench.results.console import (
    banner_lines,
    csv_row,
    dry_run_lines,
    summary_document,
    write_csv,
    write_json,
)
from batchbench.results.events import JsonlFile, LifecycleWriter
from batchbench.results.lifecycle import EngineResult
from batchbench.results.metrics import RunTotals, StreamSamples
from batchbench.results.progress import Progress, progress_wanted
from batchbench.results.recording import ClientHealth, FidelityFigures, RankFigures, Recorder
from batchbench.results.scrape import ServerMetricsScraper
from batchbench.results.sections import distributions, rank_rows
from batchbench.results.summary import LiveFigures, RunSetup, Summary, build_summary
from batchbench.results.window import (
    WindowFigures,
    WindowInputs,
    server_verdict,
    window_figures,
)
from batchbench.results.windowreport import window_csv
from batchbench.scale.partition import (
    Share,
    closed_loop_share,
    open_loop_share,
    ramp_delays,
    ramp_up_seconds,
)
from batchbench.scale.share import ShardAgents, global_record, global_result
from batchbench.text.chat_templates import BuiltinTemplate, load_chat_template
from batchbench.text.content import ContentFactory
from batchbench.text.framing import Framing
from batchbench.text.promptcount import SegmentCounter, template_counter
from batchbench.text.replycount import ReplyAccounting
from batchbench.text.synth import Synthesizer
from batchbench.text.tokenizer import LoadedTokenizer, load_tokenizer, with_markers

NO_USAGE_ERRORS = (MISSING_USAGE, NO_STREAM_USAGE)
SIM_METRICS = "sim"  # --server-metrics sim: the embedded simulator's /metrics
EXIT_REQUESTS_FAILED = 3  # the run finished, but more requests failed than allowed
EXIT_REQUESTS_LOST = 1  # the run finished, but a worker died with requests not recorded
Failure = tuple[int, str, int, str]  # (agent, trajectory id, invocation, error)


class RunOutput(Protocol):
    """Where a run's console text goes while it runs (the command line passes one)."""

    def lines(self, lines: Iterable[str]) -> None:
        """Standard-output lines: calibration results and the configuration banner."""

    def warning(self, text: str) -> None:
        """One warning line for standard error."""


@dataclass(frozen=True, repr=False)
class RunResult:
    """Everything one run measured, by name.

    ``summary`` holds every summary figure (the CSV columns and the results JSON's
    ``metrics`` keys); the rest is what the console and the JSON show beyond it. Its repr
    is short: asyncio's runner builds the repr of the task that returned it (3.8 s for
    100,000 dry-run trajectories when it spelled out every record).
    """

    config: RunConfig  # as run: with --sim, the simulator's URL as host
    setup: RunSetup
    summary: Summary
    failures: tuple[Failure, ...]  # one per failed agent, with its last error
    lifecycle: Sequence[dict[str, Any]]  # the lifecycle records, in finish order
    ranks: tuple[RankFigures, ...]  # per DP rank with perfect routing (live runs)
    fidelity: FidelityFigures | None  # live runs
    client_health: ClientHealth | None  # live runs
    stream: StreamSamples | None  # streamed latency samples (live runs)
    framing: dict | None  # what the run learned of the server's framing
    interrupted_by: str | None  # "SIGINT" or "SIGTERM" when a signal stopped the run
    exit_status: int  # 0; 3 when failures exceed --max-failure-rate; 130/143 interrupted
    workload: Workload | None  # None for results merged from shards
    engine: EngineResult
    written: tuple[tuple[str, str], ...] = ()  # (what, path) of every file written
    live: LiveFigures | None = None
    window: WindowFigures | None = None  # the measured window (live runs)
    sections: dict[str, Any] | None = None  # results JSON sections beyond the summary
    finished_by: str | None = None  # "duration" / "window" when a planned end stopped it
    shard_data: Any = None  # a shard's raw measurements (--shard, worker processes)
    merged_dry_run_lines: tuple[str, ...] = ()  # merged dry-run shards: their lines
    lost_workers: tuple[str, ...] = ()  # --workers: each worker that died, and what it cost

    @property
    def dry_run(self) -> bool:
        return self.config.dry_run

    def __repr__(self) -> str:
        return (
            f"RunResult(exit_status={self.exit_status}, dry_run={self.dry_run}, "
            f"trajectories={len(self.engine.records)}, written={self.written!r})"
        )


class OutputError(BatchbenchError):
    """A requested output file could not be written; ``result`` still holds the run."""

    def __init__(self, message: str, result: RunResult) -> None:
        super().__init__(message)
        self.result = result


def run(config: RunConfig, *, output: RunOutput | None = None) -> RunResult:
    """Run the benchmark ``config`` describes on a new event loop (uvloop when installed);
    Ctrl+C and SIGTERM stop admission, let requests in flight finish for the grace period,
    and return what was measured (``exit_status`` 130/143). For its duration the garbage
    collector is tuned for many short-lived objects. With ``workers`` above 1 the run is
    split over that many processes and their results merged."""
    if config.worker_count > 1:
        from batchbench.scale.workers import run_workers

        return run_workers(config, output)
    with event_loop_runner() as runner:
        return runner.run(_run(config, output, handle_signals=True, offload=False, tune_gc=True))


async def run_async(
    config: RunConfig, *, output: RunOutput | None = None, handle_signals: bool = False
) -> RunResult:
    """``run`` for callers that own the event loop: slow setup steps (manifest, tokenizer,
    simulator start) run in threads, and process-wide state is left alone unless asked:
    ``handle_signals`` replaces the loop's SIGINT/SIGTERM handlers with a graceful stop for
    the run (main thread only)."""
    if handle_signals and threading.current_thread() is not threading.main_thread():
        raise UsageError("handle_signals needs the main thread's event loop")
    if config.worker_count > 1:
        from batchbench.scale.workers import run_workers

        return await asyncio.to_thread(run_workers, config, output)
    return await _run(config, output, handle_signals, offload=True, tune_gc=False)


async def _offloaded(function, *args):
    return await asyncio.to_thread(function, *args)


async def _direct(function, *args):
    return function(*args)


@dataclass(frozen=True)
class _Steps:
    """How this run treats the process: blocking steps direct or in threads, signals, GC."""

    call: Any
    handle_signals: bool
    tune_gc: bool
    gate: StartGate | None = None  # awaited just before the clock starts
    monitor: Any = None  # async (recorder, planned, setup) -> None, run beside a live run


async def _run(
    config: RunConfig,
    output: RunOutput | None,
    handle_signals: bool,
    offload: bool,
    tune_gc: bool,
    gate: StartGate | None = None,
    monitor: Any = None,
) -> RunResult:
    config.check()
    if config.report_html:
        from batchbench.report import require_plotly

        try:
            require_plotly()  # before the run: a missing extra is known now, not at the end
        except BatchbenchError as exc:
            raise UsageError(str(exc)) from None
    call = _offloaded if offload else _direct
    started = datetime.now(UTC).isoformat(timespec="seconds")
    out = output if output is not None else _Silent()
    sha256 = await call(hash_manifest, config.agent_plans_jsonl) if config.replay else None
    manifest = (
        await call(partial(load_manifest, sha256=sha256), config.agent_plans_jsonl)
        if config.replay
        else None
    )
    root_seed = config.seed if config.seed is not None else secrets.randbits(64)
    workload = None
    if not config.calibrate:  # plans are compiled before the tokenizer loads
        workload = build_workload(config, manifest, root_seed, starting_overheads(config, None))
        planned(config, workload, root_seed, out)
    sim = sim_process(config) if config.sim else None
    try:
        if sim is not None:
            await call(sim.start)
            config = targeting_sim(config, sim)
        if not config.dry_run:
            config = await check_target(config, out)
        if gate is None and config.start_at is not None:
            gate = start_at_gate(config.start_at, out.warning)
        steps = _Steps(call, handle_signals, tune_gc, gate, monitor)
        return await _run_loaded(config, out, manifest, workload, root_seed, sha256, started,
                                 steps)  # fmt: skip
    finally:
        if sim is not None:
            sim.stop()  # also ends a start still running in its thread


class _Silent:
    def lines(self, lines: Iterable[str]) -> None:
        pass

    def warning(self, text: str) -> None:
        pass


def event_loop_runner() -> asyncio.Runner:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency; keep running without it
        return asyncio.Runner()
    return asyncio.Runner(loop_factory=uvloop.new_event_loop)


# -- before the run -------------------------------------------------------------------
def start_sim(config: RunConfig) -> tuple[SimProcess, RunConfig]:
    """Start the simulator child (sharing the tokenizer); the config that targets it."""
    sim = sim_process(config)
    sim.start()
    return sim, targeting_sim(config, sim)


def targeting_sim(config: RunConfig, sim: SimProcess) -> RunConfig:
    """The config of a run against the started simulator: its URL as host (and as the
    metrics endpoint with --server-metrics sim)."""
    metrics = config.server_metrics
    if metrics == SIM_METRICS:
        metrics = f"{sim.url}/metrics"
    return replace(config, host=sim.url, tokenizer_model=config.tokenizer, server_metrics=metrics)


def sim_process(config: RunConfig) -> SimProcess:
    """The simulator child of ``--sim``, not started yet."""
    extra = config.sim_args or ""
    if config.tokenizer_download:
        extra = f"--tokenizer-download {extra}"
    if config.chat_template is not None:
        extra = f"--chat-template {shlex.quote(config.chat_template)} {extra}"
    tokenizer = config.tokenizer
    assert tokenizer is not None  # with --sim: the simulator's when not given
    return SimProcess(sim_command(tokenizer, config.sim_dp_ranks, extra or None))


async def check_target(config: RunConfig, out: RunOutput) -> RunConfig:
    """The preflight check (unless turned off); the config with the model it found."""
    if host_ends_in_v1(config.host, config.endpoint):
        out.warning(
            f"note: --host ends in /v1 (an SDK base_url); requests go to {config.endpoint_url}"
        )
    if not config.preflight:
        if config.model is None:
            raise UsageError("give --model: with --no-preflight the server is not asked")
        return config
    url = config.endpoint_url
    assert url is not None  # validated: a live run has a target
    headers = request_headers(api_key_text(config), None, None)
    key_source = "--api-key" if config.api_key is not None else f"${config.api_key_env}"
    async with aiohttp.ClientSession() as session:
        found = await preflight(
            session, url, headers, config.model, body_options(config), key_source
        )
    for note in found.notes:
        out.warning(note)
    return config if found.model == config.model else replace(config, model=found.model)


def build_workload(
    config: RunConfig, manifest: Manifest | None, root_seed: int, overheads: tuple[int, int]
) -> Workload:
    """Compile the plans; ``overheads`` are (initial, turn) framing tokens (replay only)."""
    if manifest is None:
        return compile_sampled(config.shape, config.agents or 1, root_seed)
    return compile_manifest(
        manifest,
        initial_overhead=overheads[0],
        turn_overhead=overheads[1],
        time_scale=config.time_scale_factor,
    )


def planned(config: RunConfig, workload: Workload, root_seed: int, out: RunOutput) -> None:
    """Once the plans are compiled: their warnings, and a bad open-loop combination fails
    before the run."""
    for warning in workload.warnings:
        out.warning(warning)
    if config.admission_mode == "open-loop":
        start_offsets(config, workload, root_seed)


def start_offsets(config: RunConfig, workload: Workload, root_seed: int) -> list[float]:
    """Open-loop start times in seconds: the manifest's scaled ``start_after_ms``, else the
    arrival process of ``--arrival-rate``, else 0 for every trajectory."""
    if config.arrival_rate is not None:
        if workload.start_seconds is not None:
            raise UsageError(
                "--arrival-rate cannot be combined with a manifest whose trajectories set "
                "start_after_ms; drop one of them"
            )
        return config.arrival_offsets(len(workload), root_seed)
    if workload.start_seconds is not None:
        return workload.start_seconds.tolist()
    return [0.0] * len(workload)


def starting_overheads(config: RunConfig, calibration: Calibration | None) -> tuple[int, int]:
    """(initial, turn): explicit options win, then calibration, then 0."""
    initial = config.replay_initial_overhead_tokens
    turn = config.replay_turn_overhead_tokens
    if initial is None:
        initial = calibration.initial if calibration is not None else 0
    if turn is None:
        turn = calibration.turn if calibration is not None else 0
    return initial, turn


def sim_chat_template(config: RunConfig) -> str:
    """The template the simulator child renders with: --chat-template, else one given in
    --sim-args, else the simulator's default (chatml)."""
    if config.chat_template is not None:
        return config.chat_template
    words = shlex.split(config.sim_args or "")
    for index, word in enumerate(words):
        if word == "--chat-template" and index + 1 < len(words):
            return words[index + 1]
        if word.startswith("--chat-template="):
            return word.split("=", 1)[1]
    return "chatml"


def reply_accounting(
    config: RunConfig, loaded: LoadedTokenizer, warn
) -> tuple[str | None, ReplyAccounting]:
    """The server's chat template when the client can know it, and the accounting that
    counts replies in it (with no known template, replies are counted on their own)."""
    spec = sim_chat_template(config) if config.sim else config.chat_template
    if spec is None:
        if not template_beside(loaded):
            return None, ReplyAccounting.build(loaded)
        spec = "tokenizer"
    try:
        template = load_chat_template(spec, loaded, warn)
        # A built-in's markers are added tokens of every model of its family.
        counting = (
            with_markers(loaded.tokenizer, template.markers)
            if isinstance(template, BuiltinTemplate)
            else None
        )
        accounting = ReplyAccounting.build(loaded, template, tool_call_id(0, 1), tokenizer=counting)
    except BatchbenchError as exc:
        if config.chat_template is None and not config.sim:
            warn(f"warning: {exc}; replies are counted without their template")
            return None, ReplyAccounting.build(loaded)
        raise UsageError(f"--chat-template {spec}: {exc}") from None
    return spec, accounting


def template_beside(loaded: LoadedTokenizer) -> bool:
    """True when a chat template sits beside the tokenizer file."""
    source = Path(loaded.source)
    if not source.is_file():
        return False
    if (source.parent / "chat_template.jinja").is_file():
        return True
    config = source.parent / "tokenizer_config.json"
    try:
        return config.is_file() and b'"chat_template"' in config.read_bytes()
    except OSError:
        return False


def body_options(config: RunConfig) -> BodyOptions:
    return BodyOptions(
        model=config.model or "",
        sglang=config.sglang,
        ignore_eos=config.ignore_eos,
        stream=config.stream,
    )


def api_key_text(config: RunConfig) -> str | None:
    return config.resolved_api_key()


async def calibrate_target(
    config: RunConfig, synth: Synthesizer, replies: ReplyAccounting
) -> Calibration:
    """Probe the target for its framing overheads (``--calibrate``)."""
    url = config.endpoint_url
    assert url is not None  # validated: a live run has a target
    headers = request_headers(api_key_text(config), None, None)
    async with aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=float(config.request_timeout_secs))
    ) as session:
        return await calibrate(
            session,
            url,
            headers,
            body_options(config),
            synth,
            replies,
            config.user_tagging,
        )


def content_salt(config: RunConfig) -> str:
    """--content-salt; else a random salt, except in a shard, whose salt comes from the
    seed every shard shares (shards of one run must send the bytes one run would)."""
    if config.content_salt is not None:
        return config.content_salt
    if config.shard is not None and config.seed is not None:
        return hashlib.sha256(f"batchbench-shard-salt:{config.seed}".encode()).hexdigest()[:16]
    return secrets.token_hex(8)


def _stoppable(gate: StartGate, shutdown: Shutdown) -> StartGate:
    """A start gate that a shutdown (Ctrl+C while waiting for --start-at) ends at once."""

    async def wait() -> None:
        waiting = asyncio.ensure_future(gate())
        stopping = asyncio.ensure_future(shutdown.stop_event.wait())
        try:
            await asyncio.wait({waiting, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (waiting, stopping):
                task.cancel()
            await asyncio.gather(waiting, stopping, return_exceptions=True)

    return wait


def start_at_gate(start_at: float, warn) -> StartGate:
    """Wait until the wall-clock time ``start_at`` (--start-at); warn when it has passed."""

    async def wait() -> None:
        delay = start_at - time.time()
        if delay < 0:
            warn(f"warning: --start-at was {-delay:.1f} s ago; starting now")
            return
        await asyncio.sleep(delay)

    return wait


def admission_share(config: RunConfig, workload: Workload, root_seed: int) -> Share | None:
    """With --shard: the trajectories and slots this process owns (None: all of them)."""
    shard = config.shard_spec()
    if shard is None:
        return None
    if config.admission_mode == "open-loop":
        offsets = start_offsets(config, workload, root_seed)
        return open_loop_share(offsets, config.max_active_agents, shard)
    return closed_loop_share(len(workload), config.max_active_agents, shard)


async def admit(
    config: RunConfig,
    workload: Workload,
    root_seed: int,
    share: Share | None,
    agents,
    sink=None,
    shutdown: Shutdown | None = None,
    gate: StartGate | None = None,
) -> EngineResult:
    """Run this process's trajectories through closed- or open-loop admission (a shard's in
    its local numbering, reported in global ids and slots)."""
    if share is not None:
        agents = ShardAgents(agents, share)
        if sink is not None:
            outer = sink

            def sink(record, share=share):
                outer(global_record(record, share))

    n_all = len(workload)
    if config.admission_mode == "open-loop":
        if share is not None:
            offsets, cap = list(share.offsets or ()), share.cap
        else:
            offsets, cap = start_offsets(config, workload, root_seed), config.max_active_agents
        result = await run_open_loop(offsets, cap, agents, sink, shutdown, gate)
    else:
        n = len(share.agents) if share is not None else n_all
        cap = share.cap if share is not None else config.max_active_agents
        total = min(config.max_active_agents or n_all, n_all)
        ramp = ramp_up_seconds(config, n_all)
        delays = None
        if ramp > 0 and total > 0:
            delays = (
                ramp_delays(share, total, ramp)
                if share is not None
                else [ramp * slot / total for slot in range(total)]
            )
        result = await run_closed_loop(n, cap or None, agents, sink, shutdown, delays, gate)
    return global_result(result, share) if share is not None else result


def planned_counts(workload: Workload, share: Share | None) -> tuple[int, int]:
    """(trajectories, requests) this process runs."""
    if share is None:
        return len(workload), workload.n_requests
    return len(share.agents), sum(len(workload.turns(agent)) for agent in share.agents)


def generation_workers() -> int:
    """Size of the text-generation pool: min(CPU count, 32)."""
    return min(os.cpu_count() or 1, 32)


# -- the run --------------------------------------------------------------------------
async def _run_loaded(
    config: RunConfig,
    out: RunOutput,
    manifest: Manifest | None,
    workload: Workload | None,
    root_seed: int,
    sha256: str | None,
    started: str,
    steps: _Steps,
) -> RunResult:
    loaded = await steps.call(load_tokenizer, config.tokenizer, config.tokenizer_download or None)
    synth = await steps.call(Synthesizer.prepare, loaded)
    template_name, replies = reply_accounting(config, loaded, out.warning)
    calibration = None
    if config.calibrate:
        calibration = await calibrate_target(config, synth, replies)
        url = config.endpoint_url
        assert url is not None  # calibrate_target needed it
        for line in calibration.lines(url):
            if line.startswith("warning:"):
                out.warning(line)
            else:
                out.lines([line])
    overheads = starting_overheads(config, calibration)
    if workload is None:
        workload = build_workload(config, manifest, root_seed, overheads)
        planned(config, workload, root_seed, out)
    salt = content_salt(config)
    replay = config.replay
    calibrated = calibration is not None and replay
    setup = RunSetup(
        timestamp=started,
        agents=len(workload),
        manifest_sha256=sha256,
        schema_version=workload.schema_version,
        tokenizer_source=loaded.source,
        root_seed=root_seed,
        content_salt=salt,
        chat_template=template_name,
        calibration=calibration.as_dict() if calibration is not None else None,
        replay_initial_overhead_tokens=(
            overheads[0] if calibrated else config.replay_initial_overhead_tokens
        ),
        replay_turn_overhead_tokens=overheads[1]
        if calibrated
        else config.replay_turn_overhead_tokens,
        framing_initial=overheads[0],
        framing_turn=overheads[1],
        framing_measured=calibration is not None
        or config.replay_initial_overhead_tokens is not None
        or config.replay_turn_overhead_tokens is not None,
    )
    out.lines(banner_lines(config, setup))
    factory = ContentFactory(synth, workload, root_seed, salt)
    counter = None
    if workload.blocks is not None and config.prompt_correction and template_name is not None:
        counter = template_counter(loaded, load_chat_template(template_name, loaded))
    events = LifecycleWriter(
        config.agent_events_jsonl,
        config.dp_ranks,
        workload.trajectory_ids,
        True,
        workload.recorded_start_after_ms,
        workload.request_offsets,
    )
    live: LiveRun | None = None
    share = admission_share(config, workload, root_seed)
    wall_origin = time.time()
    try:
        if config.dry_run:
            engine = await _dry_run(config, workload, factory, events, share, steps.gate)
            wall_origin = time.time() - engine.total_duration
        else:
            live = await _live_run(
                config, setup, workload, factory, events, replies, out, steps, counter, share
            )
            engine = live.engine
            wall_origin = live.wall_origin if live.wall_origin is not None else wall_origin
    finally:
        events.close()
    counts = planned_counts(workload, share)
    never = None
    if live is not None:  # trajectories never started: all their requests were skipped
        started_agents = live.recorder.started_agents
        ids = share.agents if share is not None else range(len(workload))
        never = sum(len(workload.turns(a)) for a in ids if a not in started_agents)
    lifecycle = events.log
    assert lifecycle is not None
    result = finish_run(config, setup, counts, never, workload, engine, live, lifecycle)
    shard = config.shard_spec()
    if shard is not None:
        from batchbench.scale.snapshot import snapshot

        # A dry run's lines need the workload, which a merge may not have.
        lines = list(dry_run_lines(workload, engine)) if config.dry_run else None
        data = snapshot(config, setup, (shard.index, shard.count), counts, engine, live,
                        lifecycle, wall_origin, dry_run_lines=lines)  # fmt: skip
        result = replace(result, shard_data=data)
    return write_outputs(result, out)


async def _dry_run(
    config: RunConfig,
    workload: Workload,
    factory: ContentFactory,
    events: LifecycleWriter,
    share: Share | None = None,
    gate: StartGate | None = None,
) -> EngineResult:
    """Admission with instant completion while every text is generated."""
    with ThreadPoolExecutor(
        max_workers=generation_workers(), thread_name_prefix="batchbench-text"
    ) as pool:
        agents = DryRunLoop(factory, workload, pool)
        return await admit(
            config, workload, factory.root_seed, share, agents, events.write, gate=gate
        )


class FramingSource(Protocol):
    """What the results read of a run's framing: the live ``Framing``, or a merged or
    salvaged run's record of it (``batchbench.scale.merge.LearnedFraming``)."""

    def learned(self) -> dict[str, Any] | None: ...


@dataclass
class LiveRun:
    engine: EngineResult
    recorder: Recorder
    interrupted_by: str | None
    exit_status: int
    framing: FramingSource
    finished_by: str | None = None  # "duration" or "window": the run's planned end
    window_end: float | None = None  # benchmark-clock seconds where measurement stopped
    server_metrics: dict | None = None
    wall_origin: float | None = None  # Unix time of the benchmark clock's start


# Young-generation threshold during a live run: per-request objects are short-lived, and
# with thousands of agents the default (700) made full collections take ~45% of client CPU.
GC_THRESHOLDS = (50_000, 50, 100)


async def _live_run(
    config: RunConfig,
    setup: RunSetup,
    workload: Workload,
    factory: ContentFactory,
    events: LifecycleWriter,
    replies: ReplyAccounting,
    out: RunOutput,
    steps: _Steps,
    counter: SegmentCounter | None = None,
    share: Share | None = None,
) -> LiveRun:
    thresholds = gc.get_threshold()
    if steps.tune_gc:  # freeze what setup allocated so collections skip it
        gc.collect()
        gc.freeze()
        gc.set_threshold(*GC_THRESHOLDS)
    pool = ThreadPoolExecutor(
        max_workers=generation_workers(), thread_name_prefix="batchbench-text"
    )
    try:
        return await _drive(
            config,
            setup,
            workload,
            factory,
            pool,
            events,
            replies,
            out,
            steps.handle_signals,
            counter,
            share,
            steps,
        )
    finally:
        # Texts prepared ahead for turns that will never run are not waited for.
        pool.shutdown(wait=False, cancel_futures=True)
        if steps.tune_gc:
            gc.unfreeze()
            gc.set_threshold(*thresholds)


def driver_settings(config: RunConfig) -> DriverSettings:
    url = config.endpoint_url
    assert url is not None  # validated: a live run has a target
    return DriverSettings(
        url=url,
        body=body_options(config),
        api_key=api_key_text(config),
        user_tagging=config.user_tagging,
        user_prefix=config.user_prefix,
        seed=config.seed,
        dp_ranks=config.dp_ranks,
        timeout_seconds=float(config.request_timeout_secs),
        max_retries=config.max_retries,
        retry_delay_ms=config.retry_delay_ms,
        max_retry_wait_seconds=config.max_retry_wait,
        max_response_bytes=config.max_response_bytes,
        verbose=config.verbose,
    )


async def _drive(
    config: RunConfig,
    setup: RunSetup,
    workload: Workload,
    factory: ContentFactory,
    pool: ThreadPoolExecutor,
    events: LifecycleWriter,
    replies: ReplyAccounting,
    out: RunOutput,
    handle_signals: bool,
    counter: SegmentCounter | None = None,
    share: Share | None = None,
    steps: _Steps | None = None,
) -> LiveRun:
    gate = steps.gate if steps is not None else None
    settings = driver_settings(config)
    shutdown = Shutdown(config.grace_seconds)
    if gate is not None:
        gate = _stoppable(gate, shutdown)
    recorder = Recorder(dp_ranks=config.dp_ranks, goodput=config.goodput_thresholds)
    if config.request_events_jsonl:
        recorder.request_events = JsonlFile(config.request_events_jsonl)
    show_progress = config.progress and progress_wanted()
    trajectories, requests = planned_counts(workload, share)
    progress = Progress(trajectories, requests, recorder) if show_progress else None
    background = [asyncio.ensure_future(recorder.sample_lag())]
    if progress is not None:
        background.append(asyncio.ensure_future(progress.refresh()))
    if steps is not None and steps.monitor is not None:
        watch = steps.monitor(recorder, (trajectories, requests), setup)
        background.append(asyncio.ensure_future(watch))

    # A planned end lets requests in flight finish: up to one request timeout.
    planned_grace = float(config.request_timeout_secs) + 1.0
    window_count = 0
    # A shard (or worker) ends after its even part of the window, ceil(T / N): the parts
    # together measure about the trajectories one run would.
    window_trajectories = config.window_trajectories
    shard = config.shard_spec()
    if window_trajectories is not None and shard is not None:
        window_trajectories = -(-window_trajectories // shard.count)

    def sink(record) -> None:
        nonlocal window_count
        figures = recorder.take_agent(record.agent_id)
        events.write(record, figures.as_fields() if figures is not None else None)
        if progress is not None:
            progress.trajectory_finished()
        if window_trajectories is not None and record.admitted_at >= config.warmup:
            window_count += 1
            if window_count >= window_trajectories:
                shutdown.finish("window", planned_grace)

    wall_origin: float | None = None

    def note_origin(origin: float) -> None:
        nonlocal wall_origin
        wall_origin = time.time() - (time.perf_counter() - origin)

    def schedule_end(origin: float) -> None:
        if config.duration is not None:
            delay = origin + config.duration - time.perf_counter()
            asyncio.get_running_loop().call_later(
                max(delay, 0.0), shutdown.finish, "duration", planned_grace
            )

    max_connections = (
        min(config.max_active_agents or len(workload), len(workload))
        if config.admission_mode == "closed-loop"
        else config.max_active_agents
    )
    warning = raise_open_file_limit(max_connections or len(workload))
    if warning:
        out.warning(warning)
    session = make_session(settings, max_connections)
    transport = run_transport(settings, max_connections, session)
    installed = False
    scraper: ServerMetricsScraper | None = None
    scraping: asyncio.Future | None = None
    try:
        fidelity = Fidelity(
            Framing(
                setup.framing_initial,
                setup.framing_turn,
                learn=config.prompt_correction,
                measured=setup.framing_measured,
            ),
            replies if config.prompt_correction else None,
            prompt_counter=counter,
            keep_reasoning=config.replay_reasoning == "keep",
        )
        if config.prompt_oracle == "server":
            oracle = PromptOracle(
                session, server_root(settings.url), request_headers(settings.api_key, None, None)
            )
            await oracle.detect()
            fidelity = replace(fidelity, oracle=oracle)
        agents = HttpAgentLoop(
            settings,
            workload,
            factory,
            pool,
            transport,
            recorder,
            shutdown,
            fidelity,
        )
        agents.clock_listeners.append(note_origin)
        agents.clock_listeners.append(schedule_end)
        if config.server_metrics:
            scraper = ServerMetricsScraper(
                config.server_metrics, config.server_metrics_interval, config.server_metrics_jsonl
            )

            def start_scraping(origin: float, scraper=scraper) -> None:
                # On the benchmark clock from its first instant: the baseline scrape is the
                # first thing the loop does once the clock runs.
                nonlocal scraping
                scraper.origin = origin
                scraping = asyncio.ensure_future(scraper.start())

            agents.clock_listeners.append(start_scraping)
        if handle_signals:
            shutdown.install()  # after the oracle's detection, which Ctrl+C interrupts as usual
            installed = True
        engine = await admit(
            config, workload, factory.root_seed, share, agents, sink, shutdown, gate
        )
        recorder.stop_clock()
        if scraping is not None:
            await scraping
        if scraper is not None:
            await scraper.stop()
    finally:
        if scraping is not None and not scraping.done():
            scraping.cancel()
        if scraper is not None:
            await scraper.close()
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        recorder.totals.resent_requests = getattr(transport, "resent", 0)
        await transport.close()
        await session.close()
        if installed:
            shutdown.uninstall()
        if progress is not None:
            progress.close()
        if recorder.request_events is not None:
            recorder.request_events.close()
    origin = recorder.origin
    window_end = (
        shutdown.finished_at - origin
        if shutdown.finished_at is not None and origin is not None
        else engine.total_duration
    )
    metrics = None
    if scraper is not None:
        metrics = scraper.document(min(config.warmup, window_end), window_end)
    return LiveRun(
        engine,
        recorder,
        shutdown.signal_name,
        shutdown.exit_status if shutdown.stopped else 0,
        agents.fidelity.framing,
        finished_by=shutdown.finished_by,
        window_end=window_end,
        server_metrics=metrics,
        wall_origin=wall_origin,
    )


# -- after the run --------------------------------------------------------------------
def finish_run(
    config: RunConfig,
    setup: RunSetup,
    planned: tuple[int, int],
    never_started_requests: int | None,
    workload: Workload | None,
    engine: EngineResult,
    live: LiveRun | None,
    lifecycle: Sequence[dict[str, Any]],
) -> RunResult:
    """The result of a finished run (or of merged shards): ``planned`` is (trajectories,
    requests) the run owned; ``never_started_requests`` the requests of trajectories that
    never started (counted as skipped). Writes nothing."""
    completed = [r for r in engine.records if r.completed]
    if live is None:
        totals = RunTotals()  # a dry run sends nothing: no request counts as sent
        figures = None
    else:
        totals = live.recorder.totals
        recorder = live.recorder
        figures = LiveFigures(
            stream=recorder.stream,
            server_cached_tokens=recorder.server_cached_tokens,
            ranks=recorder.ranks,
            health=recorder.health(),
            interrupted_by=live.interrupted_by,
            streaming=config.stream,
            fidelity=recorder.fidelity,
            framing=live.framing.learned() if config.prompt_correction else None,
            no_usage_failures=sum(1 for f in totals.failures if f[3] in NO_USAGE_ERRORS),
            requests=totals.total_requests,
            input_tokens=totals.total_input_tokens,
        )
    if live is not None and never_started_requests:
        live.recorder.requests_skipped(None, never_started_requests)
    totals.agents = planned[0]
    totals.completed_agents = len(completed)
    totals.planned_tool_invocations = planned[1]
    totals.agent_latencies_ms = [r.loop_seconds * 1000.0 for r in completed]
    interrupted = live is not None and bool(live.interrupted_by)
    summary = build_summary(config, setup, totals, engine, figures, interrupted)
    exit_status = live.exit_status if live is not None else 0
    if exit_status == 0 and summary.verdict == "failed":
        exit_status = EXIT_REQUESTS_FAILED
    if exit_status == 0 and summary.verdict == "incomplete":
        exit_status = EXIT_REQUESTS_LOST
    failures = tuple(totals.failures)
    window, sections = _measured(config, engine, live, figures)
    result = RunResult(
        config=config,
        setup=setup,
        summary=summary,
        failures=failures,
        lifecycle=lifecycle,
        ranks=tuple(figures.ranks) if figures is not None else (),
        fidelity=figures.fidelity if figures is not None else None,
        client_health=figures.health if figures is not None else None,
        stream=figures.stream if figures is not None else None,
        framing=figures.framing if figures is not None else None,
        interrupted_by=live.interrupted_by if live is not None else None,
        exit_status=exit_status,
        workload=workload,
        engine=engine,
        live=figures,
        window=window,
        sections=sections,
        finished_by=live.finished_by if live is not None else None,
    )
    return result


def _measured(
    config: RunConfig, engine: EngineResult, live: LiveRun | None, figures: LiveFigures | None
) -> tuple[WindowFigures | None, dict[str, Any] | None]:
    """The measured window and the results JSON sections drawn from per-request samples."""
    if live is None or figures is None:
        return None, None
    recorder = live.recorder
    inputs = WindowInputs(
        samples=recorder.samples,
        gaps_ms=recorder.stream.itl_ms,
        records=engine.records,
        series=recorder.series,
        health=figures.health,
        wall_seconds=recorder.wall_seconds or engine.total_duration,
        goodput=config.goodput_thresholds,
        objectives=config.slo,
        percents=config.percentiles,
    )
    end = live.window_end if live.window_end is not None else engine.total_duration
    window = window_figures(inputs, min(config.warmup, end), end)
    metrics = live.server_metrics
    if metrics is not None:
        ttft = window.latency.get("ttft_ms")
        verdict = server_verdict(metrics.get("concepts"), ttft.get(50.0) if ttft else None)
        window = replace(window, server=verdict)
    ranks, source = rank_rows(figures.ranks, inputs, metrics)
    sections: dict[str, Any] = {
        "kind": "run",
        "finished_by": live.finished_by,
        "window": window.as_dict(),
        "distributions": distributions(inputs, window),
        "timeseries": recorder.series.document(),
        "ranks": ranks,
        "ranks_source": source,
        "server_metrics": metrics,
    }
    return window, sections


def config_file_path(config: RunConfig) -> str | None:
    """Where the resolved options go: beside the results JSON, else beside the CSV; only
    beside a regular file (not a pipe or a device)."""
    results = config.results_json or config.results_csv
    if results is None or not os.path.isfile(results):
        return None
    path = Path(results)
    return str(path.with_name(path.stem + ".config.toml"))


def write_outputs(result: RunResult, out: RunOutput | None = None) -> RunResult:
    """Write the summary files the config names; every one is attempted, and a failure
    raises OutputError carrying the result (with what was written). The resolved options
    file is a convenience: failing to write it is a warning."""
    config = result.config
    written: list[tuple[str, str]] = []
    if config.agent_events_jsonl:
        written.append(("agent lifecycle events", config.agent_events_jsonl))
    if config.request_events_jsonl and not config.dry_run:
        written.append(("request events", config.request_events_jsonl))
    if config.server_metrics_jsonl and not config.dry_run:
        written.append(("server metrics", config.server_metrics_jsonl))
    errors: list[str] = []
    if config.results_csv:
        try:
            extra = window_csv(result.window, config.percentiles)
            write_csv(config.results_csv, csv_row(result.summary), extra)
            written.append(("agent benchmark summary", config.results_csv))
        except BatchbenchError as exc:
            errors.append(str(exc))
    document = None
    if config.results_json or config.report_html:
        document = summary_document(
            config, result.setup, result.summary, result.failures, result.live
        )
        if result.sections:
            document.update(result.sections)
    if config.results_json and result.shard_data is not None and config.shard is not None:
        assert document is not None  # made for results_json
        try:
            document["shard"] = _write_shard_data(result, config.results_json)
            written.append(("shard raw data", document["shard"]["data_path"]))
        except BatchbenchError as exc:
            errors.append(str(exc))
    if config.results_json:
        assert document is not None  # made for results_json
        try:
            write_json(config.results_json, document)
            written.append(("agent benchmark JSON summary", config.results_json))
        except BatchbenchError as exc:
            errors.append(str(exc))
    if config.report_html and document is not None:
        try:
            from batchbench.report import write_report

            name = os.path.basename(config.results_json) if config.results_json else "this run"
            write_report([dict(document, _report_source=name)], config.report_html)
            written.append(("HTML report", config.report_html))
        except BatchbenchError as exc:
            errors.append(str(exc))
    options_path = config_file_path(config) if not errors else None
    if options_path is not None:
        resolved = replace(_as_given(config), seed=result.setup.root_seed)
        text = resolved.to_toml(salt_used=result.setup.content_salt)
        try:
            Path(options_path).write_text(text, encoding="utf-8")
            written.append(("resolved options", options_path))
        except (OSError, ValueError) as exc:
            if out is not None:
                out.warning(
                    f"warning: the resolved options were not written to {options_path}: {exc}"
                )
    result = replace(result, written=tuple(written))
    if errors:
        raise OutputError("; ".join(errors), result)
    return result


def _write_shard_data(result: RunResult, results_json: str) -> dict[str, Any]:
    """Save a shard's raw data beside its results JSON; the JSON's ``shard`` section."""
    from batchbench.scale.partial import data_path, save

    data = result.shard_data
    path = data_path(results_json)
    save(data, path)
    config = result.config
    index, count = data.shard
    return {
        "index": index,
        "count": count,
        "data": os.path.basename(path),
        "data_path": path,
        "wall_origin": data.meta["wall_origin"],
        "agent_events": os.path.basename(config.agent_events_jsonl)
        if config.agent_events_jsonl
        else None,
        "request_events": os.path.basename(config.request_events_jsonl)
        if config.request_events_jsonl and not config.dry_run
        else None,
    }


def _as_given(config: RunConfig) -> RunConfig:
    """The options a user would pass again: with --sim, no host (the simulator's URL is
    new every run)."""
    if config.sim:
        metrics = config.server_metrics
        if metrics is not None and config.host and metrics.startswith(config.host):
            metrics = SIM_METRICS  # the simulator's URL is new every run
        return replace(config, host=None, server_metrics=metrics)
    return config
