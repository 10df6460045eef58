"""Prompt token counting for the simulator: a chat template rendered and counted exactly.

The built-in templates (``batchbench.text.chat_templates``: ``chatml``, ``gemma``, ``llama3``)
render each message as its own segment starting with a marker token. The markers are
special tokens of the counting tokenizer (added to a copy of the loaded tokenizer when it
lacks them, as every model of that family has them). Added tokens split the text before
normalization and pre-tokenization, so the count of a whole prompt is exactly the sum of
its segments' counts. That lets the server count a message once and reuse the count while
the conversation grows: a request costs an encode of its new messages only, however long
its history.

``--chat-template tokenizer`` instead renders the tokenizer's own Jinja template (a
``chat_template.jinja`` or ``tokenizer_config.json`` beside the file) and encodes the whole
prompt each request: exact for any template, but its cost grows with the history.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tokenizers import Tokenizer

from batchbench.text.chat_templates import (
    BUILTINS,
    BuiltinTemplate,
    ChatMLTemplate,
    JinjaTemplate,
    TemplateError,
    content_text,
    load_chat_template,
)
from batchbench.text.tokenizer import LoadedTokenizer, with_markers

__all__ = [
    "ChatMLCounter",
    "Counted",
    "JinjaCounter",
    "SegmentCounter",
    "TemplateError",
    "content_text",
    "load_counter",
    "render_body",
    "render_chatml",
]

IM_START = ChatMLTemplate.start
IM_END = ChatMLTemplate.end
MESSAGE_CACHE_ENTRIES = 1 << 16
# New message text beyond this many characters is encoded off the event loop.
OFFLOAD_CHARACTERS = 16_384
_GENERATION = "\x00generation"  # chain-key salt of a generation-prompt prefix point
_CHATML = BUILTINS["chatml"]


def render_body(message: Any) -> str:
    """ChatML: the text between a message's markers (role, content, tool calls)."""
    return _CHATML.body(message)  # type: ignore[attr-defined]


def render_chatml(
    messages: Sequence[Any], add_generation_prompt: bool = True, tools: Any = None
) -> str:
    """The whole ChatML prompt as one string (for /tokenize and for tests)."""
    return _CHATML.render(messages, add_generation_prompt, tools)


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


class SegmentCounter:
    """Counts a built-in template's prompts, encoding each distinct segment once (LRU)."""

    def __init__(
        self,
        loaded: LoadedTokenizer,
        template: BuiltinTemplate,
        cache_entries: int = MESSAGE_CACHE_ENTRIES,
    ) -> None:
        self.template = template
        self.name = template.name
        self.tokenizer = (
            chatml_tokenizer(loaded)
            if template is _CHATML
            else marked_tokenizer(loaded, template.markers)
        )
        # Keyed by (hash, length) of the segment, not the segment: long tool results
        # would otherwise stay in memory as keys.
        self._cache: OrderedDict[tuple[int, int], tuple[int, bool]] = OrderedDict()
        self._limit = cache_entries
        self._generation_ids = self._encode(template.generation)
        self.generation_prompt_tokens = len(self._generation_ids)
        self.prefix_tokens = len(self._encode(template.prefix)) if template.prefix else 0
        self._prefix_chain = hash((0, template.prefix))
        self.encoded_messages = 0

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def _entry(self, ids: list[int]) -> tuple[int, bool]:
        """A segment's cache entry: its tokens, and whether it starts with the generation
        prompt (an assistant turn continues the prompt that produced it)."""
        generation = self._generation_ids
        return len(ids), len(ids) > len(generation) and ids[: len(generation)] == generation

    def _remember(self, key: tuple[int, int], entry: tuple[int, bool]) -> None:
        self.encoded_messages += 1
        self._cache[key] = entry
        if len(self._cache) > self._limit:
            self._cache.popitem(last=False)

    def _segment_entry(self, segment: str) -> tuple[int, bool]:
        key = (hash(segment), len(segment))
        entry = self._cache.get(key)
        if entry is None:
            entry = self._entry(self._encode(segment))
            self._remember(key, entry)
        else:
            self._cache.move_to_end(key)
        return entry

    def render(
        self, messages: Sequence[Any], add_generation_prompt: bool = True, tools: Any = None
    ) -> str:
        return self.template.render(messages, add_generation_prompt, tools)

    def count(
        self, messages: Sequence[Any], add_generation_prompt: bool = True, tools: Any = None
    ) -> Counted:
        """Exact token count of the rendered prompt, plus its prefix chain.

        An assistant turn starts with the generation prompt that ended the request which
        produced it, so a prefix point for that generation prompt comes first: the next
        turn is then credited with the whole previous prompt, as a paged KV cache holding
        the generation prompt would credit it.
        """
        segments = self.template.segments(messages, tools)
        return self._count_segments(segments, add_generation_prompt)

    async def count_async(
        self, messages: Sequence[Any], add_generation_prompt: bool = True, tools: Any = None
    ) -> Counted:
        """``count``, with large new segments encoded on a worker thread.

        Encoding a long tool result takes milliseconds per thousand tokens; done on the
        event loop it would stall every rank's step clock and every other request. The
        tokenizer releases the GIL, so the loop keeps serving meanwhile. The cache is
        only touched on the loop thread.
        """
        segments = self.template.segments(messages, tools)
        missing = {}
        for segment in segments:
            key = (hash(segment), len(segment))
            if key not in self._cache:
                missing[key] = segment
        if sum(map(len, missing.values())) >= OFFLOAD_CHARACTERS:
            keys = list(missing)
            loop = asyncio.get_running_loop()
            encodings = await loop.run_in_executor(
                None, self._encode_batch, [missing[key] for key in keys]
            )
            for key, encoding in zip(keys, encodings, strict=True):
                if key not in self._cache:
                    self._remember(key, self._entry(encoding.ids))
        return self._count_segments(segments, add_generation_prompt)

    def _encode_batch(self, texts: list[str]) -> list[Any]:
        return self.tokenizer.encode_batch(texts, add_special_tokens=False)

    def _count_segments(self, segments: list[str], add_generation_prompt: bool) -> Counted:
        total = self.prefix_tokens
        chain = self._prefix_chain
        ends = []
        generation = self.generation_prompt_tokens
        for segment in segments:
            tokens, starts_with_generation = self._segment_entry(segment)
            if starts_with_generation:
                ends.append((hash((chain, _GENERATION)), total + generation))
            total += tokens
            chain = hash((chain, segment))
            ends.append((chain, total))
        if add_generation_prompt:
            total += generation
            ends.append((hash((chain, _GENERATION)), total))
        return Counted(total, tuple(ends))

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


def load_counter(
    loaded: LoadedTokenizer, template: str, block_tokens: int = 16, warn=None
) -> SegmentCounter | JinjaCounter:
    """The counter for ``--chat-template`` (a built-in name or ``tokenizer``); ``warn``
    hears of a tokenizer directory holding two different templates."""
    if template == "chatml":
        return ChatMLCounter(loaded)
    if template in BUILTINS:
        return SegmentCounter(loaded, BUILTINS[template])
    if template != "tokenizer":
        raise TemplateError(
            f"unknown chat template {template!r}; expected chatml, gemma, llama3, qwen3 or "
            "tokenizer"
        )
    loaded_template = load_chat_template("tokenizer", loaded, warn)
    assert isinstance(loaded_template, JinjaTemplate)
    return JinjaCounter(loaded, loaded_template, block_tokens)
