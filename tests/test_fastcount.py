"""The fast ASCII counter (batchbench.text.fastcount) counts exactly as real tokenizers do,
takes only the tokenizers it understands, and gives ReplyAccounting the same counts as the
tokenizer in real template contexts."""

from __future__ import annotations

import re
import string

import pytest
import test_chat_templates as templates
from conftest import PACKAGED_TOKENIZERS
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Regex, pre_tokenizers

from batchbench.text.chat_templates import BUILTINS, load_chat_template
from batchbench.text.fastcount import (
    CACHE_ENTRIES,
    CACHE_PIECE_CHARS,
    Untranslatable,
    _byte_level_table,
    _Counts,
    ascii_counter,
    translate,
)
from batchbench.text.replycount import ReplyAccounting

# The byte-level BPE tokenizers it must take: DeepSeek-V3 (three split stages, numbers in
# threes), Qwen3 and Qwen3.5 (one stage, digits one by one), GLM-4 and Llama-3.1 (one stage,
# numbers in threes), MiniMax-M3 (a split that keeps only its matches).
ELIGIBLE = ["deepseek", "qwen3", "qwen3.5", "glm4", "llama3.1", "minimax-m3"]

# Characters the pre-tokenizers treat differently, weighted towards their edge cases:
# contractions, digit runs, whitespace runs before words and newlines, punctuation runs,
# control characters, and the pieces of added tokens such as <|EOT|> and <think>.
ALPHABET = string.printable + "\x00\x01\x1c\x1f\x7f" + "0123456789" + "'sdtlmrevSDTLM" + "  \n\n\t"
TEXTS = st.text(alphabet=ALPHABET, max_size=60) | st.sampled_from(
    ["<|EOT|>", "<think>x</think>", "a<|EOT|>b", "I'LL", "it's", "x'd", "1234567", " \n \n"]
)
CORPUS = [
    "Done.",
    "I'll run the tests now.\n\n```python\nassert f(3) == 9\n```",
    "  The file has 1,234 lines; 56 of them changed (4.5%).  ",
    "Let me check: ls -la /tmp && cat README.md | head -n 20",
    '{"status": "ok", "items": [1, 22, 333, 4444]}\r\n',
    "\tindented\n\n\n  trailing   ",
]


# Pure Python either way: the pass without extensions would repeat the same thing.
pytestmark = pytest.mark.native_pass_only


def tokenizer_of(name, deepseek, packaged):
    return deepseek if name == "deepseek" else packaged(name)


@pytest.mark.parametrize("name", ELIGIBLE)
def test_counts_equal_the_tokenizers(name, deepseek, packaged):
    loaded = tokenizer_of(name, deepseek, packaged)
    counter = ascii_counter(loaded.tokenizer)
    assert counter is not None

    def exact(text: str) -> int:
        return len(loaded.tokenizer.encode(text, add_special_tokens=False).ids)

    for text in CORPUS:
        assert counter.count(text) == exact(text)

    @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(TEXTS)
    def check(text: str) -> None:
        counted = counter.count(text)
        if counted is not None:
            assert counted == exact(text)

    check()


def test_texts_it_cannot_take(deepseek):
    counter = ascii_counter(deepseek.tokenizer)
    assert counter.count("naïve café") is None  # not ASCII
    assert counter.count("before <think> after") is None  # an added token's text
    assert counter.count("<|EOT|>") is None
    exact = len(deepseek.tokenizer.encode("<thin k>", add_special_tokens=False).ids)
    assert counter.count("<thin k>") == exact  # not an added token: counted
    assert counter.count("") == 0


def test_a_tokenizer_it_does_not_take(packaged):
    """A Unigram tokenizer with a Metaspace (SentencePiece-style) pre-tokenizer is not
    byte-level BPE: its replies are encoded by the tokenizer."""
    assert ascii_counter(packaged("jiutian").tokenizer) is None


def oniguruma_split(pattern: str, text: str) -> list[str]:
    """The pieces the tokenizer's own isolated Split (Oniguruma) makes of ``text``."""
    split = pre_tokenizers.Split(Regex(pattern), behavior="isolated")
    return [piece for piece, _ in split.pre_tokenize_str(text)]


def python_split(pattern: str, text: str) -> list[str]:
    """The same with Python's ``re``: matches and the stretches between them."""
    pieces, at = [], 0
    for match in re.finditer(pattern, text):
        pieces += [text[at : match.start()], match.group()]
        at = match.end()
    pieces.append(text[at:])
    return [piece for piece in pieces if piece]


# Each construct translate refuses, with its exact message: the old translation passed the
# anchors, possessive and interval forms, atomic and named groups, inline options and
# empty-matching patterns through to Python, where they mean something else.
REFUSED = [
    (r"\p{Han}+", r"\p{Han} at 0: a property with no ASCII table here"),
    (r"\P{L}", r"\P at 0: a negated property"),
    (r"\pL", r"\pL at 0: a one-letter property"),
    (r"\p{L", r"\p{ at 0: an unclosed property"),
    (r"[a[b]]", "[ at 2: a nested class or a POSIX bracket ([[:alpha:]])"),
    (r"[[:alpha:]]", "[ at 1: a nested class or a POSIX bracket ([[:alpha:]])"),
    (r"[\S]", r"\S at 1: \S inside a class"),
    ("[", "[ at 0: an unclosed class"),
    ("\\", "\\ at 0: a trailing backslash"),
    # Anchors: line anchors in Oniguruma, text anchors in Python.
    ("a$", "$ at 1: a line anchor in Oniguruma, a text anchor in Python without re.M"),
    ("^a", "^ at 0: a line anchor in Oniguruma, a text anchor in Python without re.M"),
    (r"\s+$", "$ at 3: a line anchor in Oniguruma, a text anchor in Python without re.M"),
    (r"\Aa", r"\A at 0: a text anchor"),
    (r"a\z", r"\z at 1: a text anchor (not in Python's re before 3.14)"),
    (r"a\Z", r"\Z at 1: the end or before a final newline in Oniguruma, the very end in Python"),
    (r"\ba", r"\b at 0: a word boundary (a backspace inside a class)"),
    (r"[\b]", r"\b at 1: a word boundary (a backspace inside a class)"),
    (r"a\B", r"\B at 1: a non-word boundary"),
    (r"\Ga", r"\G at 0: the search start anchor of Oniguruma"),
    (r"a\Kb", r"\K at 1: Oniguruma's keep (moves the match start)"),
    # Oniguruma-only escapes, and Unicode classes left untranslated.
    (r"\h+", r"\h at 0: a hex digit in Oniguruma, an error in Python"),
    (r"\R", r"\R at 0: Oniguruma's general newline"),
    (r"\X", r"\X at 0: Oniguruma's text segment"),
    (
        r"\x{41}",
        r"\x at 0: a code escape (\x{..} is a code point in Oniguruma, an error in Python)",
    ),
    (r"\x41", r"\x at 0: a code escape (\x{..} is a code point in Oniguruma, an error in Python)"),
    (r"\o{101}", r"\o at 0: an octal code escape in Oniguruma"),
    (r"\d+", r"\d at 0: a Unicode class not translated"),
    (r"\D", r"\D at 0: a Unicode class not translated"),
    (r"\w+", r"\w at 0: a Unicode class not translated"),
    (r"[\W]", r"\W at 1: a Unicode class not translated"),
    (r"(a)\1", r"\1 at 3: a backreference or an octal code"),
    (
        r"(?<n>a)\k<n>",
        "(?< at 0: a named group (in Oniguruma it also turns plain groups non-capturing)",
    ),
    (r"a\k<n>", r"\k at 1: a backreference by name"),
    (r"\g<0>", r"\g at 0: a subexpression call in Oniguruma"),
    # Quantifiers.
    ("a*+", "*+ at 1: possessive, or a repeated repetition"),
    ("a++", "++ at 1: possessive, or a repeated repetition"),
    ("a?+", "?+ at 1: possessive, or a repeated repetition"),
    ("a{1,2}+", "{1,2}+ at 1: possessive, or a repeated repetition"),
    ("ba{2}?", "{2}? at 2: optional in Oniguruma, exact in Python"),
    ("a{3,1}", "{3,1} at 1: n > m: possessive in Oniguruma, an error in Python"),
    ("a{,}", "{,} at 1: an empty repetition"),
    ("a{x}", "{ at 1: a brace that is not a repetition"),
    ("a**", "** at 1: a quantifier on a quantifier"),
    ("*a", "* at 0: a quantifier with nothing to repeat"),
    ("a|+", "+ at 2: a quantifier with nothing to repeat"),
    ("(?=a)+a", "+ at 5: a quantifier with nothing to repeat"),
    ("a}", "} at 1: an unescaped closing bracket outside a class"),
    # Groups and inline options.
    ("(?>a)b", "(?> at 0: an atomic group"),
    (
        "(?m)a.",
        "(?m at 0: "
        + (
            "an inline option other than (?i:...) (m is dot-all in Oniguruma, multi-line in "
            "Python; an isolated option runs to its group's end in Oniguruma, is global in Python)"
        ),
    ),
    (
        "a(?i)b",
        "(?i at 1: "
        + (
            "an inline option other than (?i:...) (m is dot-all in Oniguruma, multi-line in "
            "Python; an isolated option runs to its group's end in Oniguruma, is global in Python)"
        ),
    ),
    ("(?P<n>a)", "(?P at 0: a Python-only group"),
    ("(?#c)a", "(?# at 0: a comment"),
    ("(?~a)", "(?~ at 0: an Oniguruma absent group"),
    ("(a)(?(1)b)", "(?( at 3: a conditional group"),
    ("(*FAIL)a", "(* at 0: an Oniguruma callout"),
    ("(?i:[a-z])", "[ at 4: (?i:...) holding more than ASCII literals"),
    (r"(?i:\p{L})", r"\p at 4: (?i:...) holding more than ASCII literals"),
    ("(?i:ß)", "ß at 4: (?i:...) holding more than ASCII literals"),
    ("(?i:(?:a))", "( at 4: (?i:...) holding more than ASCII literals"),
    ("(a", "( at 0: an unclosed group"),
    ("a)", ") at 1: an unbalanced parenthesis"),
    (
        r"(?<=a|bc)d",
        "Python's re rejects the translation: look-behind requires fixed-width pattern",
    ),
    # Classes.
    ("[a&&b]", "&& at 2: a set operation (Oniguruma's &&, Python's reserved ones)"),
    ("[--a]", "-- at 1: a set operation (Oniguruma's &&, Python's reserved ones)"),
    ("[a-c-e]", "- at 4: a range that does not join two characters"),
    (r"[\s-a]", "- at 3: a range from a class"),
    (r"[a-\s]", r"a-\s at 1: not a range of two characters"),
    ("[z-a]", "z-a at 1: not a range of two characters"),
    ("[]a]", "] at 1: a ] first in a class"),
    (r"[\p{M}]", "a class at 0: no ASCII member to write"),
    # Patterns that can match the empty string, assertions taken as passing.
    ("a*", "the pattern at 0: it can match the empty string"),
    ("a|", "the pattern at 0: it can match the empty string"),
    ("(?<=a)|bc|c", "the pattern at 0: it can match the empty string"),
    (r"\s+(?!\S)|(?=x)", "the pattern at 0: it can match the empty string"),
]


@pytest.mark.parametrize(("pattern", "message"), REFUSED, ids=[p for p, _ in REFUSED])
def test_constructs_it_does_not_translate(pattern, message):
    with pytest.raises(Untranslatable) as refused:
        translate(pattern)
    assert str(refused.value) == message


@pytest.mark.parametrize(
    ("pattern", "text"),
    [
        ("a$", "xa\nya"),  # a line end in Oniguruma only
        (r"\s+$", "x \ny"),  # DeepSeek-Coder-v1.5, V2, Janus: spaces before any line end
        ("^a", "xa\nab"),
        (r"a\Z", "xa\n"),
        ("ba{2}?", "ba"),  # (?:a{2})? in Oniguruma
        ("a{1,2}+", "aaa"),  # (?:a{1,2})+ in Oniguruma, possessive in Python
        ("(?<=a)|bc|c", "abcc"),  # after an empty match Oniguruma steps on, Python retries
    ],
)
def test_refused_constructs_split_differently(pattern, text):
    """What the old translation got wrong: Python reads these patterns otherwise."""
    assert oniguruma_split(pattern, text) != python_split(pattern, text)


def test_a_class_never_starts_with_a_literal_caret():
    """A class member with no ASCII part left ^ first, and the class negated."""
    assert translate(r"[\p{M}^a]") == r"[\^a]"
    assert translate("[-a]") == r"[\-a]"


# Every construct translate accepts, and the real tokenizers' patterns: each splits ASCII
# text exactly as the tokenizer's own Split does.
ACCEPTED = [
    "a.",
    "[^a-c]+",
    "[-a]+|[a-]+",
    r"[$^.|&~*+?(){}]+",
    r"[\p{P}\p{S}]+",
    r"[\p{M}^a]+",
    r"\p{L}+|\p{N}{1,3}|\p{M}+|\p{Lu}\p{Ll}*",
    r"\s+(?!\S)|\s+",
    r"\S+",
    r"[\s\p{N}]+",
    "(?i:'s|'t|'ll|X)",
    "(?:ab)+c?",
    "x{2}|y{2,}|z{1,2}?d|e{,2}f",
    "x*?y|a??b|c+?",
    r"(?=a)\p{L}+|(?!b)\p{N}",
    r"(?<!a)b|(?<=ab)c+",
    r"\.|\$|\^|\||\?|\*|\+|\(|\)|\{|\}|\[|\]|\\|\/|\-",
    "\\'|\\`|\\\"|\\!|\\#|\\%|\\&|\\,|\\:|\\;|\\<|\\=|\\>|\\@|\\_|\\~|\\ ",
    r"\t|\n|\r|[\t\r\n]+",
    "\n+|\t",
    r"\s?[!-/:-~！-／]+",  # DeepSeek-Coder's: ranges across ASCII and beyond
    "[一-龥぀-ゟ]+",
]
REAL = {
    "qwen": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
    r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    "deepseek": "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?"
    "[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
    "minimax": r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+"
    r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+"
    r"[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
}


@pytest.mark.parametrize("pattern", [*ACCEPTED, *REAL.values()])
def test_accepted_constructs_split_as_oniguruma_does(pattern):
    translated = translate(pattern)

    @settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(st.text(alphabet=ALPHABET + "abcxyzXABT-^$|&~.!/", max_size=40))
    def check(text: str) -> None:
        assert python_split(translated, text) == oniguruma_split(pattern, text)

    check()


# Whether each tokenizer the tests use gets a fast counter; unchanged by the stricter
# translation (the packaged DeepSeek-Coder-v1.5/V2/Janus patterns with \s+$, refused now,
# come with a Digits stage the counter never took).
TAKES = {"deepseek": True, **{name: name != "jiutian" for name in PACKAGED_TOKENIZERS}}


@pytest.mark.parametrize("name", list(TAKES))
def test_which_tokenizers_get_a_counter(name, deepseek, packaged):
    counter = ascii_counter(tokenizer_of(name, deepseek, packaged).tokenizer)
    assert (counter is not None) == TAKES[name]


def test_translation_of_a_real_pattern():
    qwen = r"(?i:'s|'t)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s+(?!\S)|\s+"
    assert translate(qwen) == (
        r"(?i:'s|'t)|[^\r\nA-Za-z0-9]?[A-Za-z]+|[0-9]| ?[^\t\n\x0b\x0c\r A-Za-z0-9]+[\r\n]*"
        r"|[\t\n\x0b\x0c\r ]+(?![^\t\n\x0b\x0c\r ])|[\t\n\x0b\x0c\r ]+"
    )


def words(n: int) -> list[str]:
    """``n`` distinct lowercase words (each one piece under these pre-tokenizers)."""
    out = []
    for i in range(n):
        word = ""
        for _ in range(4):
            i, letter = divmod(i, 26)
            word += chr(97 + letter)
        out.append(word)
    return out


def test_the_piece_cache_stays_bounded(deepseek):
    tokenizer = deepseek.tokenizer
    counts = _Counts(tokenizer.model.tokenize, _byte_level_table(), limit=8)
    sizes, vocabulary = [], words(100)
    for word in vocabulary:
        assert counts[word] == len(tokenizer.encode(word, add_special_tokens=False).ids)
        sizes.append(len(counts))
    assert max(sizes) == 8
    assert list(counts)[-1] == vocabulary[-1]  # the newest piece is kept
    assert "aaaa" not in counts  # the oldest went
    long = "x" * (CACHE_PIECE_CHARS + 1)
    assert counts[long] == len(tokenizer.encode(long, add_special_tokens=False).ids)
    assert long not in counts  # a piece over the length cap is counted, not kept


def test_the_counters_cache_stays_bounded_at_its_default(deepseek):
    counter = ascii_counter(deepseek.tokenizer)
    vocabulary = words(CACHE_ENTRIES + CACHE_ENTRIES // 4)
    texts = [" ".join(vocabulary[i : i + 2000]) for i in range(0, len(vocabulary), 2000)]
    for text in texts:
        counter.count(text)
        assert len(counter._counts) <= CACHE_ENTRIES
    assert "aaaa" not in counter._counts  # the first text's first piece was dropped
    for text in (texts[0], texts[-1]):  # after evictions, the counts are still exact
        exact = len(deepseek.tokenizer.encode(text, add_special_tokens=False).ids)
        assert counter.count(text) == exact


@pytest.mark.parametrize(
    ("tokenizer", "template"),
    [("qwen-3.5", "qwen-3.5"), ("glm-4.7-flash", "glm-5"), ("minimax-m3", "minimax-m3")],
)
def test_reply_counts_in_real_template_contexts_equal_the_tokenizers(tmp_path, tokenizer, template):
    loaded = templates.model_dir(tmp_path, tokenizer, template)
    template = load_chat_template("tokenizer", loaded)
    fast = ReplyAccounting.build(loaded, template, "call_1")
    slow = ReplyAccounting.build(loaded, template, "call_1", ascii_count=False)
    assert fast.fast and not slow.fast
    texts = [*CORPUS, "x", "", "café au lait", "<think>"]
    replies = [(text, None) for text in texts] + [("ok", text) for text in texts]
    assert fast.count_many(replies) == slow.count_many(replies)


def test_reply_counter_on_deepseek_with_a_context(deepseek):
    template = BUILTINS["chatml"]
    fast = ReplyAccounting.build(deepseek, template, "call_1")
    slow = ReplyAccounting.build(deepseek, template, "call_1", ascii_count=False)
    assert fast.fast
    assert [fast.count(t) for t in CORPUS] == [slow.count(t) for t in CORPUS]
    pairs = [("a<|EOT|>b", None), ("ok", None)]
    assert fast.count_many(pairs) == slow.count_many(pairs)
