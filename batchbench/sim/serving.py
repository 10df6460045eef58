"""The serving model of one data-parallel rank: a prefix cache and continuous batching.

Each rank runs a step loop while it has work, scheduling like vLLM with chunked prefill:
every step first decodes one token for each running sequence that has finished its
prefill, then spends what is left of the ``max_num_batched_tokens`` budget on prefill,
oldest sequence first, and admits queued sequences (FIFO, up to ``max_batch`` running)
while budget remains and their KV fits. ``kv_cache_tokens`` is the rank's KV pool: a
running sequence claims its uncached prompt plus its output, and the prefix cache keeps
only what running sequences leave free (cached prefixes are evicted first). Sequences that
do not fit wait; they are the queue depth ``/metrics`` reports. A step lasts

    prefill tokens / prefill_tokens_per_s
    + (decode_step_ms + decode_step_ms_per_seq * batch
       + decode_step_ms_per_ktoken * context tokens of the batch / 1000) / 1000

divided by ``speed``, on an absolute clock so that time spent waking handlers does not
stretch the modelled steps. A sequence's first token comes out of the step that finishes
its prefill. ``speed == 0`` removes modelled time: requests complete as soon as they are
counted, which makes the simulator a zero-latency backend for client benchmarks.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable
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
    decode_step_ms_per_ktoken: float = 0.01
    max_batch: int = 64
    max_num_batched_tokens: int = 8192
    speed: float = 1.0

    def step_seconds(self, prefill_tokens: int, batch: int, context_tokens: int = 0) -> float:
        """Wall time of one step: this much prefill, this many running sequences holding
        ``context_tokens`` of KV in all (attention reads it every decode step)."""
        modelled = (
            prefill_tokens / self.prefill_tokens_per_s
            + (
                self.decode_step_ms
                + self.decode_step_ms_per_seq * batch
                + self.decode_step_ms_per_ktoken * context_tokens / 1000.0
            )
            / 1000.0
        )
        return modelled / self.speed


class Sequence:
    """One request inside a rank: its prefill work, its output length and its progress."""

    __slots__ = (
        "_changed",
        "context_tokens",
        "done",
        "generated",
        "kv_tokens",
        "on_prefilled",
        "output_tokens",
        "prefill_left",
        "prefill_tokens",
    )

    def __init__(
        self,
        prefill_tokens: int,
        output_tokens: int,
        on_prefilled: Callable[[], None] | None,
        context_tokens: int,
    ) -> None:
        self.on_prefilled = on_prefilled
        self.context_tokens = context_tokens  # the whole prompt, cached part included
        self.kv_tokens = prefill_tokens + output_tokens  # KV it claims beyond cached blocks
        self.prefill_tokens = prefill_tokens
        self.prefill_left = max(prefill_tokens, 1)  # a server computes at least one token
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
        self.kv_running = 0  # KV tokens claimed by running sequences
        self._loop_task: asyncio.Task[None] | None = None

    @property
    def load(self) -> int:
        return self.in_flight

    def account(self, prompt_tokens: int, cached_tokens: int, completion_tokens: int) -> None:
        self.requests += 1
        self.prompt_tokens += prompt_tokens
        self.cached_tokens += cached_tokens
        self.completion_tokens += completion_tokens

    def submit(
        self,
        prefill_tokens: int,
        output_tokens: int,
        on_prefilled: Callable[[], None] | None = None,
        context_tokens: int | None = None,
    ) -> Sequence:
        """Queue a sequence; the step loop (started here if idle) runs it to completion.

        ``on_prefilled`` runs after the step that finishes its prefill: the moment its
        prompt's KV blocks exist and can serve other requests' prefixes.
        ``context_tokens`` is the whole prompt (default: the prefill).
        """
        context = prefill_tokens if context_tokens is None else context_tokens
        sequence = Sequence(prefill_tokens, max(output_tokens, 1), on_prefilled, context)
        self.waiting.append(sequence)
        if self._loop_task is None or self._loop_task.done():
            self._loop_task = asyncio.get_running_loop().create_task(self._step_loop())
        return sequence

    async def _step_loop(self) -> None:
        model = self.model
        loop = asyncio.get_running_loop()
        deadline = loop.time()
        while self.waiting or self.running:
            budget = model.max_num_batched_tokens
            decoding = [s for s in self.running if s.prefill_left == 0]
            budget -= len(decoding)
            prefill = 0
            finishing: list[Sequence] = []  # sequences whose prefill ends this step
            for sequence in self.running:
                if sequence.prefill_left and budget > 0:
                    prefill, budget = self._prefill(sequence, prefill, budget, finishing)
            while self.waiting and budget > 0 and self._fits(self.waiting[0]):
                sequence = self.waiting.popleft()
                self.running.append(sequence)
                self._claim(sequence.kv_tokens)
                prefill, budget = self._prefill(sequence, prefill, budget, finishing)
            context = sum(s.context_tokens + s.generated for s in self.running)
            deadline += model.step_seconds(prefill, len(self.running), context)
            now = loop.time()
            if deadline < now - 0.1:  # far behind (an overloaded loop): do not bank debt
                deadline = now
            await asyncio.sleep(max(0.0, deadline - now))
            for sequence in finishing:
                if sequence.on_prefilled is not None:
                    sequence.on_prefilled()
                    sequence.on_prefilled = None
            for sequence in (*decoding, *finishing):
                if not sequence.done.done():  # done already: abandoned by its client
                    sequence.advance()
            still = []
            for sequence in self.running:
                if sequence.done.done():
                    self._claim(-sequence.kv_tokens)
                else:
                    still.append(sequence)
            self.running = still

    def _fits(self, sequence: Sequence) -> bool:
        """Room in the batch, and in KV (beyond what the prefix cache may give back)."""
        if len(self.running) >= self.model.max_batch:
            return False
        capacity = self.model.kv_cache_tokens
        # With no KV capacity set (0) nothing limits admission; one sequence always runs.
        return not capacity or not self.running or self.kv_running + sequence.kv_tokens <= capacity

    def _claim(self, tokens: int) -> None:
        """Running sequences' KV grows or shrinks; the prefix cache gets what is left."""
        self.kv_running += tokens
        self.cache.reserve(self.kv_running)

    @staticmethod
    def _prefill(
        sequence: Sequence, prefill: int, budget: int, finishing: list[Sequence]
    ) -> tuple[int, int]:
        take = min(sequence.prefill_left, budget)
        sequence.prefill_left -= take
        if sequence.prefill_left == 0:
            finishing.append(sequence)
        return prefill + take, budget - take

    def cancel(self, sequence: Sequence) -> None:
        """Forget a sequence whose client went away."""
        if not sequence.done.done():
            sequence.done.set_result(None)
        with contextlib.suppress(ValueError):
            self.waiting.remove(sequence)
