"""The serving model of one data-parallel rank: a prefix cache and continuous batching.

Each rank runs a step loop while it has work. A step admits queued sequences into the
running batch (up to ``max_batch``; the rest wait in FIFO order, which is the queue depth
``/metrics`` reports), prefills the admitted ones' uncached prompt tokens at
``prefill_tokens_per_s``, and decodes one token for every running sequence; its duration is

    prefill tokens / prefill rate + decode_step_ms + decode_step_ms_per_seq * batch size

divided by ``speed``. A sequence's first token comes out of the step that prefilled it,
as in vLLM. ``speed == 0`` removes modelled time: requests complete as soon as they are
counted, which makes the simulator a zero-latency backend for client benchmarks.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from dataclasses import dataclass

from batchbench.sim.cache import PrefixCache


@dataclass(frozen=True)
class ServingModel:
    """Per-rank hardware parameters, in the units of their names."""

    kv_cache_tokens: int = 1_000_000
    block_tokens: int = 16
    prefill_tokens_per_s: float = 20_000.0
    decode_step_ms: float = 10.0
    decode_step_ms_per_seq: float = 0.05
    max_batch: int = 64
    speed: float = 1.0

    def step_seconds(self, prefill_tokens: int, batch: int) -> float:
        """Wall time of one step with this much prefill and this many running sequences."""
        modelled = (
            prefill_tokens / self.prefill_tokens_per_s
            + (self.decode_step_ms + self.decode_step_ms_per_seq * batch) / 1000.0
        )
        return modelled / self.speed


class Sequence:
    """One request inside a rank: its prefill work, its output length and its progress."""

    __slots__ = ("_changed", "done", "generated", "output_tokens", "prefill_tokens")

    def __init__(self, prefill_tokens: int, output_tokens: int) -> None:
        self.prefill_tokens = prefill_tokens
        self.output_tokens = output_tokens
        self.generated = 0
        self.done = asyncio.get_running_loop().create_future()
        self._changed: asyncio.Future[None] | None = None

    def advance(self) -> None:
        self.generated += 1
        if self._changed is not None and not self._changed.done():
            self._changed.set_result(None)
        self._changed = None
        if self.generated >= self.output_tokens and not self.done.done():
            self.done.set_result(None)

    async def wait_beyond(self, seen: int) -> int:
        """Wait until more than ``seen`` tokens are generated; returns the new count."""
        while self.generated <= seen:
            if self.done.done():
                return self.generated
            self._changed = asyncio.get_running_loop().create_future()
            await self._changed
        return self.generated


class Rank:
    """One DP rank: counters for ``/metrics``, a prefix cache and (speed > 0) a step loop."""

    def __init__(self, index: int, model: ServingModel) -> None:
        self.index = index
        self.model = model
        self.cache = PrefixCache(model.kv_cache_tokens, model.block_tokens)
        self.requests = 0
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.cached_tokens = 0
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.in_flight = 0  # requests between routing and their last byte
        self._loop_task: asyncio.Task[None] | None = None

    @property
    def load(self) -> int:
        return self.in_flight

    def account(self, prompt_tokens: int, cached_tokens: int, completion_tokens: int) -> None:
        self.requests += 1
        self.prompt_tokens += prompt_tokens
        self.cached_tokens += cached_tokens
        self.completion_tokens += completion_tokens

    def submit(self, prefill_tokens: int, output_tokens: int) -> Sequence:
        """Queue a sequence; the step loop (started here if idle) runs it to completion."""
        sequence = Sequence(prefill_tokens, max(output_tokens, 1))
        self.waiting.append(sequence)
        if self._loop_task is None or self._loop_task.done():
            self._loop_task = asyncio.get_running_loop().create_task(self._step_loop())
        return sequence

    async def _step_loop(self) -> None:
        model = self.model
        while self.waiting or self.running:
            prefill = 0
            while self.waiting and len(self.running) < model.max_batch:
                sequence = self.waiting.popleft()
                prefill += sequence.prefill_tokens
                self.running.append(sequence)
            await asyncio.sleep(model.step_seconds(prefill, len(self.running)))
            still = []
            for sequence in self.running:
                if sequence.done.done():  # abandoned (client went away)
                    continue
                sequence.advance()
                if not sequence.done.done():
                    still.append(sequence)
            self.running = still

    def cancel(self, sequence: Sequence) -> None:
        """Forget a sequence whose client went away."""
        if not sequence.done.done():
            sequence.done.set_result(None)
        with contextlib.suppress(ValueError):
            self.waiting.remove(sequence)
