"""How many prompt tokens a server will see: the framing model.

A prompt is contents plus framing. Contents we synthesize count exactly (trim-stable,
exact-length text); two things do not:

* **Framing**: the chat template's markers, role headers and tool-call envelopes. It is
  modelled as an initial overhead (first or reset request) plus a per-turn overhead, from
  the flags, from ``--calibrate``, or learned from the server's ``usage.prompt_tokens`` as
  the run goes (:class:`Framing`).
* **The model's reply**, replayed in the next prompt: counted as the template renders it
  by ``batchbench.text.replycount``.
"""

from __future__ import annotations

from collections import Counter
from typing import Any


def _observe(counts: Counter[int], value: int, current: int) -> int:
    """Count one observation; the new estimate (a value must outnumber the current one)."""
    seen = counts[value] = counts[value] + 1
    if value != current and seen > counts[current]:
        return value
    return current


def trimmed(content: Any) -> Any:
    """A reply's content as the driver replays it: text without surrounding whitespace."""
    return content.strip() if isinstance(content, str) else content


class Framing:
    """The run's framing estimates (initial and per-turn overhead), refined from usage.

    Every trajectory of a run talks to the same template, so an overhead observed by one
    (``observe_*``) serves all of them: the estimate is the most frequent observation
    (the earliest seen among equals), falling back to the configured (flag or calibrated)
    value before the first one.
    """

    __slots__ = (
        "_initial",
        "_turn",
        "configured_initial",
        "configured_turn",
        "initial",
        "learn",
        "turn",
    )

    def __init__(self, initial: int, turn: int, learn: bool = True, measured: bool = False) -> None:
        """``measured``: the values come from flags or calibration, and count as two
        observations each, so one odd reply cannot displace them; otherwise the first
        observation replaces them."""
        self.configured_initial = initial
        self.configured_turn = turn
        self.learn = learn
        self.initial = initial  # the current estimates, kept up to date by observe_*
        self.turn = turn
        self._initial: Counter[int] = Counter({initial: 2} if measured else {})
        self._turn: Counter[int] = Counter({turn: 2} if measured else {})

    def observe_initial(self, value: int) -> None:
        if self.learn:
            self.initial = _observe(self._initial, value, self.initial)

    def observe_turn(self, value: int, typical: bool = True) -> None:
        """``typical`` False: the turn appended an empty tool result (a plan with no room
        left), which a template may frame differently (without the newlines around a
        text); it serves as the estimate until a typical turn is seen, never after."""
        if not self.learn:
            return
        if typical:
            self.turn = _observe(self._turn, value, self.turn)
        elif not self._turn:
            self.turn = value

    def learned(self) -> dict[str, Any]:
        """What the run observed, for the results JSON."""
        return {
            "initial_overhead_tokens": self.initial,
            "turn_overhead_tokens": self.turn,
            "initial_observations": {str(k): v for k, v in sorted(self._initial.items())},
            "turn_observations": {str(k): v for k, v in sorted(self._turn.items())},
        }
