"""How many prompt tokens a server will see: the framing model and reply accounting.

A prompt is contents plus framing. Contents we synthesize count exactly (trim-stable,
exact-length text); two things do not:

* **Framing**: the chat template's markers, role headers and tool-call envelopes. It is
  modelled as an initial overhead (first or reset request) plus a per-turn overhead, from
  the flags, from ``--calibrate``, or learned from the server's ``usage.prompt_tokens`` as
  the run goes (:class:`Framing`).
* **The model's reply**, replayed in the next prompt: its text need not re-encode to its
  ``completion_tokens``. :class:`ReplyCounter` counts it as it will be rendered: trimmed
  (the driver sends it trimmed, so trimming and non-trimming templates see the same text)
  and, when the server's chat template is known, inside the literal template text around
  assistant content, so that a reply ending in "." followed by the template's "\\n\\n"
  is charged as the server's tokenizer merges it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Protocol

from batchbench.text.fastcount import PROBES, AsciiCounter, ascii_counter
from batchbench.text.tokenizer import LoadedTokenizer

# Sentinels placed in a probe conversation to find the template text around contents:
# plain letters, so no template trims or escapes them, and unlikely in any template.
_ASSISTANT_SENTINEL = "Qzxassistantsentinelq"
_TOOL_SENTINEL = "Qzxtoolsentinelq"
_USER_SENTINEL = "Qzxusersentinelq"
_REASONING_SENTINEL = "Qzxreasoningsentinelq"


class RendersChat(Protocol):
    """What the framing model needs of a chat template (``batchbench.text.chat_templates``)."""

    markers: frozenset[str]

    def render(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, tools=None
    ) -> str: ...


@dataclass(frozen=True)
class ContentContext:
    """The template text right before and after one message content, each up to the nearest
    added token (added tokens split the text before pre-tokenization, so nothing beyond
    them can merge with the content)."""

    before: str = ""
    after: str = ""
    rendered: bool = True  # False: the template drops this text, so it costs nothing


def _probe_conversation(call_id: str) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": _USER_SENTINEL},
        {
            "role": "assistant",
            "content": _ASSISTANT_SENTINEL,
            "reasoning_content": _REASONING_SENTINEL,
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": "environment", "arguments": '{"request":"continue"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call_id, "content": _TOOL_SENTINEL},
    ]


def _around(text: str, sentinel: str, markers: frozenset[str]) -> ContentContext:
    at = text.find(sentinel)
    if at < 0:
        return ContentContext(rendered=False)
    end = at + len(sentinel)
    start = 0
    for marker in markers:
        found = text.rfind(marker, 0, at)
        if found >= 0:
            start = max(start, found + len(marker))
    stop = len(text)
    for marker in markers:
        found = text.find(marker, end)
        if found >= 0:
            stop = min(stop, found)
    return ContentContext(text[start:at], text[end:stop])


def content_contexts(template: RendersChat, call_id: str) -> dict[str, ContentContext]:
    """The context of user, assistant, reasoning and tool contents in a growth conversation
    rendered by ``template`` (``rendered=False`` for a text the template drops; many drop
    an assistant's ``reasoning_content``, Qwen3.5 renders it after the last user turn)."""
    rendered = template.render(_probe_conversation(call_id), add_generation_prompt=True)
    markers = frozenset(m for m in template.markers if m)
    return {
        "user": _around(rendered, _USER_SENTINEL, markers),
        "assistant": _around(rendered, _ASSISTANT_SENTINEL, markers),
        "reasoning": _around(rendered, _REASONING_SENTINEL, markers),
        "tool": _around(rendered, _TOOL_SENTINEL, markers),
    }


def _anchor(loaded: LoadedTokenizer) -> str | None:
    """An added token's text: counting after it measures a string where template content
    sits (after a marker), which matters for Metaspace tokenizers that prepend "▁" only at
    the very start of an input."""
    added = loaded.tokenizer.get_added_tokens_decoder()
    for token_id in sorted(added):
        content = added[token_id].content
        if content and not content.isspace():
            return content
    return None


class ReplyCounter:
    """Counts one text of an assistant reply (its content, or its reasoning) as the next
    prompt will render it; a text the template drops counts 0.

    ASCII replies are counted by ``batchbench.text.fastcount`` when the tokenizer allows
    it (4-8 times cheaper), after a check on probe texts that both ways agree here, in
    this template context; every other reply is encoded by the tokenizer."""

    def __init__(
        self,
        loaded: LoadedTokenizer,
        context: ContentContext | None = None,
        ascii_count: bool = True,
    ) -> None:
        self._tokenizer = loaded.tokenizer
        self._anchor = _anchor(loaded)
        self.context = context or ContentContext()
        self._fast = getattr(self._tokenizer, "encode_batch_fast", None)
        self._framing = self._count(self.context.before) + self._count(self.context.after)
        self._ascii: AsciiCounter | None = None
        self._ascii_framing = 0
        if ascii_count and self.context.rendered:
            self._use_ascii(ascii_counter(self._tokenizer))

    def _use_ascii(self, counter: AsciiCounter | None) -> None:
        """Takes ``counter`` if it counts the probes exactly as the tokenizer does in this
        context (an added token used as the anchor that strips spaces would not)."""
        if counter is None:
            return
        before, after = counter.count(self.context.before), counter.count(self.context.after)
        if before is None or after is None:
            return
        probes = [probe for probe in PROBES if probe]
        expected = self._encoded(probes)
        self._ascii, self._ascii_framing = counter, before + after
        if self._counted(probes) != expected:
            self._ascii = None

    @property
    def fast(self) -> bool:
        """True when ASCII replies are counted without the tokenizer's pre-tokenizer."""
        return self._ascii is not None

    def _count(self, text: str) -> int:
        if not text:
            return 0
        if self._anchor is None:
            return len(self._tokenizer.encode(text, add_special_tokens=False).ids)
        ids = self._tokenizer.encode(self._anchor + text, add_special_tokens=False).ids
        return len(ids) - 1

    def count(self, content: str | None) -> int:
        """Tokens the (already trimmed) content adds to the prompt."""
        if not content or not self.context.rendered:
            return 0
        return self.count_many([content])[0]

    def count_many(self, contents: list[str]) -> list[int]:
        """``count`` of several contents: ASCII ones by the fast counter when there is one,
        the others in one batched encode (it releases the GIL, so a worker thread can run
        it beside the event loop)."""
        if not self.context.rendered:
            return [0] * len(contents)
        if self._ascii is None:
            return self._encoded(contents)
        return self._counted(contents)

    def _counted(self, contents: list[str]) -> list[int]:
        counter = self._ascii
        before, after = self.context.before, self.context.after
        counts: list[int | None] = []
        for text in contents:
            if not text:
                counts.append(0)
                continue
            counted = counter.count(before + text + after)
            counts.append(None if counted is None else counted - self._ascii_framing)
        missing = [text for text, counted in zip(contents, counts, strict=True) if counted is None]
        if not missing:
            return counts  # type: ignore[return-value]
        encoded = iter(self._encoded(missing))
        return [next(encoded) if counted is None else counted for counted in counts]

    def _encoded(self, contents: list[str]) -> list[int]:
        """``count_many`` by the tokenizer itself."""
        context = self.context
        prefix = self._anchor or ""
        texts = [prefix + context.before + text + context.after for text in contents]
        encode = self._fast or self._tokenizer.encode_batch
        encodings = encode(texts, add_special_tokens=False)
        offset = self._framing + (1 if self._anchor is not None else 0)
        return [
            len(encoding.ids) - offset if text else 0
            for encoding, text in zip(encodings, contents, strict=True)
        ]


@dataclass(frozen=True)
class ReplyAccounting:
    """Counts a whole reply as the next prompt renders it: its content and, where the
    template renders it, its ``reasoning_content`` (both replayed trimmed)."""

    content: ReplyCounter
    reasoning: ReplyCounter

    @classmethod
    def build(
        cls, loaded: LoadedTokenizer, contexts: dict[str, ContentContext] | None = None
    ) -> ReplyAccounting:
        """Counters in the given template contexts; with no known template, both texts
        are counted on their own (and assumed rendered)."""
        contexts = contexts or {}
        return cls(
            ReplyCounter(loaded, contexts.get("assistant")),
            ReplyCounter(loaded, contexts.get("reasoning")),
        )

    def count(self, content: Any, reasoning: Any = None) -> int:
        total = self.content.count(content) if isinstance(content, str) else 0
        if isinstance(reasoning, str) and reasoning:
            total += self.reasoning.count(reasoning)
        return total


def _observe(counts: Counter[int], value: int, current: int) -> int:
    """Count one observation; the new estimate (a value must outnumber the current one)."""
    seen = counts[value] = counts[value] + 1
    if value != current and seen > counts[current]:
        return value
    return current


def trimmed(content: Any) -> Any:
    """A reply's content as the driver replays it: text without surrounding whitespace."""
    return content.strip() if isinstance(content, str) else content


class Framing:
    """The run's framing estimates (initial and per-turn overhead), refined from usage.

    Every trajectory of a run talks to the same template, so an overhead observed by one
    (``observe_*``) serves all of them: the estimate is the most frequent observation
    (the earliest seen among equals), falling back to the configured (flag or calibrated)
    value before the first one.
    """

    __slots__ = (
        "_initial",
        "_turn",
        "configured_initial",
        "configured_turn",
        "initial",
        "learn",
        "turn",
    )

    def __init__(self, initial: int, turn: int, learn: bool = True, measured: bool = False) -> None:
        """``measured``: the values come from flags or calibration, and count as two
        observations each, so one odd reply cannot displace them; otherwise the first
        observation replaces them."""
        self.configured_initial = initial
        self.configured_turn = turn
        self.learn = learn
        self.initial = initial  # the current estimates, kept up to date by observe_*
        self.turn = turn
        self._initial: Counter[int] = Counter({initial: 2} if measured else {})
        self._turn: Counter[int] = Counter({turn: 2} if measured else {})

    def observe_initial(self, value: int) -> None:
        if self.learn:
            self.initial = _observe(self._initial, value, self.initial)

    def observe_turn(self, value: int) -> None:
        if self.learn:
            self.turn = _observe(self._turn, value, self.turn)

    def learned(self) -> dict[str, Any]:
        """What the run observed, for the results JSON."""
        return {
            "initial_overhead_tokens": self.initial,
            "turn_overhead_tokens": self.turn,
            "initial_observations": {str(k): v for k, v in sorted(self._initial.items())},
            "turn_observations": {str(k): v for k, v in sorted(self._turn.items())},
        }
