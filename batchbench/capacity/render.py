"""What the search prints: one table row per step and one answer line.

Pure functions of step records and the objectives, so the console text and the capacity
document's answer are the same strings, and tests can check them exactly.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from batchbench.capacity.search import (
    CLIENT_BOUND,
    FAIL,
    UNRESOLVED,
    Search,
    StepRecord,
)
from batchbench.results.documents import OutcomeView, WindowView
from batchbench.results.formatting import MISSING, fixed, latency, percent, ratio_percent
from batchbench.results.slo import SPEED_METRICS, Objective

# (title, width): numbers right-aligned, the client column left-aligned, the verdict last.
COLUMNS = (
    ("agents", 6),
    ("window", 7),
    ("req/s", 8),
    ("out tok/s", 9),
    ("TTFT p50", 9),
    ("TTFT p99", 9),
    ("ITL p99", 9),
    ("E2E p95", 9),
    ("goodput", 7),
    ("cache hit", 9),
    ("client", 12),
    ("verdict", 0),
)


def format_ms(ms: float | None) -> str:
    """A latency in the table's spelling: ``130 ms``, ``1.83 s``, ``n/a`` when missing."""
    return latency(ms, MISSING)


def header() -> str:
    """The table's column titles."""
    return _line([title for title, _width in COLUMNS])


def _line(cells: Sequence[str]) -> str:
    parts = []
    for (title, width), cell in zip(COLUMNS, cells, strict=True):
        if title == "client":
            parts.append(cell.ljust(width))
        elif width:
            parts.append(cell.rjust(width))
        else:
            parts.append(cell)
    return "  ".join(parts).rstrip()


def step_row(record: StepRecord, note: str | None = None) -> str:
    """One table row: the step's window figures and its verdict (``; note`` after it, and
    ``(resumed)`` for a step read back from an earlier run)."""
    window = WindowView.read(record.window)
    cells = [
        str(record.agents),
        fixed(window.duration_seconds, 1, " s", MISSING),
        fixed(window.requests_per_second, 2, missing=MISSING),
        fixed(window.output_tokens_per_second, 1, missing=MISSING),
        format_ms(window.percentile("ttft_ms", "p50")),
        format_ms(window.percentile("ttft_ms", "p99")),
        format_ms(window.percentile("itl_ms", "p99")),
        format_ms(window.percentile("e2e_ms", "p95")),
        ratio_percent(window.goodput_ratio, MISSING),
        percent(window.cache_hit_percent, MISSING),
        window.client_verdict if window.client_verdict is not None else MISSING,
        verdict_text(record)
        + (f"; {note}" if note else "")
        + (" (resumed)" if record.resumed else ""),
    ]
    return _line(cells)


def deciding_outcome(record: StepRecord) -> OutcomeView | None:
    """The objective that decided the verdict: the first that failed, the first left
    unresolved, or (for a pass) the one closest to failing."""
    outcomes = WindowView.read(record.window).slo
    if not outcomes:
        return None
    for verdict in (FAIL, UNRESOLVED):
        if record.verdict == verdict:
            chosen = next((o for o in outcomes if o.verdict == verdict), None)
            return chosen or outcomes[0]
    return min(outcomes, key=lambda o: (o.attainment_low or 0.0) - (o.required or 0))


def attainment_text(outcome: OutcomeView) -> str:
    """``ttft_p99 attainment 99.6% [99.1, 99.8]``: the share of samples within the limit
    and its 95 % confidence interval."""
    low, high = outcome.attainment_low, outcome.attainment_high
    interval = (
        f" [{low * 100.0:.1f}, {high * 100.0:.1f}]" if low is not None and high is not None else ""
    )
    return f"{outcome.objective} attainment {ratio_percent(outcome.attainment, MISSING)}{interval}"


def client_figures(window: dict[str, Any] | None) -> str | None:
    """The figures in the client verdict's sentence (lag and CPU share)."""
    reason = WindowView.read(window).client_reason
    if reason is None:
        return None
    match = re.search(r"\(([^()]*)\)", reason)
    return match.group(1) if match else reason


def verdict_text(record: StepRecord) -> str:
    """``pass (ttft_p99 attainment 99.6% [99.1, 99.8])``, with the extensions it took."""
    word = record.verdict
    if record.extensions:
        plural = "s" if record.extensions > 1 else ""
        word += f" after {record.extensions} extension{plural}"
    if record.verdict == CLIENT_BOUND:
        figures = client_figures(record.window)
        return f"{word} ({figures})" if figures else word
    if record.note is not None:
        return f"{word} ({record.note})"
    outcome = deciding_outcome(record)
    return f"{word} ({attainment_text(outcome)})" if outcome is not None else word


# -- the answer -------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Answer:
    """The capacity document's "answer"."""

    agents: int | None  # the highest cap that held
    breaking_agents: int | None  # the lowest cap that broke
    text: str
    concluded: bool

    def as_dict(self) -> dict[str, Any]:
        return {
            "agents": self.agents,
            "breaking_agents": self.breaking_agents,
            "text": self.text,
            "concluded": self.concluded,
        }


def _agents(count: int) -> str:
    return f"{count} active agent{'s' if count != 1 else ''}"


def _verb(count: int, plural: str, singular: str) -> str:
    return singular if count == 1 else plural


def _human(name: str, objectives: Sequence[Objective]) -> str:
    found = next((o for o in objectives if o.name == name), None)
    return found.human if found is not None else name


def _value(outcome: OutcomeView) -> str:
    if outcome.metric == "goodput":
        return ratio_percent(outcome.attainment, MISSING)
    if outcome.metric in SPEED_METRICS:
        value = outcome.value_tokens_per_second
        return MISSING if value is None else f"{float(value):.2f} tok/s"
    return format_ms(outcome.value_ms)


def held_text(record: StepRecord, objectives: Sequence[Objective]) -> str:
    """``TTFT p99 ≤ 2 s (1.83 s) and ITL p99 ≤ 100 ms (80.4 ms)``."""
    outcomes = WindowView.read(record.window).slo
    if not outcomes:
        return " and ".join(o.human for o in objectives) or "the objectives"
    parts = [f"{_human(str(o.objective), objectives)} ({_value(o)})" for o in outcomes]
    return " and ".join(parts)


def broken_text(record: StepRecord, objectives: Sequence[Objective], named: bool) -> str:
    """What broke: ``it (2.71 s)`` for the only objective, else the objectives that failed
    with their values (``ITL p99 ≤ 100 ms (131 ms)``); ``named`` always names them."""
    if record.note is not None:
        return f"it ({record.note})" if not named else f"the objectives ({record.note})"
    outcomes = WindowView.read(record.window).slo
    failed = [o for o in outcomes if o.verdict == FAIL]
    if not failed:
        return "it"
    if len(outcomes) == 1 and not named:
        return f"it ({_value(failed[0])})"
    return " and ".join(f"{_human(str(o.objective), objectives)} ({_value(o)})" for o in failed)


CLIENT_ADVICE_WORKERS = "more worker processes (--workers)"
CLIENT_ADVICE = "fewer stream chunks (or --no-stream), or fewer agents per client machine"


def answer(
    search: Search, objectives: Sequence[Objective], workers_available: bool = False
) -> Answer:
    """The one answer line, and the figures behind it."""
    if search.sweep is not None:
        return _sweep_answer(search, objectives)
    low, high = search.highest_pass, search.lowest_fail
    passed, failed = search.step_at(low), search.step_at(high)
    so_far = _so_far(passed, failed, objectives)
    if search.stop_reason is not None:
        text = f"Capacity: not concluded: {search.stop_text or search.stop_reason}" + so_far
        return Answer(low, high, text, False)
    stopped = search.stopped_by
    if stopped is not None:
        text = _not_concluded(stopped, objectives, workers_available) + so_far
        return Answer(low, high, text, False)
    upcoming = search.next_agents()
    if upcoming is not None:
        text = (
            f"Capacity: not concluded: the search stopped before the step at "
            f"{_agents(upcoming)} (run the same command again to resume)" + so_far
        )
        return Answer(low, high, text, False)
    if passed is not None and failed is not None:
        text = (
            f"Capacity: {_agents(passed.agents)} {_verb(passed.agents, 'hold', 'holds')} "
            f"{held_text(passed, objectives)}; {failed.agents} "
            f"{_verb(failed.agents, 'break', 'breaks')} {broken_text(failed, objectives, False)}"
        )
    elif passed is not None:
        text = (
            f"Capacity: at least {_agents(passed.agents)}: {passed.agents} (--max-agents) "
            f"{_verb(passed.agents, 'hold', 'holds')} {held_text(passed, objectives)}"
        )
    elif failed is not None:
        limit = " (--min-agents)" if failed.agents > 1 else ""
        text = (
            f"Capacity: below {_agents(failed.agents)}: {failed.agents}{limit} already "
            f"{_verb(failed.agents, 'break', 'breaks')} {broken_text(failed, objectives, True)}"
        )
    else:  # pragma: no cover - a search that ended without steps
        text = "Capacity: not concluded: no step ran"
        return Answer(None, None, text, False)
    return Answer(low, high, text, True)


def _sweep_answer(search: Search, objectives: Sequence[Objective]) -> Answer:
    """``Sweep: 6 active agents hold ITL p50 ≤ 260 ms (240 ms): the highest passing cap of
    4 measured (1, 6, 11, 16)``; without objectives, the caps measured."""
    assert search.sweep is not None
    measured = sorted({s.agents for s in search.steps})
    caps = ", ".join(str(cap) for cap in measured)
    count = f"{len(measured)} cap{'s' if len(measured) != 1 else ''} measured ({caps})"
    upcoming = search.next_agents()
    unfinished = ""
    if search.stop_reason is not None:
        unfinished = f" (not finished: {search.stop_text or search.stop_reason})"
    elif upcoming is not None:
        unfinished = (
            f" (not finished: stopped before the cap of {_agents(upcoming)}; run the same "
            "command again to resume)"
        )
    low, high = search.highest_pass, search.lowest_fail
    passed = search.step_at(low)
    if not objectives:
        text = f"Sweep: {count}; no --slo, so no verdict"
    elif passed is not None:
        text = (
            f"Sweep: {_agents(passed.agents)} {_verb(passed.agents, 'hold', 'holds')} "
            f"{held_text(passed, objectives)}: the highest passing cap of {count}"
        )
    else:
        wanted = " and ".join(o.human for o in objectives)
        text = f"Sweep: no cap measured holds {wanted}: {count}"
    done = upcoming is None and search.stop_reason is None
    return Answer(low, high, text + unfinished, done)


def _so_far(
    passed: StepRecord | None, failed: StepRecord | None, objectives: Sequence[Objective]
) -> str:
    parts = []
    if passed is not None:
        parts.append(
            f"{_agents(passed.agents)} {_verb(passed.agents, 'hold', 'holds')} "
            f"{held_text(passed, objectives)}"
        )
    if failed is not None:
        parts.append(
            f"{failed.agents} {_verb(failed.agents, 'break', 'breaks')} "
            f"{broken_text(failed, objectives, True)}"
        )
    return "; so far " + " and ".join(parts) if parts else ""


def _not_concluded(
    stopped: StepRecord, objectives: Sequence[Objective], workers_available: bool
) -> str:
    at = _agents(stopped.agents)
    if stopped.verdict == CLIENT_BOUND:
        figures = client_figures(stopped.window)
        detail = f" ({figures})" if figures else ""
        advice = (CLIENT_ADVICE_WORKERS + ", " if workers_available else "") + CLIENT_ADVICE
        return (
            f"Capacity: not concluded: the client was the bottleneck at {at}{detail}, so "
            f"that step measured the client, not the server; give it {advice}"
        )
    outcome = deciding_outcome(stopped)
    plural = "s" if stopped.extensions != 1 else ""
    tries = f" after {stopped.extensions} extension{plural}"
    if outcome is None or stopped.verdict != UNRESOLVED:
        what = "the step"
        figures = ""
    else:
        what = _human(str(outcome.objective), objectives)
        required = outcome.required
        needed = f", {required * 100.0:g}% needed" if required is not None else ""
        figures = f" ({attainment_text(outcome).split(' ', 1)[1]}{needed})"
    return (
        f"Capacity: not concluded: at {at} {what} stayed unresolved{tries}{figures}; "
        "measure longer to decide (run again with a longer --window or --window-trajectories, "
        "or more --max-extensions: the decided steps are kept)"
    )
