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
        digests, known, missing = self._lookup(blocks)
        texts = list(missing.values())
        if sum(map(len, texts)) > OFF_LOOP_CHARS:
            loop = asyncio.get_running_loop()
            counted = await loop.run_in_executor(None, self._encode, texts)
        else:
            counted = self._encode(texts)
        return self._settle(digests, known, missing, counted)

    def counts_now(self, blocks: Sequence[Block]) -> list[int]:
        """Each block's count, encoded here whatever the size (a cancelled request's row
        is written before its handler ends)."""
        digests, known, missing = self._lookup(blocks)
        return self._settle(digests, known, missing, self._encode(list(missing.values())))

    def _lookup(
        self, blocks: Sequence[Block]
    ) -> tuple[list[bytes], dict[bytes, int], dict[bytes, str]]:
        """Each block's text digest, the counts the cache knows, the texts it does not."""
        digests = [
            hashlib.blake2b(block.text.encode("utf-8"), digest_size=16).digest() for block in blocks
        ]
        known: dict[bytes, int] = {}
        missing: dict[bytes, str] = {}
        for digest, block in zip(digests, blocks, strict=True):
            count = self.cache.get(digest)
            if count is None:
                missing[digest] = block.text
            else:
                self.cache.move_to_end(digest)
                known[digest] = count
        return digests, known, missing

    def _settle(
        self,
        digests: list[bytes],
        known: dict[bytes, int],
        missing: dict[bytes, str],
        counted: list[int],
    ) -> list[int]:
        self.encoded += len(counted)
        for digest, count in zip(missing, counted, strict=True):
            known[digest] = count
            self._remember(digest, count)
        return [known[digest] for digest in digests]

    def _encode(self, texts: list[str]) -> list[int]:
        if not texts:
            return []
        encodings = self.tokenizer.encode_batch(texts, add_special_tokens=False)
        return [len(encoding.ids) for encoding in encodings]

    def _remember(self, digest: bytes, count: int) -> None:
        self.cache[digest] = count
        self.cache.move_to_end(digest)
        while len(self.cache) > self.entries:
            self.cache.popitem(last=False)
