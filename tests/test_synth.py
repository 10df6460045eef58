"""Exact-length synthesis: RNG, assembler and Synthesizer.

The RNG and assembler tests run against the compiled module and its twin. The Synthesizer
tests check the contract on real and hand-built tokenizers: exact count on re-encode, no
special or added id, no control character, deterministic per seed, loud failure.
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from conftest import implementations
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

from batchbench import _impl
from batchbench.errors import SynthesisError
from batchbench.text import _synth_py
from batchbench.text import synth as synth_module
from batchbench.text.synth import Synthesizer
from batchbench.text.tokenizer import LoadedTokenizer

MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
STREAM = 0xD1B54A32D192ED03
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
SEEDS = st.integers(min_value=0, max_value=MASK64)


def reference_indices(seed: int, n: int, bound: int) -> list[int]:
    """Scalar splitmix64 + multiply-shift, written from the definition with Python ints."""
    out = []
    for k in range(n):
        z = (seed + (k + 1) * GOLDEN) & MASK64
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        z ^= z >> 31
        out.append(((z >> 32) * bound) >> 32)
    return out


# --- RNG and assembler, on every implementation -------------------------------------------


@pytest.fixture(params=implementations("synth"))
def impl(request):
    return request.param


def test_mix_seed_is_the_compat_wrapping_mix():
    from batchbench.rng import mix_seed

    assert mix_seed(0, 1, 0) == GOLDEN
    assert mix_seed(0, 0, 1) == STREAM
    assert mix_seed(5, 2, 3) == (5 + 2 * GOLDEN + 3 * STREAM) % 2**64
    assert mix_seed(MASK64, 0, 0) == MASK64
    assert mix_seed(MASK64, 1, 0) == GOLDEN - 1
    assert mix_seed(7, 0, 0x1000_0000_0000_0000) == (7 + 0x1000_0000_0000_0000 * STREAM) % 2**64


def test_draw_indices_known_values(impl):
    got = impl.draw_indices(42, 8, 10)
    assert got.dtype == np.int64
    assert got.tolist() == [7, 1, 2, 3, 0, 8, 2, 8]
    assert impl.draw_indices(42, 0, 10).tolist() == []
    assert impl.draw_indices(MASK64, 5, 1).tolist() == [0, 0, 0, 0, 0]


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(min_value=-(2**70), max_value=2**70),
    n=st.integers(0, 40),
    bound=st.one_of(st.integers(1, 100), st.integers(1, 2**32)),
)
def test_draw_indices_match_the_scalar_definition(seed, n, bound):
    for module in [p.values[0] for p in implementations("synth")]:
        got = module.draw_indices(seed, n, bound).tolist()
        assert got == reference_indices(seed & MASK64, n, bound)
        assert all(0 <= i < bound for i in got)


def test_draw_indices_rejects_bad_arguments(impl):
    with pytest.raises(ValueError, match=r"^n must be non-negative, got -1$"):
        impl.draw_indices(1, -1, 3)
    for bound in (0, -3, 2**32 + 1):
        with pytest.raises(
            ValueError, match=rf"^bound must be between 1 and 2\*\*32, got {bound}$"
        ):
            impl.draw_indices(1, 1, bound)
    with pytest.raises(TypeError):
        impl.draw_indices(1, 1.5, 3)


@pytest.mark.parametrize(
    "pieces",
    [
        [" river", " lake", " stone"],
        [" été", " река", " 中文", " 😀", " ascii"],
        [""],
        [" only"],
    ],
    ids=["ascii", "unicode", "empty-piece", "single"],
)
def test_assembler_concatenates_the_drawn_pieces(impl, pieces):
    assembler = impl.PieceAssembler(pieces)
    assert len(assembler) == len(pieces)
    for seed in (0, 1, 99, MASK64):
        for n in (1, 2, 17, 300):
            expected = "".join(pieces[i] for i in reference_indices(seed, n, len(pieces)))
            assert assembler.text(n, seed) == expected
    assert assembler.text(0, 5) == ""


def test_assembler_result_is_a_normal_str(impl):
    # The ASCII fast path writes into a fresh str: it must hash and compare like any other.
    text = impl.PieceAssembler([" ab", " cd"]).text(3, 11)
    expected = "".join([" ab", " cd"][i] for i in reference_indices(11, 3, 2))
    assert text == expected and hash(text) == hash(expected) and text.isascii()
    assert {text: 1}[expected] == 1


def test_assembler_rejects_bad_input(impl):
    with pytest.raises(ValueError, match=r"^PieceAssembler needs at least one piece$"):
        impl.PieceAssembler([])
    with pytest.raises(TypeError, match=r"^pieces must be str, got bytes$"):
        impl.PieceAssembler([" a", b" b"])
    with pytest.raises(ValueError, match=r"^n must be non-negative, got -2$"):
        impl.PieceAssembler([" a"]).text(-2, 0)


def test_assembler_starts_with_a_head_unless_told_not_to(impl):
    pieces, heads = [" river", " lake", " stone"], ["Alpha", "Beta"]
    assembler = impl.PieceAssembler(pieces, heads)
    assert assembler.head_count == 2 and len(assembler) == 3
    for seed in (0, 1, 99, MASK64):
        for n in (1, 2, 17, 300):
            index = reference_indices(seed, n, len(pieces))
            first = heads[reference_indices(seed, 1, len(heads))[0]]
            expected = first + "".join(pieces[i] for i in index[1:])
            assert assembler.text(n, seed) == expected == assembler.text(n, seed, head=True)
            assert assembler.text(n, seed, head=False) == "".join(pieces[i] for i in index)
    # Pinned bytes (texts must not change between versions or implementations).
    three = impl.PieceAssembler(pieces, ["Alpha", "Beta", "Gamma"])
    assert three.text(6, 42) == "Gamma river river lake river stone"
    assert three.text(6, 42, head=False) == " stone river river lake river stone"
    assert [three.text(1, seed) for seed in range(8)] == [
        *("Gamma", "Beta", "Beta", "Alpha", "Beta", "Beta", "Gamma", "Beta")
    ]
    assert three.text(1, 7, False) == " lake" and three.text(0, 7) == ""
    # Without heads every token is a piece, head or not.
    plain = impl.PieceAssembler(pieces)
    assert plain.head_count == 0 and plain.text(5, 3) == plain.text(5, 3, head=False)
    with pytest.raises(TypeError, match=r"^heads must be str, got int$"):
        impl.PieceAssembler(pieces, ["ok", 3])


def test_native_and_twin_give_identical_bytes():
    native = _impl.native_module("synth")
    if native is None:
        pytest.skip("native extension not built")
    twin = _synth_py
    pieces = [f" w{i}" for i in range(5000)] + [" été", " 中文", " 😀x", " Ω"]
    heads = [f"h{i}" for i in range(300)] + ["Ωmega", "中文"]
    native_asm, twin_asm = native.PieceAssembler(pieces, heads), twin.PieceAssembler(pieces, heads)
    ascii_native, ascii_twin = (
        native.PieceAssembler(pieces[:5000]),
        twin.PieceAssembler(pieces[:5000]),
    )
    for seed in (0, 1, 12345, 2**63, MASK64):
        for n in (0, 1, 3, 257, 4096, 20000):
            assert np.array_equal(
                native.draw_indices(seed, n, 5004), twin.draw_indices(seed, n, 5004)
            )
            assert native_asm.text(n, seed).encode() == twin_asm.text(n, seed).encode()
            assert native_asm.text(n, seed, False) == twin_asm.text(n, seed, False)
            assert ascii_native.text(n, seed).encode() == ascii_twin.text(n, seed).encode()


# --- tokenizers built in the test -----------------------------------------------------------

WORDS = [
    *("river", "lake", "stone", "cloud", "forest", "meadow", "ember", "harbor", "lantern"),
    *("quartz", "willow", "canyon", "falcon", "glacier", "orchard", "pebble", "thunder"),
    *("velvet", "whisper", "zephyr"),
]


def wrap(tokenizer: Tokenizer, name: str) -> LoadedTokenizer:
    """An in-memory tokenizer: its source is not a file, so it is never cached."""
    return LoadedTokenizer.wrap(tokenizer, name, f"<built in test: {name}>")


def c9_wordlevel() -> LoadedTokenizer:
    """WordLevel {[UNK], alpha, beta, gamma}, beta also an added special token."""
    tok = Tokenizer(
        models.WordLevel({"[UNK]": 0, "alpha": 1, "beta": 2, "gamma": 3}, unk_token="[UNK]")
    )
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens([AddedToken("beta", special=True)])
    return wrap(tok, "c9")


def bytelevel_tokenizer() -> LoadedTokenizer:
    """Byte-level BPE with the 256-symbol alphabet and no merges."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE({c: i for i, c in enumerate(alphabet)}, []))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return wrap(tok, "c10")


def wordpiece() -> LoadedTokenizer:
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab = [*specials, *WORDS, "##s", "##ed", "##ing", "a", "b", "c"]
    tok = Tokenizer(models.WordPiece({w: i for i, w in enumerate(vocab)}, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    tok.add_special_tokens(specials)
    return wrap(tok, "wordpiece")


def metaspace_unigram() -> LoadedTokenizer:
    vocab = [("<unk>", 0.0), ("▁", -2.0)]
    vocab += [("▁" + w, -3.0) for w in WORDS] + [(w, -4.0) for w in WORDS[:5]]
    vocab += [(c, -6.0) for c in "abcdefghijklmnopqrstuvwxyz"]
    tok = Tokenizer(models.Unigram(vocab, unk_id=0))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.add_special_tokens(["<unk>"])
    return wrap(tok, "unigram")


def bpe_without_pretokenizer() -> LoadedTokenizer:
    """ " ab" alone is one token, but joined (" ab ab") the merge "ab " wins: not fast."""
    vocab = {c: i for i, c in enumerate(" abcde")} | {"ab": 6, "ab ": 7, " ab": 8}
    tok = Tokenizer(models.BPE(vocab, [("a", "b"), ("ab", " "), (" ", "ab")]))
    return wrap(tok, "bpe-no-pretokenizer")


def deletes_everything() -> LoadedTokenizer:
    """A normalizer that removes every character: the count is always 0."""
    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "alpha": 1, "gamma": 2}, unk_token="[UNK]"))
    tok.normalizer = normalizers.Replace(Regex(r"[\s\S]"), "")
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return wrap(tok, "deletes-everything")


def gemma_style() -> LoadedTokenizer:
    """Like Gemma's: BPE over the whole text (no pre-tokenizer), spaces normalized to "▁",
    byte fallback; trained here on a fixed corpus, so it is the same on every run."""
    from tokenizers import trainers

    words = [w + s for w in WORDS for s in ("", "s", "ed", "ing")]
    # Lines start with one of a few words, so most words are learned only after a space: as
    # in Gemma's vocabulary, "▁thunder" is one token where "thunder" is several.
    corpus = [
        WORDS[i % 8] + " " + " ".join(words[(i * 7 + j * 3) % len(words)] for j in range(12)) + "\n"
        for i in range(400)
    ]
    tok = Tokenizer(models.BPE(byte_fallback=True, unk_token=None))
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    specials = ["<pad>", "<eos>", "<bos>"]
    alphabet = [f"<0x{b:02X}>" for b in range(256)]
    trainer = trainers.BpeTrainer(
        vocab_size=600, special_tokens=specials + alphabet, show_progress=False
    )
    # Trained with "▁" starting each word, as SentencePiece trains: no token ends in "▁".
    tok.pre_tokenizer = pre_tokenizers.Split("▁", behavior="merged_with_next")
    tok.train_from_iterator(corpus, trainer)
    # Then used as Gemma's file is: a split on " ", which normalization has already
    # turned into "▁", so merges run over the whole text.
    tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
    tok.add_special_tokens(specials)
    return wrap(tok, "gemma-style")


BUILT = {
    "c9": c9_wordlevel,
    "c10": bytelevel_tokenizer,
    "wordpiece": wordpiece,
    "unigram": metaspace_unigram,
    "bpe-no-pretokenizer": bpe_without_pretokenizer,
    "gemma-style": gemma_style,
}
EXPECTED_METHOD = {
    "deepseek": "fast",
    "qwen3": "fast",
    "llama3.1": "fast",
    "glm4": "fast",
    "c9": "fast",
    "wordpiece": "fast",
    "unigram": "fast",
    "c10": "repair",
    "bpe-no-pretokenizer": "repair",
    "gemma-style": "fast",
    "qwen3.5": "fast",
    "glm4.7": "fast",
    "minimax": "fast",
    "minimax-m3": "fast",
    "jiutian": "fast",
}
LARGE = ("deepseek", "qwen3", "llama3.1", "glm4")
# Real vocabularies the trim-stability property is checked on (LARGE as well).
TRIMMED = ("qwen3.5", "glm4.7", "minimax", "minimax-m3", "jiutian")


@pytest.fixture(scope="module")
def tokenizers_by_name(request) -> dict:
    """Lazily loaded LoadedTokenizer and Synthesizer per name, shared by the module."""
    cache: dict[str, tuple[LoadedTokenizer, Synthesizer]] = {}

    def get(name: str) -> tuple[LoadedTokenizer, Synthesizer]:
        if name not in cache:
            if name == "deepseek":
                loaded = request.getfixturevalue("deepseek")
            elif name in BUILT:
                loaded = BUILT[name]()
            else:
                loaded = request.getfixturevalue("packaged")(name)
            cache[name] = (loaded, Synthesizer.prepare(loaded))
        return cache[name]

    return get


def assert_exact(loaded: LoadedTokenizer, text: str, n: int) -> None:
    """Exact count, no special id, bounded failure; plus no added id, no control character."""
    if n == 0:
        assert text == ""
        return
    assert text
    ids = loaded.tokenizer.encode(text, add_special_tokens=False).ids
    assert len(ids) == n
    assert not (loaded.special_ids | loaded.added_ids).intersection(ids)
    assert CONTROL.search(text) is None
    # Trim-stable: templates that trim content see the same text, hence the same count.
    assert text == text.strip()


# --- Synthesizer ----------------------------------------------------------------------------

ALL_NAMES = [*LARGE, *BUILT, *TRIMMED]
# c10 uses the repair method: its long targets take half a minute, so under pytest-xdist
# they start first instead of finishing last
ALL_NAMES_LONG_FIRST = [
    pytest.param(name, marks=pytest.mark.slow) if name == "c10" else name for name in ALL_NAMES
]


@pytest.mark.parametrize("name", ALL_NAMES)
def test_method_is_the_expected_one(tokenizers_by_name, name):
    _, synth = tokenizers_by_name(name)
    assert synth.method == EXPECTED_METHOD[name]
    if synth.method == "fast":
        assert synth.piece_count == len(synth.pieces) >= 2
        assert all(p[0] == " " and p[1:].isalpha() for p in synth.pieces)
        assert len(set(synth.pieces)) == synth.piece_count
        assert synth.head_count == len(synth.heads) >= 1
        assert all(h.isalpha() for h in synth.heads)  # no whitespace to trim
    else:
        assert synth.piece_count == 0 and synth.pieces == ()
        assert synth.head_count == 0 and synth.heads == ()
    assert synth.prepare_seconds > 0


@pytest.mark.parametrize("name", LARGE)
def test_large_vocabularies_have_many_fast_pieces(tokenizers_by_name, name):
    _, synth = tokenizers_by_name(name)
    assert synth.piece_count > 10_000


@pytest.mark.parametrize("name", ALL_NAMES_LONG_FIRST)
@pytest.mark.parametrize("n", [0, 1, 2, 16, 2857, 131072])
def test_fixed_targets_are_exact(tokenizers_by_name, name, n):
    loaded, synth = tokenizers_by_name(name)
    assert_exact(loaded, synth.text(n, 20260509 + n), n)


@pytest.mark.parametrize("name", ALL_NAMES_LONG_FIRST)
def test_random_targets_are_exact(tokenizers_by_name, name):
    loaded, synth = tokenizers_by_name(name)
    examples = 4 if name in LARGE else 12

    @settings(max_examples=examples, deadline=None, derandomize=False)
    @given(
        n=st.one_of(st.integers(0, 64), st.integers(0, 4096), st.integers(0, 131072)),
        seed=SEEDS,
    )
    def check(n, seed):
        assert_exact(loaded, synth.text(n, seed), n)

    check()


def assert_trim_stable(loaded: LoadedTokenizer, text: str, n: int) -> None:
    """The contract templates that trim content rely on, checked with one batched encode."""
    assert text == text.strip() and text and not text[0].isspace() and not text[-1].isspace()
    plain, stripped = loaded.tokenizer.encode_batch([text, text.strip()], add_special_tokens=False)
    assert len(plain.ids) == len(stripped.ids) == n
    assert not (loaded.special_ids | loaded.added_ids).intersection(plain.ids)
    assert CONTROL.search(text) is None


FAST_TRIMMED = [*LARGE, *TRIMMED, "gemma-style", "unigram", "wordpiece", "c9"]


@pytest.mark.parametrize("name", FAST_TRIMMED)
def test_trim_stable_on_both_implementations(tokenizers_by_name, name):
    """Every text has no surrounding whitespace and counts n as is and after strip(), for
    n from 1 to a few thousand, whichever assembler (compiled or twin) builds it."""
    loaded, synth = tokenizers_by_name(name)
    assert synth.method == "fast"
    assemblers = [
        p.values[0].PieceAssembler(list(synth.pieces), list(synth.heads))
        for p in implementations("synth")
    ]

    @settings(max_examples=6 if name in LARGE else 10, deadline=None)
    @given(n=st.one_of(st.integers(1, 40), st.integers(1, 3000)), seed=SEEDS)
    def check(n, seed):
        texts = [assembler.text(n, seed) for assembler in assemblers]
        assert texts == [synth.text(n, seed)] * len(assemblers)
        assert_trim_stable(loaded, texts[0], n)

    check()


@pytest.mark.parametrize("name", ["gemma-style", "qwen3.5", "glm4.7", "llama3.1"])
def test_texts_without_a_head_would_drift_when_trimmed(tokenizers_by_name, name):
    """The failure heads fix, reproduced: on these vocabularies a text of space-prefixed
    pieces often counts differently once a template strips its leading space, and the same
    draw with a head never does."""
    loaded, synth = tokenizers_by_name(name)
    drifted = 0
    for seed in range(100):
        spaced = synth.text(20, seed, head=False)
        assert spaced.startswith(" ") and loaded.count(spaced) == 20
        drifted += loaded.count(spaced.strip()) != 20
        headed = synth.text(20, seed)
        # Same draw: only the first token differs (a head has no space, a piece one).
        assert headed[headed.index(" ") :] == spaced[spaced.index(" ", 1) :]
        assert_trim_stable(loaded, headed, 20)
    assert drifted >= 25


@pytest.mark.parametrize("name", ["deepseek", "qwen3.5", "glm4.7", "gemma-style", "jiutian"])
@pytest.mark.parametrize("context", ["\n", "\n\n"])
def test_heads_stay_one_token_after_a_newline(tokenizers_by_name, name, context):
    """Templates put content right after "\n"; the head must not merge with it."""
    loaded, synth = tokenizers_by_name(name)
    before = len(loaded.tokenizer.encode(context, add_special_tokens=False).ids)
    texts = [context + synth.text(12, seed) for seed in range(60)]
    counts = [len(e.ids) for e in loaded.tokenizer.encode_batch(texts, add_special_tokens=False)]
    assert counts == [before + 12] * len(texts)


def test_heads_fall_back_to_the_start_only_proof():
    """On the Unigram vocabulary only five words have a token without "▁", so only they
    survive a newline: too few, so every head proven at the start of a text is used."""
    loaded = metaspace_unigram()
    synth = Synthesizer.prepare(loaded)
    usable = synth_module.eligible_ids(loaded)
    candidates = synth_module.candidate_heads(loaded, synth_module.decode_each(loaded, usable))
    assert candidates == [*WORDS]
    after_newline = synth_module.prove_heads(loaded, candidates, list(synth.pieces))
    assert after_newline == WORDS[:5]
    assert synth.heads == tuple(WORDS)
    assert [loaded.count(synth.text(3, seed)) for seed in range(20)] == [3] * 20


@pytest.mark.parametrize("name", ["deepseek", "c9", "c10"])
def test_repair_loop_is_exact_even_where_fast_applies(tokenizers_by_name, name):
    loaded, synth = tokenizers_by_name(name)
    for n in (1, 7, 64, 600):
        text = synth.repair_text(n, n)
        assert_exact(loaded, text, n)
        assert synth.repair_text(n, n) == text


@pytest.mark.parametrize(
    "name", ["deepseek", "qwen3.5", "gemma-style", "jiutian", "unigram", "wordpiece", "c9", "c10"]
)
def test_repair_loop_is_trim_stable(tokenizers_by_name, name):
    """The repair loop, forced where the fast method applies, also returns texts that equal
    their strip() and count n either way."""
    loaded, synth = tokenizers_by_name(name)

    @settings(max_examples=5, deadline=None)
    @given(n=st.one_of(st.integers(1, 24), st.integers(1, 400)), seed=SEEDS)
    def check(n, seed):
        assert_trim_stable(loaded, synth.repair_text(n, seed), n)

    check()


def test_sixteen_tokens_without_the_special_word(tokenizers_by_name):
    loaded, synth = tokenizers_by_name("c9")
    assert set(synth.pieces) == {" alpha", " gamma"}
    assert synth.heads == ("alpha", "gamma")  # proven after newlines too
    for seed in range(20):
        text = synth.text(16, seed)
        ids = loaded.tokenizer.encode(text, add_special_tokens=False).ids
        assert len(ids) == 16 and 2 not in ids and "beta" not in text


def test_one_token_and_c11_2857_tokens_on_bytelevel(tokenizers_by_name):
    loaded, synth = tokenizers_by_name("c10")
    for seed in range(64):
        assert_exact(loaded, synth.text(1, seed), 1)
    assert_exact(loaded, synth.text(2857, 3), 2857)


@pytest.mark.parametrize("name", ["deepseek", "c10", "unigram"])
def test_same_seed_same_text_other_seed_other_text(tokenizers_by_name, name):
    _, synth = tokenizers_by_name(name)
    for n in (5, 40, 300):
        texts = [synth.text(n, seed) for seed in range(8)]
        assert texts == [synth.text(n, seed) for seed in range(8)]
        assert len(set(texts)) == 8


def test_text_is_a_function_of_the_tokenizer_file_not_the_instance(deepseek):
    # A fresh, uncached preparation of the same file finds the same table and text.
    fresh = LoadedTokenizer.wrap(Tokenizer.from_str(deepseek.tokenizer.to_str()), "x", "<memory>")
    again = Synthesizer.prepare(fresh)
    cached = Synthesizer.prepare(deepseek)
    assert again is not cached
    assert again.pieces == cached.pieces
    assert again.text(4096, 77) == cached.text(4096, 77)


def test_prepare_caches_one_synthesizer_per_tokenizer_file(deepseek):
    other = LoadedTokenizer.wrap(Tokenizer.from_file(deepseek.source), "again", deepseek.source)
    assert Synthesizer.prepare(other) is Synthesizer.prepare(deepseek)
    built = c9_wordlevel()
    assert Synthesizer.prepare(built) is not Synthesizer.prepare(built)


def test_concurrent_generation_matches_sequential(tokenizers_by_name):
    _, fast = tokenizers_by_name("deepseek")
    _, repair = tokenizers_by_name("c10")
    jobs = [(synth, n, seed) for synth in (fast, repair) for n in (1, 33, 512) for seed in range(6)]
    sequential = [synth.text(n, seed) for synth, n, seed in jobs]

    def run(job):
        synth, n, seed = job
        return synth.text(n, seed)

    with ThreadPoolExecutor(max_workers=4) as pool:
        assert list(pool.map(run, reversed(jobs))) == sequential[::-1]


def test_impossible_target_fails_with_the_compat_message():
    synth = Synthesizer.prepare(deletes_everything())
    assert synth.method == "repair"
    for n in (1, 5):
        with pytest.raises(SynthesisError) as caught:
            synth.text(n, 1)
        assert str(caught.value) == (
            f"failed to generate synthetic text with exactly {n} tokens after 256 attempts "
            "(last count: 0)"
        )
    assert synth.text(0, 1) == ""


def test_failure_keeps_context_chain():
    synth = Synthesizer.prepare(deletes_everything())
    with pytest.raises(SynthesisError) as caught:
        try:
            synth.text(3, 9)
        except SynthesisError as exc:
            raise exc.with_context('failed to generate initial prompt for trajectory "t"') from None
    assert str(caught.value) == (
        'failed to generate initial prompt for trajectory "t": failed to generate synthetic '
        "text with exactly 3 tokens after 256 attempts (last count: 0)"
    )


def test_identical_resamples_fail_after_eight():
    # One drawable id whose text normalizes into the special token: every candidate is
    # the same and must be resampled, so the loop gives up after 8 identical ones.
    tok = Tokenizer(models.WordLevel({"alpha": 0, "beta": 1}, unk_token="beta"))
    tok.normalizer = normalizers.Replace("alpha", "beta")
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens([AddedToken("beta", special=True, normalized=True)])
    loaded = wrap(tok, "always-special")
    synth = Synthesizer.prepare(loaded)
    assert synth.method == "repair"
    with pytest.raises(SynthesisError) as caught:
        synth.text(4, 0)
    assert str(caught.value) == (
        "tokenizer produced the same candidate in 8 consecutive deterministic resamples"
    )


def test_empty_vocabulary_is_an_error():
    loaded = wrap(Tokenizer(models.WordLevel({}, unk_token="[UNK]")), "empty")
    assert loaded.base_vocab_size == 0
    with pytest.raises(SynthesisError, match=r"^tokenizer vocabulary is empty$"):
        Synthesizer.prepare(loaded)


def test_vocabulary_of_only_special_tokens_is_an_error():
    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "<s>": 1}, unk_token="[UNK]"))
    tok.add_special_tokens(["[UNK]", "<s>"])
    with pytest.raises(
        SynthesisError, match=r"^tokenizer vocabulary contains no non-special tokens$"
    ):
        Synthesizer.prepare(wrap(tok, "only-special"))


def test_negative_target_is_a_bug(tokenizers_by_name):
    _, synth = tokenizers_by_name("c9")
    with pytest.raises(ValueError, match="non-negative"):
        synth.text(-1, 0)
