"""Hash blocks that always occur together, collapsed into one manifest block.

Traces hash prompts in small blocks (Mooncake 512 tokens, WEKA 64): written one manifest
block per id, a long prompt becomes thousands of blocks the client assembles per request.
Consecutive ids a and b form one unit when every a is followed by b and every b is
preceded by a (and they have the same role): no request can then contain one without the
other, so collapsing loses no sharing and every request still sends the same bytes for
the same ids. A request's last id (a partial block) ends its unit.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

_END = "\x00end"  # what follows a chain's last id
_START = "\x00start"  # what precedes a chain's first id
_MANY = "\x00many"


class Units:
    """The unit boundaries of a set of id chains: ``split(chain)`` gives a chain's units as
    (start, stop) positions."""

    def __init__(self, chains: Iterable[tuple[str, ...]], roles: dict[str, str]) -> None:
        after: dict[str, str] = {}
        before: dict[str, str] = {}
        for chain in chains:
            previous = _START
            for value in chain:
                _note(after, previous, value)
                _note(before, value, previous)
                previous = value
            _note(after, previous, _END)
        self._joins = {
            value: following
            for value, following in after.items()
            if following not in (_END, _MANY)
            and before.get(following) == value
            and roles.get(value) == roles.get(following)
        }

    def joins(self, value: str, following: str) -> bool:
        """Whether ``following`` continues the unit of ``value``."""
        return self._joins.get(value) == following

    def split(self, chain: Sequence[str]) -> list[tuple[int, int]]:
        spans = []
        start = 0
        for position in range(1, len(chain) + 1):
            if position == len(chain) or not self.joins(chain[position - 1], chain[position]):
                spans.append((start, position))
                start = position
        return spans


def _note(table: dict[str, str], key: str, value: str) -> None:
    seen = table.get(key)
    if seen is None:
        table[key] = value
    elif seen != value:
        table[key] = _MANY
