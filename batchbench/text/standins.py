"""Stand-ins: block texts counted in a chat template without encoding them.

A text of the synthesizer's fast method (``batchbench.text.synth``) is a head then fast
pieces, a space and letters each, and every piece is proven to stay one aligned token
whatever head or piece precedes or follows it. So the pieces between the first and the
last one can be left out of a rendering and added back as a count: a request rendered
with each block text replaced by its **stand-in** (the head, the first piece and the last
piece, as they are joined in the text) costs the full request's tokens minus the pieces
left out. What the template puts around a text meets the same characters in both
renderings (the head and first piece before, the last piece after), so the framing's
tokens are counted as they are in the full prompt; only the short stand-ins are encoded.

The count is trusted only where the template prints each stand-in verbatim exactly once
per block that holds it (``hidden_tokens``); a text it drops, repeats or rewrites is
counted in full instead. What this assumes of a template is that one printing a stand-in
verbatim prints a text verbatim in its place (templates copy contents; none cuts them to
a length). Whether counts add up this way for a tokenizer and template is
also checked once on sample requests (``batchbench.text.standincheck``): a tokenizer for
which they do not (a normalizer that rewrites across the pieces, say) is counted in full
throughout. Tool blocks are sized the same way (``BlockTexts``): their JSON wrapper is
encoded around the stand-in.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

# Characters searched for stand-ins in one rendering, at most (stand-ins times the
# rendering's length: each is looked for in all of it). Beyond (a few hundred blocks),
# finding them costs milliseconds a request, about what counting the request in full
# does, and it is counted in full.
SEARCH_BUDGET = 1 << 22


def stand_in(text: str) -> tuple[str, str, int]:
    """``text`` without the pieces between its first and last one; the stand-in itself
    (from the head to the last piece: the words a template prints as they are, without
    the JSON a tool call wraps them in); and how many pieces were left out (0, with the
    text itself twice, when there are none). Pieces start at spaces: a fast-method text
    has no other, nor has the compact JSON around a tool call's text."""
    first = text.find(" ")
    if first < 0:
        return text, text, 0
    second = text.find(" ", first + 1)
    last = text.rfind(" ")
    if second < 0 or second >= last:
        return text, text, 0
    short = text[:second] + text[last:]
    start = first
    while start and short[start - 1].isalpha():
        start -= 1
    end = second + 1
    while end < len(short) and short[end].isalpha():
        end += 1
    return short, short[start:end], text.count(" ", second, last)


@dataclass
class StandIns:
    """The stand-ins of one rendering: the tokens each hides and how many blocks hold it.
    Texts whose stand-in is in ``excluded`` (one a previous rendering could not trust) are
    kept whole."""

    excluded: frozenset[str] = frozenset()
    hidden: dict[str, tuple[int, int]] = field(default_factory=dict)
    ambiguous: bool = False  # stand-ins alike that hide different counts: count in full

    def shorten(self, text: str) -> str:
        return self.use(text, *stand_in(text))[0]

    def use(self, text: str, short: str, key: str, left_out: int) -> tuple[str, int]:
        """``shorten`` given the text's ``stand_in`` (kept by callers that reuse texts),
        with the tokens it leaves out (0 when the text is kept whole)."""
        if left_out == 0 or key in self.excluded:
            return text, 0
        known = self.hidden.get(key)
        if known is None:
            self.hidden[key] = (left_out, 1)
        elif known[0] != left_out:
            self.ambiguous = True
        else:
            self.hidden[key] = (left_out, known[1] + 1)
        return short, left_out


def hidden_tokens(rendered: str, stand_ins: StandIns) -> tuple[int, list[str]]:
    """The tokens the stand-ins of ``rendered`` hide, and the stand-ins not printed exactly
    once per block that holds them (their texts must be counted in full)."""
    total = 0
    untrusted = []
    for key, (left_out, blocks) in stand_ins.hidden.items():
        if rendered.count(key) == blocks:
            total += left_out * blocks
        else:
            untrusted.append(key)
    return total, untrusted


class RenderingCounter(Protocol):
    """A prompt counter that also gives the text it counted (``SegmentCounter``)."""

    def __call__(self, messages: list[dict], tools: list[dict] | None = None) -> int: ...

    def count_rendered(self, messages: list[dict], tools: list[dict]) -> tuple[int, str]: ...

    def encode_ids(
        self, messages: Sequence[Any], add_generation_prompt: bool = True, tools: Any = None
    ) -> list[int]: ...


Build = Callable[[StandIns | None], tuple[list[dict], list[dict]]]
T = TypeVar("T")


def trusted(render: Callable[[StandIns], tuple[str, T]]) -> tuple[int, T] | None:
    """The tokens the stand-ins of a rendering hide, and what ``render`` gave with that
    rendering, when the template prints each stand-in once per block that holds it.
    ``render`` shortens texts through the ``StandIns`` it is handed; a text whose stand-in
    is not printed so is put back whole and everything rendered again. None (count in
    full) for texts that share a stand-in, a second failure, or stand-ins that would take
    more than ``SEARCH_BUDGET`` characters to look for."""
    excluded: frozenset[str] = frozenset()
    for _ in range(2):
        stand_ins = StandIns(excluded)
        rendered, result = render(stand_ins)
        if stand_ins.ambiguous or len(stand_ins.hidden) * len(rendered) > SEARCH_BUDGET:
            return None
        hidden, untrusted = hidden_tokens(rendered, stand_ins)
        if not untrusted:
            return hidden, result
        excluded = excluded.union(untrusted)
    return None


def counted(counter: RenderingCounter, build: Build, enabled: bool) -> int:
    """The prompt's tokens with its generation prompt. ``build`` gives the request's
    messages and tools, its texts shortened through the ``StandIns`` it is handed (whole
    for None); with stand-ins ``enabled`` they are used where ``trusted``."""
    if enabled:

        def render(stand_ins: StandIns) -> tuple[str, int]:
            count, rendered = counter.count_rendered(*build(stand_ins))
            return rendered, count

        found = trusted(render)
        if found is not None:
            hidden, count = found
            return count + hidden
    messages, tools = build(None)
    return counter(messages, tools)
