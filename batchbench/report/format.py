"""Number and text formatting shared by the report's tables and charts, so one figure reads
the same everywhere (the tests compare table cells with these functions applied to the
JSON's values)."""

from __future__ import annotations

import html
import math
from typing import Any

import orjson

DASH = "–"  # a figure the document does not have (null, absent or not a number)


def number(value: Any) -> str:
    """About four significant digits: integers exactly with thousands separators; floats
    whole from 10,000 up, with one decimal from 100 up, two from 1 up, three significant
    digits below 1."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if not isinstance(value, float) or not math.isfinite(value):
        return DASH
    magnitude = abs(value)
    if magnitude >= 10_000:
        return f"{value:,.0f}"
    if magnitude >= 100:
        return f"{value:,.1f}"
    if magnitude >= 1 or value == 0:
        return f"{value:.2f}"
    return f"{value:.3g}"


def percent(value: Any) -> str:
    """A percentage already scaled to 0..100, one decimal: ``41.2%``."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return DASH
    return f"{value:.1f}%"


def ratio_percent(value: Any) -> str:
    """A ratio in 0..1 shown as a percentage: ``0.9167`` -> ``91.7%``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return DASH
    return percent(value * 100.0)


def text(value: Any) -> str:
    """Any document value as escaped HTML text: strings as they are, other values as JSON."""
    if value is None:
        return DASH
    if isinstance(value, str):
        return html.escape(value)
    return html.escape(orjson.dumps(value).decode())


def get(document: Any, *keys: str | int) -> Any:
    """``document[k1][k2]...``, or None where a level is absent or not a container."""
    for key in keys:
        if isinstance(document, dict):
            document = document.get(key)
        elif (
            isinstance(document, list)
            and isinstance(key, int)
            and -len(document) <= key < len(document)
        ):
            document = document[key]
        else:
            return None
    return document


def finite(value: Any) -> float | None:
    """A finite float of a JSON number, else None (bools are not numbers here)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    return value if math.isfinite(value) else None
