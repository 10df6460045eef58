"""How every renderer spells numbers, durations, percentages and a missing value: the
console summary, the CSV, the capacity table and the HTML report all format through here,
so one figure reads the same wherever it is shown.

A missing figure (None, absent, not a number, not finite) is ``MISSING`` (``n/a``) on the
console, in the capacity table and in the HTML report. The CSV alone writes an empty cell
(``csv_cell``), because users' scripts read it and the compatibility specification fixes
it; the functions take the spelling as ``missing``.
"""

from __future__ import annotations

import math
from typing import Any

MISSING = "n/a"


def finite(value: Any) -> float | None:
    """A finite float of a number, else None (bools are not numbers here)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def flag(value: bool) -> str:
    """A boolean as the console and the CSV write it: ``true`` or ``false``."""
    return "true" if value else "false"


def fixed(value: Any, digits: int = 2, unit: str = "", missing: str = MISSING) -> str:
    """Fixed-point with ``digits`` decimals and an optional unit: ``12.34``, ``0.80ms``."""
    number = finite(value)
    return missing if number is None else f"{number:.{digits}f}{unit}"


def percent(value: Any, missing: str = MISSING) -> str:
    """A percentage already scaled to 0..100, one decimal: ``41.2%``."""
    number = finite(value)
    return missing if number is None else f"{number:.1f}%"


def ratio_percent(value: Any, missing: str = MISSING) -> str:
    """A ratio in 0..1 shown as a percentage: ``0.9167`` -> ``91.7%``."""
    number = finite(value)
    return missing if number is None else percent(number * 100.0)


def latency(ms: Any, missing: str = MISSING) -> str:
    """A latency with three significant digits in its natural unit: ``130 ms``, ``1.83 s``."""
    number = finite(ms)
    if number is None:
        return missing
    if abs(number) >= 999.5:
        seconds = number / 1000.0
        return f"{seconds:.3g} s" if abs(seconds) < 999.5 else f"{seconds:.0f} s"
    return f"{number:.3g} ms"


def measured_latency(ms: float) -> str:
    """A measured latency at a readable precision: ``2.57 s``, ``102.5 ms``, ``850 us``."""
    if ms >= 1000.0:
        return f"{ms / 1000.0:.2f} s"
    if ms >= 1.0:
        return f"{ms:.1f} ms"
    return f"{ms * 1000.0:.0f} us"


def number(value: Any) -> str:
    """About four significant digits (the HTML report's tables): integers exactly with
    thousands separators; floats whole from 10,000 up, with one decimal from 100 up, two
    from 1 up, three significant digits below 1; booleans as ``yes``/``no``."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if not isinstance(value, float) or not math.isfinite(value):
        return MISSING
    magnitude = abs(value)
    if magnitude >= 10_000:
        return f"{value:,.0f}"
    if magnitude >= 100:
        return f"{value:,.1f}"
    if magnitude >= 1 or value == 0:
        return f"{value:.2f}"
    return f"{value:.3g}"


def csv_cell(value: Any) -> str:
    """One CSV cell: empty when missing, ``true``/``false``, floats in their shortest
    round-tripping form."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return flag(value)
    if isinstance(value, float):
        return repr(value)
    return str(value)


def rank_order(label: str) -> tuple[int, int, str]:
    """Sort key of a data-parallel rank label: numbered ranks in numeric order, then any
    other label by name."""
    return (0, int(label), label) if label.isdigit() else (1, 0, label)
