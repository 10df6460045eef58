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

import re
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


# The shapes of a reply the template may render differently: (has reasoning, has content).
ReplyShape = tuple[bool, bool]
REFERENCE_SHAPE: ReplyShape = (False, True)
_SHAPES: tuple[ReplyShape, ...] = ((False, True), (False, False), (True, True), (True, False))
_HOLES = {_ASSISTANT_SENTINEL: "content", _REASONING_SENTINEL: "reasoning"}
# Text that looks like template structure (``<tool_call>``, ``</think>``, ``<|im_end|>``).
_TAG = re.compile(r"<[^<>\s]{1,40}>")


def _reply_probe(
    call_id: str, shape: ReplyShape, content: str | None = None, reasoning: str | None = None
) -> list[dict[str, Any]]:
    """The conversation the driver sends after a reply of ``shape``: the reply with its
    synthetic tool call, then the tool result (sentinels stand for the texts not given)."""
    with_reasoning, with_content = shape
    assistant: dict[str, Any] = {
        "role": "assistant",
        "content": (content if content is not None else _ASSISTANT_SENTINEL)
        if with_content
        else "",
    }
    if with_reasoning:
        assistant["reasoning_content"] = reasoning if reasoning is not None else _REASONING_SENTINEL
    assistant["tool_calls"] = [
        {
            "id": call_id,
            "type": "function",
            "function": {"name": "environment", "arguments": '{"request":"continue"}'},
        }
    ]
    return [
        {"role": "user", "content": _USER_SENTINEL},
        assistant,
        {"role": "tool", "tool_call_id": call_id, "content": _TOOL_SENTINEL},
    ]


@dataclass(frozen=True)
class ReplyForm:
    """How the template renders a reply of one shape: the literal text around its texts
    within the stretch between two added tokens that holds them (``pieces``, one more than
    ``holes``, which name the texts in rendered order), and the tokens the shape costs
    outside that stretch, relative to the reference shape (text, no reasoning), whose
    count is the reply's own tokens in its context."""

    pieces: tuple[str, ...]
    holes: tuple[str, ...]
    constant: int

    def assemble(self, content: str, reasoning: str) -> str:
        texts = {"content": content, "reasoning": reasoning}
        parts = [self.pieces[0]]
        for hole, piece in zip(self.holes, self.pieces[1:], strict=True):
            parts += [texts[hole], piece]
        return "".join(parts)


class _Tokens:
    """Token counts of template text with one tokenizer: whole prompts, and stretches
    between added tokens (counted after an added token, where they sit in a prompt),
    ASCII ones by the fast counter when it agrees with the tokenizer here."""

    def __init__(self, tokenizer: Any, anchor: str | None, ascii_count: bool) -> None:
        self.tokenizer = tokenizer
        self.anchor = anchor
        self.fast = getattr(tokenizer, "encode_batch_fast", None) or tokenizer.encode_batch
        self.ascii = ascii_counter(tokenizer) if ascii_count else None

    def whole(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def stretches(self, texts: list[str], ascii_ok: bool = True) -> list[int]:
        counts: list[int | None] = [
            self.ascii.count(text) if self.ascii is not None and ascii_ok else None
            for text in texts
        ]
        missing = [text for text, counted in zip(texts, counts, strict=True) if counted is None]
        if missing:
            prefix = self.anchor or ""
            encoded = self.fast([prefix + text for text in missing], add_special_tokens=False)
            drop = 1 if self.anchor is not None else 0
            lengths = iter(
                len(encoding.ids) - drop if text else 0
                for encoding, text in zip(encoded, missing, strict=True)
            )
            counts = [next(lengths) if counted is None else counted for counted in counts]
        return counts  # type: ignore[return-value]


def _reply_form(
    template: RendersChat, tokens: _Tokens, markers: frozenset[str], call_id: str, shape: ReplyShape
) -> tuple[ReplyForm, int, str]:
    """The form of ``shape`` with its raw constant (whole prompt minus its stretch), and
    the rendered probe."""
    rendered = template.render(_reply_probe(call_id, shape), add_generation_prompt=True)
    found = sorted((rendered.find(s), s) for s in _HOLES if rendered.find(s) >= 0)
    if not found:
        return ReplyForm(("",), (), 0), tokens.whole(rendered), rendered
    first, last = found[0][0], found[-1][0] + len(found[-1][1])
    start = max(
        (rendered.rfind(m, 0, first) + len(m) for m in markers if m in rendered[:first]), default=0
    )
    stop = min((at for m in markers if (at := rendered.find(m, last)) >= 0), default=len(rendered))
    pieces, holes, at = [], [], start
    for position, sentinel in found:
        pieces.append(rendered[at:position])
        holes.append(_HOLES[sentinel])
        at = position + len(sentinel)
    pieces.append(rendered[at:stop])
    form = ReplyForm(tuple(pieces), tuple(holes), 0)
    stretch = form.assemble(_ASSISTANT_SENTINEL, _REASONING_SENTINEL)
    raw = tokens.whole(rendered) - tokens.stretches([stretch], ascii_ok=False)[0]
    return form, raw, rendered


class ReplyAccounting:
    """Counts a whole reply as the next prompt renders it, in the template context of the
    conversation the driver actually sends (``--calibrate`` and the learned turn overhead
    assume a reply of text without reasoning; everything else is counted relative to it).

    A template may render a reply differently by its shape: Qwen-style templates put
    ``<think>`` blocks around reasoning (``</think>\n\n`` then stands before the text,
    where ``assistant\n`` stands without it) and drop the newline before a tool call when
    the text is empty. Each shape's form is found once by rendering probe conversations;
    a reply is then one count of its stretch of template text (the tokens around it merge
    with its first and last characters as the server's tokenizer merges them) plus the
    shape's constant. A reply holding template-like tags (``<tool_call>``, ``</think>``)
    could change how the template renders it, so it is counted by rendering the probe
    conversation with the reply itself. With no known template, texts are counted alone.
    """

    def __init__(
        self,
        tokens: _Tokens,
        forms: dict[ReplyShape, ReplyForm] | None,
        template: RendersChat | None = None,
        reference: int = 0,
        tags: frozenset[str] = frozenset(),
        call_id: str = "",
    ) -> None:
        self._tokens = tokens
        self.forms = forms
        self._template = template
        self._reference = reference
        self._tags = tuple(sorted(tags))
        self._call_id = call_id

    @classmethod
    def build(
        cls,
        loaded: LoadedTokenizer,
        template: RendersChat | None = None,
        call_id: str = "call_1",
        ascii_count: bool = True,
        tokenizer: Any = None,
    ) -> ReplyAccounting:
        """The accounting for ``template`` (None: unknown, texts counted on their own);
        ``tokenizer`` counts instead of ``loaded``'s (one with the template's markers as
        added tokens, for the built-in templates)."""
        tokens = _Tokens(tokenizer or loaded.tokenizer, _anchor(loaded), ascii_count)
        if template is None:
            return cls(tokens, None)
        markers = frozenset(m for m in template.markers if m)
        forms: dict[ReplyShape, ReplyForm] = {}
        raws: dict[ReplyShape, int] = {}
        tags: set[str] = set(markers)
        for shape in _SHAPES:
            form, raws[shape], rendered = _reply_form(template, tokens, markers, call_id, shape)
            forms[shape] = form
            tags.update(_TAG.findall(rendered))
        reference = forms[REFERENCE_SHAPE]
        base = raws[REFERENCE_SHAPE]
        if reference.holes:  # the text's own context (a template may drop the text)
            base += sum(tokens.stretches(list(reference.pieces), ascii_ok=False))
        forms = {
            shape: ReplyForm(form.pieces, form.holes, raws[shape] - base)
            for shape, form in forms.items()
        }
        accounting = cls(tokens, forms, template, base, frozenset(tags), call_id)
        accounting._check_fast()
        return accounting

    def _check_fast(self) -> None:
        """Keeps the fast counter only if it counts probe replies in every form exactly as
        the tokenizer does (an added token used as the anchor that strips spaces would not)."""
        tokens = self._tokens
        if tokens.ascii is None or not self.forms:
            return
        probes = [probe for probe in PROBES if probe]
        texts = [
            form.assemble(probe, probe)
            for form in self.forms.values()
            if form.holes
            for probe in probes
        ]
        if tokens.stretches(texts) != tokens.stretches(texts, ascii_ok=False):
            tokens.ascii = None

    @property
    def fast(self) -> bool:
        """True when ASCII replies are counted without the tokenizer's pre-tokenizer."""
        return self._tokens.ascii is not None

    def shape(self, content: Any, reasoning: Any = None) -> ReplyShape:
        return (
            isinstance(reasoning, str) and bool(reasoning),
            isinstance(content, str) and bool(content),
        )

    def count(self, content: Any, reasoning: Any = None) -> int:
        """Tokens the (already trimmed) reply adds to the next prompt."""
        return self.count_many([(content, reasoning)])[0]

    def count_many(self, replies: list[tuple[Any, Any]]) -> list[int]:
        """``count`` of several (content, reasoning) replies, the stretches in one batch."""
        content_of = [c if isinstance(c, str) else "" for c, _ in replies]
        reasoning_of = [r if isinstance(r, str) else "" for _, r in replies]
        if self.forms is None:
            texts = content_of + reasoning_of
            counts = self._tokens.stretches(texts)
            half = len(replies)
            return [a + b for a, b in zip(counts[:half], counts[half:], strict=True)]
        results: list[int | None] = [None] * len(replies)
        stretches, owners = [], []
        for index, (content, reasoning) in enumerate(zip(content_of, reasoning_of, strict=True)):
            if self._tags and any(tag in content or tag in reasoning for tag in self._tags):
                results[index] = self._rendered(content, reasoning)
                continue
            form = self.forms[(bool(reasoning), bool(content))]
            if not form.holes:
                results[index] = form.constant
                continue
            stretches.append(form.assemble(content, reasoning))
            owners.append((index, form.constant))
        for (index, constant), counted in zip(
            owners, self._tokens.stretches(stretches), strict=True
        ):
            results[index] = counted + constant
        return results  # type: ignore[return-value]

    def _rendered(self, content: str, reasoning: str) -> int:
        """The exact count, by rendering the probe conversation with the reply itself."""
        assert self._template is not None
        shape = (bool(reasoning), bool(content))
        conversation = _reply_probe(self._call_id, shape, content, reasoning)
        rendered = self._template.render(conversation, add_generation_prompt=True)
        return self._tokens.whole(rendered) - self._reference


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
