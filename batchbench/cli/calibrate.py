"""``batchbench calibrate``: measure a server's framing overheads and print the flags."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import orjson

from batchbench.cli.agent_args import add_chat_template_flag, add_target_flags
from batchbench.cli.argtypes import CommandParser, positive_finite
from batchbench.config import RunConfig, api_key_from
from batchbench.errors import BatchbenchError, UsageError
from batchbench.stages.hosting import event_loop_runner
from batchbench.stages.prepare import calibrate_target, reply_accounting
from batchbench.stages.target import check_target, start_sim
from batchbench.text.synth import Synthesizer
from batchbench.text.tokenizer import load_tokenizer

DESCRIPTION = """\
Send a few probe conversations built exactly as batchbench-agent builds its requests (a
user message, then assistant replies carrying the synthetic `environment` tool call and
tool results; the same token fields, ignore_eos and streaming; max_tokens 1) and solve the
chat template's framing from usage.prompt_tokens: the initial overhead (first or reset
request) and the per-turn overhead. Prints both, the flags that use them, and a check: a
conversation of one user message and four turns, every prompt predicted and compared
with what the server counted. `batchbench-agent --calibrate` does the same before a run."""


def build_parser(prog: str) -> CommandParser:
    parser = CommandParser(
        prog=prog,
        allow_abbrev=False,
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_target_flags(parser.add_argument_group("target and model"))
    probes = parser.add_argument_group("probes (as in batchbench-agent)")
    probes.add_argument("--sglang", action="store_true", help="send max_new_tokens/min_new_tokens")
    probes.add_argument("--ignore-eos", action="store_true", help='add "ignore_eos": true')
    probes.add_argument("--stream", action="store_true", help="stream the probe replies")
    probes.add_argument(
        "--disable-user-tagging", action="store_true", help="send no user field in the probes"
    )
    probes.add_argument(
        "--request-timeout-secs",
        type=positive_finite,
        default=60,
        metavar="S",
        help="timeout of one probe request (default: %(default)s)",
    )
    add_chat_template_flag(probes)
    out = parser.add_argument_group("output")
    out.add_argument("--json", action="store_true", help="print the result as one JSON object")
    sim = parser.add_argument_group("embedded simulator")
    sim.add_argument(
        "--sim", action="store_true", help="calibrate against a `batchbench sim` started here"
    )
    sim.add_argument("--sim-args", metavar="ARGS", help="more `batchbench sim` options")
    return parser


def run(argv: Sequence[str], prog: str = "batchbench calibrate") -> int:
    """0 after printing the calibration; 1 when the server cannot be calibrated; 2 on misuse."""
    try:
        try:
            args = build_parser(prog).parse_args(list(argv))
        except SystemExit as exc:
            return 0 if exc.code in (0, None) else 2
        if args.sim_args is not None and not args.sim:
            raise UsageError("--sim-args requires --sim")
        return _calibrate(probe_config(args), args.json)
    except UsageError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 2
    except BatchbenchError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("Error: interrupted", file=sys.stderr)
        return 130


def probe_config(args: argparse.Namespace) -> RunConfig:
    """The probes' settings, as a run configuration (the options mean what they mean in
    batchbench-agent)."""
    return RunConfig(
        model=args.model,
        host=args.host,
        endpoint=args.endpoint,
        api_key=api_key_from(args.api_key, args.api_key_env),
        api_key_env=args.api_key_env,
        tokenizer_model=args.tokenizer_model,
        sglang=args.sglang,
        ignore_eos=args.ignore_eos,
        stream=args.stream,
        user_tagging=not args.disable_user_tagging,
        request_timeout_secs=args.request_timeout_secs,
        chat_template=args.chat_template,
        sim=args.sim,
        sim_args=args.sim_args,
    )


class _StderrNotes:
    def lines(self, lines) -> None:
        for line in lines:
            print(line)

    def warning(self, text: str) -> None:
        print(text, file=sys.stderr)


def _calibrate(config: RunConfig, as_json: bool) -> int:
    sim = None
    if config.sim:
        sim, config = start_sim(config)
    try:
        config.check()
        if config.model is None:  # the one model the server lists
            with event_loop_runner() as runner:
                config = runner.run(check_target(config, _StderrNotes()))
        url, tokenizer = config.endpoint_url, config.tokenizer
        assert url is not None  # checked: a live target
        assert tokenizer is not None  # the model's, which the server named if not given
        loaded = load_tokenizer(tokenizer)
        synth = Synthesizer.prepare(loaded)
        template, replies = reply_accounting(
            config, loaded, lambda text: print(text, file=sys.stderr)
        )
        with event_loop_runner() as runner:
            calibration = runner.run(calibrate_target(config, synth, replies))
    finally:
        if sim is not None:
            sim.stop()
    if as_json:
        document = {"endpoint": url, "chat_template": template, **calibration.as_dict()}
        sys.stdout.write(orjson.dumps(document).decode() + "\n")
        return 0
    for line in calibration.lines(url):
        print(line, file=sys.stderr if line.startswith("warning:") else sys.stdout)
    return 0
