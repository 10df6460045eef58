"""Run trajectories through closed- or open-loop admission on the benchmark clock.

The engine knows nothing about HTTP: it admits trajectories, hands each one to an
``AgentLoop`` (the dry-run loop, or the HTTP driver) and records when each was
scheduled, admitted and collected.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any, Protocol

from batchbench.drive.admission import ClosedLoopAdmission, SlotPool
from batchbench.drive.alarm import Alarm
from batchbench.drive.shutdown import Shutdown
from batchbench.results.lifecycle import EngineResult, Outcome, TrajectoryRecord

OPEN_LOOP_LOOKAHEAD = 256
# First requests prepared at once before the clock starts (each may take a generation
# worker; more in flight only hold memory).
PREPARE_CONCURRENCY = 256


class AgentLoop(Protocol):
    """What the engine drives: first-request preparation, then the agent's whole loop."""

    async def prepare(self, agent: int) -> Any:
        """Build the first request's content (may run off the event loop)."""

    async def run(self, agent: int, slot: int, prepared: Any) -> Outcome:
        """Run every turn and say how the loop ended."""


RecordSink = Callable[[TrajectoryRecord], None]
# Awaited after the first requests are prepared and before the clock starts: a shard
# waits there for the common start time (--start-at), a worker for its parent's go.
StartGate = Callable[[], Awaitable[None]]


class _Clock:
    def __init__(self) -> None:
        self.origin = 0.0

    def start(self) -> None:
        self.origin = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self.origin


async def _cancel_all(tasks: set[asyncio.Task]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def _announce_clock(agents: AgentLoop, clock: _Clock) -> None:
    """Tell an agent loop that wants it when the benchmark clock started (perf_counter seconds)."""
    started = getattr(agents, "clock_started", None)
    if started is not None:
        started(clock.origin)


def _stopped(shutdown: Shutdown | None) -> bool:
    return shutdown is not None and shutdown.stopped


async def _run_trajectory(
    agents: AgentLoop,
    record: TrajectoryRecord,
    content: Any,
    clock: _Clock,
    finish_order: itertools.count,
    shutdown: Shutdown | None,
) -> TrajectoryRecord:
    """Run one admitted trajectory; a cancellation during shutdown marks it interrupted."""
    try:
        outcome = await agents.run(record.agent_id, record.routing_slot, content)
    except asyncio.CancelledError:
        if not _stopped(shutdown):
            raise
        outcome = Outcome.INTERRUPTED
    record.completed = outcome == Outcome.COMPLETED
    record.interrupted = outcome == Outcome.INTERRUPTED
    record.loop_seconds = clock.now() - record.admitted_at
    record.finish_sequence = next(finish_order)
    return record


class _ShutdownWatch:
    """Tasks that finish when a shutdown stops admission and when it cancels the rest."""

    def __init__(self, shutdown: Shutdown | None) -> None:
        self.stop = self.cancel = None
        if shutdown is not None:
            self.stop = asyncio.ensure_future(shutdown.stop_event.wait())
            self.cancel = asyncio.ensure_future(shutdown.cancel_event.wait())

    def pending(self) -> set[asyncio.Future]:
        return {w for w in (self.stop, self.cancel) if w is not None and not w.done()}

    def react(self, done: set, unadmitted: set[asyncio.Task], running: set[asyncio.Task]) -> None:
        """Once admission stops, cancel what is not admitted yet; once the grace period
        ends, cancel what still runs."""
        if self.stop in done:
            for task in unadmitted:
                task.cancel()
        if self.cancel in done:
            for task in running:
                task.cancel()

    def close(self) -> None:
        for waiter in (self.stop, self.cancel):
            if waiter is not None:
                waiter.cancel()


async def prepare_in_order(
    agents: AgentLoop, plans: Sequence[int], limit: int = PREPARE_CONCURRENCY
) -> list[Any]:
    """Every plan's first request, in plan order, with at most ``limit`` preparations in
    flight: a million plans admitted at t = 0 do not become a million pending tasks."""
    prepared: list[Any] = [None] * len(plans)
    queue = iter(enumerate(plans))

    async def worker() -> None:
        for index, agent in queue:
            prepared[index] = await agents.prepare(agent)

    await asyncio.gather(*(worker() for _ in range(min(limit, len(plans)))))
    return prepared


async def run_closed_loop(
    n_plans: int,
    max_active: int | None,
    agents: AgentLoop,
    sink: RecordSink | None = None,
    shutdown: Shutdown | None = None,
    start_delays: Sequence[float] | None = None,
    gate: StartGate | None = None,
) -> EngineResult:
    """The first ``effective_max`` plans start in slots 0..k-1, at t=0 or, with
    ``start_delays`` (the ramp-up), slot s's first plan at ``start_delays[s]``; a freed slot
    goes to the next plan. After a shutdown stops admission no plan is admitted (nor a
    ramped start begun), and the agents still running are cancelled when the shutdown says
    so.

    An agent loop whose agents finish without waiting on anything outside the process (the
    dry run) may set ``start_window``: at most that many of the plans admitted at t = 0 run
    at once, the others starting, still admitted at 0, as running ones finish. Finished
    agents are collected by a callback, so the loop costs the same per agent however many
    run at once."""
    admission = ClosedLoopAdmission(n_plans, max_active)
    result = EngineResult(max_active_agents=admission.effective_max)
    first = range(admission.effective_max)  # slot s holds plan s
    prepared = await prepare_in_order(agents, first)
    if gate is not None:
        await gate()
    clock = _Clock()
    clock.start()
    _announce_clock(agents, clock)
    finish_order = itertools.count()
    loop = asyncio.get_running_loop()

    tasks: set[asyncio.Task] = set()
    waiting: set[asyncio.Task] = set()  # replacements and ramped starts not admitted yet
    ready: deque[asyncio.Task] = deque()  # finished, not collected yet, in finish order
    fired: list[asyncio.Future] = []  # shutdown waiters that completed since the last turn
    wake: list[asyncio.Future] = []  # the collector's pending wake-up, when it sleeps

    def wake_up() -> None:
        if wake and not wake[0].done():
            wake[0].set_result(None)

    def finished_task(task: asyncio.Task) -> None:
        ready.append(task)
        wake_up()

    def spawn(coroutine: Awaitable[TrajectoryRecord | None], admitted: bool) -> None:
        task = asyncio.ensure_future(coroutine)
        tasks.add(task)
        if not admitted:
            waiting.add(task)
        task.add_done_callback(finished_task)

    async def ramped_start(
        slot: int, agent: int, content: Any, at: float
    ) -> TrajectoryRecord | None:
        me = asyncio.current_task()
        try:
            # The loop's timer may end a sleep up to a millisecond early: never start early.
            while not _stopped(shutdown) and (delay := at - clock.now()) > 0:
                await asyncio.sleep(delay)
            if _stopped(shutdown):
                return None
        except asyncio.CancelledError:
            if not _stopped(shutdown):
                raise
            return None
        finally:
            waiting.discard(me)
        record = TrajectoryRecord(agent, slot, at, clock.now())
        result.last_agent_admitted_at = max(result.last_agent_admitted_at, record.admitted_at)
        return await _run_trajectory(agents, record, content, clock, finish_order, shutdown)

    def start_at_zero(slot: int) -> None:
        record = TrajectoryRecord(slot, slot, 0.0, 0.0)
        content, prepared[slot] = prepared[slot], None  # the agent holds it from now on
        spawn(_run_trajectory(agents, record, content, clock, finish_order, shutdown), True)

    # plans admitted at t = 0 that wait for room in the start window
    unstarted: Iterator[int] = iter(())
    if not _stopped(shutdown):  # stopped while waiting at the gate: start nothing
        window = getattr(agents, "start_window", None)
        if start_delays is None and window is not None:
            unstarted = iter(first)
            for slot in itertools.islice(unstarted, window):
                start_at_zero(slot)
        else:
            for slot in first:
                at = start_delays[slot] if start_delays is not None else 0.0
                if at > 0:
                    spawn(ramped_start(slot, slot, prepared[slot], at), False)
                else:
                    start_at_zero(slot)
    last_admission: asyncio.Future = loop.create_future()
    last_admission.set_result(None)

    async def admit_replacement(
        slot: int, agent: int, previous: asyncio.Future, mine: asyncio.Future
    ) -> TrajectoryRecord | None:
        me = asyncio.current_task()
        try:
            content = await agents.prepare(agent)
            await previous
            if _stopped(shutdown):
                return None
            record = TrajectoryRecord(agent, slot, 0.0, clock.now())
            result.last_agent_admitted_at = record.admitted_at
        except asyncio.CancelledError:
            if not _stopped(shutdown):
                raise
            return None
        finally:
            waiting.discard(me)
            if not mine.done():
                mine.set_result(None)
        return await _run_trajectory(agents, record, content, clock, finish_order, shutdown)

    watch = _ShutdownWatch(shutdown)

    def on_fired(waiter: asyncio.Future) -> None:
        fired.append(waiter)
        wake_up()

    for waiter in watch.pending():
        waiter.add_done_callback(on_fired)
    try:
        while tasks:
            if not ready and not fired:
                wake[:] = [loop.create_future()]
                await wake[0]
                wake.clear()
            watch.react(set(fired), waiting, tasks)
            fired.clear()
            finished = [ready.popleft() for _ in range(len(ready))]
            tasks.difference_update(finished)
            for record in _in_finish_order(finished):
                record.finished_at = clock.now()
                result.records.append(record)
                if sink is not None:
                    sink(record)
                if _stopped(shutdown):
                    continue
                following = admission.on_finish(record.routing_slot)
                if following is not None:
                    mine = loop.create_future()
                    spawn(
                        admit_replacement(record.routing_slot, following, last_admission, mine),
                        False,
                    )
                    last_admission = mine
            if not _stopped(shutdown):
                for slot in itertools.islice(unstarted, len(finished)):
                    start_at_zero(slot)
    except BaseException:
        await _cancel_all(tasks)
        raise
    finally:
        watch.close()
    result.total_duration = clock.now()
    return result


def _in_finish_order(done: list[asyncio.Task]) -> list[TrajectoryRecord]:
    """Results of tasks collected in one turn, in finish order; trajectories that were
    never admitted (None) are left out."""
    records = [record for record in (task.result() for task in done) if record is not None]
    return sorted(records, key=lambda record: record.finish_sequence)


async def run_open_loop(
    start_offsets: Sequence[float],
    max_active: int | None,
    agents: AgentLoop,
    sink: RecordSink | None = None,
    shutdown: Shutdown | None = None,
    gate: StartGate | None = None,
) -> EngineResult:
    """Admit each plan at its scaled offset, behind an optional cap, into the lowest free slot.

    Plans go in offset order (a stable sort: ties keep their index order). The first
    ``OPEN_LOOP_LOOKAHEAD`` are prepared before the clock starts; after that at most that
    many are started but not admitted, and each one leaving that state (admitted, or
    dropped by a shutdown) starts the next. A started plan prepares its first request if
    needed, waits for its offset (``_Alarm``: never early), then takes a cap permit; when
    none is free it counts as late and waits. A finished trajectory is recorded and handed
    to ``sink`` at once, in finish order. After a shutdown stops admission nothing more is
    admitted, and the agents still running are cancelled when the shutdown says so."""
    n = len(start_offsets)
    order = sorted(range(n), key=start_offsets.__getitem__)  # stable: ties keep index order
    result = EngineResult()
    slots = SlotPool()
    cap = asyncio.Semaphore(max_active) if max_active is not None else None
    early = order[:OPEN_LOOP_LOOKAHEAD]
    prepared = dict(
        zip(early, await asyncio.gather(*(agents.prepare(a) for a in early)), strict=True)
    )
    if gate is not None:
        await gate()
    loop = asyncio.get_running_loop()
    clock = _Clock()
    clock.start()
    _announce_clock(agents, clock)
    alarm = Alarm(clock)
    finish_order = itertools.count()
    tasks: set[asyncio.Task] = set()
    waiting: set[asyncio.Task] = set()  # started, not admitted yet
    failed: list[asyncio.Task] = []
    finished = loop.create_future()  # nothing runs and nothing is left to start, or a failure
    started = 0  # positions in ``order`` started so far
    closing = False  # the run is being torn down: start nothing more

    def start_next() -> None:
        nonlocal started
        if started < n and not closing and not _stopped(shutdown):
            task = loop.create_task(trajectory(order[started], started))
            started += 1
            tasks.add(task)
            waiting.add(task)
            task.add_done_callback(collected)

    def collected(task: asyncio.Task) -> None:
        tasks.discard(task)
        waiting.discard(task)
        if task.cancelled() and _stopped(shutdown):
            pass  # dropped by the shutdown: nothing to record
        elif task.cancelled() or task.exception() is not None:
            failed.append(task)
        if not finished.done() and (failed or (not tasks and (started == n or _stopped(shutdown)))):
            finished.set_result(None)

    async def trajectory(agent: int, position: int) -> None:
        me = asyncio.current_task()
        scheduled = start_offsets[agent]
        try:
            content = prepared.pop(agent) if agent in prepared else await agents.prepare(agent)
            if scheduled > clock.now():
                await alarm.at(scheduled, position)
            holds_cap = False
            if cap is not None and not _stopped(shutdown):
                if cap.locked():
                    result.late_admissions += 1
                await cap.acquire()  # no suspension when a permit is free
                holds_cap = True
            if _stopped(shutdown):
                if holds_cap:
                    assert cap is not None  # held only once acquired
                    cap.release()
                return
            admitted = clock.now()
        except asyncio.CancelledError:
            if not _stopped(shutdown):
                raise
            return
        finally:
            waiting.discard(me)
            start_next()  # this trajectory's lookahead permit is free again
        slot = slots.acquire()
        record = TrajectoryRecord(agent, slot, scheduled, admitted)
        if admitted > result.last_agent_admitted_at:
            result.last_agent_admitted_at = admitted
        if admitted - scheduled > result.max_admission_lag:
            result.max_admission_lag = admitted - scheduled
        try:
            await _run_trajectory(agents, record, content, clock, finish_order, shutdown)
        finally:
            slots.release(slot)
            if cap is not None:
                cap.release()
        record.finished_at = clock.now()
        result.records.append(record)
        if sink is not None:
            sink(record)

    for _ in range(min(n, OPEN_LOOP_LOOKAHEAD)):
        start_next()
    if not tasks:
        # Nothing started, so no ``collected`` will ever say the run is over: there are no
        # plans, or a shutdown stopped admission before the clock started (a signal during
        # the preparation or the start gate).
        finished.set_result(None)
    watch = _ShutdownWatch(shutdown)
    try:
        while not finished.done():
            done, _ = await asyncio.wait(
                {finished} | watch.pending(), return_when=asyncio.FIRST_COMPLETED
            )
            watch.react(done, set(waiting), set(tasks))
        if failed:
            failed[0].result()  # raises the first failure
    except BaseException:
        closing = True
        await _cancel_all(set(tasks))
        raise
    finally:
        watch.close()
        alarm.close()
    result.max_active_agents = slots.peak
    result.total_duration = clock.now()
    return result
