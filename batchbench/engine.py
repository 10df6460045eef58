"""Run trajectories through closed- or open-loop admission on the benchmark clock (COMPAT §3.7).

The engine knows nothing about HTTP: it admits trajectories, hands each one to an
``AgentBody`` (the dry-run body here, the HTTP driver later) and records when each was
scheduled, admitted and collected.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from batchbench.admission import ClosedLoopAdmission, SlotPool

OPEN_LOOP_LOOKAHEAD = 256


class AgentBody(Protocol):
    """What the engine drives: first-request preparation, then the agent's whole loop."""

    async def prepare(self, agent: int) -> Any:
        """Build the first request's content (may run off the event loop)."""

    async def run(self, agent: int, slot: int, prepared: Any) -> bool:
        """Run every turn; return True when the trajectory completed."""


@dataclass
class TrajectoryRecord:
    """One admitted trajectory's lifecycle on the benchmark clock (seconds)."""

    agent_id: int
    routing_slot: int
    scheduled_at: float
    admitted_at: float
    finished_at: float = 0.0
    loop_seconds: float = 0.0
    completed: bool = False
    finish_sequence: int = 0


@dataclass
class EngineResult:
    """Everything admission measured; records are in finish (collection) order."""

    records: list[TrajectoryRecord] = field(default_factory=list)
    total_duration: float = 0.0
    max_active_agents: int = 0
    last_agent_admitted_at: float = 0.0
    late_admissions: int = 0
    max_admission_lag: float = 0.0


RecordSink = Callable[[TrajectoryRecord], None]


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


async def run_closed_loop(
    n_plans: int, max_active: int | None, body: AgentBody, sink: RecordSink | None = None
) -> EngineResult:
    """The first ``effective_max`` plans start at t=0 in slots 0..k-1; a freed slot goes to the
    next plan."""
    admission = ClosedLoopAdmission(n_plans, max_active)
    result = EngineResult(max_active_agents=admission.effective_max)
    initial = admission.initial()
    prepared = await asyncio.gather(*(body.prepare(agent) for _slot, agent in initial))
    clock = _Clock()
    clock.start()

    finish_order = itertools.count()

    async def run_agent(record: TrajectoryRecord, content: Any) -> TrajectoryRecord:
        record.completed = await body.run(record.agent_id, record.routing_slot, content)
        record.loop_seconds = clock.now() - record.admitted_at
        record.finish_sequence = next(finish_order)
        return record

    tasks: set[asyncio.Task] = set()
    for (slot, agent), content in zip(initial, prepared, strict=True):
        tasks.add(
            asyncio.ensure_future(run_agent(TrajectoryRecord(agent, slot, 0.0, 0.0), content))
        )
    last_admission: asyncio.Future = asyncio.get_running_loop().create_future()
    last_admission.set_result(None)

    async def admit_replacement(
        slot: int, agent: int, previous: asyncio.Future, mine: asyncio.Future
    ) -> TrajectoryRecord:
        try:
            content = await body.prepare(agent)
            await previous
            record = TrajectoryRecord(agent, slot, 0.0, clock.now())
            result.last_agent_admitted_at = record.admitted_at
        finally:
            if not mine.done():
                mine.set_result(None)
        return await run_agent(record, content)

    try:
        while tasks:
            done, tasks = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for record in _in_finish_order(done):
                record.finished_at = clock.now()
                result.records.append(record)
                if sink is not None:
                    sink(record)
                following = admission.on_finish(record.routing_slot)
                if following is not None:
                    mine = asyncio.get_running_loop().create_future()
                    tasks.add(
                        asyncio.ensure_future(
                            admit_replacement(record.routing_slot, following, last_admission, mine)
                        )
                    )
                    last_admission = mine
    except BaseException:
        await _cancel_all(tasks)
        raise
    result.total_duration = clock.now()
    return result


def _in_finish_order(done: set[asyncio.Task]) -> list[TrajectoryRecord]:
    """Results of tasks that finished in one loop turn, in finish order (not set order)."""
    return sorted((task.result() for task in done), key=lambda record: record.finish_sequence)


async def run_open_loop(
    start_offsets: list[float],
    max_active: int | None,
    body: AgentBody,
    sink: RecordSink | None = None,
) -> EngineResult:
    """Admit each plan at its scaled offset, behind an optional cap, into the lowest free slot."""
    n = len(start_offsets)
    order = sorted(range(n), key=lambda agent: start_offsets[agent])  # stable: ties keep file order
    result = EngineResult()
    slots = SlotPool()
    cap = asyncio.Semaphore(max_active) if max_active is not None else None
    lookahead = asyncio.Semaphore(OPEN_LOOP_LOOKAHEAD)
    early = order[:OPEN_LOOP_LOOKAHEAD]
    prepared = dict(
        zip(early, await asyncio.gather(*(body.prepare(a) for a in early)), strict=True)
    )
    clock = _Clock()
    clock.start()
    finish_order = itertools.count()

    async def trajectory(agent: int) -> TrajectoryRecord:
        try:
            content = prepared.pop(agent) if agent in prepared else await body.prepare(agent)
            scheduled = start_offsets[agent]
            delay = scheduled - clock.now()
            if delay > 0:
                await asyncio.sleep(delay)
            if cap is not None:
                if cap.locked():
                    result.late_admissions += 1
                await cap.acquire()
        finally:
            lookahead.release()
        admitted = clock.now()
        slot = slots.acquire()
        record = TrajectoryRecord(agent, slot, scheduled, admitted)
        result.last_agent_admitted_at = max(result.last_agent_admitted_at, admitted)
        result.max_admission_lag = max(result.max_admission_lag, max(admitted - scheduled, 0.0))
        try:
            record.completed = await body.run(agent, slot, content)
            record.loop_seconds = clock.now() - admitted
            record.finish_sequence = next(finish_order)
        finally:
            slots.release(slot)
            if cap is not None:
                cap.release()
        return record

    tasks: set[asyncio.Task] = set()

    async def spawner() -> None:
        for agent in order:
            await lookahead.acquire()
            tasks.add(asyncio.ensure_future(trajectory(agent)))

    spawn = asyncio.ensure_future(spawner())
    try:
        while not spawn.done() or tasks:
            waiting = set(tasks) | ({spawn} if not spawn.done() else set())
            done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            if spawn in done:
                done.discard(spawn)
                spawn.result()
            tasks.difference_update(done)
            for record in _in_finish_order(done):
                record.finished_at = clock.now()
                result.records.append(record)
                if sink is not None:
                    sink(record)
    except BaseException:
        spawn.cancel()
        await _cancel_all(tasks | {spawn})
        raise
    result.max_active_agents = slots.peak
    result.total_duration = clock.now()
    return result
