"""The one mapping from how a command ended to its exit status, with its one ``Error:`` line
on stderr: 2 for a usage error, 1 for a runtime error (a file or socket problem included),
the error's own ``exit_status`` when it reports an interruption (130 / 143), and 130 for
Ctrl+C."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from batchbench.errors import BatchbenchError, UsageError
from batchbench.options.parser import CommandParser, parse_or_help
from batchbench.secrets import redact


def exit_status(command: Callable[[], int], *, resume_note: str | None = None) -> int:
    """Run ``command`` and return its status, or the status of the error that ended it.
    ``resume_note`` follows the message of an interruption (what was kept, how to go on)."""
    after = f"; {resume_note}" if resume_note else ""
    try:
        return command()
    except UsageError as exc:
        return _error(str(exc), 2)
    except BatchbenchError as exc:
        status = getattr(exc, "exit_status", None)
        if isinstance(status, int):  # an interruption the command reports itself
            return _error(f"{exc}{after}", status)
        return _error(str(exc), 1)
    except OSError as exc:  # a file or socket problem not wrapped above: still one line
        return _error(redact(str(exc)), 1)
    except KeyboardInterrupt:
        print(f"Error: interrupted{after}", file=sys.stderr)
        return 130


def _error(message: str, status: int) -> int:
    sys.stdout.flush()  # what was printed before comes first
    print(f"Error: {message}", file=sys.stderr)
    return status


def parsed_or_status(parser: CommandParser, argv: Sequence[str]) -> argparse.Namespace | int:
    """A small command's arguments, or the exit status to return instead: 0 after --help,
    2 after a usage error (its message printed as one ``Error:`` line)."""
    try:
        args = parse_or_help(parser, argv)
    except UsageError as exc:
        return _error(str(exc), 2)
    return 0 if args is None else args
