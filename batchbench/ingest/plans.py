"""Plan construction: a reconstructed session as a schema v2 trajectory (COMPAT §7.6)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from batchbench.ingest.rows import Row
from batchbench.ingest.sessions import Session
from batchbench.ingest.window import Window

Plan = dict[str, Any]


@dataclass
class PlanCounters:
    normalized_block_tokens: int = 0
    prewindow_sessions: int = 0


def extends(previous: Row, row: Row) -> bool:
    """Whether ``previous``'s chain is a strict prefix of ``row``'s (cumulative hashes:
    comparing the previous leaf at its position is enough)."""
    n = len(previous.chain)
    return n < len(row.chain) and (n == 0 or row.chain[n - 1] == previous.chain[-1])


class PlanBuilder:
    """Builds plans in trajectory order, numbering ids per root leaf."""

    def __init__(self, window: Window, time_scale: float) -> None:
        self.window = window
        self.time_scale = time_scale
        self.counters = PlanCounters()
        self._names: Counter[str] = Counter()

    def trajectory_id(self, root: Row) -> str:
        base = root.leaf or f"{root.principal_id}-{root.correlation_id}"
        n = self._names[base]
        self._names[base] = n + 1
        return f"{base}-{n}"

    def build(self, session: Session) -> Plan:
        rows = session.requests
        if session.prewindow:
            self.counters.prewindow_sessions += 1
        seeds: dict[str, int] = {}  # seed -> first token count in this trajectory
        requests = []
        for i, row in enumerate(rows):
            previous = rows[i - 1] if i else None
            prompt = row.prompt_tokens
            assert prompt is not None and row.completion_tokens is not None
            request: dict[str, Any] = {
                "prompt_tokens": prompt,
                "output_tokens": row.completion_tokens,
            }
            if i + 1 < len(rows):
                gap_ms = (rows[i + 1].ts_us - row.ts_us) / 1000 - row.duration_ms
                request["delay_after_ms"] = round(max(gap_ms, 0.0) / self.time_scale)
            grows = previous is not None and extends(previous, row)
            if (previous is None and session.prewindow) or (previous is not None and not grows):
                request["reset_before"] = True
            blocks, total = self._blocks(row, previous if grows else None, seeds)
            request["overhead_tokens"] = max(prompt - total, 0) if row.block_tokens else 0
            if row.stream is not None:
                request["stream"] = row.stream
            if row.max_tokens is not None and row.max_tokens > 0:
                request["max_tokens"] = row.max_tokens
            request["recorded_start_after_ms"] = self.window.offset_ms(row.ts_us, self.time_scale)
            request["blocks"] = blocks
            requests.append(request)
        return {
            "schema_version": 2,
            "trajectory_id": self.trajectory_id(rows[0]),
            "start_after_ms": self.window.offset_ms(rows[0].ts_us, self.time_scale),
            "requests": requests,
        }

    def _blocks(
        self, row: Row, grown_from: Row | None, seeds: dict[str, int]
    ) -> tuple[list[dict[str, Any]], int]:
        """The request's blocks and their token total; ``grown_from`` is the previous
        request when this one extends it (its reply is then the live block)."""
        if not row.block_tokens:
            seed = row.leaf or f"{row.principal_id}-{row.correlation_id}"
            assert row.prompt_tokens is not None
            tokens = self._normalized(seeds, seed, row.prompt_tokens)
            return [{"seed": seed, "role": "user", "tokens": tokens}], tokens
        live_at = len(grown_from.chain) if grown_from is not None else -1
        blocks = []
        total = 0
        for k, (seed, raw) in enumerate(zip(row.chain, row.block_tokens, strict=True)):
            role = row.block_roles[k] if row.block_roles else "user"
            tokens = self._normalized(seeds, seed, raw)
            total += tokens
            block: dict[str, Any] = {"seed": seed, "role": role, "tokens": tokens}
            if k == live_at and role == "assistant":
                block["live"] = True
            blocks.append(block)
        return blocks, total

    def _normalized(self, seeds: dict[str, int], seed: str, tokens: int) -> int:
        first = seeds.setdefault(seed, tokens)
        if first != tokens:
            self.counters.normalized_block_tokens += 1
        return first
