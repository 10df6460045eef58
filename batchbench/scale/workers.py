"""``--workers N``: one run over N client processes on this machine, merged into one result.

Each worker is a fresh interpreter (multiprocessing's spawn: no inherited event loop,
threads or tokenizer state) running the shard ``(i + k·N)/(K·N)`` of the run (shard i/K
of a sharded run, else 0/1), so worker k owns routing slots k, k+N, … and its exact part
of the active-agent cap. The parent starts the simulator and checks the target once, then
waits: every worker loads the manifest and tokenizer and prepares its first requests, says
it is ready, and starts its clock at the common time the parent sends. Workers report
progress twice a second (one global progress bar) and hand their raw measurements back
through their pipe; the parent merges them exactly (``merge``) and writes the outputs a
single process would. Workers run in their own process group: Ctrl+C reaches the parent,
which passes SIGINT/SIGTERM on (``supervisor``), so the grace period works as in one
process.

A worker that dies (any signal, a crash) costs only what it had not written down: the
others run on to the end, so none of their planned requests is lost as well, and the
parent then merges the dead worker's request events and lifecycle records (``salvage``),
counts the rest of its share as ``lost``, names it and its cause, and exits 1.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import secrets
import shutil
import signal
import tempfile
import threading
import time
import traceback
from dataclasses import asdict, replace
from multiprocessing.connection import Connection
from typing import Any

from batchbench.config import RunConfig
from batchbench.drive.shutdown import EXIT_STATUS
from batchbench.errors import BatchbenchError, UsageError
from batchbench.lifeline import die_with_parent
from batchbench.results.metrics import RunTotals
from batchbench.results.placement import rank_layout_lines
from batchbench.results.progress import Progress, progress_wanted
from batchbench.results.recording import Recorder
from batchbench.results.summary import RunSetup
from batchbench.scale.combine import finish_merged
from batchbench.scale.loss import LostWorker
from batchbench.scale.merge import check_shards, merge
from batchbench.scale.partition import Shard
from batchbench.scale.salvage import salvage
from batchbench.scale.supervisor import PROGRESS_SECONDS, Supervisor, WorkerState
from batchbench.stages.console import Silent
from batchbench.stages.hosting import event_loop_runner, worker
from batchbench.stages.prepare import calibrate_ahead, content_salt
from batchbench.stages.sequence import check_run, run_stages
from batchbench.stages.target import (
    check_rank_layout,
    check_target,
    sim_chat_template,
    sim_process,
    targeting_sim,
)


class _ChildOutput:
    """A worker's console lines and warnings, sent to the parent."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn

    def lines(self, lines) -> None:
        self._conn.send(("lines", list(lines)))

    def warning(self, text: str) -> None:
        self._conn.send(("warning", text))


def _child(config: RunConfig, conn: Connection, parent_pid: int) -> None:
    """A worker process: run its shard, send planned/ready/progress/stopping/done (or
    error). It ends with its parent, at once (SIGKILL): nobody would merge what it
    measured, and it must not go on loading the server; the events files it wrote stay
    in the hidden folder."""
    os.setpgrp()  # Ctrl+C reaches the parent only; it passes signals on
    # Until the run's graceful stop is installed (before it reports ready), a signal must
    # not kill the worker half-started: the parent holds signals back until then. They
    # were blocked while this process started (see ``_spawn``): ignored, then unblocked,
    # a Ctrl+C that reached it while it was still in the terminal's group is dropped.
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    die_with_parent(signal.SIGKILL, parent_pid)
    announced = asyncio.Event()  # its share is known to the parent before it says ready

    async def gate() -> None:
        if not config.dry_run:
            await announced.wait()
        conn.send(("ready",))
        loop = asyncio.get_running_loop()
        message = await loop.run_in_executor(None, conn.recv)
        start = float(message[1])
        delay = start - time.time()
        if delay > 0:
            await asyncio.sleep(delay)

    async def monitor(recorder: Recorder, planned: tuple[int, int], setup: RunSetup) -> None:
        conn.send(("planned", planned, asdict(setup)))
        announced.set()
        try:
            while True:
                await asyncio.sleep(PROGRESS_SECONDS)
                conn.send(("progress", _counts(recorder)))
        except asyncio.CancelledError:
            conn.send(("stopping",))  # the run is over: its results follow
            raise

    try:
        with event_loop_runner() as runner:
            result = runner.run(run_stages(config, _ChildOutput(conn), worker(gate, monitor)))
        conn.send(("done", result.shard_data, result.config.model))
    except (BrokenPipeError, EOFError):
        pass  # the parent is gone: nobody to tell
    except UsageError as exc:
        _tell(conn, ("error", "usage", str(exc)))
    except BatchbenchError as exc:
        _tell(conn, ("error", "runtime", str(exc)))
    except BaseException as exc:  # a bug: the parent prints it in one line, the trace here
        traceback.print_exc()
        _tell(conn, ("error", "runtime", f"agent worker task failed: {exc!r}"))
    finally:
        conn.close()


def _tell(conn: Connection, message: tuple) -> None:
    with contextlib.suppress(OSError):  # the parent is gone
        conn.send(message)


def _counts(recorder) -> tuple[int, int, int, int, int]:
    """(settled, failed, output tokens, active agents, finished trajectories)."""
    totals = recorder.totals
    active = len(recorder.agents)
    return (
        totals.total_requests + totals.cancelled_requests,
        totals.failed_requests,
        totals.total_output_tokens,
        active,
        len(recorder.started_agents) - active,
    )


class _ProgressView:
    """What the progress bar reads, summed over workers."""

    def __init__(self) -> None:
        self.totals = RunTotals()
        self.agents: range = range(0)


def worker_configs(config: RunConfig, workers: int, folder: str) -> list[RunConfig]:
    """Each worker's configuration: its shard, common seed and salt, no simulator or
    preflight of its own, its events files in ``folder``; worker 0 scrapes the metrics."""
    base = config.shard_spec() or Shard(0, 1)
    configs = []
    for k in range(workers):
        shard = base.split(workers, k)
        configs.append(
            replace(
                config,
                shard=shard.label,
                workers=workers,  # its banner names the workers; it spawns none itself
                start_at=None,
                preflight=False,
                progress=False,
                sim=False,
                sim_args=None,
                sim_dp_ranks=None,
                results_csv=None,
                results_json=None,
                report_html=None,
                agent_events_jsonl=os.path.join(folder, f"agents.{k}.jsonl")
                if config.agent_events_jsonl
                else None,
                request_events_jsonl=os.path.join(folder, f"requests.{k}.jsonl")
                if config.request_events_jsonl
                else None,
                server_metrics=config.server_metrics if k == 0 else (),
                server_metrics_jsonl=config.server_metrics_jsonl if k == 0 else None,
            )
        )
    return configs


def run_workers(config: RunConfig, output: Any = None):
    """Run ``config`` over ``config.worker_count`` processes; the merged RunResult."""
    check_run(config)
    out = output if output is not None else Silent()
    workers = config.worker_count
    if config.max_active_agents is not None:
        shard = config.shard_spec()
        workers = min(workers, config.max_active_agents // (shard.count if shard else 1))
    sim = sim_process(config) if config.sim else None
    try:
        target = config
        if sim is not None:
            sim.start()
            target = targeting_sim(config, sim)
        calibrated = target
        if not target.dry_run:
            with event_loop_runner() as runner:
                target = runner.run(check_target(target, out))
                layout = runner.run(check_rank_layout(target))
                # Once here, for every worker (which then sends no probes of its own).
                calibrated = runner.run(calibrate_ahead(target, out))
            if layout is not None:  # the workers print the banner, without the probes
                for note in layout.notes:
                    out.warning(note)
                out.lines(rank_layout_lines(layout.workers, target.routed_worker_header))
        # Workers share one seed and salt (one run's content), not a simulator or preflight.
        common = replace(
            calibrated,
            seed=config.seed if config.seed is not None else secrets.randbits(64),
            content_salt=content_salt(config),
            chat_template=sim_chat_template(config) if config.sim else config.chat_template,
        )
        return _drive_workers(common, target, workers, out)
    finally:
        if sim is not None:
            sim.stop()


def _drive_workers(config: RunConfig, as_run: RunConfig, workers: int, out: Any):
    """``config``: what the workers share; ``as_run``: the run as the user asked for it."""
    target_dir = os.path.dirname(os.path.abspath(config.results_json or "results")) or "."
    folder = tempfile.mkdtemp(prefix=".batchbench-workers-", dir=_writable(target_dir))
    configs = worker_configs(config, workers, folder)
    supervisor = Supervisor(config, [], out)
    merged = False
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM):
            previous[signum] = signal.signal(signum, supervisor.on_signal)
    try:
        supervisor.states = _spawn(configs)
        _watch(config, supervisor)
        supervisor.writing = True
        result = _finish(config, as_run, configs, supervisor, out)
        merged = True
        return result
    finally:
        _stop_all(supervisor.states, config.dry_run)
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if merged or config.dry_run or not _holds_events(folder):
            shutil.rmtree(folder, ignore_errors=True)
        else:  # never lose what the workers wrote: the run ended before it was merged
            out.warning(f"warning: the workers' events files are kept in {folder}")


def _spawn(configs: list[RunConfig]) -> list[WorkerState]:
    """Start every worker with SIGINT/SIGTERM ignored and blocked (both survive the exec):
    until a worker has left the terminal's process group (its first act), a Ctrl+C meant
    for the parent cannot kill it half-started. The parent's own signals stay pending
    while they are blocked and reach its handlers when the mask is restored."""
    from multiprocessing import resource_tracker

    # Started first: starting it unblocks SIGINT/SIGTERM, which would drop what arrives
    # while they are ignored here.
    resource_tracker.ensure_running()
    context = multiprocessing.get_context("spawn")
    states: list[WorkerState] = []
    blocked = {signal.SIGINT, signal.SIGTERM}
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, blocked)
    handlers = {}
    if threading.current_thread() is threading.main_thread():
        handlers = {signum: signal.signal(signum, signal.SIG_IGN) for signum in blocked}
    try:
        for k, child_config in enumerate(configs):
            parent_end, child_end = context.Pipe()
            process = context.Process(
                target=_child, args=(child_config, child_end, os.getpid()),
                name="batchbench-worker",
            )  # fmt: skip
            try:
                process.start()
            finally:
                child_end.close()
            states.append(WorkerState(k, process, parent_end))
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    return states


def _watch(config: RunConfig, supervisor: Supervisor) -> None:
    """Run the supervisor with the global progress bar (on a terminal)."""
    show = config.progress and progress_wanted() and not config.dry_run
    view = _ProgressView()
    bar: list[Any] = []

    def draw(states: list[WorkerState]) -> None:
        if not show or any(state.start is None for state in states):
            return
        if not bar:
            trajectories = sum(state.start.planned[0] for state in states if state.start)
            requests = sum(state.start.planned[1] for state in states if state.start)
            bar.append(Progress(trajectories, requests, view))
        _update(view, bar[0], [state.counts for state in states if state.counts])
        bar[0].draw()

    try:
        supervisor.run(draw)
    finally:
        if bar:
            _update(view, bar[0], [s.counts for s in supervisor.states if s.counts])
            bar[0].close()


def _finish(
    config: RunConfig,
    as_run: RunConfig,
    configs: list[RunConfig],
    supervisor: Supervisor,
    out: Any,
):
    """Merge what every worker measured (a dead one's from its files) and write it all."""
    states = supervisor.states
    workers = len(states)
    shards = []
    lost: list[LostWorker] = []
    for state, child_config in zip(states, configs, strict=True):
        if state.result is not None:
            shards.append(state.result)
            continue
        lost_worker, data = _account(config, child_config, state, supervisor, workers)
        lost.append(lost_worker)
        shards.append(data)
    expected = [shard_of(c).index for c in configs]
    merged = merge(check_shards(shards, [f"worker {k}" for k in range(workers)], expected))
    merged = replace(merged, config=as_run)
    if supervisor.signal_name and merged.live is not None and not merged.live.interrupted_by:
        # Every worker that stopped for the signal died of it: the run was still interrupted.
        merged.live.interrupted_by = supervisor.signal_name
        merged.live.exit_status = EXIT_STATUS.get(supervisor.signal_name, 130)
    outputs = {
        "results_json": config.results_json,
        "results_csv": config.results_csv,
        "agent_events_jsonl": config.agent_events_jsonl,
        "request_events_jsonl": config.request_events_jsonl,
        "server_metrics_jsonl": config.server_metrics_jsonl,
        "report_html": config.report_html,
    }
    request_events = [c.request_events_jsonl for c in configs]
    sections = {"lost_workers": [w.as_dict() for w in lost]} if lost else None
    result = finish_merged(merged, outputs, request_events, out, sections)
    return replace(result, lost_workers=tuple(w.text() for w in lost))


def _account(
    config: RunConfig,
    child_config: RunConfig,
    state: WorkerState,
    supervisor: Supervisor,
    workers: int,
) -> tuple[LostWorker, Any]:
    """A dead worker: its raw data rebuilt from its files, and what it cost."""
    if config.dry_run or state.start is None or supervisor.start_time is None:
        raise BatchbenchError(f"worker {state.index} (of {workers}) {state.cause}")
    origin = supervisor.start_time
    died = state.died_at if state.died_at is not None else time.time()
    shard = shard_of(child_config)
    salvaged = salvage(
        child_config,
        (shard.index, shard.count),
        state.start,
        origin,
        max(died - origin, 0.0),
        state.peak_active,
    )
    lost = LostWorker(
        index=state.index,
        workers=workers,
        pid=state.process.pid,
        cause=state.cause or "vanished",
        exitcode=state.exitcode,
        planned_requests=int(state.start.planned[1]),
        recorded_requests=salvaged.recorded,
        lost_requests=salvaged.lost,
        events_file=child_config.request_events_jsonl is not None,
    )
    return lost, salvaged.data


def _stop_all(states: list[WorkerState], dry_run: bool) -> None:
    """Normally every worker has exited; after an error, stop the rest (gracefully when
    they have a graceful stop, else at once), and close the pipes."""
    for state in states:
        if state.process.is_alive():
            if state.ready and not dry_run:
                state.process.terminate()  # a live worker's graceful stop
            else:
                state.process.kill()  # still loading (signals ignored), or a dry run
    deadline = time.monotonic() + 10.0
    for state in states:
        state.process.join(timeout=max(deadline - time.monotonic(), 0.1))
        if state.process.is_alive():  # stuck
            state.process.kill()
            state.process.join()
    for state in states:
        state.conn.close()


def _holds_events(folder: str) -> bool:
    """Whether a worker wrote anything into the events folder."""
    try:
        return any(entry.stat().st_size > 0 for entry in os.scandir(folder))
    except OSError:
        return False


def shard_of(config: RunConfig) -> Shard:
    shard = config.shard_spec()
    assert shard is not None
    return shard


def _writable(folder: str) -> str | None:
    return folder if os.access(folder, os.W_OK) else None


def _update(view: _ProgressView, progress, counts: list[tuple[int, ...]]) -> None:
    settled = sum(c[0] for c in counts)
    failed = sum(c[1] for c in counts)
    totals = view.totals
    totals.successful_requests = settled - failed
    totals.failed_requests = failed
    totals.cancelled_requests = 0
    totals.total_output_tokens = sum(c[2] for c in counts)
    view.agents = range(sum(c[3] for c in counts))
    progress.trajectories_finished(sum(c[4] for c in counts))
