"""``batchbench-agent``: the run sequence of COMPAT §1.3, from arguments to reports."""

from __future__ import annotations

import asyncio
import gc
import os
import secrets
import shlex
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp

from batchbench.cli.agent_args import parse_agent_args, resolve_shape, shape_flags_given
from batchbench.config import RunConfig
from batchbench.errors import BatchbenchError, UsageError
from batchbench.plan.manifest import Manifest, hash_manifest, load_manifest
from batchbench.plan.workload import SampledShape, Workload, compile_manifest, compile_sampled
from batchbench.results.events import JsonlFile, LifecycleWriter
from batchbench.results.metrics import RunTotals
from batchbench.results.progress import Progress, progress_wanted
from batchbench.results.recording import Recorder
from batchbench.results.report import (
    CsvContext,
    LiveFigures,
    banner_lines,
    csv_row,
    dry_run_lines,
    live_lines,
    summary_document,
    summary_lines,
    write_csv,
    write_json,
)
from batchbench.run.calibrate import Calibration, calibrate
from batchbench.run.driver import (
    DriverSettings,
    Fidelity,
    HttpAgentBody,
    make_session,
    raise_open_file_limit,
)
from batchbench.run.dryrun import DryRunBody
from batchbench.run.engine import EngineResult, run_closed_loop, run_open_loop
from batchbench.run.oracle import PromptOracle, server_root
from batchbench.run.shutdown import Shutdown
from batchbench.run.simlaunch import SimProcess, sim_command
from batchbench.run.wire import (
    MISSING_USAGE,
    NO_STREAM_USAGE,
    BodyOptions,
    request_headers,
    tool_call_id,
)
from batchbench.text.chat_templates import load_chat_template
from batchbench.text.content import ContentFactory
from batchbench.text.framing import ContentContext, Framing, ReplyAccounting, content_contexts
from batchbench.text.synth import Synthesizer
from batchbench.text.tokenizer import LoadedTokenizer, load_tokenizer

SIM_DEFAULT_TOKENIZER = "deepseek-v3"
NO_USAGE_ERRORS = (MISSING_USAGE, NO_STREAM_USAGE)


def resolve_endpoint(host: str, endpoint: str) -> str:
    """COMPAT §2.2: scheme defaulting, trailing-slash trimming, full-URL endpoints."""
    if endpoint.startswith(("http://", "https://")):
        url = endpoint
    else:
        if not host.startswith(("http://", "https://")):
            host = "https://" + host
        url = host.rstrip("/") + "/" + endpoint.lstrip("/")
    try:
        parts = urlsplit(url)
        valid = parts.scheme in ("http", "https") and bool(parts.hostname)
        _ = parts.port  # raises ValueError for a port that is not a number in range
    except ValueError:
        valid = False
    if not valid:
        raise UsageError(f"invalid endpoint URL: {url}")
    return url


def runtime_checks(args) -> tuple[str | None, SampledShape]:
    """The runtime checks of COMPAT §2.8, in order; returns (manifest hash, shape)."""
    replay = args.agent_plans_jsonl is not None
    if replay and args.agents is not None:
        raise UsageError(
            "--agents cannot be combined with --agent-plans-jsonl; "
            "the manifest defines the total agent count"
        )
    if replay and shape_flags_given(args):
        raise UsageError(
            "synthetic workload-shape flags cannot be combined with --agent-plans-jsonl"
        )
    sha256 = hash_manifest(args.agent_plans_jsonl) if replay else None
    if args.agents == 0:
        raise UsageError("agents must be greater than zero")
    if args.request_timeout_secs == 0:
        raise UsageError("request-timeout-secs must be greater than zero")
    shape = resolve_shape(args)
    if not args.model:
        raise UsageError("model must not be empty")
    return sha256, shape


def load_plans(args, sha256: str | None) -> Manifest | None:
    """Parse the manifest (replay) so its errors come before anything slow; None when sampled."""
    if args.agent_plans_jsonl is None:
        return None
    return load_manifest(args.agent_plans_jsonl, sha256=sha256)


def build_workload(
    args,
    manifest: Manifest | None,
    shape: SampledShape,
    root_seed: int,
    overheads: tuple[int, int] = (0, 0),
) -> Workload:
    """Compile the plans; ``overheads`` are (initial, turn) framing tokens (replay only)."""
    if manifest is None:
        return compile_sampled(shape, args.agents or 1, root_seed)
    return compile_manifest(
        manifest,
        initial_overhead=overheads[0],
        turn_overhead=overheads[1],
        time_scale=args.time_scale or 1.0,
    )


def starting_overheads(args, calibration: Calibration | None) -> tuple[int, int]:
    """(initial, turn): explicit flags win, then calibration, then 0."""
    initial = args.replay_initial_overhead_tokens
    turn = args.replay_turn_overhead_tokens
    if initial is None:
        initial = calibration.initial if calibration is not None else 0
    if turn is None:
        turn = calibration.turn if calibration is not None else 0
    return initial, turn


def make_config(
    args,
    sha256: str | None,
    shape: SampledShape,
    workload: Workload,
    root_seed: int,
    extras: dict | None = None,
) -> RunConfig:
    return RunConfig(
        **(extras or {}),
        model=args.model,
        tokenizer_model=args.tokenizer_model or args.model,
        host=args.host,
        endpoint_url=resolve_endpoint(args.host, args.endpoint),
        workload_mode=workload.mode,
        agents=len(workload),
        root_seed=root_seed,
        seed_given=args.seed,
        max_active_requested=args.max_active_agents,
        admission=args.admission or "closed-loop",
        time_scale=args.time_scale or 1.0,
        manifest_path=args.agent_plans_jsonl,
        manifest_sha256=sha256,
        initial_overhead=args.replay_initial_overhead_tokens,
        turn_overhead=args.replay_turn_overhead_tokens,
        shape=shape,
        sglang=args.sglang,
        ignore_eos=args.ignore_eos,
        dp_ranks=args.dp_rank_perfect_routing_num if args.dp_rank_perfect_routing else None,
        user_tagging=not args.disable_user_tagging,
        dry_run=args.dry_run,
        results_csv=args.results_csv,
        agent_events_jsonl=args.agent_events_jsonl,
        latency_flags=(
            args.tool_call_latency_ms,
            args.tool_call_latency_lognorm_mu,
            args.tool_call_latency_lognorm_median_ms,
            args.tool_call_latency_lognorm_sigma,
            args.tool_call_latency_lognorm_max_ms,
        ),
        schema_version=workload.schema_version,
    )


def _event_loop_runner() -> asyncio.Runner:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency; keep running without it
        return asyncio.Runner()
    return asyncio.Runner(loop_factory=uvloop.new_event_loop)


def generation_workers() -> int:
    """Size of the text-generation pool: min(CPU count, 32) (COMPAT §4.7)."""
    return min(os.cpu_count() or 1, 32)


def execute_dry_run(
    config: RunConfig, workload: Workload, factory: ContentFactory, events: LifecycleWriter | None
) -> EngineResult:
    """Run admission with instant completion while generating every text."""
    workers = generation_workers()
    sink = events.write if events is not None else None
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="batchbench-text") as pool:
        body = DryRunBody(factory, workload, pool)
        with _event_loop_runner() as runner:
            if config.admission == "open-loop":
                offsets = [0.0] * len(workload)  # schema v1 has no start offsets
                return runner.run(run_open_loop(offsets, config.max_active_requested, body, sink))
            return runner.run(
                run_closed_loop(len(workload), config.max_active_requested, body, sink)
            )


def dry_run_totals(workload: Workload, result: EngineResult) -> RunTotals:
    """D13: no request counts as sent; completed agents report their end-to-end latency."""
    completed = [r for r in result.records if r.completed]
    return RunTotals(
        agents=len(workload),
        completed_agents=len(completed),
        planned_tool_invocations=workload.n_requests,
        agent_latencies_ms=[r.loop_seconds * 1000.0 for r in completed],
    )


def _write(lines) -> None:
    out = sys.stdout
    chunk: list[str] = []
    for line in lines:
        chunk.append(line)
        if len(chunk) >= 4096:
            out.write("\n".join(chunk) + "\n")
            chunk.clear()
    if chunk:
        out.write("\n".join(chunk) + "\n")


# Young-generation threshold during a live run: per-request objects are short-lived, and
# with thousands of agents the default (700) made full collections take ~45% of client CPU.
GC_THRESHOLDS = (50_000, 50, 100)


def quiet_garbage_collector() -> None:
    """Freeze what setup allocated (tokenizer, tables, workload) so collections skip it, and
    collect the young generation less often."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def api_key(args) -> str | None:
    """§2.2: --api-key, else the variable named by --api-key-env; empty means none."""
    key = args.api_key if args.api_key is not None else os.environ.get(args.api_key_env)
    return key or None


def driver_settings(args, config: RunConfig) -> DriverSettings:
    return DriverSettings(
        url=config.endpoint_url,
        body=BodyOptions(
            model=config.model,
            sglang=config.sglang,
            ignore_eos=config.ignore_eos,
            stream=args.stream,
        ),
        api_key=api_key(args),
        user_tagging=config.user_tagging,
        user_prefix=args.user_prefix,
        seed=args.seed,
        dp_ranks=config.dp_ranks,
        timeout_seconds=float(args.request_timeout_secs),
        max_retries=args.max_retries,
        retry_delay_ms=args.retry_delay_ms,
        verbose=args.verbose,
    )


@dataclass
class LiveRun:
    result: EngineResult
    recorder: Recorder
    interrupted_by: str | None
    exit_status: int
    framing: Framing


async def _drive(
    args,
    config: RunConfig,
    workload: Workload,
    factory: ContentFactory,
    pool,
    events,
    replies: ReplyAccounting,
) -> LiveRun:
    settings = driver_settings(args, config)
    recorder = Recorder(dp_ranks=config.dp_ranks)
    if args.request_events_jsonl:
        recorder.request_events = JsonlFile(args.request_events_jsonl)
    shutdown = Shutdown(args.grace_seconds)
    progress = Progress(len(workload), recorder) if progress_wanted(args.no_progress) else None
    background = [asyncio.ensure_future(recorder.sample_lag())]
    if progress is not None:
        background.append(asyncio.ensure_future(progress.refresh()))

    def sink(record) -> None:
        figures = recorder.take_agent(record.agent_id)
        if events is not None:
            events.write(record, figures.as_fields() if figures is not None else None)
        if progress is not None:
            progress.trajectory_finished()

    max_connections = (
        config.effective_max_active
        if config.admission == "closed-loop"
        else config.max_active_requested
    )
    warning = raise_open_file_limit(max_connections or len(workload))
    if warning:
        print(warning, file=sys.stderr)
    session = make_session(settings, max_connections)
    try:
        fidelity = Fidelity(
            Framing(
                config.framing_initial,
                config.framing_turn,
                learn=config.prompt_correction,
                measured=config.framing_measured,
            ),
            replies if config.prompt_correction else None,
        )
        if config.prompt_oracle == "server":
            oracle = PromptOracle(
                session, server_root(settings.url), request_headers(settings.api_key, None, None)
            )
            await oracle.detect()
            fidelity = replace(fidelity, oracle=oracle)
        body = HttpAgentBody(
            settings, workload, factory, pool, session, recorder, shutdown, fidelity
        )
        shutdown.install()  # after the oracle's detection, which Ctrl+C interrupts as usual
        if config.admission == "open-loop":
            offsets = [0.0] * len(workload)  # schema v1 has no start offsets
            run = run_open_loop(offsets, config.max_active_requested, body, sink, shutdown)
        else:
            run = run_closed_loop(len(workload), config.max_active_requested, body, sink, shutdown)
        result = await run
        recorder.stop_clock()
    finally:
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        await session.close()
        shutdown.uninstall()
        if progress is not None:
            progress.close()
        if recorder.request_events is not None:
            recorder.request_events.close()
    return LiveRun(
        result,
        recorder,
        shutdown.signal_name,
        shutdown.exit_status if shutdown.stopped else 0,
        body.fidelity.framing,
    )


def live_totals(workload: Workload, live: LiveRun) -> RunTotals:
    totals = live.recorder.totals
    completed = [r for r in live.result.records if r.completed]
    totals.agents = len(workload)
    totals.completed_agents = len(completed)
    totals.planned_tool_invocations = workload.n_requests
    totals.agent_latencies_ms = [r.loop_seconds * 1000.0 for r in completed]
    return totals


def _start_sim(args):
    """--sim: the simulator child, with the tokenizer both sides share."""
    if not args.sim:
        return None
    tokenizer = args.tokenizer_model or SIM_DEFAULT_TOKENIZER
    args.tokenizer_model = tokenizer
    extra = args.sim_args or ""
    if args.chat_template is not None:
        extra = f"--chat-template {shlex.quote(args.chat_template)} {extra}"
    sim = SimProcess(sim_command(tokenizer, args.sim_dp_ranks, extra or None))
    sim.start()
    args.host = sim.url
    return sim


def main(argv: Sequence[str] | None = None, prog: str = "batchbench-agent") -> int:
    """Run the benchmark; raises BatchbenchError (UsageError for argument errors).

    Returns 0, or 130/143 after an interruption (D6, D9).
    """
    args = parse_agent_args(sys.argv[1:] if argv is None else argv, prog=prog)
    if args is None:  # --help or --version was printed
        return 0
    started = datetime.now(UTC).isoformat(timespec="seconds")
    sha256, shape = runtime_checks(args)
    root_seed = args.seed if args.seed is not None else secrets.randbits(64)
    manifest = load_plans(args, sha256)
    workload = None
    if not args.calibrate:  # plans are built before the tokenizer loads (COMPAT §1.3)
        workload = build_workload(args, manifest, shape, root_seed, starting_overheads(args, None))
    sim = _start_sim(args)
    try:
        return _run(args, sha256, shape, manifest, workload, root_seed, started)
    finally:
        if sim is not None:
            sim.stop()


def sim_chat_template(args) -> str:
    """The template the --sim child renders with: --chat-template, else one given in
    --sim-args, else the simulator's default (chatml)."""
    if args.chat_template is not None:
        return args.chat_template
    words = shlex.split(args.sim_args or "")
    for index, word in enumerate(words):
        if word == "--chat-template" and index + 1 < len(words):
            return words[index + 1]
        if word.startswith("--chat-template="):
            return word.split("=", 1)[1]
    return "chatml"


def reply_context_template(
    args, loaded: LoadedTokenizer
) -> tuple[str | None, dict[str, ContentContext] | None]:
    """The server's chat template when the client can know it, and the template text around
    each part of a message in it (None when unknown: replies are counted on their own)."""
    spec = args.chat_template
    if args.sim:
        spec = sim_chat_template(args)
    if spec is None:
        if not template_beside(loaded):
            return None, None
        spec = "tokenizer"
    try:
        template = load_chat_template(spec, loaded)
        contexts = content_contexts(template, tool_call_id(0, 1))
    except BatchbenchError as exc:
        if args.chat_template is None and not args.sim:
            print(f"warning: {exc}; replies are counted without their template", file=sys.stderr)
            return None, None
        raise UsageError(f"--chat-template {spec}: {exc}") from None
    return spec, contexts


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


def run_calibration(args, loaded: LoadedTokenizer, synth: Synthesizer, replies) -> Calibration:
    """--calibrate: probe the target before the run."""
    url = resolve_endpoint(args.host, args.endpoint)
    options = BodyOptions(
        model=args.model, sglang=args.sglang, ignore_eos=args.ignore_eos, stream=args.stream
    )
    headers = request_headers(api_key(args), None, None)

    async def probe() -> Calibration:
        async with aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=float(args.request_timeout_secs))
        ) as session:
            return await calibrate(
                session, url, headers, options, synth, replies, not args.disable_user_tagging
            )

    with _event_loop_runner() as runner:
        return runner.run(probe())


def _run(
    args,
    sha256,
    shape,
    manifest: Manifest | None,
    workload: Workload | None,
    root_seed: int,
    started: str,
) -> int:
    loaded = load_tokenizer(args.tokenizer_model or args.model)
    synth = Synthesizer.prepare(loaded)
    template_name, contexts = reply_context_template(args, loaded)
    replies = ReplyAccounting.build(loaded, contexts)
    calibration = None
    if args.calibrate:
        calibration = run_calibration(args, loaded, synth, replies)
        for line in calibration.lines(resolve_endpoint(args.host, args.endpoint)):
            print(line, file=sys.stderr if line.startswith("warning:") else sys.stdout)
    overheads = starting_overheads(args, calibration)
    if workload is None:
        workload = build_workload(args, manifest, shape, root_seed, overheads)
    salt = args.content_salt if args.content_salt is not None else secrets.token_hex(8)
    config = make_config(
        args,
        sha256,
        shape,
        workload,
        root_seed,
        extras={
            "content_salt": salt,
            "prompt_correction": args.prompt_correction,
            "prompt_oracle": args.prompt_oracle,
            "chat_template": template_name,
            "calibration": calibration.as_dict() if calibration is not None else None,
            "framing_initial": overheads[0],
            "framing_turn": overheads[1],
            "framing_measured": calibration is not None
            or args.replay_initial_overhead_tokens is not None
            or args.replay_turn_overhead_tokens is not None,
        },
    )
    if calibration is not None and config.workload_mode == "trajectory_replay":
        config.initial_overhead, config.turn_overhead = overheads
    config.tokenizer_source = loaded.source
    _write(banner_lines(config))
    sys.stdout.flush()
    factory = ContentFactory(synth, workload, root_seed, salt)
    events = (
        LifecycleWriter(config.agent_events_jsonl, config.dp_ranks, workload.trajectory_ids)
        if config.agent_events_jsonl
        else None
    )
    live: LiveRun | None = None
    try:
        if config.dry_run:
            result = execute_dry_run(config, workload, factory, events)
        else:
            quiet_garbage_collector()
            with (
                ThreadPoolExecutor(
                    max_workers=generation_workers(), thread_name_prefix="batchbench-text"
                ) as pool,
                _event_loop_runner() as runner,
            ):
                try:
                    live = runner.run(
                        _drive(args, config, workload, factory, pool, events, replies)
                    )
                finally:
                    # Texts prepared ahead for turns that will never run are not waited for.
                    pool.shutdown(wait=False, cancel_futures=True)
            result = live.result
    finally:
        if events is not None:
            events.close()
    if live is None:
        totals = dry_run_totals(workload, result)
        figures = None
        _write(dry_run_lines(workload, result))
    else:
        totals = live_totals(workload, live)
        recorder = live.recorder
        figures = LiveFigures(
            stream=recorder.stream,
            server_cached_tokens=recorder.server_cached_tokens,
            ranks=recorder.ranks,
            health=recorder.health(),
            interrupted_by=live.interrupted_by,
            streaming=args.stream,
            fidelity=recorder.fidelity,
            framing=live.framing.learned() if config.prompt_correction else None,
            no_usage_failures=sum(
                1 for failure in totals.failures if failure[3] in NO_USAGE_ERRORS
            ),
        )
    _write(summary_lines(totals, result, figures))
    if figures is not None:
        _write(live_lines(figures))
    ctx = CsvContext(
        timestamp=started, interrupted=live is not None and bool(live.interrupted_by), live=figures
    )
    if config.agent_events_jsonl:
        print(f"Wrote agent lifecycle events to {config.agent_events_jsonl}")
    if args.request_events_jsonl and live is not None:
        print(f"Wrote request events to {args.request_events_jsonl}")
    if config.results_csv:
        write_csv(config.results_csv, csv_row(config, totals, result, ctx))
        print(f"Wrote agent benchmark summary to {config.results_csv}")
    if args.results_json:
        write_json(args.results_json, summary_document(config, totals, result, ctx))
        print(f"Wrote agent benchmark JSON summary to {args.results_json}")
    sys.stdout.flush()
    return live.exit_status if live is not None else 0


def run_console(argv: Sequence[str] | None, prog: str) -> int:
    """Exit-status contract of D9: 0 ok, 1 runtime error, 2 usage error, 130 interrupted."""
    try:
        return main(argv, prog=prog)
    except UsageError as exc:
        sys.stdout.flush()
        print(f"Error: {exc}", file=sys.stderr)
        return 2
    except BatchbenchError as exc:
        sys.stdout.flush()
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # a file or socket problem not wrapped above: still one line
        sys.stdout.flush()
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("Error: interrupted", file=sys.stderr)
        return 130


def console_main() -> None:
    sys.exit(run_console(None, "batchbench-agent"))
