"""Stage 1, the plans: the manifest read and hashed (replay), the root seed drawn, and the
workload compiled when it can be before the tokenizer loads (when the run calibrates, the
replay overheads come from the server, so compiling waits for ``prepare``)."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial

from batchbench.config import RunConfig
from batchbench.drive.calibrate import Calibration
from batchbench.errors import PlanError, UsageError
from batchbench.plan.manifest import Manifest, hash_manifest, load_manifest
from batchbench.plan.workload import Workload, compile_manifest, compile_sampled
from batchbench.stages.console import RunOutput
from batchbench.stages.hosting import BlockingCall


@dataclass(frozen=True)
class Plans:
    """What the run will send, as far as it is known before the target is."""

    started: str  # ISO time the run started, for the results
    manifest: Manifest | None  # replay only
    sha256: str | None  # the manifest's hash (replay only)
    root_seed: int
    workload: Workload | None  # None until calibrated (``RunConfig.calibrates``)


async def load_plans(config: RunConfig, out: RunOutput, call: BlockingCall) -> Plans:
    """Read the plans ``config`` names; their warnings go to ``out``."""
    started = datetime.now(UTC).isoformat(timespec="seconds")
    sha256 = await call(hash_manifest, config.agent_plans_jsonl) if config.replay else None
    manifest = (
        await call(partial(load_manifest, sha256=sha256), config.agent_plans_jsonl)
        if config.replay
        else None
    )
    root_seed = config.seed if config.seed is not None else secrets.randbits(64)
    workload = None
    if not config.calibrates:  # plans are compiled before the tokenizer loads
        preset = config.preset_calibration
        calibration = preset if isinstance(preset, Calibration) else None
        workload = calibrated_workload(config, manifest, root_seed, calibration, out)
        planned(config, workload, root_seed, out)
    return Plans(started, manifest, sha256, root_seed, workload)


def calibrated_workload(
    config: RunConfig,
    manifest: Manifest | None,
    root_seed: int,
    calibration: Calibration | None,
    out: RunOutput,
) -> Workload:
    """Compile the plans with the overheads ``starting_overheads`` gives. A calibration
    the run made by default (not asked for with --calibrate) whose overheads do not fit a
    plan (a prompt smaller than the framing) costs one note: the plans are compiled without
    it, and the prompt correction, which starts from the calibrated framing, reports the
    requests it cannot bring to their targets."""
    overheads = starting_overheads(config, calibration)
    try:
        return build_workload(config, manifest, root_seed, overheads)
    except PlanError as exc:
        if calibration is None or config.calibrate:
            raise
        fallback = starting_overheads(config, None)
        out.warning(
            f"note: the calibrated overheads (initial {overheads[0]}, turn {overheads[1]} "
            f"tokens) do not fit the plans ({exc}); they are compiled with initial "
            f"{fallback[0]}, turn {fallback[1]} instead"
        )
        return build_workload(config, manifest, root_seed, fallback)


def build_workload(
    config: RunConfig, manifest: Manifest | None, root_seed: int, overheads: tuple[int, int]
) -> Workload:
    """Compile the plans; ``overheads`` are (initial, turn) framing tokens (replay only)."""
    if manifest is None:
        return compile_sampled(config.shape, config.agents or 1, root_seed)
    return compile_manifest(
        manifest,
        initial_overhead=overheads[0],
        turn_overhead=overheads[1],
        time_scale=config.time_scale_factor,
    )


BLOCKS_AS_WRITTEN = "replaying the blocks as written"


def planned(config: RunConfig, workload: Workload, root_seed: int, out: RunOutput) -> None:
    """Once the plans are compiled: their warnings, and a bad open-loop combination fails
    before the run."""
    warnings = workload.warnings
    mismatches = [w for w in warnings if w.endswith(BLOCKS_AS_WRITTEN)]
    if config.prompt_correction and not config.dry_run and mismatches:
        # The correction aims every block request at its prompt_tokens, so the blocks are
        # not replayed as written: one line says so instead of one per trajectory (an
        # imported trace's prompts hold their template's framing in their blocks).
        first = mismatches[0].removeprefix("warning: ").removesuffix(BLOCKS_AS_WRITTEN)
        out.warning(
            f"note: {len(mismatches)} trajectories have block requests whose prompt_tokens "
            f"differ from their blocks plus overhead (first: {first}aiming at prompt_tokens "
            "with the prompt correction)"
        )
        warnings = tuple(w for w in warnings if not w.endswith(BLOCKS_AS_WRITTEN))
    for warning in warnings:
        out.warning(warning)
    if config.admission_mode == "open-loop":
        start_offsets(config, workload, root_seed)


def start_offsets(config: RunConfig, workload: Workload, root_seed: int) -> list[float]:
    """Open-loop start times in seconds: the manifest's scaled ``start_after_ms``, else the
    arrival process of ``--arrival-rate``, else 0 for every trajectory."""
    if config.arrival_rate is not None:
        if workload.start_seconds is not None:
            raise UsageError(
                "--arrival-rate cannot be combined with a manifest whose trajectories set "
                "start_after_ms; drop one of them"
            )
        return config.arrival_offsets(len(workload), root_seed)
    if workload.start_seconds is not None:
        return workload.start_seconds.tolist()
    return [0.0] * len(workload)


def starting_overheads(config: RunConfig, calibration: Calibration | None) -> tuple[int, int]:
    """(initial, turn): explicit options win, then calibration, then 0."""
    initial = config.replay_initial_overhead_tokens
    turn = config.replay_turn_overhead_tokens
    if initial is None:
        initial = calibration.initial if calibration is not None else 0
    if turn is None:
        turn = calibration.turn if calibration is not None else 0
    return initial, turn
