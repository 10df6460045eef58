"""The declaration of run options, and everything derived from it.

Each option is declared once, as the metadata of the ``RunConfig`` field it sets
(``option(default, Flag(...))``): the field gives its name in Python, its type and its
default; the ``Flag`` gives its command-line name (also its TOML key and its key in the
resolved-options file), aliases, value checker, help, ``--help`` group, the commands that
take it, and whether it names an output file. The parsers of ``batchbench-agent``,
``batchbench capacity`` and ``batchbench calibrate``, the reading of a parsed command line
(or TOML file) into a ``RunConfig``, and ``RunConfig.options()`` are all computed here from
those fields, so a new option is one new field.

Why field metadata rather than a separate table or a pydantic model: the frozen dataclass
stays the one typed description of a run that the rest of the package (and mypy) reads, and
the metadata sits beside the very field it describes, so the two cannot drift apart; a
pydantic model would add a dependency and a second notion of validation beside the checks
the command line must keep word for word. A field may carry several flags when the command
line spells one setting with several (``--dp-rank-perfect-routing`` with its ``-num``, the 25
sampled-shape flags); its ``read`` and ``write`` functions then say how the flags' values
make the field's value and back.

Nothing here imports the configuration: the functions take the configuration class, which
is what lets a test build a class with one more option and see it everywhere.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

METADATA_KEY = "batchbench.option"
RUN_COMMANDS = ("agent", "capacity")  # the commands that take (nearly) every run option


@dataclass(frozen=True)
class Group:
    """A ``--help`` section. ``order`` pins the listed options first, in that order (the
    order ``--help`` has always shown); the others follow in field order."""

    title: str
    order: tuple[str, ...] = ()


@dataclass(frozen=True)
class Variant:
    """How one command shows an option differently (``calibrate`` speaks of probes)."""

    help: str | None = None
    parse: Callable[[str], Any] | None = None
    group: Group | None = None


@dataclass(frozen=True)
class Flag:
    """One command-line option. ``name`` (without dashes) is also its key in a TOML options
    file and in ``RunConfig.options()``."""

    name: str
    help: str
    group: Group
    parse: Callable[[str], Any] | None = None  # the value checker; None: the text itself
    switch: bool = False  # takes no value
    negates: bool = False  # a switch that turns its field off (--no-preflight)
    aliases: tuple[str, ...] = ()  # further option strings, dashes included
    choices: tuple[str, ...] | None = None
    metavar: str | None = None
    commands: tuple[str, ...] = RUN_COMMANDS
    variants: tuple[tuple[str, Variant], ...] = ()  # (command, how it differs there)
    output: bool = False  # names a file the run writes
    repeat: bool = False  # may be given again: the field holds every value, in order

    @property
    def dest(self) -> str:
        return self.name.replace("-", "_")

    @property
    def option_strings(self) -> tuple[str, ...]:
        return (f"--{self.name}", *self.aliases)

    def variant(self, command: str) -> Variant:
        return dict(self.variants).get(command, Variant())


@dataclass(frozen=True)
class FieldOption:
    """The flags of one field; ``read`` makes the field's value from a parsed namespace and
    ``write`` turns it back into options by name (defaults: the one flag's value)."""

    flags: tuple[Flag, ...]
    read: Callable[[argparse.Namespace], Any] | None = None
    write: Callable[[Any], dict[str, object]] | None = None


def option(
    default: Any,
    *flags: Flag,
    read: Callable[[argparse.Namespace], Any] | None = None,
    write: Callable[[Any], dict[str, object]] | None = None,
) -> Any:
    """A dataclass field with its default, declared as the option(s) ``flags``."""
    spec = FieldOption(flags, read, write)
    return dataclasses.field(default=default, metadata={METADATA_KEY: spec})


def declared(cls: type) -> Iterator[tuple[dataclasses.Field[Any], FieldOption]]:
    """The option fields of a configuration class, in field order."""
    for spec in dataclasses.fields(cls):
        if METADATA_KEY in spec.metadata:
            yield spec, spec.metadata[METADATA_KEY]


def all_flags(cls: type) -> list[Flag]:
    return [flag for _field, spec in declared(cls) for flag in spec.flags]


# -- argparse -----------------------------------------------------------------------------
def add_run_options(
    parser: argparse.ArgumentParser,
    cls: type,
    command: str,
    groups: Sequence[Group] | None = None,
) -> None:
    """Add the options ``command`` takes, section by section: ``groups`` in that order, or
    every section of ``cls.OPTION_GROUPS`` (then any other) that holds one of them."""
    entries: list[tuple[Group, int, Flag, Variant, Any]] = []
    for spec_field, spec in declared(cls):
        for flag in spec.flags:
            if command not in flag.commands:
                continue
            variant = flag.variant(command)
            group = variant.group or flag.group
            default = _parser_default(spec_field, spec, flag)
            rank = group.order.index(flag.name) if flag.name in group.order else len(group.order)
            entries.append((group, rank, flag, variant, default))
    chosen: list[Group] = list(getattr(cls, "OPTION_GROUPS", ()) if groups is None else groups)
    if groups is None:
        for group, *_ in entries:
            if group not in chosen:
                chosen.append(group)
    for group in chosen:
        members = sorted((e for e in entries if e[0] == group), key=lambda e: e[1])
        if not members:
            continue
        section = parser.add_argument_group(group.title)
        for _group, _rank, flag, variant, default in members:
            _add_flag(section, flag, variant, default)


def _parser_default(spec_field: dataclasses.Field[Any], spec: FieldOption, flag: Flag) -> Any:
    """A field's only switch is off unless given; a field's only flag defaults to the
    field's default (shown by ``%(default)s``); the flags of a many-flag field (switches
    too: an options file may set one false) to "not given" (None)."""
    if len(spec.flags) > 1:
        return None
    return False if flag.switch else spec_field.default


def _add_flag(section: Any, flag: Flag, variant: Variant, default: Any) -> None:
    help_text = variant.help or flag.help
    if flag.switch:
        section.add_argument(
            *flag.option_strings,
            dest=flag.dest,
            action="store_true",
            default=default,
            help=help_text,
        )
        return
    if flag.repeat:  # argparse's append; its field's default is the empty tuple
        section.add_argument(
            *flag.option_strings,
            dest=flag.dest,
            action="append",
            type=variant.parse or flag.parse,
            default=None,
            choices=flag.choices,
            metavar=flag.metavar,
            help=help_text,
        )
        return
    section.add_argument(
        *flag.option_strings,
        dest=flag.dest,
        type=variant.parse or flag.parse,
        default=default,
        choices=flag.choices,
        metavar=flag.metavar,
        help=help_text,
    )


# -- reading and writing --------------------------------------------------------------------
def field_values(cls: type, args: argparse.Namespace) -> dict[str, Any]:
    """Keyword arguments of ``cls`` from a parsed command line: every field whose flags the
    command took (the others keep their defaults)."""
    values: dict[str, Any] = {}
    for spec_field, spec in declared(cls):
        if not all(hasattr(args, flag.dest) for flag in spec.flags):
            continue
        if spec.read is not None:
            values[spec_field.name] = spec.read(args)
        else:
            (flag,) = spec.flags
            value = getattr(args, flag.dest)
            if flag.repeat:
                value = tuple(value or ())
            values[spec_field.name] = (not value) if flag.negates else value
    return values


def option_values(config: object) -> dict[str, object]:
    """Every option of ``config`` by name, in field order; options without a value (None,
    or a repeatable option never given) are left out."""
    values: dict[str, object] = {}
    for spec_field, spec in declared(type(config)):
        value = getattr(config, spec_field.name)
        if spec.write is not None:
            values.update(spec.write(value))
        else:
            (flag,) = spec.flags
            values[flag.name] = (not value) if flag.negates else value
    return {name: value for name, value in values.items() if value is not None and value != ()}


def output_fields(cls: type) -> list[tuple[str, str]]:
    """(option name, field name) of every option that names a file the run writes."""
    return [
        (flag.name, spec_field.name)
        for spec_field, spec in declared(cls)
        for flag in spec.flags
        if flag.output
    ]


def closest(name: str, known: Iterable[str]) -> str | None:
    """The known name a misspelled one most likely meant: the same name spelled with
    dashes for underscores (or the other way round, or in other case), else the closest
    by ``difflib``; None when none is close."""
    candidates = list(known)
    plain = {_plain(candidate): candidate for candidate in candidates}
    if _plain(name) in plain:
        return plain[_plain(name)]
    import difflib  # lazy: only a misspelled name needs it

    close = difflib.get_close_matches(name, candidates, n=1, cutoff=0.75)
    return close[0] if close else None


def _plain(name: str) -> str:
    return name.replace("-", "_").lower()
