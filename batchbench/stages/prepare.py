"""Stage 3, preparation: the tokenizer and the text synthesizer, how replies are counted in
the server's chat template, calibration (a live run's default), the compiled workload, and the
run's setup (printed as the banner). Everything the agents need, before the clock runs."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass, replace
from pathlib import Path

import aiohttp

from batchbench.config import RunConfig
from batchbench.drive.calibrate import Calibration, CalibrationError, calibrate
from batchbench.drive.rankcheck import RankLayout
from batchbench.drive.wire import tool_call_id
from batchbench.errors import BatchbenchError, UsageError
from batchbench.plan.workload import Workload
from batchbench.results.console import banner_lines
from batchbench.results.summary import RunSetup
from batchbench.scale.partition import Share, closed_loop_share, open_loop_share
from batchbench.stages.console import RunOutput
from batchbench.stages.hosting import BlockingCall
from batchbench.stages.plans import (
    Plans,
    calibrated_workload,
    planned,
    start_offsets,
    starting_overheads,
)
from batchbench.stages.target import body_options, probe_headers, sim_chat_template
from batchbench.text.chat_templates import BuiltinTemplate, load_chat_template
from batchbench.text.content import ContentFactory
from batchbench.text.promptcount import SegmentCounter, template_counter
from batchbench.text.replycount import ReplyAccounting
from batchbench.text.synth import Synthesizer
from batchbench.text.tokenizer import LoadedTokenizer, load_tokenizer, with_markers


@dataclass(frozen=True)
class Prepared:
    """A run ready to start: its configuration as run, what it sends and how it counts."""

    config: RunConfig
    setup: RunSetup
    workload: Workload
    factory: ContentFactory  # every text of the run, from the root seed and salt
    replies: ReplyAccounting
    counter: SegmentCounter | None  # counts block prompts in the server's template
    share: Share | None  # with --shard: the trajectories and slots this process owns


async def prepare(
    config: RunConfig,
    plans: Plans,
    out: RunOutput,
    call: BlockingCall,
    layout: RankLayout | None = None,
) -> Prepared:
    """Load and measure what the run needs against the target ``config`` names; prints the
    calibration (when the run calibrates) and the banner (with the rank layout the target stage
    probed, when it did)."""
    loaded = await call(load_tokenizer, config.tokenizer, config.tokenizer_download or None)
    synth = await call(Synthesizer.prepare, loaded)
    template_name, replies = reply_accounting(config, loaded, out.warning)
    preset = config.preset_calibration
    calibration = preset if isinstance(preset, Calibration) else None
    note = preset if isinstance(preset, str) else None
    if config.calibrates:
        calibration, note = await calibrate_or_note(config, synth, replies, out)
    workload = plans.workload
    if workload is None:
        workload = calibrated_workload(config, plans.manifest, plans.root_seed, calibration, out)
        planned(config, workload, plans.root_seed, out)
    salt = content_salt(config)
    setup = run_setup(config, plans, workload, loaded, template_name, calibration, salt)
    if note is not None:
        setup = replace(setup, calibration_note=note)
    if layout is not None:
        setup = replace(setup, rank_workers=list(layout.workers))
    # A --workers child sent no preflight or layout probes (its parent did): it would
    # undercount them, so only a run in one process counts its probes.
    if config.dp_ranks is not None and not config.dry_run and config.worker_count == 1:
        setup = replace(setup, probes=probe_counts(config, layout, calibration))
    out.lines(banner_lines(config, setup))
    factory = ContentFactory(synth, workload, plans.root_seed, salt)
    counter = None
    if workload.blocks is not None and config.prompt_correction and template_name is not None:
        counter = template_counter(loaded, load_chat_template(template_name, loaded))
    share = admission_share(config, workload, plans.root_seed)
    return Prepared(config, setup, workload, factory, replies, counter, share)


def run_setup(
    config: RunConfig,
    plans: Plans,
    workload: Workload,
    loaded: LoadedTokenizer,
    template_name: str | None,
    calibration: Calibration | None,
    salt: str,
) -> RunSetup:
    """What the results record of how the run was set up."""
    overheads = starting_overheads(config, calibration)
    calibrated = calibration is not None and config.replay
    return RunSetup(
        timestamp=plans.started,
        agents=len(workload),
        manifest_sha256=plans.sha256,
        schema_version=workload.schema_version,
        tokenizer_source=loaded.source,
        root_seed=plans.root_seed,
        content_salt=salt,
        chat_template=template_name,
        calibration=calibration.as_dict() if calibration is not None else None,
        replay_initial_overhead_tokens=(
            overheads[0] if calibrated else config.replay_initial_overhead_tokens
        ),
        replay_turn_overhead_tokens=overheads[1]
        if calibrated
        else config.replay_turn_overhead_tokens,
        framing_initial=overheads[0],
        framing_turn=overheads[1],
        framing_measured=calibration is not None
        or config.replay_initial_overhead_tokens is not None
        or config.replay_turn_overhead_tokens is not None,
        sources=plans.manifest.source_summary() if plans.manifest is not None else None,
    )


def reply_accounting(
    config: RunConfig, loaded: LoadedTokenizer, warn
) -> tuple[str | None, ReplyAccounting]:
    """The server's chat template when the client can know it, and the accounting that
    counts replies in it (with no known template, replies are counted on their own)."""
    spec = sim_chat_template(config) if config.sim else config.chat_template
    if spec is None:
        if not template_beside(loaded):
            return None, ReplyAccounting.build(loaded)
        spec = "tokenizer"
    try:
        template = load_chat_template(spec, loaded, warn)
        # A built-in's markers are added tokens of every model of its family.
        counting = (
            with_markers(loaded.tokenizer, template.markers)
            if isinstance(template, BuiltinTemplate)
            else None
        )
        accounting = ReplyAccounting.build(loaded, template, tool_call_id(0, 1), tokenizer=counting)
    except BatchbenchError as exc:
        if config.chat_template is None and not config.sim:
            warn(f"warning: {exc}; replies are counted without their template")
            return None, ReplyAccounting.build(loaded)
        raise UsageError(f"--chat-template {spec}: {exc}") from None
    return spec, accounting


def template_beside(loaded: LoadedTokenizer) -> bool:
    """True when a chat template sits beside the tokenizer file."""
    source = Path(loaded.source)
    if not source.is_file():
        return False
    if (source.parent / "chat_template.jinja").is_file():
        return True
    config = source.parent / "tokenizer_config.json"
    try:
        return config.is_file() and b'"chat_template"' in config.read_bytes()
    except OSError:
        return False


async def calibrate_or_note(
    config: RunConfig, synth: Synthesizer, replies: ReplyAccounting, out: RunOutput
) -> tuple[Calibration | None, str | None]:
    """Calibrate and print the result; (calibration, None), or, when a default calibration
    fails (not asked for with --calibrate, whose failure fails the run), (None, the one
    note line printed instead) and the run goes on uncalibrated."""
    url = config.endpoint_url
    assert url is not None  # validated: a live run has a target
    try:
        calibration = await calibrate_target(config, synth, replies)
    except CalibrationError as exc:
        if config.calibrate:
            raise
        if exc.no_usage:
            note = (
                f"note: {url} reports no usage.prompt_tokens; prompts are not calibrated "
                "(give --replay-*-overhead-tokens, or --no-calibrate to skip this check)"
            )
        else:
            note = (
                f"note: prompts are not calibrated ({exc}); the run learns the framing as it "
                "goes (give --replay-*-overhead-tokens, or --no-calibrate to skip this check)"
            )
        out.warning(note)
        return None, note
    for line in calibration.lines(url):
        if line.startswith("warning:"):
            out.warning(line)
        else:
            out.lines([line])
    return calibration, None


async def calibrate_ahead(config: RunConfig, out: RunOutput) -> RunConfig:
    """Calibrate once for runs to come (a --workers parent's, a capacity search's before
    its first step): ``config`` with the calibration (or the note of a failed one) preset,
    so that those runs send no probes of their own."""
    if not config.calibrates:
        return config
    assert config.tokenizer is not None  # a live run's target named it
    loaded = load_tokenizer(config.tokenizer, config.tokenizer_download or None)
    synth = Synthesizer.prepare(loaded)
    _template, replies = reply_accounting(config, loaded, out.warning)
    calibration, note = await calibrate_or_note(config, synth, replies, out)
    return replace(config, preset_calibration=calibration if calibration is not None else note)


async def calibrate_target(
    config: RunConfig, synth: Synthesizer, replies: ReplyAccounting
) -> Calibration:
    """Probe the target for its framing overheads."""
    url = config.endpoint_url
    assert url is not None  # validated: a live run has a target
    headers = probe_headers(config)
    async with aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=float(config.request_timeout_secs))
    ) as session:
        return await calibrate(
            session,
            url,
            headers,
            body_options(config),
            synth,
            replies,
            config.user_tagging,
        )


def probe_counts(
    config: RunConfig, layout: RankLayout | None, calibration: Calibration | None
) -> dict[str, int]:
    """The chat requests sent before the run, by what sent them: the preflight's 1-token
    completion, the rank-layout probes (one per rank), the calibration's probes."""
    return {
        "preflight": 1 if config.preflight else 0,
        "rank_layout": layout.probes if layout is not None else 0,
        "calibration": calibration.requests
        if calibration is not None and config.preset_calibration is None
        else 0,
    }


def content_salt(config: RunConfig) -> str:
    """--content-salt; else a random salt, except in a shard, whose salt comes from the
    seed every shard shares (shards of one run must send the bytes one run would)."""
    if config.content_salt is not None:
        return config.content_salt
    if config.shard is not None and config.seed is not None:
        return hashlib.sha256(f"batchbench-shard-salt:{config.seed}".encode()).hexdigest()[:16]
    return secrets.token_hex(8)


def admission_share(config: RunConfig, workload: Workload, root_seed: int) -> Share | None:
    """With --shard: the trajectories and slots this process owns (None: all of them)."""
    shard = config.shard_spec()
    if shard is None:
        return None
    if config.admission_mode == "open-loop":
        offsets = start_offsets(config, workload, root_seed)
        return open_loop_share(offsets, config.max_active_agents, shard)
    return closed_loop_share(len(workload), config.max_active_agents, shard)
