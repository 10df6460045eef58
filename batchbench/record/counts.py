"""Token counts of blocks, cached by content so a growing conversation encodes only what
is new: an agent resends its whole history on every turn, and encoding it again each
time would cost the proxy more than the request's own forwarding."""

from __future__ import annotations

import asyncio
import hashlib
from collections import OrderedDict
from collections.abc import Sequence

from batchbench.record.blocks import Block
from batchbench.text.tokenizer import LoadedTokenizer

CACHE_ENTRIES = 200_000  # about 25 MB of digests and counts
OFF_LOOP_CHARS = 16_384  # new text above this is encoded on a worker thread


class BlockCounter:
    """Counts of blocks' texts (no special tokens added), from a bounded LRU cache keyed
    by a digest of the text; ``encoded`` is the number of blocks actually encoded."""

    def __init__(self, tokenizer: LoadedTokenizer, entries: int = CACHE_ENTRIES) -> None:
        self.tokenizer = tokenizer.tokenizer
        self.entries = entries
        self.cache: OrderedDict[bytes, int] = OrderedDict()
        self.encoded = 0

    async def counts(self, blocks: Sequence[Block]) -> list[int]:
        """Each block's count. New texts are encoded in one batch, on a worker thread
        when they are large (the tokenizer releases the GIL) so other streams go on."""
        digests = [
            hashlib.blake2b(block.text.encode("utf-8"), digest_size=16).digest() for block in blocks
        ]
        found: dict[bytes, int] = {}
        missing: dict[bytes, str] = {}
        for digest, block in zip(digests, blocks, strict=True):
            count = self.cache.get(digest)
            if count is None:
                missing[digest] = block.text
            else:
                self.cache.move_to_end(digest)
                found[digest] = count
        if missing:
            texts = list(missing.values())
            if sum(map(len, texts)) > OFF_LOOP_CHARS:
                loop = asyncio.get_running_loop()
                counted = await loop.run_in_executor(None, self._encode, texts)
            else:
                counted = self._encode(texts)
            self.encoded += len(texts)
            for digest, count in zip(missing, counted, strict=True):
                found[digest] = count
                self._remember(digest, count)
        return [found[digest] for digest in digests]

    def _encode(self, texts: list[str]) -> list[int]:
        encodings = self.tokenizer.encode_batch(texts, add_special_tokens=False)
        return [len(encoding.ids) for encoding in encodings]

    def _remember(self, digest: bytes, count: int) -> None:
        self.cache[digest] = count
        self.cache.move_to_end(digest)
        while len(self.cache) > self.entries:
            self.cache.popitem(last=False)
