"""Command line of ``batchbench-agent``: the parser and checks of ``batchbench.options.agent``
applied to ``RunConfig``, whose fields declare every option."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any

from batchbench.config import RunConfig
from batchbench.options import agent
from batchbench.options.agent import version_text
from batchbench.options.parser import CommandParser
from batchbench.options.shape import SHAPE_FLAGS

__all__ = [
    "build_parser",
    "check_companions",
    "config_from_argv",
    "config_from_namespace",
    "parse_agent_args",
    "shape_dests",
    "version_text",
]


def build_parser(
    prog: str = "batchbench-agent",
    *,
    command: str = "agent",
    description: str | None = None,
    epilog: str | None = None,
    own: tuple[str, Callable[[Any], None]] | None = None,
) -> CommandParser:
    """Every option of ``command`` (see ``batchbench.options.agent.build_parser``)."""
    return agent.build_parser(
        RunConfig, prog, command=command, description=description, epilog=epilog, own=own
    )


def parse_agent_args(
    argv: Sequence[str], prog: str = "batchbench-agent"
) -> argparse.Namespace | None:
    """Parsed and companion-checked arguments; None after --help or --version printed."""
    return agent.parse_agent_args(RunConfig, argv, prog)


def check_companions(args: argparse.Namespace) -> None:
    agent.check_companions(args, RunConfig)


def config_from_namespace(args: argparse.Namespace) -> RunConfig:
    config: RunConfig = agent.config_from_namespace(RunConfig, args)
    return config


def config_from_argv(argv: Sequence[str], prog: str = "batchbench-agent") -> RunConfig | None:
    """The frozen run configuration of a command line; None after --help or --version."""
    config: RunConfig | None = agent.config_from_argv(RunConfig, argv, prog)
    return config


def shape_dests() -> list[str]:
    """Namespace destinations of the 25 sampled-shape flags."""
    return [flag.dest for flag in SHAPE_FLAGS]
