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
stage's pattern (refusing any construct it does not know or that Python's ``re`` reads
otherwise, such as ``^`` and ``$``: see :func:`translate`), and then checks itself against
the real tokenizer on a probe set of texts before it is used. ``count`` answers None for a
text it cannot take (not ASCII, or holding an added token's text): the caller encodes it.
"""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Callable
from itertools import islice
from typing import NoReturn

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
# Escapes that mean the same in Oniguruma and Python's re: three control characters and
# escaped punctuation, which both read as the character itself (Oniguruma's default
# syntax, the one ``tokenizers`` compiles with, has no GNU buffer anchors \` and \').
_PLAIN_ESCAPES = set("rnt-[]\\/.^$|?*+(){}'\"!#%&,:;<=>@_`~ ")
_ESCAPED_CHAR = {"r": "\r", "n": "\n", "t": "\t"}
_NEVER = "(?!)"
# Literal characters escaped when written into a class: Python reads a leading ^ as a
# negation, \ [ ] and - as syntax, and warns on doubled & ~ | (future set operations).
_CLASS_SPECIAL = set("\\[]^-&~|")
_INTERVAL = re.compile(r"\{(\d*)(,?)(\d*)\}")

# Why each refused construct is refused (see ``translate``).
_LINE_ANCHOR = "a line anchor in Oniguruma, a text anchor in Python without re.M"
_REFUSED_ESCAPES = {
    "A": "a text anchor",
    "z": "a text anchor (not in Python's re before 3.14)",
    "Z": "the end or before a final newline in Oniguruma, the very end in Python",
    "b": "a word boundary (a backspace inside a class)",
    "B": "a non-word boundary",
    "G": "the search start anchor of Oniguruma",
    "K": "Oniguruma's keep (moves the match start)",
    "R": "Oniguruma's general newline",
    "X": "Oniguruma's text segment",
    "y": "Oniguruma's text segment boundary",
    "Y": "Oniguruma's text segment non-boundary",
    "N": "Oniguruma's non-newline",
    "O": "Oniguruma's any character",
    "h": "a hex digit in Oniguruma, an error in Python",
    "H": "a non-hex digit in Oniguruma, an error in Python",
    "d": "a Unicode class not translated",
    "D": "a Unicode class not translated",
    "w": "a Unicode class not translated",
    "W": "a Unicode class not translated",
    "x": "a code escape (\\x{..} is a code point in Oniguruma, an error in Python)",
    "u": "a code escape",
    "o": "an octal code escape in Oniguruma",
    "c": "a control escape in Oniguruma",
    "C": "a control escape in Oniguruma",
    "M": "a meta escape in Oniguruma",
    "k": "a backreference by name",
    "g": "a subexpression call in Oniguruma",
    "P": "a negated property",
}
_REFUSED_GROUPS = {
    "(?>": "an atomic group",
    "(?<": "a named group (in Oniguruma it also turns plain groups non-capturing)",
    "(?'": "a named group",
    "(?P": "a Python-only group",
    "(?#": "a comment",
    "(?~": "an Oniguruma absent group",
    "(?(": "a conditional group",
    "(?{": "an Oniguruma callout",
}
_GROUP_OPENERS = {
    "(?:": "group",
    "(?=": "look",
    "(?!": "look",
    "(?<=": "look",
    "(?<!": "look",
    "(?i:": "ignorecase",
}
_INLINE_OPTION = (
    "an inline option other than (?i:...) (m is dot-all in Oniguruma, multi-line in Python; "
    "an isolated option runs to its group's end in Oniguruma, is global in Python)"
)


class Untranslatable(ValueError):
    """A pattern construct this module does not translate."""


def translate(pattern: str) -> str:
    """The Oniguruma ``pattern`` as a Python ``re`` pattern that splits ASCII text the
    same way (``\\p{..}``, ``\\s``, ``\\S`` replaced by their ASCII members).

    It accepts only constructs that mean the same on ASCII text in Oniguruma's default
    syntax (the one ``tokenizers`` compiles with) and in Python: literal characters,
    ``.`` (anything but ``\\n`` in both), the escapes of ``_PLAIN_ESCAPES``, the
    properties of ``_CLASSES``, ``\\s`` and ``\\S``; classes of those (``^`` negating,
    ranges between two characters); ``|``; plain, non-capturing and look-around groups;
    ``(?i:..)`` holding only ASCII literals; the quantifiers ``* + ? {n} {n,} {n,m} {,m}``
    and their lazy forms except ``{n}?``. Anything else raises :class:`Untranslatable`
    (its message names the construct, where it is and why), notably:

    - ``^`` and ``$`` outside a class (line anchors in Oniguruma, text anchors in Python),
      and every other anchor or boundary (``\\A \\z \\Z \\b \\B \\G \\K``);
    - possessive quantifiers (``*+ ++ ?+``; ``{n,m}+`` repeats again in Oniguruma and is
      possessive in Python), ``{n}?`` (optional in Oniguruma, plain in Python),
      ``{n,m}`` with n > m (possessive in Oniguruma), a quantifier on a quantifier;
    - atomic, named, conditional, absent and comment groups, inline options other than
      ``(?i:``, callouts, backreferences and subexpression calls;
    - Oniguruma-only escapes (``\\h \\R \\X \\K \\x{..} \\o{..}``) and classes this
      module does not translate (``\\d \\w \\D \\W``: the same on ASCII, but no
      tokenizer needs them);
    - nested classes and POSIX brackets (``[[:alpha:]]``), ``&&`` (an intersection in
      Oniguruma) and the other doubled operators Python reserves;
    - a pattern that can match the empty string, assertions taken as passing: after an
      empty match Python retries at the same place for a longer one, the tokenizer's
      ``onig`` iterator steps one character on, so the splits can differ.
    """
    return _Translator(pattern).run()


class _Translator:
    """A recursive-descent pass over one pattern, writing the Python pattern as it goes."""

    def __init__(self, pattern: str) -> None:
        self.src = pattern
        self.i = 0
        self.out: list[str] = []

    def refuse(self, construct: str, reason: str, at: int | None = None) -> NoReturn:
        where = self.i if at is None else at
        raise Untranslatable(f"{construct} at {where}: {reason}")

    def peek(self, offset: int = 0) -> str:
        at = self.i + offset
        return self.src[at] if at < len(self.src) else ""

    def run(self) -> str:
        nullable = self.alternation(ignorecase=False)
        if self.i < len(self.src):  # only a ')' stops an alternation early
            self.refuse(")", "an unbalanced parenthesis")
        if nullable:
            self.refuse("the pattern", "it can match the empty string", at=0)
        translated = "".join(self.out)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                re.compile(translated)
        except (re.error, Warning) as exc:
            raise Untranslatable(f"Python's re rejects the translation: {exc}") from None
        return translated

    def alternation(self, ignorecase: bool) -> bool:
        """Alternatives up to a ')' or the end; True when one can match nothing."""
        nullable = self.sequence(ignorecase)
        while self.peek() == "|":
            self.out.append("|")
            self.i += 1
            nullable = self.sequence(ignorecase) or nullable
        return nullable

    def sequence(self, ignorecase: bool) -> bool:
        nullable = True
        while self.i < len(self.src) and self.src[self.i] not in "|)":
            atom_nullable, repeatable = self.atom(ignorecase)
            optional = self.quantifier(repeatable)
            nullable = nullable and (atom_nullable or optional)
        return nullable

    def quantifier(self, repeatable: bool) -> bool:
        """Copy a quantifier if one follows; True when it allows zero repetitions."""
        start, ch = self.i, self.peek()
        if ch in ("*", "+", "?"):
            text, optional, exact = ch, ch != "+", False
        elif ch == "{":
            interval = _INTERVAL.match(self.src, self.i)
            if interval is None:
                self.refuse("{", "a brace that is not a repetition")
            text = interval.group()
            low, comma, high = interval.groups()
            if not low and not high:
                self.refuse(text, "an empty repetition")
            if low and high and int(low) > int(high):
                self.refuse(text, "n > m: possessive in Oniguruma, an error in Python")
            optional, exact = not low or int(low) == 0, not comma
        else:
            return False
        if not repeatable:
            self.refuse(text, "a quantifier with nothing to repeat")
        self.i += len(text)
        if self.peek() == "?":
            if exact:
                self.refuse(text + "?", "optional in Oniguruma, exact in Python", at=start)
            text += "?"
            self.i += 1
        elif self.peek() == "+":
            self.refuse(text + "+", "possessive, or a repeated repetition", at=start)
        if self.peek() and self.peek() in "*+?{":
            self.refuse(self.src[start : self.i + 1], "a quantifier on a quantifier", at=start)
        self.out.append(text)
        return optional

    def atom(self, ignorecase: bool) -> tuple[bool, bool]:
        """Copy one atom; (can it match nothing, can it take a quantifier)."""
        ch = self.src[self.i]
        if ch == "(":
            return self.group(ignorecase)
        if ch == "\\":
            return self.escape(ignorecase)
        if ch in ("^", "$"):
            self.refuse(ch, _LINE_ANCHOR)
        if ch in ("*", "+", "?", "{"):
            self.quantifier(repeatable=False)  # refuses: nothing to repeat, or a stray {
        if ch in ("]", "}"):
            self.refuse(ch, "an unescaped closing bracket outside a class")
        if ignorecase and (ch in ("[", ".") or not ch.isascii()):
            self.refuse(ch, "(?i:...) holding more than ASCII literals")
        if ch == "[":
            return self.char_class(), True
        self.out.append(ch)  # '.' or a literal
        self.i += 1
        return False, True

    def group(self, ignorecase: bool) -> tuple[bool, bool]:
        start = self.i
        if ignorecase:
            self.refuse("(", "(?i:...) holding more than ASCII literals")
        kind, opener = "group", "("
        if self.src.startswith("(?", start):
            known = [(o, k) for o, k in _GROUP_OPENERS.items() if self.src.startswith(o, start)]
            if not known:
                construct = self.src[start : start + 3]
                self.refuse(construct, _REFUSED_GROUPS.get(construct, _INLINE_OPTION))
            opener, kind = known[0]
        elif self.src.startswith("(*", start):
            self.refuse("(*", "an Oniguruma callout")
        self.out.append(opener)
        self.i += len(opener)
        nullable = self.alternation(ignorecase=kind == "ignorecase")
        if self.peek() != ")":
            self.refuse(opener, "an unclosed group", at=start)
        self.out.append(")")
        self.i += 1
        if kind == "look":
            return True, False  # zero-width, and not repeated
        return nullable, True

    def escape(self, ignorecase: bool) -> tuple[bool, bool]:
        """An escape outside a class."""
        nxt = self.peek(1)
        if nxt in ("p", "s", "S"):
            if ignorecase:
                self.refuse("\\" + nxt, "(?i:...) holding more than ASCII literals")
            members = self.members()
            if nxt == "S":
                self.out.append(f"[^{members}]")
            else:
                self.out.append(f"[{members}]" if members else _NEVER)
            return False, True
        self.out.append(self.plain_escape()[0])
        return False, True

    def plain_escape(self) -> tuple[str, str]:
        """Read an escape of ``_PLAIN_ESCAPES``: its text and the character it means."""
        nxt = self.peek(1)
        if not nxt:
            self.refuse("\\", "a trailing backslash")
        if nxt not in _PLAIN_ESCAPES:
            reason = _REFUSED_ESCAPES.get(nxt, "an escape this module does not translate")
            if nxt.isdigit():
                reason = "a backreference or an octal code"
            self.refuse("\\" + nxt, reason)
        self.i += 2
        return "\\" + nxt, _ESCAPED_CHAR.get(nxt, nxt)

    def members(self) -> str:
        """The ASCII members of ``\\p{..}``, ``\\s`` or ``\\S`` (read, not written)."""
        nxt = self.peek(1)
        if nxt in ("s", "S"):
            self.i += 2
            return _WHITESPACE
        if self.peek(2) != "{":
            self.refuse(self.src[self.i : self.i + 3], "a one-letter property")
        end = self.src.find("}", self.i)
        if end < 0:
            self.refuse("\\p{", "an unclosed property")
        name = self.src[self.i + 3 : end]
        if name not in _CLASSES:
            self.refuse(f"\\p{{{name}}}", "a property with no ASCII table here")
        self.i = end + 1
        return _CLASSES[name]

    def char_class(self) -> bool:
        """Copy a class; False (a class matches one character)."""
        start = self.i
        self.i += 1
        negated = self.peek() == "^"
        if negated:
            self.i += 1
        body: list[str] = []
        first = True
        while True:
            ch = self.peek()
            if not ch:
                self.refuse("[", "an unclosed class", at=start)
            if ch == "]":
                if first:
                    self.refuse("]", "a ] first in a class")
                break
            if ch == "[":
                self.refuse("[", "a nested class or a POSIX bracket ([[:alpha:]])")
            if ch in ("&", "~", "|", "-") and self.peek(1) == ch:
                self.refuse(ch * 2, "a set operation (Oniguruma's &&, Python's reserved ones)")
            if ch == "-" and (first or self.peek(1) == "]"):
                body.append("\\-")
                self.i += 1
                first = False
                continue
            if ch == "-":
                self.refuse("-", "a range that does not join two characters")
            low_at = self.i
            low = self.class_item(body)
            if self.peek() == "-" and self.peek(1) != "]":
                if low is None:
                    self.refuse("-", "a range from a class")
                self.i += 1
                body.append("-")
                high = self.class_item(body)
                if high is None or ord(high) < ord(low):
                    construct = self.src[low_at : self.i]
                    self.refuse(construct, "not a range of two characters", at=low_at)
            first = False
        self.i += 1
        if not "".join(body):
            kind = "a negated class" if negated else "a class"
            self.refuse(kind, "no ASCII member to write", at=start)
        self.out.append("[^" if negated else "[")
        self.out.extend(body)
        self.out.append("]")
        return False

    def class_item(self, body: list[str]) -> str | None:
        """Write one class member to ``body``: the character, or None for a set."""
        ch = self.peek()
        if ch == "\\":
            nxt = self.peek(1)
            if nxt == "S":
                self.refuse("\\S", "\\S inside a class")
            if nxt in ("p", "s"):
                body.append(self.members())
                return None
            text, char = self.plain_escape()
            body.append(text)
            return char
        if ch == "[":
            self.refuse("[", "a nested class or a POSIX bracket ([[:alpha:]])")
        body.append("\\" + ch if ch in _CLASS_SPECIAL else ch)
        self.i += 1
        return ch


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


# Bounds of the piece cache (see ``_Counts``).
CACHE_ENTRIES = 1 << 16
CACHE_PIECE_CHARS = 256


class _Counts(dict):
    """Piece -> its BPE token count, filled on first use, holding at most ``limit`` pieces
    of at most ``CACHE_PIECE_CHARS`` characters (a longer piece is counted every time).

    A hit stays a plain dict lookup in C (``AsciiCounter.count`` maps ``__getitem__``);
    only a miss runs Python. When the cache is full, a miss drops the older half of the
    entries (insertion order): amortized O(1) per miss, and the newer half is kept. An LRU
    would make every hit pay for its bookkeeping: ``functools.lru_cache`` cost 1.16-1.55x
    this dict per piece with nothing evicted, and under pressure (a bound 16 times below the
    distinct pieces) the three policies were within noise of each other, dropping half
    calling BPE less often than clearing everything (193k vs 210k calls); see
    ``benchmarks/bench_piece_cache.py``. The bound: the 4.1M pieces of the stdlib's Python
    hold 37k distinct ones, so 65536 entries keep a large working set; a full cache takes
    3.5 MiB at those pieces and 21 MiB at the length cap, the worst case.
    """

    def __init__(
        self, tokenize: Callable[[str], list], table: dict[int, str], limit: int = CACHE_ENTRIES
    ) -> None:
        super().__init__()
        self._tokenize = tokenize
        self._table = table
        self._limit = max(limit, 2)
        self[""] = 0  # the empty strings a captured split leaves between adjacent matches

    def __missing__(self, piece: str) -> int:
        count = len(self._tokenize(piece.translate(self._table)))
        if len(piece) <= CACHE_PIECE_CHARS:
            if len(self) >= self._limit:
                for old in list(islice(self, len(self) // 2)):
                    del self[old]  # the empty piece too: a miss counts it as 0 again
            self[piece] = count
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
