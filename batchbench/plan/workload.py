"""Compile a manifest or sampled specs into per-request turn shapes (docs/manifest.md).

The result is columnar and text-free: a few numpy columns indexed by request, grouped
per trajectory by ``request_offsets`` (CSR). Text is materialized later, per admitted
trajectory, by ``batchbench.text.content``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from batchbench.errors import PlanError
from batchbench.plan.limits import MAX_REQUEST_TOKENS
from batchbench.plan.manifest import quoted
from batchbench.plan.sampling import SizeSpec, sample_sizes
from batchbench.rng import mix_seed

# Sampling stream ids: each sampled field of an agent has its own stream (4 is unused).
if TYPE_CHECKING:
    from batchbench.plan.manifest import Manifest

STREAM_INPUT = 0
STREAM_INVOCATIONS = 1
STREAM_OUTPUT = 2
STREAM_ENVIRONMENT = 3
STREAM_LATENCY = 5


class SampledIds(Sequence[str]):
    """``sampled-<i>`` ids without storing a string per agent."""

    def __init__(self, count: int) -> None:
        self._count = count

    def __len__(self) -> int:
        return self._count

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [f"sampled-{i}" for i in range(*index.indices(self._count))]
        if index < 0:
            index += self._count
        if not 0 <= index < self._count:
            raise IndexError(index)
        return f"sampled-{index}"


@dataclass
class BlockPlan:
    """The blocks of every request (CSR by request), as the manifest wrote them.

    ``shared`` marks seeds that more than one trajectory uses: their text is generated once
    per run, and the prompt correction never resizes them (shared prefixes stay identical).
    """

    offsets: np.ndarray  # int64, n_requests + 1
    seed: np.ndarray  # int32 per block: index into ``seeds``
    seeds: list[str]
    tokens: np.ndarray  # int64 per block
    role: np.ndarray  # uint8 per block: index into BLOCK_ROLES
    live: np.ndarray  # bool per block
    shared: np.ndarray  # bool per seed
    trajectory_has_blocks: np.ndarray  # bool per trajectory

    def of(self, request: int) -> range:
        """Block rows of one request (global request index)."""
        return range(int(self.offsets[request]), int(self.offsets[request + 1]))


@dataclass
class Workload:
    """Turn shapes of every trajectory; request columns are aligned int64/float64 arrays."""

    mode: str  # "synthetic" or "trajectory_replay"
    trajectory_ids: Sequence[str]
    request_offsets: np.ndarray
    input_content_tokens: np.ndarray
    output_tokens: np.ndarray
    environment_tokens: np.ndarray
    target_prompt_tokens: np.ndarray
    tool_call_latency_ms: np.ndarray
    reset_before: np.ndarray
    schema_version: int | None = None
    # Schema v2 (None when no trajectory uses the feature):
    start_seconds: np.ndarray | None = None  # float64 per trajectory: scaled start offset
    request_stream: np.ndarray | None = None  # int8 per request: -1 run default, 0/1 set
    request_max_tokens: np.ndarray | None = None  # int64 per request: 0 = planned output
    recorded_start_after_ms: np.ndarray | None = None  # int64 per request: -1 absent
    overhead_tokens: np.ndarray | None = None  # int64 per request: effective overhead
    blocks: BlockPlan | None = None  # seeded content blocks of block trajectories
    # int64 per request: its row in its source file, -1 absent (plan.provenance); None
    # when no trajectory has provenance.
    source_rows: np.ndarray | None = None
    warnings: tuple[str, ...] = ()  # plan warnings to print once before the run

    def __len__(self) -> int:
        return len(self.trajectory_ids)

    @property
    def n_requests(self) -> int:
        return int(self.request_offsets[-1])

    def has_blocks(self, trajectory: int) -> bool:
        """True when the trajectory's prompts are made of seeded blocks (schema v2)."""
        return self.blocks is not None and bool(self.blocks.trajectory_has_blocks[trajectory])

    def turns(self, trajectory: int) -> range:
        """Global request indices of one trajectory, in order."""
        return range(
            int(self.request_offsets[trajectory]), int(self.request_offsets[trajectory + 1])
        )


def compile_manifest(
    manifest: Manifest,
    initial_overhead: int = 0,
    turn_overhead: int = 0,
    time_scale: float = 1.0,
) -> Workload:
    """Apply the overheads, content targets and environment inference of the growth model;
    block trajectories take their content from their blocks instead."""
    offsets = np.asarray(manifest.request_offsets, dtype=np.int64)
    prompt = np.asarray(manifest.prompt_tokens, dtype=np.int64)
    output = np.asarray(manifest.output_tokens, dtype=np.int64)
    reset = np.asarray(manifest.reset_before, dtype=bool).copy()
    n = len(prompt)
    index = np.arange(n, dtype=np.int64)
    is_first = np.zeros(n, dtype=bool)
    is_first[offsets[:-1]] = True
    reset[is_first] = False  # the first request starts fresh anyway
    starts = is_first | reset
    own = _own_overheads(manifest)
    overhead = _effective_overheads(starts, own, index, initial_overhead, turn_overhead)
    content = prompt - overhead

    environment = np.zeros(n, dtype=np.int64)
    if n > 1:
        appends = ~starts[1:]
        environment[:-1] = np.where(appends, content[1:] - content[:-1] - output[:-1], 0)

    blocks = _block_plan(manifest)
    warnings: list[str] = []
    if blocks is not None:
        in_blocks = np.repeat(blocks.trajectory_has_blocks, np.diff(offsets))
        running = np.concatenate(([0], np.cumsum(blocks.tokens)))
        sums = running[blocks.offsets[1:]] - running[blocks.offsets[:-1]]
        content = np.where(in_blocks, sums, content)
        environment[in_blocks] = 0
        warnings += _block_warnings(manifest, offsets, prompt, overhead, content, blocks)
    else:
        in_blocks = None
    _raise_first_plan_error(manifest, offsets, prompt, overhead, content, environment, in_blocks)
    block_sums = np.where(in_blocks, content, 0) if in_blocks is not None else None
    _raise_oversized(manifest, offsets, prompt, output, block_sums)
    latency = np.asarray(manifest.delay_after_ms, dtype=np.float64)
    if time_scale != 1.0:
        latency = latency / time_scale
    v2 = manifest.schema_version >= 2
    start_seconds = None
    if v2 and manifest.has_start_offsets:
        start_seconds = np.asarray(manifest.start_after_ms, dtype=np.float64) / 1000.0
        if time_scale != 1.0:
            start_seconds = start_seconds / time_scale
    stream = _optional_column(manifest, "stream", -1, np.int8) if v2 else None
    max_tokens = _optional_column(manifest, "max_tokens", 0, np.int64) if v2 else None
    recorded = _optional_column(manifest, "recorded_start_after_ms", -1, np.int64) if v2 else None
    return Workload(
        mode="trajectory_replay",
        trajectory_ids=manifest.trajectory_ids,
        request_offsets=offsets,
        input_content_tokens=content,
        output_tokens=output,
        environment_tokens=environment,
        target_prompt_tokens=prompt,
        tool_call_latency_ms=latency,
        reset_before=reset,
        schema_version=manifest.schema_version,
        start_seconds=start_seconds,
        request_stream=stream,
        request_max_tokens=max_tokens,
        recorded_start_after_ms=recorded,
        overhead_tokens=overhead,
        blocks=blocks,
        source_rows=np.asarray(manifest.source_rows) if manifest.source_names else None,
        warnings=tuple(warnings),
    )


def _optional_column(manifest: Manifest, name: str, absent: int, dtype) -> np.ndarray | None:
    """A schema v2 request column, or None when no request sets the field."""
    column = np.asarray(getattr(manifest, name), dtype=dtype)
    return column if bool(np.any(column != absent)) else None


def _own_overheads(manifest: Manifest) -> np.ndarray:
    """Each request's own ``overhead_tokens`` (schema v2), -1 where it has none."""
    return np.asarray(manifest.overhead_tokens, dtype=np.int64)


def _effective_overheads(
    starts: np.ndarray, own: np.ndarray, index: np.ndarray, initial: int, turn: int
) -> np.ndarray:
    """A request's own overhead wins; else a fresh request gets ``initial`` and an appended
    one the previous request's overhead plus ``turn``. Vectorized: each request counts turns
    from its anchor, the latest fresh request or request with its own overhead."""
    anchors = starts | (own >= 0)
    anchor = np.maximum.accumulate(np.where(anchors, index, 0))
    base = np.where(own >= 0, own, initial)
    return base[anchor] + turn * (index - anchor)


def _block_plan(manifest: Manifest) -> BlockPlan | None:
    """The manifest's blocks with per-seed sharing, or None when no request has blocks."""
    block_offsets = manifest.block_offsets
    if int(block_offsets[-1]) == 0:
        return None
    block_offsets = np.asarray(block_offsets, dtype=np.int64)
    seed = np.asarray(manifest.block_seed, dtype=np.int32)
    request_offsets = np.asarray(manifest.request_offsets, dtype=np.int64)
    first_blocks = block_offsets[request_offsets[:-1]]
    trajectory_has_blocks = block_offsets[request_offsets[:-1] + 1] > first_blocks
    # A seed is shared when more than one trajectory uses it.
    trajectory_of_block = np.repeat(
        np.arange(len(manifest.trajectory_ids), dtype=np.int64),
        np.diff(block_offsets[request_offsets]),
    )
    pairs = np.unique(np.stack([seed.astype(np.int64), trajectory_of_block]), axis=1)
    users = np.bincount(pairs[0], minlength=len(manifest.block_seeds))
    return BlockPlan(
        offsets=block_offsets,
        seed=seed,
        seeds=manifest.block_seeds,
        tokens=np.asarray(manifest.block_tokens, dtype=np.int64),
        role=np.asarray(manifest.block_role, dtype=np.uint8),
        live=np.asarray(manifest.block_live, dtype=bool),
        shared=users > 1,
        trajectory_has_blocks=trajectory_has_blocks,
    )


def _block_warnings(
    manifest: Manifest,
    offsets: np.ndarray,
    prompt: np.ndarray,
    overhead: np.ndarray,
    content: np.ndarray,
    blocks: BlockPlan,
) -> list[str]:
    """Once per trajectory: its first request whose prompt is not its blocks plus overhead,
    and its first seed redefined with other tokens or role."""
    warnings = []
    mismatch = (prompt != content + overhead) & np.repeat(
        blocks.trajectory_has_blocks, np.diff(offsets)
    )
    reported = set()
    for request in np.flatnonzero(mismatch):
        trajectory = int(np.searchsorted(offsets, request, side="right") - 1)
        if trajectory in reported:
            continue
        reported.add(trajectory)
        warnings.append(
            f"warning: trajectory {quoted(manifest.trajectory_ids[trajectory])} request "
            f"{int(request - offsets[trajectory]) + 1}: prompt_tokens {int(prompt[request])} "
            f"!= sum(blocks.tokens) {int(content[request])} + overhead_tokens "
            f"{int(overhead[request])}; replaying the blocks as written"
        )
    return warnings + manifest.seed_redefinition_warnings()


def _raise_oversized(
    manifest: Manifest,
    offsets: np.ndarray,
    prompt: np.ndarray,
    output: np.ndarray,
    blocks: np.ndarray | None = None,
) -> None:
    """A request larger than one request can hold is refused before any text is made (a
    typo must not become gigabytes of text); ``blocks`` is each block request's block sum."""
    checked = [("prompt_tokens", prompt), ("output_tokens", output)]
    if blocks is not None:
        checked.append(("blocks", blocks))
    for name, values in checked:
        over = np.flatnonzero(values > MAX_REQUEST_TOKENS)
        if len(over):
            request = int(over[0])
            trajectory = int(np.searchsorted(offsets, request, side="right") - 1)
            raise PlanError(
                f"trajectory {quoted(manifest.trajectory_ids[trajectory])} request "
                f"{request - int(offsets[trajectory]) + 1} {name} ({int(values[request])}) is "
                f"more than one request can hold (at most {MAX_REQUEST_TOKENS})"
            )


def _raise_first_plan_error(
    manifest: Manifest,
    offsets: np.ndarray,
    prompt: np.ndarray,
    overhead: np.ndarray,
    content: np.ndarray,
    environment: np.ndarray,
    in_blocks: np.ndarray | None = None,
) -> None:
    """Report the first build-time error in file order, as a per-request loop would; block
    requests are made of their blocks, so the growth rules do not apply to them."""
    too_small = content <= 0
    if in_blocks is not None:
        too_small &= ~in_blocks
    bad_content = np.flatnonzero(too_small)
    # A negative environment after request i is discovered while building request i + 1.
    bad_growth = np.flatnonzero(environment < 0) + 1
    candidates = []
    if len(bad_content):
        candidates.append((int(bad_content[0]), 0))
    if len(bad_growth):
        candidates.append((int(bad_growth[0]), 1))
    if not candidates:
        return
    request, kind = min(candidates)
    trajectory = int(np.searchsorted(offsets, request, side="right") - 1)
    ident = manifest.trajectory_ids[trajectory]
    number = request - int(offsets[trajectory]) + 1
    if kind == 0:
        raise PlanError(
            f'trajectory "{ident}" request {number} prompt ({int(prompt[request])}) '
            f"must exceed its replay overhead ({int(overhead[request])})"
        )
    raise PlanError(
        f'trajectory "{ident}" request {number} cannot satisfy its replay overhead '
        f"({int(overhead[request])} tokens); lower the overhead or set reset_before=true"
    )


@dataclass(frozen=True)
class SampledShape:
    """The resolved specs of the sampled mode."""

    input: SizeSpec
    output: SizeSpec
    environment: SizeSpec
    tool_invocations: SizeSpec
    latency: SizeSpec | None


def compile_sampled(shape: SampledShape, agents: int, root_seed: int) -> Workload:
    """Draw every agent's turns from its own streams, one stream per sampled field."""
    counts = np.empty(agents, dtype=np.int64)
    firsts = np.empty(agents, dtype=np.int64)
    outputs, environments, latencies = [], [], []
    for agent in range(agents):
        firsts[agent] = sample_sizes(
            shape.input, mix_seed(root_seed, agent, STREAM_INPUT), 1, "input"
        )[0]
        k = int(
            sample_sizes(
                shape.tool_invocations,
                mix_seed(root_seed, agent, STREAM_INVOCATIONS),
                1,
                "tool-invocations",
            )[0]
        )
        counts[agent] = k
        outputs.append(
            sample_sizes(shape.output, mix_seed(root_seed, agent, STREAM_OUTPUT), k, "output")
        )
        environments.append(
            sample_sizes(
                shape.environment, mix_seed(root_seed, agent, STREAM_ENVIRONMENT), k, "environment"
            )
        )
        if shape.latency is None:
            latencies.append(np.zeros(k, dtype=np.float64))
        else:
            latencies.append(
                sample_sizes(
                    shape.latency,
                    mix_seed(root_seed, agent, STREAM_LATENCY),
                    k,
                    "tool-call latency",
                ).astype(np.float64)
            )
    offsets = np.zeros(agents + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    output = np.concatenate(outputs) if agents else np.zeros(0, dtype=np.int64)
    environment = np.concatenate(environments) if agents else np.zeros(0, dtype=np.int64)
    growth = output + environment
    content = np.empty_like(output)
    for agent in range(agents):
        lo, hi = int(offsets[agent]), int(offsets[agent + 1])
        content[lo] = firsts[agent]
        np.cumsum(growth[lo : hi - 1], out=content[lo + 1 : hi])
        content[lo + 1 : hi] += firsts[agent]
    return Workload(
        mode="synthetic",
        trajectory_ids=SampledIds(agents),
        request_offsets=offsets,
        input_content_tokens=content,
        output_tokens=output,
        environment_tokens=environment,
        target_prompt_tokens=content,
        tool_call_latency_ms=np.concatenate(latencies) if agents else np.zeros(0),
        reset_before=np.zeros(int(offsets[-1]), dtype=bool),
        schema_version=None,
    )
