"""A perfect prefix cache: infinite, token-exact, never evicting. It bounds what any real
server's prefix cache can reuse of a workload, so the workload description reports it.

Prompts are sequences of block identities (see ``describe``). The cache is a trie of the
prefixes served so far, stored as one dict of edges ``(parent node, identity) -> child
node`` (node 0 is the empty prefix): serving a prompt walks it once, so the whole workload
costs one dict lookup or insertion per block reference, and equal prefixes are compared
exactly (no hash of a prefix that could collide).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence


class PrefixCache:
    """The prefixes of every prompt served, and of every reply a prompt was answered with."""

    def __init__(self) -> None:
        self._edges: dict[tuple[int, Hashable], int] = {}

    def serve(self, identities: Sequence[Hashable], tokens: Sequence[int]) -> tuple[int, int]:
        """Serve a prompt: (tokens of its longest cached prefix, the node of the whole
        prompt). Every prefix of the prompt is cached afterwards."""
        edges = self._edges
        node = hit = i = 0
        n = len(identities)
        while i < n:
            child = edges.get((node, identities[i]))
            if child is None:
                break
            node = child
            hit += tokens[i]
            i += 1
        while i < n:
            child = len(edges) + 1  # every node but the root has exactly one parent edge
            edges[(node, identities[i])] = child
            node = child
            i += 1
        return hit, node

    def extend(self, node: int, identity: Hashable) -> None:
        """Cache the prefix ``node`` followed by one more block (a prompt's reply)."""
        self._edges.setdefault((node, identity), len(self._edges) + 1)
