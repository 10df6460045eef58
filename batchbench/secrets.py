"""Keeps the run's API key out of everything the run prints or stores.

A server may echo the key in an error text (``Incorrect API key provided: Bearer sk-…``),
and error texts are printed, stored in events and results, and shown in reports. The key
is remembered when the run resolves it, and every error text passes through ``redact``
before it is kept: errors of attempts, fatal errors and warnings.
"""

from __future__ import annotations

MASK = "***"
_keys: set[str] = set()


def remember(key: str | None) -> None:
    """A key this process sends: from now on it never appears in a redacted text."""
    if key:
        _keys.add(key)


def redact(text: str) -> str:
    """``text`` with every remembered key (and so its ``Bearer`` form) replaced by ***."""
    for key in _keys:
        if key in text:
            text = text.replace(key, MASK)
    return text
