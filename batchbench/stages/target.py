"""Stage 2, the target: start the simulator (``--sim``) and check the server (preflight);
the configuration as run names the server's URL and the model it serves."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, replace

import aiohttp

from batchbench.config import RunConfig, host_ends_in_v1
from batchbench.drive.preflight import MODEL_CHOSEN_NOTE, preflight
from batchbench.drive.rankcheck import RankLayout, probe_ranks
from batchbench.drive.simlaunch import SimProcess
from batchbench.drive.wire import BodyOptions, request_headers
from batchbench.errors import UsageError
from batchbench.options.simulator import check_sim_command
from batchbench.stages.console import RunOutput
from batchbench.stages.hosting import BlockingCall

SIM_METRICS = "sim"  # --server-metrics sim: the embedded simulator's /metrics


@dataclass(frozen=True)
class Target:
    """The configuration as run, and the simulator child serving it (stop it at the end)."""

    config: RunConfig
    sim: SimProcess | None = None
    layout: RankLayout | None = None  # the rank -> worker probes (perfect routing)


async def resolve_target(config: RunConfig, out: RunOutput, call: BlockingCall) -> Target:
    """Start the simulator when asked and check a live target. On failure nothing is left
    running; on success the caller stops ``Target.sim``."""
    sim = sim_process(config) if config.sim else None
    layout = None
    try:
        if sim is not None:
            await call(sim.start)
            config = targeting_sim(config, sim)
        if not config.dry_run:
            config = await check_target(config, out)
            layout = await check_rank_layout(config)
            for note in layout.notes if layout is not None else ():
                out.warning(note)
    except BaseException:
        if sim is not None:
            sim.stop()  # also ends a start still running in its thread
        raise
    return Target(config, sim, layout)


def start_sim(config: RunConfig) -> tuple[SimProcess, RunConfig]:
    """Start the simulator child (sharing the tokenizer); the config that targets it."""
    sim = sim_process(config)
    sim.start()
    return sim, targeting_sim(config, sim)


def targeting_sim(config: RunConfig, sim: SimProcess) -> RunConfig:
    """The config of a run against the started simulator: its URL as host (and as the
    metrics endpoint with --server-metrics sim)."""
    metrics = tuple(f"{sim.url}/metrics" if u == SIM_METRICS else u for u in config.server_metrics)
    return replace(config, host=sim.url, tokenizer_model=config.tokenizer, server_metrics=metrics)


def sim_process(config: RunConfig) -> SimProcess:
    """The simulator child of ``--sim``, not started yet."""
    command = config.sim_child_command()
    if config.sim_args:
        check_sim_command(command)  # a mistake in it: one line, before anything starts
    return SimProcess(command)


def sim_chat_template(config: RunConfig) -> str:
    """The template the simulator child renders with: --chat-template, else one given in
    --sim-args, else the simulator's default (chatml)."""
    if config.chat_template is not None:
        return config.chat_template
    words = shlex.split(config.sim_args or "")
    for index, word in enumerate(words):
        if word == "--chat-template" and index + 1 < len(words):
            return words[index + 1]
        if word.startswith("--chat-template="):
            return word.split("=", 1)[1]
    return "chatml"


async def check_target(config: RunConfig, out: RunOutput) -> RunConfig:
    """The preflight check (unless turned off); the config with the model it found."""
    if host_ends_in_v1(config.host, config.endpoint):
        out.warning(
            f"note: --host ends in /v1 (an SDK base_url); requests go to {config.endpoint_url}"
        )
    if not config.preflight:
        if config.model is None:
            raise UsageError("give --model: with --no-preflight the server is not asked")
        return config
    url = config.endpoint_url
    assert url is not None  # validated: a live run has a target
    headers = probe_headers(config)
    key_source = "--api-key" if config.api_key is not None else f"${config.api_key_env}"
    async with aiohttp.ClientSession() as session:
        found = await preflight(
            session, url, headers, config.model, body_options(config), key_source
        )
    for note in found.notes:
        if config.sim and note.startswith(MODEL_CHOSEN_NOTE):
            continue  # the embedded simulator serves one known model: nothing to note
        out.warning(note)
    return config if found.model == config.model else replace(config, model=found.model)


async def check_rank_layout(config: RunConfig) -> RankLayout | None:
    """With perfect routing and the preflight on: one probe per rank index (after
    ``check_target``, so the model is known); None otherwise."""
    if config.dp_ranks is None or not config.preflight:
        return None
    url = config.endpoint_url
    assert url is not None and config.model is not None  # checked by check_target
    async with aiohttp.ClientSession() as session:
        return await probe_ranks(
            session,
            url,
            config.resolved_api_key(),
            config.dp_ranks,
            config.dp_rank_header,
            config.routed_worker_header,
            config.model,
            body_options(config),
        )


def probe_headers(config: RunConfig) -> dict[str, str]:
    """The headers of the preflight's and the calibration's probes: with perfect routing,
    rank 0's rank header, so that they land on a known worker (the rank-0 worker's cache
    and counters then account for them)."""
    rank = 0 if config.dp_ranks is not None else None
    return request_headers(config.resolved_api_key(), None, rank, config.dp_rank_header)


def body_options(config: RunConfig) -> BodyOptions:
    """The request-body settings every request of the run shares."""
    return BodyOptions(
        model=config.model or "",
        sglang=config.sglang,
        ignore_eos=config.ignore_eos,
        stream=config.stream,
    )
