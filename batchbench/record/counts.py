"""Token counts of blocks, cached by content so a growing conversation encodes only what
is new: an agent resends its whole history on every turn, and encoding it again each
time would cost the proxy more than the request's own forwarding.

Large work (encoding new text, hashing a long history for the chain) runs on one worker thread: the
tokenizer and hashlib release the GIL, so the event loop keeps relaying other streams,
and one thread bounds the proxy's counting to one core however many requests end at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from batchbench.record.blocks import Block
from batchbench.text.fastcount import ascii_counter
from batchbench.text.promptcount import SegmentCache, SegmentKey, segment_key
from batchbench.text.tokenizer import LoadedTokenizer

T = TypeVar("T")
CACHE_ENTRIES = 200_000  # about 25 MB of keys and counts
# Work on more characters than this goes to the worker thread (encoding 2,048 characters
# takes about half a millisecond: longer would hold up every stream the loop relays).
OFF_LOOP_CHARS = 2_048


class BlockCounter:
    """Counts of blocks' texts (no special tokens added), from the bounded LRU cache the
    prompt counters use, keyed by each text's (hash, length) so it holds no text;
    ``encoded`` is the number of blocks actually encoded."""

    def __init__(self, tokenizer: LoadedTokenizer, entries: int = CACHE_ENTRIES) -> None:
        self.tokenizer = tokenizer.tokenizer
        self.fast = ascii_counter(tokenizer.tokenizer)
        self.cache = SegmentCache(entries)
        self.encoded = 0
        self.worker: ThreadPoolExecutor | None = None  # started by the first large job

    async def off_loop(self, size: int, job: Callable[..., T], *args: object) -> T:
        """``job(*args)`` on the worker thread when ``size`` (characters) is large,
        otherwise here at once."""
        if size <= OFF_LOOP_CHARS:
            return job(*args)
        return await self.on_worker(job, *args)

    async def on_worker(self, job: Callable[..., T], *args: object) -> T:
        if self.worker is None:
            self.worker = ThreadPoolExecutor(1, thread_name_prefix="batchbench-record")
        return await asyncio.get_running_loop().run_in_executor(self.worker, job, *args)

    async def counts(self, blocks: Sequence[Block]) -> list[int]:
        """Each block's count; only texts the cache does not know are encoded."""
        keys, known, missing = self._lookup(blocks)
        texts = list(missing.values())
        if sum(map(len, texts)) > OFF_LOOP_CHARS:
            counted = await self.on_worker(self._encode_batch, texts)
        else:
            counted = self._encode(texts)
        return self._settle(keys, known, missing, counted)

    def counts_now(self, blocks: Sequence[Block]) -> list[int]:
        """Each block's count, worked out here whatever the size (a cancelled request's
        row is written before its handler ends)."""
        keys, known, missing = self._lookup(blocks)
        return self._settle(keys, known, missing, self._encode(list(missing.values())))

    def close(self) -> None:
        if self.worker is not None:
            self.worker.shutdown()

    def _lookup(
        self, blocks: Sequence[Block]
    ) -> tuple[list[SegmentKey], dict[SegmentKey, int], dict[SegmentKey, str]]:
        """Each block's key, the counts the cache knows, and the texts it does not."""
        keys = [segment_key(block.text) for block in blocks]
        known: dict[SegmentKey, int] = {}
        missing: dict[SegmentKey, str] = {}
        for key, block, entry in zip(keys, blocks, self.cache.lookup(keys), strict=True):
            if entry is None:
                missing[key] = block.text
            else:
                known[key] = entry[0]
        return keys, known, missing

    def _settle(
        self,
        keys: list[SegmentKey],
        known: dict[SegmentKey, int],
        missing: dict[SegmentKey, str],
        counted: list[int],
    ) -> list[int]:
        self.encoded += len(counted)
        fresh = dict(zip(missing, counted, strict=True))
        self.cache.store({key: (count, False) for key, count in fresh.items()})
        known.update(fresh)
        return [known[key] for key in keys]

    def _encode(self, texts: list[str]) -> list[int]:
        """On the loop: one text after another (a batch hands off to the tokenizer's
        threads and waits for the GIL to come back, slower for small texts), ASCII text
        with the fast exact counter when the tokenizer has one (about 4x faster)."""
        counts = []
        for text in texts:
            count = self.fast.count(text) if self.fast is not None else None
            if count is None:
                count = len(self.tokenizer.encode(text, add_special_tokens=False).ids)
            counts.append(count)
        return counts

    def _encode_batch(self, texts: list[str]) -> list[int]:
        """On the worker: one batch, encoded without the GIL."""
        encodings = self.tokenizer.encode_batch(texts, add_special_tokens=False)
        return [len(encoding.ids) for encoding in encodings]
