"""The 25 sampled-shape options (four size families and the tool-call latency), declared
once: their flags, and the sampled shape a set of them describes."""

from __future__ import annotations

from typing import NamedTuple

from batchbench.options.declare import Flag
from batchbench.options.sections import SHAPE
from batchbench.options.values import number, uint
from batchbench.plan.sampling import FamilyFlags, resolve_latency_spec, resolve_size_spec
from batchbench.plan.workload import SampledShape


class SizeFamily(NamedTuple):
    """A sampled size: its label in messages, the option names of a fixed size and the
    prefixes of the log-normal options (main spelling first, then aliases), its default."""

    label: str
    fixed: tuple[str, ...]
    lognorm: tuple[str, ...]
    default: int


SIZE_FAMILIES = (
    SizeFamily("input", ("input-tokens", "initial-prompt-tokens"),
               ("input-lognorm", "initial-prompt-lognorm"), 128),
    SizeFamily("output", ("output-tokens", "model-response-tokens"),
               ("output-lognorm", "model-response-lognorm"), 64),
    SizeFamily("environment", ("environment-tokens", "environment-response-tokens"),
               ("environment-lognorm", "environment-response-lognorm"), 64),
    SizeFamily("tool-invocations", ("tool-invocations",), ("tool-invocations-lognorm",), 4),
)  # fmt: skip
LOGNORMAL_PARTS = (
    ("mu", number, "mu of ln(size)"),
    ("median", number, "median size (mu = ln(median))"),
    ("sigma", number, "sigma of ln(size); required for log-normal"),
    ("max", uint, "cap on each sample"),
)
LATENCY_FLAGS = (
    Flag(
        "tool-call-latency-ms",
        "fixed sleep after each successful response, ms (default: 0 = disabled)",
        SHAPE,
        parse=uint,
        aliases=("--tool-latency-ms",),
        metavar="MS",
    ),
    Flag(
        "tool-call-latency-lognorm-mu",
        "log-normal latency: mu of ln(ms)",
        SHAPE,
        parse=number,
        metavar="X",
    ),
    Flag(
        "tool-call-latency-lognorm-median-ms",
        "log-normal latency: median in ms",
        SHAPE,
        parse=number,
        aliases=("--tool-call-latency-lognorm-median",),
        metavar="MS",
    ),
    Flag(
        "tool-call-latency-lognorm-sigma",
        "log-normal latency: sigma (required)",
        SHAPE,
        parse=number,
        metavar="X",
    ),
    Flag(
        "tool-call-latency-lognorm-max-ms",
        "log-normal latency: cap in ms",
        SHAPE,
        parse=uint,
        aliases=("--tool-call-latency-lognorm-max",),
        metavar="MS",
    ),
)


def _size_flags(family: SizeFamily) -> list[Flag]:
    unit = "invocations" if family.label == "tool-invocations" else "tokens"
    flags = [
        Flag(
            family.fixed[0],
            f"fixed {family.label} size in {unit} (default: fixed {family.default})",
            SHAPE,
            parse=uint,
            aliases=tuple(f"--{name}" for name in family.fixed[1:]),
            metavar="N",
        )
    ]
    for suffix, parse, what in LOGNORMAL_PARTS:
        flags.append(
            Flag(
                f"{family.lognorm[0]}-{suffix}",
                f"log-normal {family.label}: {what}",
                SHAPE,
                parse=parse,
                aliases=tuple(f"--{prefix}-{suffix}" for prefix in family.lognorm[1:]),
                metavar="X",
            )
        )
    return flags


# The 25 sampled-shape options in command-line order: four size families, the tool latency.
SHAPE_FLAGS = (*(flag for family in SIZE_FAMILIES for flag in _size_flags(family)), *LATENCY_FLAGS)


# Each shape option's keyword in Python (its name with underscores; aliases too) -> its name.
SHAPE_KEYWORDS = {
    option.lstrip("-").replace("-", "_"): flag.name
    for flag in SHAPE_FLAGS
    for option in flag.option_strings
}
_ORDER = {flag.name: index for index, flag in enumerate(SHAPE_FLAGS)}


def in_flag_order(
    pairs: tuple[tuple[str, float | int], ...],
) -> tuple[tuple[str, float | int], ...]:
    """Shape options (name, value) in command-line order, as a command line gives them;
    names that are no shape option follow in their own order (the checks name them)."""
    return tuple(sorted(pairs, key=lambda pair: _ORDER.get(pair[0], len(_ORDER))))


def shape_option_names() -> list[str]:
    """The 25 sampled-shape options by their main names, in command-line order."""
    return [flag.name for flag in SHAPE_FLAGS]


def resolve_shape(options: dict[str, float | int]) -> SampledShape:
    """The four size families and the tool latency from the given shape options (missing
    ones take their defaults: fixed 128/64/64 tokens, 4 invocations, no latency)."""
    specs = {}
    for family in SIZE_FAMILIES:
        prefix = family.lognorm[0]
        # fixed and cap are whole numbers from the parser (uint); _check_values lets any
        # number through for a config built in Python.
        flags = FamilyFlags(
            fixed=options.get(family.fixed[0]),  # type: ignore[arg-type]
            mu=options.get(f"{prefix}-mu"),
            median=options.get(f"{prefix}-median"),
            sigma=options.get(f"{prefix}-sigma"),
            cap=options.get(f"{prefix}-max"),  # type: ignore[arg-type]
        )
        specs[family.label] = resolve_size_spec(family.label, flags, family.default)
    # fixed and cap as above
    latency_flags = FamilyFlags(*(options.get(flag.name) for flag in LATENCY_FLAGS))  # type: ignore[arg-type]
    latency = resolve_latency_spec(latency_flags)
    return SampledShape(
        input=specs["input"],
        output=specs["output"],
        environment=specs["environment"],
        tool_invocations=specs["tool-invocations"],
        latency=latency,
    )
