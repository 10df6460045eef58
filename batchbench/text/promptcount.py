"""Prompt token counting: a conversation rendered in a chat template and counted exactly.

One counter serves both sides. The simulator counts every request with it (its usage and
its prefix-cache keys); the client counts block requests (schema v2) with it in the
server's chat template when it knows that template, to size the block that absorbs the
prompt correction.

A prompt is counted segment by segment. Every segment but a leading one starts with a
marker, and the markers are special tokens of the counting tokenizer (added to a copy of
the loaded tokenizer when it lacks them, as every model of the template's family has
them). Added tokens split the text before normalization and pre-tokenization, and a
segment that starts with one is encoded as it is in the whole prompt (never as a text's
first word), so the count of a whole prompt is exactly the sum of its segments' counts.
Segment counts are kept in a bounded LRU keyed by the segment's (hash, length), never by
its text (a long tool result would otherwise stay in memory as a key): a request costs an
encode of its new segments only, however long its history.

The segments of a built-in template (``batchbench.text.chat_templates``: ``chatml``,
``gemma``, ``llama3``, ``qwen3``) are its rendered messages. Any other template (a model's
Jinja template, on the client) is rendered whole and cut before each marker.

``--chat-template tokenizer`` on the simulator instead renders the tokenizer's own Jinja
template and encodes the whole prompt each request (``JinjaCounter``): exact for any
template, with prefix-cache keys every ``block`` tokens, but its cost grows with the
history.
"""

from __future__ import annotations

import asyncio
import itertools
import re
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tokenizers import Tokenizer

from batchbench.text.chat_templates import (
    BUILTINS,
    BuiltinTemplate,
    ChatTemplate,
    JinjaTemplate,
    TemplateError,
    load_chat_template,
)
from batchbench.text.tokenizer import LoadedTokenizer, with_markers

__all__ = [
    "MESSAGE_CACHE_ENTRIES",
    "OFFLOAD_CHARACTERS",
    "ChatMLCounter",
    "Counted",
    "JinjaCounter",
    "SegmentCache",
    "SegmentCounter",
    "chatml_tokenizer",
    "load_counter",
    "marked_tokenizer",
    "template_counter",
]

MESSAGE_CACHE_ENTRIES = 1 << 16  # segment counts kept (each a few ints, never its text)
# New segment text beyond this many characters is encoded off the event loop.
OFFLOAD_CHARACTERS = 16_384
_GENERATION = "\x00generation"  # chain-key salt of a generation-prompt prefix point
_CHATML = BUILTINS["chatml"]

SegmentKey = tuple[int, int]  # (hash, length) of a segment's text
Entry = tuple[int, bool]  # (tokens, starts with the generation prompt)


def marked_tokenizer(loaded: LoadedTokenizer, markers: frozenset[str]) -> Tokenizer:
    """A copy of the tokenizer in which every marker is a special token."""
    return with_markers(loaded.tokenizer, markers)


def chatml_tokenizer(loaded: LoadedTokenizer) -> Tokenizer:
    """A copy of the tokenizer in which both ChatML markers are special tokens."""
    return marked_tokenizer(loaded, _CHATML.markers)


@dataclass(frozen=True)
class Counted:
    """A prompt's total token count and the per-message pieces the prefix cache keys on."""

    prompt_tokens: int
    # Ascending (chain key, token end) points: one per message (preceded, for an assistant
    # message, by one for the generation prompt it starts with) and one for this prompt's
    # generation prompt; equal keys mean equal token prefixes, so they are what the
    # prefix cache stores and looks up.
    prefix_ends: tuple[tuple[int, int], ...]


def segment_key(segment: str) -> SegmentKey:
    """A segment's cache key: its (hash, length), so the cache holds no text."""
    return hash(segment), len(segment)


class SegmentCache:
    """Segment counts by (hash, length), least recently used evicted beyond ``limit``.

    Thread-safe: the client counts on worker threads, the simulator on its event loop
    (and encodes long segments on a worker thread)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._entries: OrderedDict[SegmentKey, Entry] = OrderedDict()
        self._lock = threading.Lock()
        self.stored = 0  # entries ever stored: segments encoded

    def __len__(self) -> int:
        return len(self._entries)

    def keys(self) -> list[SegmentKey]:
        with self._lock:
            return list(self._entries)

    def values(self) -> list[Entry]:
        with self._lock:
            return list(self._entries.values())

    def lookup(self, keys: list[SegmentKey]) -> list[Entry | None]:
        """Each key's entry (None when not kept); found ones become the most recent."""
        entries = self._entries
        found: list[Entry | None] = []
        with self._lock:
            for key in keys:
                entry = entries.get(key)
                if entry is not None:
                    entries.move_to_end(key)
                found.append(entry)
        return found

    def store(self, fresh: dict[SegmentKey, Entry]) -> None:
        entries = self._entries
        with self._lock:
            for key, entry in fresh.items():
                if key not in entries:
                    self.stored += 1
                entries[key] = entry
                entries.move_to_end(key)
            while len(entries) > self.limit:
                entries.popitem(last=False)


_SAMPLE = [
    {"role": "system", "content": "You are a careful coding agent."},
    {"role": "user", "content": "Fix the failing test in the parser."},
    {"role": "assistant", "content": "Reading the parser now."},
    {"role": "user", "content": "Thanks, go on."},
]


class SegmentCounter:
    """Counts a chat template's prompts segment by segment, encoding each distinct segment
    once (bounded LRU keyed by content hash).

    ``count`` / ``count_async`` (the simulator) give the total and the prefix chain;
    calling the counter with ``(messages, tools)`` (the client) gives the total of the
    prompt with its generation prompt, from whole-prompt encodes when segment sums do not
    match one on a sample conversation for this tokenizer (a marker stripping the
    whitespace before it, say)."""

    def __init__(
        self,
        loaded: LoadedTokenizer,
        template: ChatTemplate,
        cache_entries: int = MESSAGE_CACHE_ENTRIES,
    ) -> None:
        self.template = template
        self.name = template.name
        self.tokenizer = (
            chatml_tokenizer(loaded)
            if template is _CHATML
            else marked_tokenizer(loaded, template.markers)
        )
        # Without offsets when the library can (tokenizers >= 0.20): counts only.
        self._encode_batch = getattr(
            self.tokenizer, "encode_batch_fast", self.tokenizer.encode_batch
        )
        self.cache = SegmentCache(cache_entries)
        self._builtin = isinstance(template, BuiltinTemplate)
        self._per_message = (
            template if isinstance(template, BuiltinTemplate) and template.per_message else None
        )
        self._cut: re.Pattern[str] | None = None
        if self._builtin:
            generation, prefix = template.generation, template.prefix  # type: ignore[attr-defined]
        else:  # rendered whole, cut before each marker (the longest where two start alike)
            markers = sorted((m for m in template.markers if m), key=len, reverse=True)
            if markers:
                self._cut = re.compile("|".join(re.escape(m) for m in markers))
            generation, prefix = "", ""
        self._generation_ids = self._encode(generation) if generation else []
        self.generation_prompt_tokens = len(self._generation_ids)
        self.prefix_tokens = len(self._encode(prefix)) if prefix else 0
        self._prefix_chain = hash((0, prefix))
        self._adds_up: bool | None = None

    @property
    def encoded_messages(self) -> int:
        """Segments encoded so far (a built-in template's segment is a message)."""
        return self.cache.stored

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def _entry(self, ids: list[int]) -> Entry:
        """A segment's cache entry: its tokens, and whether it starts with the generation
        prompt (an assistant turn continues the prompt that produced it)."""
        generation = self._generation_ids
        starts = bool(generation) and len(ids) > len(generation)
        return len(ids), starts and ids[: len(generation)] == generation

    def render(
        self, messages: Sequence[Any], add_generation_prompt: bool = True, tools: Any = None
    ) -> str:
        return self.template.render(messages, add_generation_prompt, tools)

    def segments(
        self, messages: Sequence[Any], add_generation_prompt: bool = True, tools: Any = None
    ) -> list[str]:
        """The texts counted one by one. A built-in template's prefix and generation prompt
        are not among them (they are counted once, as ``prefix_tokens`` and
        ``generation_prompt_tokens``); another template's prompt is cut before each marker,
        all of it."""
        if self._builtin:
            return self.template.segments(messages, tools)  # type: ignore[attr-defined]
        text = self.render(messages, add_generation_prompt, tools)
        if self._cut is None:
            return [text] if text else []
        cuts = [0, *(match.start() for match in self._cut.finditer(text)), len(text)]
        return [text[start:end] for start, end in itertools.pairwise(cuts) if end > start]

    def outside_tokens(self) -> int:
        """Tokens of a prompt with its generation prompt that no segment holds: a built-in
        template's prefix and generation prompt (none for another template)."""
        return self.prefix_tokens + self.generation_prompt_tokens

    def per_message(self) -> bool:
        """True when a prompt counts as ``outside_tokens`` plus its tools' segments and
        one segment per message, each message rendered on its own (``tool_segments``,
        ``message_segment``): a built-in template that renders messages alone, with a
        tokenizer whose segment counts add up."""
        return self._per_message is not None and self.segments_add_up()

    def tool_segments(self, tools: list[dict]) -> list[str]:
        """The segments of the tools (``per_message`` counters)."""
        assert self._per_message is not None  # asked of per_message counters only
        return self._per_message.tool_segments(tools or None)

    def message_segment(self, message: dict) -> str:
        """The segment of one message (``per_message`` counters)."""
        assert self._per_message is not None  # asked of per_message counters only
        return self._per_message.message_segment(message)

    def segment_tokens(self, segments: list[str]) -> list[int]:
        """Each segment's tokens, new ones encoded (as parts of a prompt, after a marker)."""
        return [tokens for tokens, _ in self._segment_entries(segments)]

    def _lookup(self, segments: list[str]) -> tuple[list[Entry | None], dict[SegmentKey, str]]:
        """The segments' kept entries, and the missing segments by key (once each)."""
        keys = [segment_key(segment) for segment in segments]
        entries = self.cache.lookup(keys)
        missing = {
            key: segment
            for key, segment, entry in zip(keys, segments, entries, strict=True)
            if entry is None
        }
        return entries, missing

    def _encode_missing(self, missing: dict[SegmentKey, str]) -> dict[SegmentKey, Entry]:
        """Encode new segments without offsets (faster even for one): short ones a segment
        per call, long ones in one batch.

        A batch of several texts is spread over the tokenizer's thread pool, whose workers
        wake for it and spin before they sleep again: for the few short segments a request
        adds, that costs more CPU than the encodes (a fifth more for a block request's three
        new segments with DeepSeek-V3)."""
        texts = list(missing.values())
        encode = self._encode_batch
        if len(texts) > 1 and sum(map(len, texts)) < OFFLOAD_CHARACTERS:
            encoded = [encode([text], add_special_tokens=False)[0] for text in texts]
        else:
            encoded = encode(texts, add_special_tokens=False)
        return {key: self._entry(e.ids) for key, e in zip(missing, encoded, strict=True)}

    def _entries(
        self, segments: list[str], entries: list[Entry | None], fresh: dict[SegmentKey, Entry]
    ) -> list[Entry]:
        if fresh:
            self.cache.store(fresh)
            entries = [
                fresh[segment_key(segment)] if entry is None else entry
                for segment, entry in zip(segments, entries, strict=True)
            ]
        return entries  # type: ignore[return-value]

    def _segment_entries(self, segments: list[str]) -> list[Entry]:
        entries, missing = self._lookup(segments)
        fresh = self._encode_missing(missing) if missing else {}
        return self._entries(segments, entries, fresh)

    def count(
        self, messages: Sequence[Any], add_generation_prompt: bool = True, tools: Any = None
    ) -> Counted:
        """Exact token count of the rendered prompt, plus its prefix chain.

        An assistant turn starts with the generation prompt that ended the request which
        produced it, so a prefix point for that generation prompt comes first: the next
        turn is then credited with the whole previous prompt, as a paged KV cache holding
        the generation prompt would credit it.
        """
        segments = self.segments(messages, add_generation_prompt, tools)
        return self._chain(segments, self._segment_entries(segments), add_generation_prompt)

    async def count_async(
        self, messages: Sequence[Any], add_generation_prompt: bool = True, tools: Any = None
    ) -> Counted:
        """``count``, with large new segments encoded on a worker thread.

        Encoding a long tool result takes milliseconds per thousand tokens; done on the
        event loop it would stall every rank's step clock and every other request. The
        tokenizer releases the GIL, so the loop keeps serving meanwhile.
        """
        segments = self.segments(messages, add_generation_prompt, tools)
        entries, missing = self._lookup(segments)
        fresh: dict[SegmentKey, Entry] = {}
        if missing:
            if sum(map(len, missing.values())) >= OFFLOAD_CHARACTERS:
                loop = asyncio.get_running_loop()
                fresh = await loop.run_in_executor(None, self._encode_missing, missing)
            else:
                fresh = self._encode_missing(missing)
        complete = self._entries(segments, entries, fresh)
        return self._chain(segments, complete, add_generation_prompt)

    def _chain(
        self, segments: list[str], entries: list[Entry], add_generation_prompt: bool
    ) -> Counted:
        total = self.prefix_tokens
        chain = self._prefix_chain
        ends = []
        generation = self.generation_prompt_tokens
        for segment, (tokens, starts_with_generation) in zip(segments, entries, strict=True):
            if starts_with_generation:
                ends.append((hash((chain, _GENERATION)), total + generation))
            total += tokens
            chain = hash((chain, segment))
            ends.append((chain, total))
        if add_generation_prompt and self._builtin:  # another template renders it itself
            total += generation
            ends.append((hash((chain, _GENERATION)), total))
        return Counted(total, tuple(ends))

    def __call__(self, messages: list[dict], tools: list[dict] | None = None) -> int:
        """The prompt's tokens with its generation prompt, as the server counts them (the
        client's prompt counter)."""
        tools = tools or None
        if not self.segments_add_up():
            return len(self.encode_ids(messages, True, tools))
        segments = self.segments(messages, True, tools)
        return self.outside_tokens() + sum(tokens for tokens, _ in self._segment_entries(segments))

    def count_rendered(self, messages: list[dict], tools: list[dict]) -> tuple[int, str]:
        """What calling the counter gives, and the text it counted (a built-in template's
        prefix and generation prompt left out): the stand-ins of
        ``batchbench.text.standins`` are looked for in it."""
        tools_or_none = tools or None
        if not self.segments_add_up():
            text = self.render(messages, True, tools_or_none)
            return len(self._encode(text)), text
        segments = self.segments(messages, True, tools_or_none)
        entries = self._segment_entries(segments)
        return self.outside_tokens() + sum(tokens for tokens, _ in entries), "".join(segments)

    def segments_add_up(self) -> bool:
        """True when counting segment by segment equals encoding the whole prompt, checked
        once on a sample conversation (a tokenizer whose marker strips the whitespace
        before it counts each segment one token more)."""
        if self._adds_up is None:
            try:
                whole = len(self.encode_ids(_SAMPLE, True, None))
                segments = self.segments(_SAMPLE, True, None)
            except Exception:  # a template that cannot render the sample: count whole prompts
                self._adds_up = False
            else:
                parts = sum(len(self._encode(segment)) for segment in segments)
                self._adds_up = whole == self.outside_tokens() + parts
        return self._adds_up

    def encode_ids(
        self, messages: Sequence[Any], add_generation_prompt: bool = True, tools: Any = None
    ) -> list[int]:
        """The ids of the whole rendered prompt, encoded in one pass (the reference)."""
        return self._encode(self.render(messages, add_generation_prompt, tools))


class ChatMLCounter(SegmentCounter):
    """The ChatML template's counter."""

    def __init__(self, loaded: LoadedTokenizer, cache_entries: int = MESSAGE_CACHE_ENTRIES):
        super().__init__(loaded, _CHATML, cache_entries)


class JinjaCounter:
    """Counts prompts rendered with a model's own Jinja template (whole prompt)."""

    name = "tokenizer"

    def __init__(
        self, loaded: LoadedTokenizer, template: JinjaTemplate, block_tokens: int = 16
    ) -> None:
        self.template = template
        self.tokenizer = loaded.tokenizer
        self.block_tokens = block_tokens
        self.generation_prompt_tokens = 0
        self.prefix_tokens = 0
        self.encoded_messages = 0

    def render(
        self, messages: Sequence[Any], add_generation_prompt: bool = True, tools: Any = None
    ) -> str:
        return self.template.render(messages, add_generation_prompt, tools)

    def encode_ids(
        self, messages: Sequence[Any], add_generation_prompt: bool = True, tools: Any = None
    ) -> list[int]:
        text = self.render(messages, add_generation_prompt, tools)
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    async def count_async(
        self, messages: Sequence[Any], add_generation_prompt: bool = True, tools: Any = None
    ) -> Counted:
        """``count`` on a worker thread: rendering and encoding the whole prompt is slow."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            None, self.count, list(messages), add_generation_prompt, tools
        )

    def count(
        self, messages: Sequence[Any], add_generation_prompt: bool = True, tools: Any = None
    ) -> Counted:
        """Exact count of the rendered prompt; prefix points every ``block`` token ids."""
        ids = self.encode_ids(messages, add_generation_prompt, tools)
        self.encoded_messages += len(messages)
        block = self.block_tokens
        chain = 0
        ends = []
        for start in range(0, len(ids) - len(ids) % block, block):
            chain = hash((chain, tuple(ids[start : start + block])))
            ends.append((chain, start + block))
        if len(ids) % block:
            ends.append((hash((chain, tuple(ids[len(ids) - len(ids) % block :]))), len(ids)))
        return Counted(len(ids), tuple(ends))


def template_counter(
    loaded: LoadedTokenizer, template: ChatTemplate, cache_entries: int = MESSAGE_CACHE_ENTRIES
) -> SegmentCounter:
    """The segment counter of a chat template: the simulator's for a built-in one, and the
    client's for the server's template (a built-in or a model's own)."""
    if template is _CHATML:
        return ChatMLCounter(loaded, cache_entries)
    return SegmentCounter(loaded, template, cache_entries)


def load_counter(
    loaded: LoadedTokenizer, template: str, block_tokens: int = 16, warn=None
) -> SegmentCounter | JinjaCounter:
    """The simulator's counter for ``--chat-template`` (a built-in name or ``tokenizer``);
    ``warn`` hears of a tokenizer directory holding two different templates."""
    if template in BUILTINS:
        return template_counter(loaded, BUILTINS[template])
    if template != "tokenizer":
        raise TemplateError(
            f"unknown chat template {template!r}; expected chatml, gemma, llama3, qwen3 or "
            "tokenizer"
        )
    loaded_template = load_chat_template("tokenizer", loaded, warn)
    assert isinstance(loaded_template, JinjaTemplate)
    return JinjaCounter(loaded, loaded_template, block_tokens)
