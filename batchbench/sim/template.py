"""Prompt token counting for the simulator: a chat template rendered and counted exactly.

The default template is ChatML::

    <|im_start|>{role}\\n{content}{tool calls}<|im_end|>\\n   (per message)
    <|im_start|>assistant\\n                                  (generation prompt)

with each assistant tool call rendered as
``\\n<tool_call>\\n{"name": <name>, "arguments": <arguments>}\\n</tool_call>``. Call ids are
not rendered (ChatML models do not see them), so a turn's template cost does not depend
on the agent or turn number.

The two markers are special tokens of the counting tokenizer (they are added to a copy of
the loaded tokenizer when it lacks them, as every ChatML model has them). Added tokens
split the text before normalization and pre-tokenization, so the count of the whole
rendered prompt is exactly the sum of the counts of its messages. That lets the server
count a message once and reuse the count while the conversation grows: a request costs an
encode of its new messages only, however long its history.

``--chat-template tokenizer`` instead renders the tokenizer's own ``chat_template`` (from
the ``tokenizer_config.json`` beside the file) with jinja2 and encodes the whole prompt
each request: exact for any template, but its cost grows with the history.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Tokenizer

from batchbench.errors import BatchbenchError
from batchbench.tokenizer import LoadedTokenizer

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
MESSAGE_CACHE_ENTRIES = 1 << 16
# New message text beyond this many characters is encoded off the event loop.
OFFLOAD_CHARACTERS = 16_384
_GENERATION = "\x00generation"  # chain-key salt of a generation-prompt prefix point


class TemplateError(BatchbenchError):
    """A request the template cannot render, or a template that cannot be loaded."""


def content_text(content: Any) -> str:
    """A message's ``content`` as text: a string, null, or a list of OpenAI content parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif isinstance(part, str):
                parts.append(part)
            else:
                raise TemplateError("message content parts must be text")
        return "".join(parts)
    raise TemplateError("message content must be a string, null or a list of text parts")


def _tool_call_text(call: Any) -> str:
    if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
        raise TemplateError("tool_calls entries must be objects with a function")
    function = call["function"]
    name = function.get("name")
    arguments = function.get("arguments", "")
    if not isinstance(name, str):
        raise TemplateError("tool call function name must be a string")
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    quoted = json.dumps(name, ensure_ascii=False)
    return f'\n<tool_call>\n{{"name": {quoted}, "arguments": {arguments}}}\n</tool_call>'


def render_body(message: Any) -> str:
    """The text between a message's markers: ``role\\n``, content, rendered tool calls."""
    if not isinstance(message, dict):
        raise TemplateError("each message must be an object")
    role = message.get("role")
    if not isinstance(role, str) or not role:
        raise TemplateError("each message needs a non-empty string role")
    body = role + "\n" + content_text(message.get("content"))
    calls = message.get("tool_calls")
    if calls:
        if not isinstance(calls, list):
            raise TemplateError("tool_calls must be a list")
        body += "".join(_tool_call_text(call) for call in calls)
    return body


def tools_message(tools: Any) -> dict[str, str] | None:
    """The system message that presents a request's ``tools`` (Qwen-style), or None.

    Tool definitions are prompt content: each is rendered as one JSON line inside
    ``<tools>`` in a system message placed before the conversation.
    """
    if tools is None or tools == []:
        return None
    if not isinstance(tools, list) or not all(isinstance(tool, dict) for tool in tools):
        raise TemplateError("tools must be a list of objects")
    lines = "\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools)
    return {"role": "system", "content": f"# Tools\n\n<tools>\n{lines}\n</tools>"}


def _with_tools(messages: Sequence[Any], tools: Any) -> Sequence[Any]:
    block = tools_message(tools)
    return messages if block is None else [block, *messages]


def render_chatml(
    messages: Sequence[Any], add_generation_prompt: bool = True, tools: Any = None
) -> str:
    """The whole ChatML prompt as one string (for /tokenize and for tests)."""
    text = "".join(f"{IM_START}{render_body(m)}{IM_END}\n" for m in _with_tools(messages, tools))
    return text + (f"{IM_START}assistant\n" if add_generation_prompt else "")


def chatml_tokenizer(loaded: LoadedTokenizer) -> Tokenizer:
    """A copy of the tokenizer in which both ChatML markers are special tokens."""
    tokenizer = Tokenizer.from_str(loaded.tokenizer.to_str())
    tokenizer.no_truncation()
    tokenizer.no_padding()
    specials = {t.content for t in tokenizer.get_added_tokens_decoder().values() if t.special}
    missing = [m for m in (IM_START, IM_END) if m not in specials]
    if missing:
        tokenizer.add_special_tokens(
            [AddedToken(m, special=True, normalized=False) for m in missing]
        )
    return tokenizer


@dataclass(frozen=True)
class Counted:
    """A prompt's total token count and the per-message pieces the prefix cache keys on."""

    prompt_tokens: int
    # Ascending (chain key, token end) points: one per message (preceded, for an assistant
    # message, by one for the generation prompt it starts with) and one for this prompt's
    # generation prompt; equal keys mean equal token prefixes, so they are what the
    # prefix cache stores and looks up.
    prefix_ends: tuple[tuple[int, int], ...]


class ChatMLCounter:
    """Counts ChatML prompts, encoding each distinct message once (LRU of message counts)."""

    name = "chatml"

    def __init__(self, loaded: LoadedTokenizer, cache_entries: int = MESSAGE_CACHE_ENTRIES):
        self.tokenizer = chatml_tokenizer(loaded)
        # Keyed by (hash, length) of the rendered body, not the body: long tool results
        # would otherwise stay in memory as keys.
        self._cache: OrderedDict[tuple[int, int], tuple[int, bool]] = OrderedDict()
        self._limit = cache_entries
        # Each piece is measured right after a marker, where it sits in a real prompt: a
        # Metaspace tokenizer with prepend_scheme "first" adds "▁" only at position 0.
        newline = self._encode_len(IM_END + "\n") - 1
        self._marker_cost = 2 + newline  # <|im_start|>, <|im_end|>, the "\n" after it
        self._generation_ids = self.tokenizer.encode(
            IM_START + "assistant\n", add_special_tokens=False
        ).ids
        self.generation_prompt_tokens = len(self._generation_ids)
        self.encoded_messages = 0

    def _encode_len(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def _entry(self, ids: list[int]) -> tuple[int, bool]:
        """A message's cache entry from the ids of ``<|im_start|>`` + its body."""
        generation = self._generation_ids
        return (
            len(ids) - 1 + self._marker_cost,
            len(ids) > len(generation) and ids[: len(generation)] == generation,
        )

    def _remember(self, key: tuple[int, int], entry: tuple[int, bool]) -> None:
        self.encoded_messages += 1
        self._cache[key] = entry
        if len(self._cache) > self._limit:
            self._cache.popitem(last=False)

    def _body_entry(self, body: str) -> tuple[int, bool]:
        key = (hash(body), len(body))
        entry = self._cache.get(key)
        if entry is None:
            entry = self._entry(
                self.tokenizer.encode(IM_START + body, add_special_tokens=False).ids
            )
            self._remember(key, entry)
        else:
            self._cache.move_to_end(key)
        return entry

    def count(
        self, messages: Sequence[Any], add_generation_prompt: bool = True, tools: Any = None
    ) -> Counted:
        """Exact token count of the rendered prompt, plus its prefix chain.

        An assistant message starts with the generation prompt that ended the request
        which produced it, so a prefix point for that generation prompt comes first: the
        next turn is then credited with the whole previous prompt, as a paged KV cache
        holding ``<|im_start|>assistant\\n`` would credit it.
        """
        bodies = [render_body(m) for m in _with_tools(messages, tools)]
        return self._count_bodies(bodies, add_generation_prompt)

    async def count_async(
        self, messages: Sequence[Any], add_generation_prompt: bool = True, tools: Any = None
    ) -> Counted:
        """``count``, with large new messages encoded on a worker thread.

        Encoding a long tool result takes milliseconds per thousand tokens; done on the
        event loop it would stall every rank's step clock and every other request. The
        tokenizer releases the GIL, so the loop keeps serving meanwhile. The cache is
        only touched on the loop thread.
        """
        bodies = [render_body(m) for m in _with_tools(messages, tools)]
        missing = {}
        for body in bodies:
            key = (hash(body), len(body))
            if key not in self._cache:
                missing[key] = body
        if sum(map(len, missing.values())) >= OFFLOAD_CHARACTERS:
            keys = list(missing)
            texts = [IM_START + missing[key] for key in keys]
            loop = asyncio.get_running_loop()
            encodings = await loop.run_in_executor(None, self._encode_batch, texts)
            for key, encoding in zip(keys, encodings, strict=True):
                if key not in self._cache:
                    self._remember(key, self._entry(encoding.ids))
        return self._count_bodies(bodies, add_generation_prompt)

    def _encode_batch(self, texts: list[str]) -> list[Any]:
        return self.tokenizer.encode_batch(texts, add_special_tokens=False)

    def _count_bodies(self, bodies: list[str], add_generation_prompt: bool) -> Counted:
        total = 0
        chain = 0
        ends = []
        generation = self.generation_prompt_tokens
        for body in bodies:
            tokens, starts_with_generation = self._body_entry(body)
            if starts_with_generation:
                ends.append((hash((chain, _GENERATION)), total + generation))
            total += tokens
            chain = hash((chain, body))
            ends.append((chain, total))
        if add_generation_prompt:
            total += generation
            ends.append((hash((chain, _GENERATION)), total))
        return Counted(total, tuple(ends))

    def encode_ids(
        self, messages: Sequence[Any], add_generation_prompt: bool = True, tools: Any = None
    ) -> list[int]:
        """The ids of the whole rendered prompt, encoded in one pass (the reference)."""
        text = render_chatml(messages, add_generation_prompt, tools)
        return self.tokenizer.encode(text, add_special_tokens=False).ids


class JinjaCounter:
    """Counts prompts rendered with the tokenizer's own ``chat_template`` (whole prompt)."""

    name = "tokenizer"

    def __init__(
        self,
        loaded: LoadedTokenizer,
        template_source: str,
        config: dict[str, Any],
        block_tokens: int = 16,
    ):
        try:
            import jinja2
            import jinja2.sandbox
        except ImportError:
            raise TemplateError(
                "--chat-template tokenizer needs jinja2: pip install 'batchbench[templates]'"
            ) from None
        # The environment transformers renders chat templates in: loop controls, a tojson
        # that keeps key order and non-ASCII text, raise_exception and strftime_now.
        env = jinja2.sandbox.ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_template_error
        env.globals["strftime_now"] = _strftime_now
        try:
            self._template = env.from_string(template_source)
        except jinja2.TemplateError as exc:
            raise TemplateError(f"cannot compile the tokenizer's chat_template: {exc}") from None
        self._specials = {
            key: _token_text(config.get(key)) for key in ("bos_token", "eos_token", "pad_token")
        }
        self.tokenizer = loaded.tokenizer
        self.block_tokens = block_tokens
        self.generation_prompt_tokens = 0
        self.encoded_messages = 0

    def render(
        self, messages: Sequence[Any], add_generation_prompt: bool = True, tools: Any = None
    ) -> str:
        if tools is not None and not isinstance(tools, list):
            raise TemplateError("tools must be a list of objects")
        try:
            return self._template.render(
                messages=list(messages),
                tools=tools or None,
                add_generation_prompt=add_generation_prompt,
                **self._specials,
            )
        except TemplateError:
            raise
        except Exception as exc:
            raise TemplateError(f"chat_template failed to render the request: {exc}") from None

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


def _tojson(
    value: Any, indent: int | None = None, separators: Any = None, sort_keys: bool = False
) -> str:
    return json.dumps(
        value, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(format_string: str) -> str:
    return time.strftime(format_string)


def _raise_template_error(message: str) -> None:
    raise TemplateError(f"chat_template raised: {message}")


def _token_text(value: Any) -> str:
    if isinstance(value, dict):
        return str(value.get("content", ""))
    return value if isinstance(value, str) else ""


def load_counter(
    loaded: LoadedTokenizer, template: str, block_tokens: int = 16
) -> ChatMLCounter | JinjaCounter:
    """The counter for ``--chat-template`` (``chatml`` or ``tokenizer``)."""
    if template == "chatml":
        return ChatMLCounter(loaded)
    if template != "tokenizer":
        raise TemplateError(f"unknown chat template {template!r}; expected chatml or tokenizer")
    source = Path(loaded.source)
    config_path = source.parent / "tokenizer_config.json" if source.is_file() else None
    if config_path is None or not config_path.is_file():
        raise TemplateError(
            f"--chat-template tokenizer needs a tokenizer_config.json beside {loaded.source}"
        )
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise TemplateError(f"cannot read {config_path}: {exc}") from None
    template_source = config.get("chat_template")
    if isinstance(template_source, list):  # named templates: take "default"
        named = {t.get("name"): t.get("template") for t in template_source if isinstance(t, dict)}
        template_source = named.get("default")
    if not isinstance(template_source, str) or not template_source:
        raise TemplateError(f"{config_path} has no chat_template")
    return JinjaCounter(loaded, template_source, config, block_tokens)
