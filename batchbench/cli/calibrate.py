"""``batchbench calibrate``: measure a server's framing overheads and print the flags."""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence

import orjson

from batchbench.cli.agent import (
    SIM_DEFAULT_TOKENIZER,
    reply_context_template,
    resolve_endpoint,
    run_calibration,
)
from batchbench.cli.agent_args import (
    AgentArgumentParser,
    _positive_uint,
    add_chat_template_flag,
    add_target_flags,
)
from batchbench.errors import BatchbenchError, UsageError
from batchbench.run.simlaunch import SimProcess, sim_command
from batchbench.text.framing import ReplyAccounting
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


def build_parser(prog: str) -> AgentArgumentParser:
    parser = AgentArgumentParser(
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
        type=_positive_uint,
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
        args.sim_dp_ranks = None
        return _calibrate(args)
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


def _calibrate(args) -> int:
    sim = None
    if args.sim:
        args.tokenizer_model = args.tokenizer_model or SIM_DEFAULT_TOKENIZER
        extra = args.sim_args or ""
        if args.chat_template is not None:
            extra = f"--chat-template {shlex.quote(args.chat_template)} {extra}"
        sim = SimProcess(sim_command(args.tokenizer_model, None, extra or None))
        sim.start()
        args.host = sim.url
    try:
        if not args.model:
            raise UsageError("model must not be empty")
        url = resolve_endpoint(args.host, args.endpoint)
        loaded = load_tokenizer(args.tokenizer_model or args.model)
        synth = Synthesizer.prepare(loaded)
        template, contexts = reply_context_template(args, loaded)
        replies = ReplyAccounting.build(loaded, contexts)
        calibration = run_calibration(args, loaded, synth, replies)
    finally:
        if sim is not None:
            sim.stop()
    if args.json:
        document = {"endpoint": url, "chat_template": template, **calibration.as_dict()}
        sys.stdout.write(orjson.dumps(document).decode() + "\n")
        return 0
    for line in calibration.lines(url):
        print(line, file=sys.stderr if line.startswith("warning:") else sys.stdout)
    return 0
