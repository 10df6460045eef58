"""Sizing each request's new content so the server sees the planned prompt (prompt correction).

A trajectory's requests grow: request i+1 is request i's prompt, the model's reply, the
framing of one more turn and a tool result. Everything but the tool result is fixed by the
time it is built, so the tool result absorbs every difference:

    tool_i = target_{i+1} - served_i - rendered_reply_i - turn_overhead

where ``served_i`` is the server's ``usage.prompt_tokens`` of request i (closed loop: a
drift the client did not predict is paid back by the next request of the same trajectory),
``rendered_reply_i`` the reply as the next prompt renders it (``ReplyAccounting``) and the
turn overhead the run's estimate (``Framing``: flags, calibration, learned). A first or
reset request is one fresh user message of ``target - initial_overhead`` tokens.

Targets: in replay the manifest's ``prompt_tokens``; in sampled mode the planned content
plus the framing estimate at the time the request is built (the sampled plan counts
content only).

With correction off, the plan's sizes are sent unchanged (the behaviour before correction
existed) and only the fidelity is measured.
"""

from __future__ import annotations

from dataclasses import dataclass

from batchbench.plan.workload import Workload
from batchbench.text.framing import Framing


@dataclass(slots=True)
class Sizing:
    """The size of one request's new content and why."""

    tokens: int  # tokens of the new content to send (tool result or fresh user message)
    target: int  # the prompt tokens the request should cost
    correction: int = 0  # tokens added to (negative: removed from) the plan's content
    note: str | None = None  # why the target cannot be reached, when it cannot


class TrajectorySizer:
    """Targets and content sizes of one trajectory's requests."""

    __slots__ = ("_appended", "_content", "_correct", "_framing", "_replay", "_turns", "_w")

    def __init__(self, workload: Workload, agent: int, framing: Framing, correct: bool) -> None:
        self._w = workload
        self._turns = workload.turns(agent)
        self._framing = framing
        self._correct = correct
        self._replay = workload.mode == "trajectory_replay"
        self._appended = 0  # turns appended since the last fresh request (sampled targets)
        self._content = 0

    def _sampled_target(self, content: int, appended: int) -> int:
        framing = self._framing
        if self._correct:
            return content + framing.initial + appended * framing.turn
        return content + framing.configured_initial + appended * framing.configured_turn

    def fresh(self, turn: int) -> Sizing:
        """A first (``turn`` 0) or reset request: one user message replaces the history."""
        request = self._turns[turn]
        planned = int(self._w.input_content_tokens[request])
        self._appended = 0
        if not self._replay:
            return Sizing(planned, self._sampled_target(planned, 0))
        target = int(self._w.target_prompt_tokens[request])
        if not self._correct:
            return Sizing(planned, target)
        wanted = target - self._framing.initial
        if wanted >= 1:
            return Sizing(wanted, target, wanted - planned)
        note = (
            f"the framing ({self._framing.initial} tokens) leaves no room for content in a "
            f"{target}-token prompt; sent 1 token"
        )
        return Sizing(1, target, 1 - planned, note)

    def appended(self, turn: int, served: int, rendered: int | None) -> Sizing:
        """The tool result appended after request ``turn`` (0-based) for request turn+1."""
        request = self._turns[turn]
        following = self._turns[turn + 1]
        planned = int(self._w.environment_tokens[request])
        self._appended += 1
        if self._replay:
            target = int(self._w.target_prompt_tokens[following])
        else:
            target = self._sampled_target(
                int(self._w.input_content_tokens[following]), self._appended
            )
        if not self._correct or rendered is None:
            return Sizing(planned, target)
        wanted = target - served - rendered - self._framing.turn
        if wanted >= 0:
            return Sizing(wanted, target, wanted - planned)
        note = (
            f"the tool result would need {wanted} tokens to reach {target} after a "
            f"{served}-token prompt and a {rendered}-token reply; sent 0"
        )
        return Sizing(0, target, -planned, note)

    def resized(self, sizing: Sizing, counted: int) -> Sizing:
        """``sizing`` moved by what a server count of the built request says (oracle)."""
        floor = 1 if self._appended == 0 else 0  # a fresh user message keeps one token
        wanted = sizing.tokens + sizing.target - counted
        if wanted >= floor:
            return Sizing(wanted, sizing.target, sizing.correction + wanted - sizing.tokens)
        note = (
            f"the server counts {counted} tokens with {sizing.tokens} of content; "
            f"the {sizing.target}-token target needs {wanted}; sent {floor}"
        )
        return Sizing(floor, sizing.target, sizing.correction + floor - sizing.tokens, note)
