"""``batchbench calibrate``: measure a server's framing overheads and print the flags."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import orjson

from batchbench.cli.exits import exit_status
from batchbench.config import RunConfig
from batchbench.errors import UsageError
from batchbench.options.declare import add_run_options, field_values
from batchbench.options.parser import CommandParser, parse_or_help
from batchbench.options.sections import CALIBRATE_SIM, PROBES, TARGET
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
    """The target and the probes' options as batchbench-agent declares them (see
    ``RunConfig``), and --json."""
    parser = CommandParser(
        prog=prog, description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_run_options(parser, RunConfig, "calibrate", groups=(TARGET, PROBES))
    out = parser.add_argument_group("output")
    out.add_argument("--json", action="store_true", help="print the result as one JSON object")
    add_run_options(parser, RunConfig, "calibrate", groups=(CALIBRATE_SIM,))
    return parser


def run(argv: Sequence[str], prog: str = "batchbench calibrate") -> int:
    """0 after printing the calibration; 1 when the server cannot be calibrated; 2 on misuse."""
    return exit_status(lambda: _run(argv, prog))


def _run(argv: Sequence[str], prog: str) -> int:
    args = parse_or_help(build_parser(prog), argv)
    if args is None:  # --help printed
        return 0
    if args.sim_args is not None and not args.sim:
        raise UsageError("--sim-args requires --sim")
    return _calibrate(probe_config(args), args.json)


def probe_config(args: argparse.Namespace) -> RunConfig:
    """The probes' settings, as a run configuration (the options mean what they mean in
    batchbench-agent)."""
    return RunConfig(**field_values(RunConfig, args))


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
        loaded = load_tokenizer(tokenizer, config.tokenizer_download or None)
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
