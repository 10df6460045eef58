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
which passes each SIGINT/SIGTERM on once, so the grace period works as in one process.
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
from dataclasses import replace
from multiprocessing.connection import Connection, wait
from typing import Any

from batchbench.config import RunConfig
from batchbench.errors import BatchbenchError, UsageError
from batchbench.scale.partition import Shard

PROGRESS_SECONDS = 0.5
START_MARGIN_SECONDS = 0.05  # the go message reaches every worker well within this


class _ChildOutput:
    """A worker's console lines and warnings, sent to the parent."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn

    def lines(self, lines) -> None:
        self._conn.send(("lines", list(lines)))

    def warning(self, text: str) -> None:
        self._conn.send(("warning", text))


def _child(config: RunConfig, conn: Connection) -> None:
    """A worker process: run its shard, send ready/progress/done (or error)."""
    os.setpgrp()  # Ctrl+C reaches the parent only; it passes signals on once
    # Until the run's graceful stop is installed (before it reports ready), a signal must
    # not kill the worker half-started: the parent holds signals back until then.
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)
    from batchbench import api

    async def gate() -> None:
        conn.send(("ready",))
        loop = asyncio.get_running_loop()
        message = await loop.run_in_executor(None, conn.recv)
        start = float(message[1])
        delay = start - time.time()
        if delay > 0:
            await asyncio.sleep(delay)

    async def monitor(recorder, planned) -> None:
        conn.send(("planned", planned))
        while True:
            await asyncio.sleep(PROGRESS_SECONDS)
            conn.send(("progress", _counts(recorder)))

    try:
        with api.event_loop_runner() as runner:
            result = runner.run(
                api._run(
                    config,
                    _ChildOutput(conn),
                    handle_signals=True,
                    offload=False,
                    tune_gc=True,
                    gate=gate,
                    monitor=monitor,
                )
            )
        conn.send(("done", result.shard_data, result.config.model))
    except UsageError as exc:
        conn.send(("error", "usage", str(exc)))
    except BatchbenchError as exc:
        conn.send(("error", "runtime", str(exc)))
    except BaseException as exc:  # a bug: the parent prints it in one line, the trace here
        traceback.print_exc()
        conn.send(("error", "runtime", f"agent worker task failed: {exc!r}"))
    finally:
        conn.close()


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
        from batchbench.results.metrics import RunTotals

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
                server_metrics=config.server_metrics if k == 0 else None,
                server_metrics_jsonl=config.server_metrics_jsonl if k == 0 else None,
            )
        )
    return configs


def run_workers(config: RunConfig, output: Any = None):
    """Run ``config`` over ``config.worker_count`` processes; the merged RunResult."""
    from batchbench import api

    config.check()
    if config.report_html:
        from batchbench.report import require_plotly

        try:
            require_plotly()
        except BatchbenchError as exc:
            raise UsageError(str(exc)) from None
    out = output if output is not None else api._Silent()
    workers = config.worker_count
    if config.max_active_agents is not None:
        shard = config.shard_spec()
        workers = min(workers, config.max_active_agents // (shard.count if shard else 1))
    sim = api.sim_process(config) if config.sim else None
    try:
        target = config
        if sim is not None:
            sim.start()
            target = api.targeting_sim(config, sim)
        if not target.dry_run:
            with api.event_loop_runner() as runner:
                target = runner.run(api.check_target(target, out))
        # Workers share one seed and salt (one run's content), not a simulator or preflight.
        common = replace(
            target,
            seed=config.seed if config.seed is not None else secrets.randbits(64),
            content_salt=api.content_salt(config),
            chat_template=api.sim_chat_template(config) if config.sim else config.chat_template,
        )
        return _drive_workers(common, target, workers, out)
    finally:
        if sim is not None:
            sim.stop()


def _drive_workers(config: RunConfig, as_run: RunConfig, workers: int, out: Any):
    """``config``: what the workers share; ``as_run``: the run as the user asked for it."""
    from batchbench.scale.combine import finish_merged, remove_quietly
    from batchbench.scale.merge import check_shards, merge

    target_dir = os.path.dirname(os.path.abspath(config.results_json or "results")) or "."
    folder = tempfile.mkdtemp(prefix=".batchbench-workers-", dir=_writable(target_dir))
    configs = worker_configs(config, workers, folder)
    context = multiprocessing.get_context("spawn")
    processes = []
    conns: list[Connection] = []
    try:
        for child_config in configs:
            parent_end, child_end = context.Pipe()
            process = context.Process(
                target=_child, args=(child_config, child_end), name="batchbench-worker"
            )
            process.start()
            child_end.close()
            processes.append(process)
            conns.append(parent_end)
        shards = _supervise(config, processes, conns, out)
        expected = [shard_of(c).index for c in configs]
        merged = merge(check_shards(shards, [f"worker {k}" for k in range(workers)], expected))
        merged = replace(merged, config=as_run)
        outputs = {
            "results_json": config.results_json,
            "results_csv": config.results_csv,
            "agent_events_jsonl": config.agent_events_jsonl,
            "request_events_jsonl": config.request_events_jsonl,
            "server_metrics_jsonl": config.server_metrics_jsonl,
            "report_html": config.report_html,
        }
        request_events = [c.request_events_jsonl for c in configs]
        result = finish_merged(merged, outputs, request_events, out)
        remove_quietly([c.agent_events_jsonl for c in configs] + request_events)
        return result
    finally:
        for process in processes:  # normally all exited; after an error, stop the rest
            if process.is_alive():
                process.terminate()  # a live worker's graceful stop
        deadline = time.monotonic() + 10.0
        for process in processes:
            process.join(timeout=max(deadline - time.monotonic(), 0.1))
            if process.is_alive():  # a dry run (no graceful stop), or stuck
                process.kill()
                process.join()
        for conn in conns:
            conn.close()
        shutil.rmtree(folder, ignore_errors=True)


def shard_of(config: RunConfig) -> Shard:
    shard = config.shard_spec()
    assert shard is not None
    return shard


def _writable(folder: str) -> str | None:
    return folder if os.access(folder, os.W_OK) else None


def _supervise(config: RunConfig, processes, conns: list[Connection], out: Any) -> list:
    """Wait for every worker: pass on the banner, start them together, draw progress,
    forward signals; their raw results in worker order."""
    from batchbench.results.progress import Progress, progress_wanted

    n = len(processes)
    ready: set[int] = set()
    planned: dict[int, tuple[int, int]] = {}
    counts: dict[int, tuple[int, ...]] = {}
    results: dict[int, Any] = {}
    warnings: set[str] = set()
    started = False
    progress = None
    view = _ProgressView()
    show = config.progress and progress_wanted(False) and not config.dry_run
    forwarded: list[int] = []

    def send(k: int, signum: int) -> None:
        process = processes[k]
        if process.is_alive() and process.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signum)

    def forward(signum, _frame) -> None:
        """A worker takes signals once it is ready (its graceful stop is installed by
        then); one that is not ready yet gets them when it is. A dry run has no graceful
        stop: it ends at once, as one process does."""
        forwarded.append(signum)
        if config.dry_run:
            raise KeyboardInterrupt
        for k in ready:
            send(k, signum)

    previous = {}
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM):
            previous[signum] = signal.signal(signum, forward)
    try:
        open_conns = dict(enumerate(conns))
        while len(results) < n:
            waitables: list[Any] = list(open_conns.values())
            waitables += [p.sentinel for k, p in enumerate(processes) if k not in results]
            for item in wait(waitables, timeout=PROGRESS_SECONDS):
                k = next((i for i, c in open_conns.items() if c is item), None)
                if k is None:
                    continue
                try:
                    message = item.recv()
                except EOFError:
                    del open_conns[k]
                    continue
                kind = message[0]
                if kind == "lines" and k == 0:
                    out.lines(message[1])
                elif kind == "warning" and message[1] not in warnings:
                    warnings.add(message[1])
                    out.warning(message[1])
                elif kind == "ready":
                    ready.add(k)
                    for signum in forwarded:  # what arrived while it was getting ready
                        send(k, signum)
                elif kind == "planned":
                    planned[k] = message[1]
                elif kind == "progress":
                    counts[k] = message[1]
                elif kind == "done":
                    results[k] = message[1]
                elif kind == "error":
                    if message[1] == "usage":
                        raise UsageError(message[2])
                    raise BatchbenchError(f"worker {k}: {message[2]}")
            for k, process in enumerate(processes):
                if k not in results and not process.is_alive() and k not in open_conns:
                    raise BatchbenchError(
                        f"worker {k} exited with status {process.exitcode} before its results"
                    )
            if not started and len(ready) == n:
                start = time.time() + START_MARGIN_SECONDS
                if config.start_at is not None:
                    if config.start_at < time.time():
                        out.warning(
                            f"warning: --start-at was {time.time() - config.start_at:.1f} s "
                            "ago; starting now"
                        )
                    start = max(start, config.start_at)
                for conn in conns:
                    conn.send(("go", start))
                started = True
            if show and len(planned) == n:
                if progress is None:
                    trajectories = sum(p[0] for p in planned.values())
                    requests = sum(p[1] for p in planned.values())
                    progress = Progress(trajectories, requests, view)
                _update(view, progress, counts)
                progress.draw()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if progress is not None:
            _update(view, progress, counts)
            progress.close()
    return [results[k] for k in range(n)]


def _update(view: _ProgressView, progress, counts: dict[int, tuple[int, ...]]) -> None:
    settled = sum(c[0] for c in counts.values())
    failed = sum(c[1] for c in counts.values())
    totals = view.totals
    totals.successful_requests = settled - failed
    totals.failed_requests = failed
    totals.cancelled_requests = 0
    totals.total_output_tokens = sum(c[2] for c in counts.values())
    view.agents = range(sum(c[3] for c in counts.values()))
    progress.trajectories_finished(sum(c[4] for c in counts.values()))
