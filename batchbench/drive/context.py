"""What every request of a run shares: its HTTP settings, how prompts are kept on target,
and the run-wide helpers that make texts on the loop or on the worker pool.

The agent loop (``batchbench.drive.driver``) and the two ways of building a request
(``batchbench.drive.growth`` for growing conversations, ``batchbench.drive.blockturns``
for block trajectories) all take one ``AgentRun``: nothing reaches into another class's
attributes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, Protocol

from batchbench.drive.failover import DEFAULT_RANK_FAILOVER
from batchbench.drive.oracle import ORACLE_ROUNDS, PromptOracle
from batchbench.drive.sizing import Sizing, TrajectorySizer
from batchbench.drive.transport import DEFAULT_MAX_RESPONSE_BYTES, DEFAULT_WORKER_HEADER
from batchbench.drive.wire import DEFAULT_DP_RANK_HEADER, BodyOptions, Reply
from batchbench.plan.workload import Workload
from batchbench.results.recording import Recorder
from batchbench.text.content import ContentFactory
from batchbench.text.framing import Framing
from batchbench.text.replycount import ReplyAccounting

# Texts up to this many tokens are assembled on the loop (microseconds with the fast
# method); longer ones, and every text of the repair method, go to the worker pool.
INLINE_TEXT_TOKENS = 4096
# Replies up to this many characters are counted on the loop; longer ones on a worker
# thread (the batched encode releases the GIL).
INLINE_COUNT_CHARACTERS = 1024


@dataclass(frozen=True)
class DriverSettings:
    """Run-wide HTTP settings: target, identity and routing, timeouts and retries."""

    url: str
    body: BodyOptions
    api_key: str | None = None
    user_tagging: bool = True
    user_prefix: str | None = None
    seed: int | None = None
    dp_ranks: int | None = None
    dp_rank_header: str = DEFAULT_DP_RANK_HEADER  # which header(s) name the rank
    rank_failover: str = DEFAULT_RANK_FAILOVER  # what a down rank's agents do (none, rehash)
    worker_header: str = DEFAULT_WORKER_HEADER  # the response header naming the worker
    timeout_seconds: float = 60.0
    max_retries: int = 2
    retry_delay_ms: int = 250
    max_retry_wait_seconds: float = 300.0  # the longest wait before a retry (Retry-After)
    max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES
    verbose: bool = False


@dataclass(frozen=True)
class Fidelity:
    """How the driver keeps prompts on target (see ``batchbench.drive.sizing``)."""

    framing: Framing
    replies: ReplyAccounting | None = None  # None: replies replayed as received, not counted
    oracle: PromptOracle | None = None
    # Counts a block request in the server's chat template, when the client knows it.
    prompt_counter: Callable[[list, list], int] | None = None
    keep_reasoning: bool = True  # replay the reply's reasoning_content (--replay-reasoning)

    @property
    def correct(self) -> bool:
        return self.replies is not None


class RequestSizing(Protocol):
    """What a request event tells of how its request was sized."""

    @property
    def target(self) -> int: ...
    @property
    def correction(self) -> int: ...
    @property
    def note(self) -> str | None: ...


class RequestBuilder(Protocol):
    """How one trajectory's requests are made: the only thing that differs between a
    growing conversation (v1) and a block trajectory (v2). The agent loop calls, per
    request: ``body`` (then sends it), ``served`` and ``replied`` once it succeeded, and
    ``build`` to make the next request (during the tool delay when there is one)."""

    @property
    def sizing(self) -> RequestSizing:
        """How the current request was sized."""
        ...

    @property
    def oracle_seconds(self) -> float | None:
        """Time the current request's server counts took (--prompt-oracle server)."""
        ...

    def body(self, turn: int, request: int, fields: bytes) -> bytes:
        """The current request's body, ``fields`` (``body_fields``) after its messages."""
        ...

    def served(self, turn: int, request: int, reply: Reply) -> int:
        """Learn from the server's prompt count; returns the tokens perfect caching could
        serve to a fresh request (the fidelity's explainable cache)."""
        ...

    def replied(self, turn: int, request: int, reply: Reply) -> int | asyncio.Future | None:
        """Keep the reply for the next request; its rendered size (None when not counted,
        a future when it is counted on a worker thread)."""
        ...

    def build(self, turn: int) -> Awaitable[None]:
        """Make the request after ``turn`` the current one."""
        ...


class AgentRun:
    """The run-wide parts request builders use: workload, texts, pool, recorder."""

    __slots__ = ("factory", "fidelity", "inline", "pool", "recorder", "settings", "workload")

    def __init__(
        self,
        settings: DriverSettings,
        workload: Workload,
        factory: ContentFactory,
        pool: Executor,
        recorder: Recorder,
        fidelity: Fidelity,
    ) -> None:
        self.settings = settings
        self.workload = workload
        self.factory = factory
        self.pool = pool
        self.recorder = recorder
        self.fidelity = fidelity
        self.inline = factory.synth.method == "fast"

    def cheap(self, tokens: int) -> bool:
        """True when a text of ``tokens`` is cheaper to assemble here than to hand off."""
        return self.inline and tokens <= INLINE_TEXT_TOKENS

    def text_later(self, make: Callable[..., str], agent: int, turn: int, tokens: int) -> Any:
        """A future for a planned-size text, or None when it is cheap to make when needed."""
        if self.cheap(tokens):
            return None
        return asyncio.get_running_loop().run_in_executor(self.pool, make, agent, turn, tokens)

    async def text(
        self, pending, planned: int, make: Callable[..., str], agent: int, turn: int, tokens: int
    ) -> str:
        """The text of ``tokens``: the prefetched one when the size did not change."""
        if pending is not None and tokens == planned:
            return await pending
        if pending is not None:
            pending.cancel()
        if self.cheap(tokens):
            return make(agent, turn, tokens)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.pool, make, agent, turn, tokens)

    def rendered(self, content, reasoning) -> Any:
        """The reply as the next prompt renders it (content and reasoning): its token count,
        or a future of it for a long reply (counted on a worker thread during the delay)."""
        replies = self.fidelity.replies
        assert replies is not None  # called when correcting
        size = (len(content) if isinstance(content, str) else 0) + (
            len(reasoning) if isinstance(reasoning, str) else 0
        )
        if size <= INLINE_COUNT_CHARACTERS:
            return replies.count(content, reasoning)
        return asyncio.get_running_loop().run_in_executor(
            self.pool, replies.count, content, reasoning
        )

    async def make(self, make: Callable[[int], str], tokens: int) -> str:
        """A text of ``tokens``, assembled here when cheap, else on a worker thread."""
        if self.cheap(tokens):
            return make(tokens)
        return await asyncio.get_running_loop().run_in_executor(self.pool, make, tokens)

    async def oracle_sized(
        self,
        sizer: TrajectorySizer,
        sizing: Sizing,
        build: Callable[[str], bytes],
        make: Callable[[int], str],
        text: str,
    ) -> tuple[str, Sizing, float | None]:
        """With ``--prompt-oracle server``: resize the new content until the server's count
        of the request equals its target (at most three counts). ``build`` turns a content
        text into the tokenize body, ``make`` makes a text of a given size."""
        oracle = self.fidelity.oracle
        if oracle is None:
            return text, sizing, None
        started = time.perf_counter()
        for _ in range(ORACLE_ROUNDS):
            counted = await oracle.count(build(text))
            if counted == sizing.target:
                break
            resized = sizer.resized(sizing, counted)
            if resized.tokens == sizing.tokens:
                sizing = resized
                break
            sizing = resized
            text = await self.make(make, sizing.tokens)
        elapsed = time.perf_counter() - started
        self.recorder.oracle_counted(elapsed, oracle.queries)
        return text, sizing, elapsed
