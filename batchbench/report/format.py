"""What only the HTML report needs on top of ``batchbench.results.formatting`` (where its
numbers, percentages and missing-value spelling come from): escaped text and safe lookups
in documents that earlier versions may have written without a field."""

from __future__ import annotations

import html
from typing import Any

import orjson

from batchbench.results.formatting import MISSING


def text(value: Any) -> str:
    """Any document value as escaped HTML text: strings as they are, other values as JSON."""
    if value is None:
        return MISSING
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
