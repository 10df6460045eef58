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

    def __getitem__(self, index):  # type: ignore[override]
        if isinstance(index, slice):
            return [f"sampled-{i}" for i in range(*index.indices(self._count))]
        if index < 0:
            index += self._count
        if not 0 <= index < self._count:
            raise IndexError(index)
        return f"sampled-{index}"


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

    def __len__(self) -> int:
        return len(self.trajectory_ids)

    @property
    def n_requests(self) -> int:
        return int(self.request_offsets[-1])

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
    """Apply the overheads, content targets and environment inference of the growth model."""
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
    segment_start = np.maximum.accumulate(np.where(starts, index, 0))
    overhead = initial_overhead + turn_overhead * (index - segment_start)
    content = prompt - overhead

    environment = np.zeros(n, dtype=np.int64)
    if n > 1:
        appends = ~starts[1:]
        environment[:-1] = np.where(appends, content[1:] - content[:-1] - output[:-1], 0)

    _raise_first_plan_error(manifest, offsets, prompt, overhead, content, environment)
    _raise_oversized(manifest, offsets, prompt, output)
    latency = np.asarray(manifest.delay_after_ms, dtype=np.float64)
    if time_scale != 1.0:
        latency = latency / time_scale
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
    )


def _raise_oversized(
    manifest: Manifest, offsets: np.ndarray, prompt: np.ndarray, output: np.ndarray
) -> None:
    """A request larger than one request can hold is refused before any text is made."""
    for name, values in (("prompt_tokens", prompt), ("output_tokens", output)):
        over = np.flatnonzero(values > MAX_REQUEST_TOKENS)
        if len(over):
            request = int(over[0])
            trajectory = int(np.searchsorted(offsets, request, side="right") - 1)
            raise PlanError(
                f'trajectory "{manifest.trajectory_ids[trajectory]}" request '
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
) -> None:
    """Report the first build-time error in file order, as a per-request loop would."""
    bad_content = np.flatnonzero(content <= 0)
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
