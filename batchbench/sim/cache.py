"""A rank's KV prefix cache: an LRU of prompt prefixes, sized in tokens, hit in blocks.

A prompt arrives as prefix points ``(key, end)``: the key identifies the first ``end``
tokens (equal keys mean equal token prefixes). A request is credited with the longest
leading run of its points already cached, rounded down to whole blocks and never the whole
prompt (a server always computes at least the last token, as vLLM does). Then all its
points are stored. Points are touched from the longest to the shortest, so a prefix is
always more recently used than its extensions and eviction removes tails first, the way a
paged KV cache frees a sequence's last blocks first.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


class PrefixCache:
    """LRU of prefix points; ``capacity_tokens`` bounds the tokens held (0 disables it)."""

    __slots__ = (
        "_entries",
        "block_tokens",
        "capacity_tokens",
        "evicted_tokens",
        "reserved_tokens",
        "used_tokens",
    )

    def __init__(self, capacity_tokens: int, block_tokens: int) -> None:
        if block_tokens <= 0:
            raise ValueError("block_tokens must be positive")
        self.capacity_tokens = max(0, capacity_tokens)
        self.block_tokens = block_tokens
        self._entries: OrderedDict[int, int] = OrderedDict()  # key -> tokens it adds
        self.used_tokens = 0
        self.evicted_tokens = 0
        self.reserved_tokens = 0  # KV held by running sequences, not available to the LRU

    def reserve(self, tokens: int) -> None:
        """Set how much of the capacity running sequences hold; evicts to make room."""
        self.reserved_tokens = max(0, tokens)
        self._evict()

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, points: Sequence[tuple[int, int]]) -> int:
        """Cached tokens for a prompt with these points (the cache is not changed)."""
        if not points or self.capacity_tokens == 0:
            return 0
        entries = self._entries
        hit_end = 0
        for key, end in points:
            if key not in entries:
                break
            hit_end = end
        prompt = points[-1][1]
        block = self.block_tokens
        cached = min(hit_end, prompt - 1) // block * block if prompt > 0 else 0
        return max(cached, 0)

    def store(self, points: Sequence[tuple[int, int]]) -> None:
        """Cache a prompt's prefixes (once its prefill has computed them)."""
        if not points or self.capacity_tokens == 0:
            return
        entries = self._entries
        for index in range(len(points) - 1, -1, -1):
            key, end = points[index]
            size = end - (points[index - 1][1] if index else 0)
            if key in entries:
                entries.move_to_end(key)
            else:
                entries[key] = size
                self.used_tokens += size
        self._evict()

    def _evict(self) -> None:
        entries = self._entries
        limit = max(0, self.capacity_tokens - self.reserved_tokens)
        while self.used_tokens > limit and entries:
            _, size = entries.popitem(last=False)
            self.used_tokens -= size
            self.evicted_tokens += size
