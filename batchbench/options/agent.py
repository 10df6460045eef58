"""The command line of ``batchbench run`` (also ``batchbench agent``, ``batchbench-agent``):
its parser, the parse-time checks, and the configuration a parsed command line makes. Every
function takes the configuration class whose fields declare the options (``RunConfig``), so
this module does not import it and ``RunConfig.from_args`` can use it."""

from __future__ import annotations

import argparse
import textwrap
from collections.abc import Callable, Sequence
from typing import Any

from batchbench import __version__
from batchbench.errors import UsageError
from batchbench.options.declare import add_run_options, field_values
from batchbench.options.parser import CommandParser, parse_with_config

DESCRIPTION = (
    "Replay agent trajectories (or sampled agents) against an OpenAI-compatible "
    "/v1/chat/completions server. Every prompt and tool result is synthetic text that "
    "re-encodes to exactly the planned token count."
)
EPILOG = (
    "exit statuses: 0 every planned request succeeded (or the failures stayed within "
    "--max-failure-rate); 3 the run finished but more requests failed than that "
    "allows (outputs written, the last line says so); 1 a runtime error; 2 a usage "
    "error; 130 / 143 interrupted by SIGINT / SIGTERM (outputs written).",
    "Replay does not reproduce the original text, the model's real replies or "
    "content-dependent effects; compare the live usage.prompt_tokens with the plan "
    "before accepting a capacity result.",
)
CONFIG_HELP = (
    "read options from a TOML file (`name = value`, names as the long options without "
    "dashes, e.g. `max-active-agents = 8`); options given on the command line override it "
    "(a switch set true in the file stays on); relative paths are taken from the working "
    "directory. Runs that write --results-json or --results-csv write their resolved "
    "options beside them as <name>.config.toml, which --config reads back"
)


def paragraphs(*texts: str) -> str:
    """Help text paragraphs wrapped to the terminal's usual width."""
    return "\n\n".join(textwrap.fill(text, 88, break_on_hyphens=False) for text in texts)


def version_text() -> str:
    from batchbench._impl import active_implementation  # lazy: asked only for --version

    return f"batchbench {__version__} ({active_implementation()})"


def build_parser(
    cls: type,
    prog: str = "batchbench-agent",
    *,
    command: str = "agent",
    description: str | None = None,
    epilog: str | None = None,
    own: tuple[str, Callable[[Any], None]] | None = None,
) -> CommandParser:
    """The parser of a command that takes the run options, then --config and --version.
    ``own`` is the command's own section: its title, shown before the run options, and a
    function that adds its options to it (after the others, so that the usage line lists
    them last). Defaults are None where "not given" must stay visible."""
    parser = CommandParser(
        prog=prog,
        description=paragraphs(DESCRIPTION) if description is None else description,
        epilog=paragraphs(*EPILOG) if epilog is None else epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    section = parser.add_argument_group(own[0]) if own is not None else None
    add_run_options(parser, cls, command)
    parser.add_argument("--config", metavar="FILE", help=CONFIG_HELP)
    parser.add_argument("--version", action="version", version=version_text())
    if own is not None:
        own[1](section)
    return parser


def check_companions(args: argparse.Namespace, cls: type) -> None:
    """Flags that need another flag, or exclude one: checked right after parsing, on the
    configuration the arguments make (before its other checks)."""
    unchecked = cls(**field_values(cls, args))
    pair = (args.dp_rank_perfect_routing, args.dp_rank_perfect_routing_num)
    unchecked.check_combinations(routing_pair=pair)


def parse_agent_args(
    cls: type, argv: Sequence[str], prog: str = "batchbench-agent"
) -> argparse.Namespace | None:
    """Parse (with the --config file's values as defaults) and run the parse-time checks;
    raises UsageError (exit 2). Returns None after ``--help`` or ``--version`` printed."""
    args = parse_with_config(build_parser(cls, prog), argv)
    if args is not None:
        check_companions(args, cls)
    return args


def config_from_namespace(cls: type, args: argparse.Namespace) -> Any:
    """The configuration of arguments whose companions were checked (``parse_agent_args``);
    runs the remaining checks."""
    config = cls(**field_values(cls, args))
    config.check(combinations=False)
    if config.shard is not None and config.results_json is None:
        raise UsageError(
            f"--shard {config.shard} needs --results-json: `batchbench merge` reads every "
            "shard's results JSON (and the raw data saved beside it)"
        )
    config.mark_checked()  # the run does not check it again
    return config


def config_from_argv(cls: type, argv: Sequence[str], prog: str = "batchbench-agent") -> Any:
    """The frozen run configuration of a command line; None after --help or --version."""
    args = parse_agent_args(cls, argv, prog)
    if args is None:
        return None
    return config_from_namespace(cls, args)
