"""The on-disk cache of synthesis tables: same table, same texts, safe when damaged."""

from __future__ import annotations

import os

import orjson
import pytest
from tokenizers import Tokenizer

from batchbench.text.synth import NO_TABLE_CACHE_ENV, TABLE_FORMAT, Synthesizer, table_cache_path
from batchbench.text.tokenizer import LoadedTokenizer, builtin_tokenizer_path


@pytest.fixture
def deepseek_file(tmp_path, monkeypatch) -> LoadedTokenizer:
    """DeepSeek-V3 from its file, with a cache directory of this test's own."""
    monkeypatch.setenv("BATCHBENCH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(NO_TABLE_CACHE_ENV, raising=False)
    path = str(builtin_tokenizer_path("deepseek-v3"))
    return LoadedTokenizer.wrap(Tokenizer.from_file(path), "deepseek-v3", path)


def test_a_cached_table_equals_a_prepared_one(deepseek_file):
    fresh = Synthesizer._build(deepseek_file)
    path = table_cache_path(deepseek_file)
    assert not fresh.table_cached and os.path.isfile(path)
    cached = Synthesizer._build(deepseek_file)
    assert cached.table_cached
    assert cached.pieces == fresh.pieces and cached.method == fresh.method == "fast"
    assert cached.heads == fresh.heads and cached.head_count > 1000
    with open(path, "rb") as handle:
        document = orjson.loads(handle.read())
    assert document["format"] == TABLE_FORMAT == 3
    assert document["heads"] == list(fresh.heads) and document["pieces"] == list(fresh.pieces)
    assert list(cached._pool) == list(fresh._pool) and cached._forbidden == fresh._forbidden
    for n, seed in ((1, 3), (64, 7), (2857, 11)):
        text = cached.text(n, seed)
        assert text == fresh.text(n, seed) and text == text.strip()
        assert deepseek_file.count(text) == n
        assert cached.text(n, seed, head=False) == fresh.text(n, seed, head=False)
    assert cached.repair_text(40, 5) == fresh.repair_text(40, 5)


def test_a_damaged_cache_file_is_prepared_again(deepseek_file):
    fresh = Synthesizer._build(deepseek_file)
    path = table_cache_path(deepseek_file)
    with open(path, "wb") as handle:
        handle.write(b'{"format": 1, "pieces": [')  # cut short
    again = Synthesizer._build(deepseek_file)
    assert not again.table_cached and again.pieces == fresh.pieces
    assert Synthesizer._build(deepseek_file).table_cached  # rewritten whole


def test_a_table_of_an_older_format_is_prepared_again(deepseek_file):
    """A format-2 file holds heads from an older proof: even at this format's path it is
    ignored and replaced."""
    fresh = Synthesizer._build(deepseek_file)
    path = table_cache_path(deepseek_file)
    with open(path, "wb") as handle:
        handle.write(
            orjson.dumps(
                {"format": 2, "pieces": [" a"], "heads": ["a"], "pool": [1], "forbidden": []}
            )
        )
    again = Synthesizer._build(deepseek_file)
    assert not again.table_cached and again.heads == fresh.heads
    assert Synthesizer._build(deepseek_file).table_cached


def test_the_cache_can_be_switched_off(deepseek_file, monkeypatch):
    monkeypatch.setenv(NO_TABLE_CACHE_ENV, "1")
    assert table_cache_path(deepseek_file) is None
    assert not Synthesizer._build(deepseek_file).table_cached
    assert not os.path.exists(os.environ["BATCHBENCH_CACHE_DIR"])


def test_in_memory_tokenizers_are_not_cached(deepseek_file):
    path = str(builtin_tokenizer_path("deepseek-v3"))
    in_memory = LoadedTokenizer.wrap(Tokenizer.from_file(path), "deepseek-v3", "<memory>")
    assert table_cache_path(in_memory) is None
