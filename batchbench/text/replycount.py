"""Counting a model's reply as the next prompt renders it.

The driver replays each reply (trimmed) in the next request, and a real reply need not
re-encode to its ``completion_tokens``. It is counted inside the template text the
conversation actually sent gives it: the chat template is rendered once per reply shape
(with or without reasoning, with text or empty), since Qwen-style templates put
``</think>\n\n`` before a thinking reply and ``assistant\n`` before a plain one, frame
reasoning in ``<think>`` blocks and drop the newline before a tool call when the text is
empty. Within its stretch of template text (between two added tokens, where nothing
beyond can merge with it) the reply is counted whole, so its first and last characters
merge with the text around them as the server's tokenizer merges them: under GPT-2's
pre-tokenizer a letter after "\n\n" splits the newlines, a digit does not.

ASCII stretches are counted by ``batchbench.text.fastcount`` when the tokenizer allows it
(4-8 times cheaper), after a check on probe texts that both ways agree in every form.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Protocol

from batchbench.text.fastcount import PROBES, ascii_counter
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


# The shapes of a reply the template may render differently: (has reasoning, has content).
ReplyShape = tuple[bool, bool]
REFERENCE_SHAPE: ReplyShape = (False, True)
_SHAPES: tuple[ReplyShape, ...] = ((False, True), (False, False), (True, True), (True, False))
_HOLES = {_ASSISTANT_SENTINEL: "content", _REASONING_SENTINEL: "reasoning"}
# Text that looks like template structure (``<tool_call>``, ``</think>``, ``<|im_end|>``):
# a template may test a reply for it (Qwen3 splits a text at "</think>").
_TAG = re.compile(r"<[^<>\s]{1,40}>")


# The synthetic tool call the driver appends to every reply of a growth conversation:
# one definition, so the forms are probed with exactly what is sent.
TOOL_CALL_ARGUMENTS = '{"request":"continue"}'


def environment_calls(call_id: str) -> list[dict[str, Any]]:
    """The ``tool_calls`` of a replayed reply: one call of the ``environment`` tool."""
    return [
        {
            "id": call_id,
            "type": "function",
            "function": {"name": "environment", "arguments": TOOL_CALL_ARGUMENTS},
        }
    ]


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
    assistant["tool_calls"] = environment_calls(call_id)
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
    # True when the template renders a text of this shape more than once: such replies
    # are counted by rendering the conversation with them.
    rendered: bool = False

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
        self._encode_batch = getattr(tokenizer, "encode_batch_fast", None) or tokenizer.encode_batch
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
            encoded = self._encode_batch([prefix + t for t in missing], add_special_tokens=False)
            drop = 1 if self.anchor is not None else 0
            lengths = iter(
                len(encoding.ids) - drop if text else 0
                for encoding, text in zip(encoded, missing, strict=True)
            )
            counts = [next(lengths) if counted is None else counted for counted in counts]
        return counts  # type: ignore[return-value]  # every None was just counted


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
    # A text the template prints twice, or a stretch that also holds the user's or the tool's
    # text (no added token between them), has no single form: such replies are rendered.
    if any(rendered.count(sentinel) > 1 for _, sentinel in found) or any(
        sentinel in rendered[start:stop] for sentinel in (_USER_SENTINEL, _TOOL_SENTINEL)
    ):
        return ReplyForm(("",), (), 0, rendered=True), tokens.whole(rendered), rendered
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


def _prints_verbatim(template: RendersChat, call_id: str) -> bool:
    """True when the template prints a reply's text as it is (no escaping, no JSON):
    quotes, newlines, angle brackets and backslashes come back unchanged."""
    awkward = _ASSISTANT_SENTINEL + ' "quoted"\n<b>&amp; back\\slash'
    conversation = _reply_probe(call_id, REFERENCE_SHAPE, content=awkward)
    rendered = template.render(conversation, add_generation_prompt=True)
    return awkward in rendered


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
        # One search for all tags (a template's source may name hundreds of added tokens).
        self._tags = (
            re.compile("|".join(re.escape(t) for t in sorted(tags, key=len, reverse=True)))
            if tags
            else None
        )
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
        # Tags a template could act on: those it prints, and those its source names
        # (QwQ's cuts a text at "</think>" without ever printing it in a probe).
        tags: set[str] = {m for m in markers if _TAG.fullmatch(m)}
        tags.update(_TAG.findall(getattr(template, "source", "")))
        verbatim = _prints_verbatim(template, call_id)
        for shape in _SHAPES:
            form, raws[shape], rendered = _reply_form(template, tokens, markers, call_id, shape)
            if not verbatim and form.holes:
                form = ReplyForm(("",), (), 0, rendered=True)
                raws[shape] = tokens.whole(rendered)
            forms[shape] = form
            tags.update(_TAG.findall(rendered))
        reference = forms[REFERENCE_SHAPE]
        if reference.rendered:  # counts relative to an empty text's
            base = raws[(False, False)]
        else:
            base = raws[REFERENCE_SHAPE]
            if reference.holes:  # the text's own context (a template may drop the text)
                base += sum(tokens.stretches(list(reference.pieces), ascii_ok=False))
        forms = {
            shape: ReplyForm(form.pieces, form.holes, raws[shape] - base, form.rendered)
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
            form = self.forms[(bool(reasoning), bool(content))]
            tags = self._tags
            if form.rendered or (
                tags is not None
                and ("<" in content or "<" in reasoning)
                and (tags.search(content) or tags.search(reasoning))
            ):
                results[index] = self._rendered(content, reasoning)
                continue
            if not form.holes:
                results[index] = form.constant
                continue
            stretches.append(form.assemble(content, reasoning))
            owners.append((index, form.constant))
        for (index, constant), counted in zip(
            owners, self._tokens.stretches(stretches), strict=True
        ):
            results[index] = counted + constant
        return results  # type: ignore[return-value]  # every entry is set by now

    def _rendered(self, content: str, reasoning: str) -> int:
        """The exact count, by rendering the probe conversation with the reply itself."""
        assert self._template is not None
        shape = (bool(reasoning), bool(content))
        conversation = _reply_probe(self._call_id, shape, content, reasoning)
        rendered = self._template.render(conversation, add_generation_prompt=True)
        return self._tokens.whole(rendered) - self._reference
