"""The fast ASCII counter (batchbench.text.fastcount) counts exactly as real tokenizers do,
takes only the tokenizers it understands, and gives ReplyAccounting the same counts as the
tokenizer in real template contexts."""

from __future__ import annotations

import string

import pytest
import test_chat_templates as templates
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batchbench.text.chat_templates import BUILTINS, load_chat_template
from batchbench.text.fastcount import Untranslatable, ascii_counter, translate
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


@pytest.mark.parametrize(
    "pattern",
    [r"\p{Han}+", r"\P{L}", r"\d+", r"[a[b]]", r"[\S]", r"\w+", "[", "\\"],
)
def test_constructs_it_does_not_translate(pattern):
    with pytest.raises(Untranslatable):
        translate(pattern)


def test_translation_of_a_real_pattern():
    qwen = r"(?i:'s|'t)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s+(?!\S)|\s+"
    assert translate(qwen) == (
        r"(?i:'s|'t)|[^\r\nA-Za-z0-9]?[A-Za-z]+|[0-9]| ?[^\t\n\x0b\x0c\r A-Za-z0-9]+[\r\n]*"
        r"|[\t\n\x0b\x0c\r ]+(?![^\t\n\x0b\x0c\r ])|[\t\n\x0b\x0c\r ]+"
    )


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
