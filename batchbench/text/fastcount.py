"""Exact token counts of plain-ASCII text for byte-level BPE tokenizers, without the
tokenizer's own pre-tokenizer.

Every reply is counted before its next prompt is sized (``batchbench.text.framing``). With
the ``tokenizers`` library that costs about 1.5 µs per token on DeepSeek-V3 and Qwen, and
most of it is the pre-tokenizer: Oniguruma regexes with Unicode classes. For ASCII text
those classes are small fixed sets, so the same splits can run in Python's ``re`` (C), and
BPE never merges across a split, so a text's count is the sum of its pieces' counts, each
computed once by the tokenizer's own BPE model and then remembered.

Exactness is not assumed: :func:`ascii_counter` accepts only a tokenizer whose pipeline it
understands (no normalizer but NFC, ``Split`` stages with isolated matches, then
``ByteLevel`` without a prefix space or its own regex, a plain BPE model), translates each
stage's pattern (refusing any construct it does not know), and then checks itself against
the real tokenizer on a probe set of texts before it is used. ``count`` answers None for a
text it cannot take (not ASCII, or holding an added token's text): the caller encodes it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from tokenizers import Tokenizer

# ASCII members of the Unicode classes the pre-tokenizers use.
_WHITESPACE = "\\t\\n\\x0b\\x0c\\r "
_CLASSES = {
    "L": "A-Za-z",
    "Lu": "A-Z",
    "Ll": "a-z",
    "Lt": "",
    "Lm": "",
    "Lo": "",
    "M": "",
    "N": "0-9",
    "Nd": "0-9",
    "P": re.escape("!\"#%&'()*,-./:;?@[\\]_{}"),
    "S": re.escape("$+<=>^`|~"),
}
# Escapes that mean the same in Oniguruma and Python's re.
_PLAIN_ESCAPES = set("rnt-[]\\/.^$|?*+(){}'\"!#%&,:;<=>@_`~ ")
_NEVER = "(?!)"


class Untranslatable(ValueError):
    """A pattern construct this module does not translate."""


def translate(pattern: str) -> str:
    """The Oniguruma ``pattern`` as a Python ``re`` pattern that splits ASCII text the
    same way (``\\p{..}``, ``\\s``, ``\\S`` replaced by their ASCII members)."""
    out: list[str] = []
    in_class = False
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\":
            if i + 1 >= len(pattern):
                raise Untranslatable("a trailing backslash")
            nxt = pattern[i + 1]
            if nxt in "pP":
                if nxt == "P" or i + 2 >= len(pattern) or pattern[i + 2] != "{":
                    raise Untranslatable(f"\\{nxt} at {i}")
                end = pattern.index("}", i)
                name = pattern[i + 3 : end]
                if name not in _CLASSES:
                    raise Untranslatable(f"\\p{{{name}}}")
                members = _CLASSES[name]
                if in_class:
                    out.append(members)
                else:
                    out.append(f"[{members}]" if members else _NEVER)
                i = end + 1
                continue
            if nxt == "s":
                out.append(_WHITESPACE if in_class else f"[{_WHITESPACE}]")
            elif nxt == "S":
                if in_class:
                    raise Untranslatable("\\S inside a class")
                out.append(f"[^{_WHITESPACE}]")
            elif nxt in _PLAIN_ESCAPES:
                out.append(pattern[i : i + 2])
            else:
                raise Untranslatable(f"\\{nxt}")
            i += 2
            continue
        if ch == "[" and not in_class:
            in_class = True
            out.append(ch)
            if pattern.startswith("^", i + 1):
                out.append("^")
                i += 1
            i += 1
            continue
        if ch == "]" and in_class:
            in_class = False
        elif ch == "[":
            raise Untranslatable("a nested class")
        out.append(ch)
        i += 1
    if in_class:
        raise Untranslatable("an unclosed class")
    translated = "".join(out)
    if "[]" in translated or "[^]" in translated:
        raise Untranslatable("a class with no ASCII member")
    return translated


def _byte_level_table() -> dict[int, str]:
    """GPT-2's byte-to-character map, for the ASCII bytes."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {}
    shift = 0
    for byte in range(256):
        if byte in printable:
            char = chr(byte)
        else:
            char = chr(256 + shift)
            shift += 1
        if byte < 128:
            table[byte] = char
    return table


class _Counts(dict):
    """Piece -> its BPE token count, filled on first use."""

    def __init__(self, tokenize: Callable[[str], list], table: dict[int, str]) -> None:
        super().__init__()
        self._tokenize = tokenize
        self._table = table

        self[""] = 0  # the empty strings a captured split leaves between adjacent matches

    def __missing__(self, piece: str) -> int:
        count = self[piece] = len(self._tokenize(piece.translate(self._table)))
        return count


# Texts the counter must count exactly as the tokenizer does before it is trusted.
PROBES = (
    "The quick brown fox jumps over the lazy dog.",
    "def f(x):\n    return x * 2  # double it\n\nprint(f(21))\n",
    "  leading and trailing spaces  ",
    "tabs\tand\t\ttabs\n\n\nnewlines\r\nCRLF\r\n",
    "numbers 1 12 123 1234 12345 3.14159 -42 1e10 0x1F",
    "I'm you're we've they'll she'd it's DON'T I'D",
    "!!! ??? ... --- *** ### $$$ %%% &&& @@@ ^^^ ~~~ ``` |||",
    "a.b,c;d:e!f?g(h)i[j]k{l}m<n>o/p\\q|r_s-t+u=v*w&x^y%z$#@~`'\"",
    '{"key": [1, 2, {"nested": true}], "s": "x\\ny"}',
    "    indented\n        more\n    less\n",
    "\n \n  \n   \n",
    "CamelCaseWords and snake_case_words and kebab-case-words",
    "x" * 50 + " " + "ab" * 30,
    "a\x00b\x01c\x1fd\x7f e\x0bf\x0cg",
    "   \t  \t",
    "",
)


def _trie_pattern(words: list[str]) -> str:
    """One regex matching any of ``words``, factored by common prefixes (a thousand added
    tokens that share ``<|place_holder_`` cost one comparison per character, not one per
    token)."""
    trie: dict = {}
    for word in words:
        node = trie
        for char in word:
            node = node.setdefault(char, {})
        node[""] = {}

    def build(node: dict) -> str:
        ends = "" in node
        branches = [re.escape(char) + build(child) for char, child in sorted(node.items()) if char]
        if not branches:
            return ""
        body = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
        if ends:
            return "(?:" + body + ")?"
        return body

    return build(trie)


class AsciiCounter:
    """Counts ASCII texts as one tokenizer does (see the module's docstring)."""

    def __init__(
        self, stages: list[tuple[re.Pattern[str], bool]], counts: _Counts, added: list[str]
    ) -> None:
        # An isolated Split keeps matches and the stretches between them, in order: a
        # split with the pattern captured (its empty strings count 0). A Split that keeps
        # only its matches (MiniMax: "Removed", inverted) is a findall.
        self._splits = [
            stage.findall if matches_only else re.compile(f"({stage.pattern})").split
            for stage, matches_only in stages
        ]
        self._counts = counts
        self._added = re.compile(_trie_pattern(added)) if added else None

    def count(self, text: str) -> int | None:
        """The token count of ``text`` (no special tokens), or None when it is not ASCII
        or holds an added token's text."""
        if not text.isascii():
            return None
        if self._added is not None and self._added.search(text):
            return None
        pieces = [text]
        for split in self._splits:
            if len(pieces) == 1:
                pieces = split(pieces[0])
            else:
                pieces = [part for piece in pieces for part in split(piece)]
        return sum(map(self._counts.__getitem__, pieces))


def _stages_of(document: dict) -> list[tuple[str, bool]] | None:
    """The Split patterns of a byte-level pre-tokenizer, each with True when the stage
    keeps only its matches, or None when it is another kind (``document``: the
    tokenizer's normalizer, pre-tokenizer and model settings)."""
    normalizer = document.get("normalizer")
    if normalizer is not None:
        kinds = (
            [n.get("type") for n in normalizer.get("normalizers", [])]
            if normalizer.get("type") == "Sequence"
            else [normalizer.get("type")]
        )
        if any(kind != "NFC" for kind in kinds):  # NFC leaves ASCII alone
            return None
    pre = document.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    if not steps or steps[-1].get("type") != "ByteLevel":
        return None
    last = steps[-1]
    if last.get("add_prefix_space") or last.get("use_regex", True):
        return None
    patterns = []
    for step in steps[:-1]:
        if step.get("type") != "Split" or "Regex" not in step.get("pattern", {}):
            return None
        mode = (step.get("behavior"), bool(step.get("invert")))
        if mode not in (("Isolated", False), ("Removed", True)):
            return None
        patterns.append((step["pattern"]["Regex"], mode == ("Removed", True)))
    model = document.get("model") or {}
    if model.get("type") != "BPE" or model.get("dropout") or model.get("byte_fallback"):
        return None
    if model.get("continuing_subword_prefix") or model.get("end_of_word_suffix"):
        return None
    return patterns or None


def _settings(tokenizer: Tokenizer) -> dict:
    """The parts of the tokenizer's JSON this module reads, without serializing the
    vocabulary (a whole ``to_str`` costs about 100 ms)."""
    model = tokenizer.model
    return {
        "normalizer": _state(tokenizer.normalizer),
        "pre_tokenizer": _state(tokenizer.pre_tokenizer),
        "model": {
            "type": type(model).__name__,
            **{
                name: getattr(model, name, None)
                for name in (
                    "dropout",
                    "byte_fallback",
                    "continuing_subword_prefix",
                    "end_of_word_suffix",
                )
            },
        },
    }


def _state(component) -> dict | None:
    return None if component is None else json.loads(component.__getstate__())


def _can_match_ascii(pattern: str) -> bool:
    """False for a pattern that is one class of non-ASCII characters (DeepSeek's CJK
    stage): it never splits ASCII text, so the stage is skipped."""
    return re.fullmatch(r"\[(?:[^\x00-\x7f]|-)+\][+*]?", pattern) is None


def ascii_counter(tokenizer: Tokenizer) -> AsciiCounter | None:
    """A checked fast counter for ``tokenizer``, or None when it does not qualify."""
    try:
        patterns = _stages_of(_settings(tokenizer))
    except (ValueError, TypeError, AttributeError):
        return None
    if patterns is None:
        return None
    stages = []
    try:
        for pattern, matches_only in patterns:
            translated = translate(pattern)
            if matches_only or _can_match_ascii(translated):  # else it never splits ASCII
                stages.append((re.compile(translated), matches_only))
    except (Untranslatable, re.error):
        return None
    if not stages or any(stage.groups or stage.fullmatch("") for stage, _ in stages):
        return None  # a capturing group or an empty match would change the split
    added = sorted(
        {
            token.content
            for token in tokenizer.get_added_tokens_decoder().values()
            if token.content and token.content.isascii()
        }
    )
    counter = AsciiCounter(stages, _Counts(tokenizer.model.tokenize, _byte_level_table()), added)
    for probe in PROBES:
        expected = len(tokenizer.encode(probe, add_special_tokens=False).ids)
        if counter.count(probe) not in (expected, None):
            return None
    return counter
