"""Admission on the benchmark clock with real coroutines (closed and open loop)."""

from __future__ import annotations

import asyncio
import time

import pytest

from batchbench.drive.engine import run_closed_loop, run_open_loop


class ScriptedBody:
    """An agent body whose preparation and run times are chosen per agent."""

    def __init__(self, prepare_s=None, run_s=None) -> None:
        self.prepare_s = prepare_s or {}
        self.run_s = run_s or {}
        self.prepare_spans: dict[int, tuple[float, float]] = {}
        self.started: list[tuple[int, int]] = []

    async def prepare(self, agent: int):
        start = time.perf_counter()
        await asyncio.sleep(self.prepare_s.get(agent, 0.0))
        self.prepare_spans[agent] = (start, time.perf_counter())
        return f"content-{agent}"

    async def run(self, agent: int, slot: int, prepared) -> bool:
        assert prepared == f"content-{agent}"
        self.started.append((slot, agent))
        await asyncio.sleep(self.run_s.get(agent, 0.0))
        return True


def test_closed_loop_eight_agents_four_slots():
    body = ScriptedBody(run_s={a: 0.01 for a in range(8)})
    result = asyncio.run(run_closed_loop(8, 4, body))
    by_agent = {r.agent_id: r for r in result.records}
    assert result.max_active_agents == 4
    assert sorted(by_agent) == list(range(8)) and all(r.completed for r in result.records)
    assert [by_agent[a].admitted_at for a in range(4)] == [0.0, 0.0, 0.0, 0.0]
    assert all(by_agent[a].admitted_at > 0 for a in range(4, 8))
    assert result.last_agent_admitted_at == max(by_agent[a].admitted_at for a in range(4, 8))
    assert all(r.scheduled_at == 0.0 for r in result.records)


def test_freed_slots_refill_in_fifo_order():
    # a and b start; b (slot 1) finishes first, so c takes slot 1; then a frees slot 0 for d.
    body = ScriptedBody(run_s={0: 0.06, 1: 0.01, 2: 0.2, 3: 0.0})
    result = asyncio.run(run_closed_loop(4, 2, body))
    assert body.started == [(0, 0), (1, 1), (1, 2), (0, 3)]
    assert [r.agent_id for r in result.records] == [1, 0, 3, 2]


def test_replacements_prepare_concurrently():
    body = ScriptedBody(prepare_s={2: 0.1, 3: 0.1}, run_s={0: 0.01, 1: 0.01})
    asyncio.run(run_closed_loop(4, 2, body))
    (start2, end2), (start3, end3) = body.prepare_spans[2], body.prepare_spans[3]
    assert start3 < end2 and start2 < end3


def test_admission_keeps_queue_order_when_a_later_preparation_wins():
    body = ScriptedBody(prepare_s={2: 0.15, 3: 0.0}, run_s={0: 0.01, 1: 0.02})
    result = asyncio.run(run_closed_loop(4, 2, body))
    by_agent = {r.agent_id: r for r in result.records}
    assert body.prepare_spans[3][1] < body.prepare_spans[2][1]
    assert [agent for _slot, agent in body.started] == [0, 1, 2, 3]
    assert by_agent[2].admitted_at <= by_agent[3].admitted_at


def test_limit_validation():
    with pytest.raises(ValueError):
        asyncio.run(run_closed_loop(2, 0, ScriptedBody()))
    result = asyncio.run(run_closed_loop(1, 2, ScriptedBody()))
    assert result.max_active_agents == 1 and [r.agent_id for r in result.records] == [0]


def test_open_loop_cap_delays_and_counts_late_admissions():
    body = ScriptedBody(run_s={0: 0.1, 1: 0.0})
    result = asyncio.run(run_open_loop([0.0, 0.0], 1, body))
    by_agent = {r.agent_id: r for r in result.records}
    assert result.late_admissions == 1
    wait = by_agent[1].admitted_at - by_agent[1].scheduled_at
    assert wait >= 0.09
    assert result.max_admission_lag >= wait
    assert result.max_active_agents == 1
    assert by_agent[1].admitted_at >= by_agent[0].admitted_at + by_agent[0].loop_seconds - 1e-3


def test_open_loop_uses_offsets_and_lowest_free_slot():
    body = ScriptedBody(run_s={0: 0.05, 1: 0.05, 2: 0.0})
    result = asyncio.run(run_open_loop([0.0, 0.0, 0.2], None, body))
    by_agent = {r.agent_id: r for r in result.records}
    assert by_agent[2].scheduled_at == 0.2 and by_agent[2].admitted_at >= 0.2
    assert by_agent[2].routing_slot == 0  # both earlier slots were free again by then
    assert result.max_active_agents == 2 and result.late_admissions == 0
    assert result.total_duration >= 0.2


def test_a_failing_preparation_aborts_the_run():
    class Failing(ScriptedBody):
        async def prepare(self, agent: int):
            if agent == 2:
                raise RuntimeError("cannot build text")
            return await super().prepare(agent)

    with pytest.raises(RuntimeError, match="cannot build text"):
        asyncio.run(run_closed_loop(3, 2, Failing()))


class WindowedBody(ScriptedBody):
    """A body that asks for a start window and records how many of its agents run at once."""

    start_window = 3

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.running = 0
        self.most = 0

    async def run(self, agent: int, slot: int, prepared) -> bool:
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            return await super().run(agent, slot, prepared)
        finally:
            self.running -= 1


def test_a_start_window_bounds_the_agents_run_at_once_but_all_are_admitted_at_zero():
    body = WindowedBody(run_s={a: 0.002 * (a % 3) for a in range(10)})
    result = asyncio.run(run_closed_loop(10, None, body))
    assert body.most == 3
    assert body.started == [(a, a) for a in range(10)]  # slot s holds plan s, started in order
    assert result.max_active_agents == 10
    assert sorted(r.agent_id for r in result.records) == list(range(10))
    assert {(r.routing_slot, r.admitted_at, r.scheduled_at) for r in result.records} == {
        (a, 0.0, 0.0) for a in range(10)
    }
    assert [r.finish_sequence for r in result.records] == list(range(10))


def test_many_instant_agents_are_collected_in_linear_time():
    """20,000 agents at t = 0 (asyncio.wait over every task each turn took minutes)."""
    body = ScriptedBody()
    started = time.perf_counter()
    result = asyncio.run(run_closed_loop(20_000, None, body))
    assert len(result.records) == 20_000 and all(r.completed for r in result.records)
    assert time.perf_counter() - started < 20.0
