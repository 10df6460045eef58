"""The one argparse parser class of every command, and the reading of a TOML options file
(``--config``) into a parser's defaults."""

from __future__ import annotations

import argparse
import difflib
import re
import shlex
import sys
import tomllib
from collections.abc import Sequence
from typing import Any, NoReturn

from batchbench.errors import UsageError

_UNRECOGNIZED = re.compile(r"unrecognized arguments: (.*)")
_ALIASED = re.compile(r"argument (-[^ :/]+(?:/-[^ :/]+)+):")
_NO_VALUE = re.compile(r"argument ([^ :/]+)(?:/[^ :]+)?: expected one argument")
# options whose value is another program's command line (options starting with -)
COMMAND_LINE_VALUES = {"--sim-args": "the simulator's"}


class SingleValue(argparse.Action):
    """An option that takes one value and may be given once: argparse's own ``store``
    keeps the last of repeated values and drops the others without a word, which turned a
    second ``--server-metrics URL`` into one silently unscraped endpoint."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        given: set[str] = getattr(parser, "given_options", set())
        spelled: dict[str, str] = getattr(parser, "given_spellings", {})
        name = option_string or self.dest
        if self.dest in given:
            first = spelled.get(self.dest)
            if first is not None and first != name:  # an alias: both spellings are one option
                raise UsageError(
                    f"{name} given twice (as {first} and {name}, the same option): it takes "
                    "one value, so give it once"
                )
            raise UsageError(f"{name} given twice: it takes one value, so give it once")
        given.add(self.dest)
        spelled[self.dest] = name
        setattr(namespace, self.dest, values)


class Repeated(argparse.Action):
    """A repeatable option: every value given, in order (argparse's ``append``, as a class
    of this module so that the options file can tell a repeatable option by it)."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        items = list(getattr(namespace, self.dest, None) or [])
        items.append(values)
        setattr(namespace, self.dest, items)


def _single_value(kwargs: dict[str, Any], args: tuple[Any, ...]) -> dict[str, Any]:
    """``kwargs`` with SingleValue for an option that stores one value (argparse's default
    ``store`` action without ``nargs``) and Repeated for ``append``; positionals and other
    actions as declared."""
    is_option = bool(args) and isinstance(args[0], str) and args[0].startswith("-")
    if is_option and kwargs.get("action", "store") == "store" and "nargs" not in kwargs:
        return {**kwargs, "action": SingleValue}
    if is_option and kwargs.get("action") == "append":
        return {**kwargs, "action": Repeated}
    return kwargs


class CommandParser(argparse.ArgumentParser):
    """argparse that raises UsageError (one line, exit status 2, a suggestion for a
    misspelled option) instead of printing usage and exiting, and that keeps the actions it
    was given, so the options can be looked up without argparse's private attributes. A
    command that wants argparse's own form (usage line, then ``prog: error: ...``) calls
    ``exit_with_usage``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.declared_actions: list[argparse.Action] = []  # before argparse adds --help
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        action = super().add_argument(*args, **_single_value(kwargs, args))
        self.declared_actions.append(action)
        return action

    def add_argument_group(self, *args: Any, **kwargs: Any) -> Any:
        group = super().add_argument_group(*args, **kwargs)
        add = group.add_argument

        def add_and_keep(*args: Any, **kwargs: Any) -> argparse.Action:
            action = add(*args, **_single_value(kwargs, args))
            self.declared_actions.append(action)
            return action

        group.add_argument = add_and_keep  # type: ignore[method-assign]
        return group

    def action_for(self, option_string: str) -> argparse.Action | None:
        for action in self.declared_actions:
            if option_string in action.option_strings:
                return action
        return None

    def long_options(self) -> list[str]:
        return [o for a in self.declared_actions for o in a.option_strings if o.startswith("--")]

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        self.words = list(sys.argv[1:] if args is None else args)  # for error()'s hints
        self.given_options: set[str] = set()  # SingleValue's record of this parse
        self.given_spellings: dict[str, str] = {}  # ... and how each was spelled
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> NoReturn:
        message = as_typed(getattr(self, "words", []), message)
        raise UsageError(quoting_hint(self, suggestion(self, message)))

    def exit_with_usage(self, message: str) -> NoReturn:
        """argparse's usage error: the usage line and ``prog: error: message``, status 2."""
        super().error(message)


def suggestion(parser: CommandParser, message: str) -> str:
    """``message`` with `` (did you mean --x?)`` for each unknown option close to a known one."""
    match = _UNRECOGNIZED.match(message)
    if match is None:
        return message
    known = parser.long_options()
    hints = []
    for word in match.group(1).split():
        if not word.startswith("--"):
            continue
        name = word.split("=", 1)[0]
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.75)
        if close:
            hints.append((name, close[0]))
    if not hints:
        return message
    if len(hints) == 1:
        return f"{message} (did you mean {hints[0][1]}?)"
    listed = ", ".join(f"{close} for {name}" for name, close in hints)
    return f"{message} (did you mean {listed}?)"


def as_typed(words: Sequence[str], message: str) -> str:
    """argparse names an option with aliases by all its spellings (``argument
    --max-active-agents/--concurrency: ...``): name it as the command line spelled it (the
    first spelling when it used several)."""
    match = _ALIASED.match(message)
    if match is None:
        return message
    spellings = match.group(1).split("/")
    typed = [s for s in spellings if any(w == s or w.startswith(s + "=") for w in words)]
    name = typed[0] if len(typed) == 1 else spellings[0]
    return f"argument {name}:{message[match.end() :]}"


def quoting_hint(parser: CommandParser, message: str) -> str:
    """``message`` with how to quote the value of an option that takes another program's
    options (``--sim-args --max-batch 4`` left them unquoted: argparse took them for its
    own and gave --sim-args no value)."""
    match = _NO_VALUE.match(message)
    if match is None or match.group(1) not in COMMAND_LINE_VALUES:
        return message
    option = match.group(1)
    words = getattr(parser, "words", [])
    given = [i for i, word in enumerate(words) if word == option]
    known = set(parser.long_options()) | {"-h", "-v"}
    following: list[str] = []
    for word in words[given[-1] + 1 :] if given else []:
        if word.split("=", 1)[0] in known or word == "--":
            break
        following.append(word)
    whose = COMMAND_LINE_VALUES[option]
    if len(following) == 1:  # one word: quotes do not help, argparse needs the = form
        return f"{message}: give {whose} option with =, as in {option}={following[0]}"
    example = shlex.join(following) if following else "--max-batch 4"
    return f'{message}: quote {whose} options as one value, as in {option} "{example}"'


def parse_or_help(parser: CommandParser, argv: Sequence[str]) -> argparse.Namespace | None:
    """The parsed arguments; None after ``--help`` or ``--version`` printed (a usage error
    raises UsageError)."""
    try:
        return parser.parse_args(list(argv))
    except SystemExit as exc:
        if exc.code in (0, None):
            return None
        raise


def parse_with_config(parser: CommandParser, argv: Sequence[str]) -> argparse.Namespace | None:
    """Parse with the --config file's values as defaults; None after ``--help`` or
    ``--version`` printed (a usage error raises as the parser does)."""
    argv = list(argv)
    path = config_file_argument(argv)
    if path is None or {"-h", "--help", "--version"} & set(argv):
        return parse_or_help(parser, argv)
    defaults = toml_defaults(parser, path)
    overridden = _opposites_given(parser, argv, defaults)
    parser.set_defaults(
        **{dest: value for dest, value in defaults.items() if dest not in overridden}
    )
    return parse_or_help(parser, argv)


def _opposites_given(
    parser: CommandParser, argv: list[str], defaults: dict[str, object]
) -> set[str]:
    """The file's switches whose opposite the command line gives (``stream = true`` in the
    file, ``--no-stream`` here; ``no-calibrate = true`` there, ``--calibrate`` here): the
    command line wins, as it does for every other option, instead of the two contradicting."""
    given = {word.split("=", 1)[0] for word in argv if word.startswith("--")}
    overridden = set()
    for flag in given:
        name = flag[2:]
        opposite = name[3:] if name.startswith("no-") else f"no-{name}"
        action = parser.action_for(f"--{opposite}")
        mine = parser.action_for(flag)
        if action is None or mine is None or action.nargs != 0 or mine.nargs != 0:
            continue
        if action.dest in defaults and action.dest != mine.dest:
            overridden.add(action.dest)
    return overridden


def config_file_argument(argv: list[str]) -> str | None:
    """The value of --config, read before the real parse (given twice: a UsageError)."""
    path = None
    for index, word in enumerate(argv):
        if word == "--":
            break
        if path is not None and (word == "--config" or word.startswith("--config=")):
            raise UsageError("--config given twice: it takes one value, so give it once")
        if word == "--config":
            if index + 1 >= len(argv):
                raise UsageError("argument --config: expected one argument")
            path = argv[index + 1]
        elif word.startswith("--config="):
            path = word.split("=", 1)[1]
    return path


def toml_defaults(parser: CommandParser, path: str) -> dict[str, object]:
    """The file's options as parser defaults; every value goes through the option's own
    type check, so a file accepts exactly what the command line accepts."""
    try:
        with open(path, "rb") as handle:
            document = tomllib.load(handle)
    except OSError as exc:
        raise UsageError(f"--config {path}: {exc.strerror or exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"--config {path}: invalid TOML: {exc}") from None
    defaults: dict[str, object] = {}
    for name, value in document.items():
        action = parser.action_for(f"--{name}")
        if name in ("config", "help", "version"):
            raise UsageError(f'{path}: "{name}" cannot be set in an options file')
        if action is None:
            hint = suggestion(parser, f"unrecognized arguments: --{name}")
            hint = hint.split("(", 1)[1].rstrip(")") if "(" in hint else ""
            raise UsageError(f'{path}: unknown option "{name}"' + (f" ({hint})" if hint else ""))
        defaults[action.dest] = _toml_option(path, name, action, value)
    return defaults


def _toml_option(path: str, name: str, action: argparse.Action, value: object) -> object:
    if isinstance(action, Repeated):  # a repeatable option: one or a list
        items = value if isinstance(value, list) else [value]
        return [_toml_scalar(path, name, action, item) for item in items]
    return _toml_scalar(path, name, action, value)


def _toml_scalar(path: str, name: str, action: argparse.Action, value: object) -> object:
    if action.nargs == 0:  # a switch (store_true): the file says whether it is on
        if not isinstance(value, bool):
            raise UsageError(f"{path}: {name}: expected true or false")
        return value
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise UsageError(f"{path}: {name}: expected a string or a number")
    text = repr(value) if isinstance(value, float) else str(value)
    if action.type is None:
        converted: object = text
    else:
        assert not isinstance(action.type, str)  # these parsers name no registered types
        try:
            converted = action.type(text)
        except (argparse.ArgumentTypeError, ValueError) as exc:
            raise UsageError(f"{path}: {name}: {exc}") from None
    if action.choices is not None and converted not in action.choices:
        choices = ", ".join(map(str, action.choices))
        raise UsageError(f"{path}: {name}: invalid choice {text!r} (choose from {choices})")
    return converted
