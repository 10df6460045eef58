"""Exact-length synthetic text: the API the rest of the package uses.

``Synthesizer.prepare(loaded)`` inspects a tokenizer once. Most tokenizers have many
**fast pieces**: a leading space plus one alphabetic word that is a single token and, being
its own pre-token, stays a single token whatever piece precedes or follows it. Joining n of
them gives exactly n tokens with no re-encoding, so text costs a memcpy per token
(``PieceAssembler``, compiled or twin). The property is proven on long random joins at
preparation, not assumed. Tokenizers where it fails or finds too few pieces (no
pre-tokenizer, byte-level BPE without merges, normalizers that rewrite words) use the
decode, re-encode and repair loop, which is exact but costs several encodes a text.

Every text is **trim-stable**: it has no leading or trailing whitespace, so chat templates
that trim message content (Gemma, Llama-3, Qwen3.5, GLM) cannot change its count. The fast
method starts each text with a **head**: a proven single-token word without a leading
space ("river" rather than " river"), then n-1 fast pieces; the repair loop strips what it
measures.

Both methods are deterministic functions of (tokenizer file, n, seed), so equal inputs
give byte-identical text.
"""

from __future__ import annotations

import contextlib
import hashlib
import operator
import os
import re
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Literal

import numpy as np
import orjson
import tokenizers
from tokenizers import Encoding, Tokenizer

from batchbench import __version__, _impl
from batchbench.errors import SynthesisError
from batchbench.rng import mix_seed
from batchbench.text.tokenizer import LoadedTokenizer

if _impl.NO_EXTENSIONS:
    from batchbench.text import _synth_py as _synth
else:
    try:
        # mypy types _synth as the twin (same API, batchbench/_native/_synth.pyi)
        from batchbench._native import _synth  # type: ignore[no-redef]
    except ImportError:  # not built: the twin gives the same bytes
        from batchbench.text import _synth_py as _synth

draw_indices = _synth.draw_indices
PieceAssembler = _synth.PieceAssembler

Method = Literal["fast", "repair"]

# Bounds of the repair loop: rounds, trim cuts tried per round, identical resamples.
REPAIR_ATTEMPTS = 256
TRIM_BOUNDARIES = 16
IDENTICAL_RESAMPLES = 8

# The fast-piece proof: at least this many pieces per join, in this many random orders,
# pruning pieces that break alignment for at most this many rounds.
PROOF_PIECES = 100_000
PROOF_ORDERS = 3
PROOF_ROUNDS = 4
# Each order is encoded in chunks of this many pieces, so the tokenizer's batch encoder can
# spread them over cores; only the few pairs that straddle a chunk edge go untested.
PROOF_CHUNK = 8192
# Fewer proven pieces than this means little variety: use the repair loop instead. A tiny
# vocabulary cannot supply 64 words, so there an eighth of its usable ids (at least 2) is
# enough; the repair loop would not give more varied text on it anyway.
MIN_FAST_PIECES = 64

# Heads: at most this many candidates are proven (a deterministic sample; variety only
# matters for one token a text), each followed by this many random pieces in at least this
# many trials, at the start of a text and after each of these contexts (templates put
# content right after them).
HEAD_CANDIDATES = 2048
HEAD_FOLLOWERS = 3
HEAD_TRIALS = 3
HEAD_CONTEXTS = ("", "\n", "\n\n")
MIN_HEADS = 8

# Fixed seeds keep preparation, and so the piece table and every text, deterministic.
_PROOF_SEED = 0x5EED_0F_FA57_0000
_REPAIR_STREAM = 0x7E9A_17  # derives the successive draw seeds of the repair loop

# C0 and C1 control characters. Ids that decode to one are not drawn, but byte-level ids
# can still combine into one (0xC2 then 0x85 is U+0085), so decoded text is scrubbed too.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")

EMPTY_VOCAB = "tokenizer vocabulary is empty"
NO_NON_SPECIAL = "tokenizer vocabulary contains no non-special tokens"
SAME_CANDIDATE = "tokenizer produced the same candidate in 8 consecutive deterministic resamples"


def failure_message(target: int, last_count: int | None) -> str:
    """The error message for a target that the bounded loop could not reach."""
    last = "unknown" if last_count is None else str(last_count)
    return (
        f"failed to generate synthetic text with exactly {target} tokens after "
        f"{REPAIR_ATTEMPTS} attempts (last count: {last})"
    )


def min_fast_pieces(usable: int) -> int:
    """Proven pieces needed to use the fast method on a vocabulary of ``usable`` ids."""
    return min(MIN_FAST_PIECES, max(2, -(-usable // 8)))


def eligible_ids(loaded: LoadedTokenizer) -> np.ndarray:
    """Eligible ids: the base vocabulary minus special ids; raises when there are none."""
    if loaded.base_vocab_size <= 0:
        raise SynthesisError(EMPTY_VOCAB)
    ids = np.arange(loaded.base_vocab_size, dtype=np.int64)
    if loaded.special_ids:
        ids = ids[~np.isin(ids, np.fromiter(loaded.special_ids, dtype=np.int64))]
    if ids.size == 0:
        raise SynthesisError(NO_NON_SPECIAL)
    return ids


def _without(ids: np.ndarray, excluded: Iterable[int]) -> np.ndarray:
    drop = np.fromiter(excluded, dtype=np.int64)
    return ids[~np.isin(ids, drop)] if drop.size else ids


def _is_word(candidate: str) -> bool:
    """A space then letters only (letters are printable and never whitespace)."""
    return candidate[1:].isalpha()


def decode_each(loaded: LoadedTokenizer, ids: np.ndarray) -> list[str]:
    """The single-id decode of every id in ``ids`` (special tokens kept)."""
    return loaded.tokenizer.decode_batch([[i] for i in ids.tolist()], skip_special_tokens=False)


def candidate_pieces(
    loaded: LoadedTokenizer, decoded: Sequence[str], *, spaced_only: bool
) -> list[str]:
    """Space-prefixed alphabetic single-id decodes that encode back to one allowed id.

    With ``spaced_only``, only decodes that already start with a space are tried. Where
    the tokenizer keeps the space inside its tokens (byte-level BPE), a word that is one
    token after a space has its own id whose decode is among those, so prefixing a space
    to the other decodes mostly adds strings that are not single tokens, at the cost of
    encoding them all (half of preparation on DeepSeek-V3). Otherwise every decode gets a
    space prefix when it lacks one (Metaspace, WordPiece decodes never start with one).
    """
    tokenizer = loaded.tokenizer
    if spaced_only:
        pool = [text for text in decoded if text.startswith(" ")]
    else:
        pool = [text if text.startswith(" ") else " " + text for text in decoded]
    candidates = [text for text in dict.fromkeys(pool) if _is_word(text)]
    if not candidates:
        return []
    forbidden = loaded.added_ids | loaded.special_ids
    encodings = tokenizer.encode_batch(candidates, add_special_tokens=False)
    return [
        piece
        for piece, encoding in zip(candidates, encodings, strict=True)
        if len(encoding.ids) == 1 and encoding.ids[0] not in forbidden
    ]


def candidate_heads(loaded: LoadedTokenizer, decoded: Sequence[str]) -> list[str]:
    """Alphabetic words without leading whitespace that encode alone to one allowed id.

    A byte-level decode " river" gives "river"; a Metaspace decode is already "river"
    (its "▁" is restored by the pre-tokenizer at the start of a text)."""
    words = (text[1:] if text.startswith(" ") else text for text in decoded)
    # In id order (deterministic per file); sorting 100k words would only cost time.
    candidates = [word for word in dict.fromkeys(words) if word.isalpha()]
    if len(candidates) > HEAD_CANDIDATES:
        keys = draw_indices(mix_seed(_PROOF_SEED, 2, 2), len(candidates), 1 << 32)
        order = np.argsort(keys, kind="stable")[:HEAD_CANDIDATES]
        candidates = [candidates[i] for i in sorted(order.tolist())]
    if not candidates:
        return []
    forbidden = loaded.added_ids | loaded.special_ids
    encodings = loaded.tokenizer.encode_batch(candidates, add_special_tokens=False)
    return [
        head
        for head, encoding in zip(candidates, encodings, strict=True)
        if len(encoding.ids) == 1 and encoding.ids[0] not in forbidden
    ]


def prove_heads(
    loaded: LoadedTokenizer, heads: Sequence[str], pieces: Sequence[str], contexts=HEAD_CONTEXTS
) -> list[str]:
    """The heads that stay one aligned token before random pieces in every context.

    For each head, context and trial, the text context + head + followers must encode to
    the context's own tokens plus exactly 1 + followers tokens, the first of them spanning
    exactly the head, none of them forbidden: the head merges neither with what precedes
    nor with what follows it. Each head meets at least ``HEAD_TRIALS`` follower draws in
    all, at least one per context. (The context's own tokens may be forbidden: a
    vocabulary without a newline token maps it to unknown, which the head cannot help.)
    """
    if not heads:
        return []
    tokenizer = loaded.tokenizer
    forbidden = loaded.added_ids | loaded.special_ids
    trials = max(1, -(-HEAD_TRIALS // len(contexts)))
    context_counts = {
        c: len(tokenizer.encode(c, add_special_tokens=False).ids) if c else 0 for c in contexts
    }
    per_head = len(contexts) * trials
    draws = draw_indices(
        mix_seed(_PROOF_SEED, 3, 3), len(heads) * per_head * HEAD_FOLLOWERS, len(pieces)
    ).tolist()
    texts, spans = [], []
    for h, head in enumerate(heads):
        for c, context in enumerate(contexts):
            for t in range(trials):
                at = (h * per_head + c * trials + t) * HEAD_FOLLOWERS
                followers = "".join(pieces[i] for i in draws[at : at + HEAD_FOLLOWERS])
                texts.append(context + head + followers)
                spans.append((len(context), len(context) + len(head), context_counts[context]))
    encodings = tokenizer.encode_batch(texts, add_special_tokens=False)
    good = np.ones(len(heads), dtype=bool)
    for index, (encoding, (start, end, before)) in enumerate(zip(encodings, spans, strict=True)):
        h = index // per_head
        if not good[h]:
            continue
        ids = encoding.ids
        if (
            len(ids) != before + 1 + HEAD_FOLLOWERS
            or tuple(encoding.offsets[before]) != (start, end)
            or not forbidden.isdisjoint(ids[before:])
        ):
            good[h] = False
    return [head for head, ok in zip(heads, good.tolist(), strict=True) if ok]


def _misaligned(
    encoding: Encoding, order: np.ndarray, lengths: np.ndarray, forbidden: frozenset[int]
) -> np.ndarray:
    """Piece indices (into the table) whose span in the join did not get exactly one token.

    Token offsets (characters, in the joined text) locate each token in the piece spans: a
    piece fails if it got no token, several tokens, a forbidden id, or a token that runs
    past its end (a merge across the boundary, which also fails the next piece).
    """
    ends = np.cumsum(lengths[order])
    starts = ends - lengths[order]
    offsets = np.asarray(encoding.offsets, dtype=np.int64).reshape(-1, 2)
    ids = np.asarray(encoding.ids, dtype=np.int64)
    if ids.size == order.size and offsets.size:
        inside = (
            (offsets[:, 0] >= starts) & (offsets[:, 1] <= ends) & (offsets[:, 1] > offsets[:, 0])
        )
        ok = inside
        if forbidden:
            ok = ok & ~np.isin(ids, np.fromiter(forbidden, dtype=np.int64))
        if ok.all():
            return np.empty(0, dtype=np.int64)
    bad = np.zeros(order.size, dtype=bool)
    if offsets.size:
        # Assign each token to the piece holding its first character.
        first = np.searchsorted(ends, offsets[:, 0], side="right").clip(0, order.size - 1)
        last = np.searchsorted(ends, np.maximum(offsets[:, 1] - 1, offsets[:, 0]), side="right")
        last = last.clip(0, order.size - 1)
        per_piece = np.bincount(first, minlength=order.size)
        bad |= per_piece != 1
        for a, b in zip(first[last > first].tolist(), last[last > first].tolist(), strict=True):
            bad[a : b + 1] = True
        if forbidden:
            hit = np.isin(ids, np.fromiter(forbidden, dtype=np.int64))
            bad[first[hit]] = True
    else:
        bad[:] = True
    return np.unique(order[bad])


def _proof_orders(count: int, round_index: int) -> list[np.ndarray]:
    """Random joins of the table: the first a permutation (every piece appears) padded with
    random draws, the others fully random; each at least ``PROOF_PIECES`` long."""
    length = max(PROOF_PIECES, count)
    orders = []
    for j in range(PROOF_ORDERS):
        seed = mix_seed(_PROOF_SEED, round_index, j)
        draws = draw_indices(seed, length, count)
        if j == 0:
            keys = draw_indices(mix_seed(seed, 1, 1), count, 1 << 32)
            perm = np.argsort(keys, kind="stable")
            draws = np.concatenate([perm, draws[: length - count]])
        orders.append(draws)
    return orders


def prove_pieces(loaded: LoadedTokenizer, pieces: Sequence[str]) -> list[str] | None:
    """The subset of ``pieces`` proven to give one token each in long random joins.

    Pieces that break alignment are pruned and the survivors re-proven, for a few rounds;
    returns None when no round passes cleanly.
    """
    forbidden = loaded.added_ids | loaded.special_ids
    table = list(pieces)
    for round_index in range(PROOF_ROUNDS):
        if not table:
            return None
        array = np.array(table, dtype=object)
        lengths = np.fromiter(map(len, table), dtype=np.int64, count=len(table))
        orders = [
            order[start : start + PROOF_CHUNK]
            for order in _proof_orders(len(table), round_index)
            for start in range(0, order.size, PROOF_CHUNK)
        ]
        joins = ["".join(array[order].tolist()) for order in orders]
        encodings = loaded.tokenizer.encode_batch(joins, add_special_tokens=False)
        bad = np.unique(
            np.concatenate(
                [
                    _misaligned(encoding, order, lengths, forbidden)
                    for encoding, order in zip(encodings, orders, strict=True)
                ]
            )
        )
        if bad.size == 0:
            return table
        keep = np.ones(len(table), dtype=bool)
        keep[bad] = False
        table = [piece for piece, kept in zip(table, keep.tolist(), strict=True) if kept]
    return None


class _Draws:
    """Successive id draws of one repair run: draw j uses a seed derived from (seed, j)."""

    __slots__ = ("_next", "_pool", "_seed", "_tokenizer")

    def __init__(self, tokenizer: Tokenizer, pool: np.ndarray, seed: int) -> None:
        self._tokenizer = tokenizer
        self._pool = pool
        self._seed = seed
        self._next = 0

    def decode(self, count: int) -> str:
        # The mixed seed is scrambled (two splitmix64 outputs make the draw seed): without
        # that, draw k of decode j would be draw k-1 of decode j+1, every decode a shifted
        # window of one sequence, and a tiny vocabulary could loop on the same candidates.
        high, low = draw_indices(mix_seed(self._seed, self._next, _REPAIR_STREAM), 2, 1 << 32)
        seed = (int(high) << 32) | int(low)
        self._next += 1
        ids = self._pool[draw_indices(seed, count, self._pool.size)]
        return _CONTROL.sub(" ", self._tokenizer.decode(ids.tolist(), skip_special_tokens=False))


class Synthesizer:
    """Exact-length text for one tokenizer; thread-safe, one per tokenizer file per process."""

    _cache: dict[tuple, Synthesizer] = {}  # noqa: RUF012 - process-wide by design
    _cache_lock = threading.Lock()

    def __init__(
        self,
        loaded: LoadedTokenizer,
        pieces: list[str] | None,
        pool: np.ndarray,
        forbidden: frozenset[int],
        prepare_seconds: float,
        heads: list[str] | None = None,
    ) -> None:
        """Use :meth:`prepare`; this only stores what it found. The fast method needs both
        pieces and heads; without either, texts come from the repair loop."""
        self.loaded = loaded
        self._tokenizer = loaded.tokenizer
        if not pieces or not heads:
            pieces = heads = None
        self._pieces = pieces
        self._heads = heads
        self._assembler = PieceAssembler(pieces, heads) if pieces else None
        self._pool = pool
        self._forbidden = forbidden
        self.prepare_seconds = prepare_seconds
        self.table_cached = False  # True when the table came from the on-disk cache

    @classmethod
    def prepare(cls, loaded: LoadedTokenizer) -> Synthesizer:
        """The synthesizer of ``loaded``, built once per tokenizer file in this process.

        Raises ``SynthesisError`` for a vocabulary with no base or no non-special ids.
        """
        key = _cache_key(loaded)
        if key is None:
            return cls._build(loaded)
        with cls._cache_lock:
            cached = cls._cache.get(key)
            if cached is None:
                cached = cls._cache[key] = cls._build(loaded)
            return cached

    @classmethod
    def _build(cls, loaded: LoadedTokenizer) -> Synthesizer:
        """Read the table from the on-disk cache, or prepare it and store it there."""
        started = time.perf_counter()
        path = table_cache_path(loaded)
        table = _read_table(path) if path is not None else None
        if table is not None:
            pieces, heads, pool, forbidden = table
            synth = cls(loaded, pieces, pool, forbidden, time.perf_counter() - started, heads)
            synth.table_cached = True
            return synth
        synth = cls._prepare_table(loaded, started)
        if path is not None:
            _write_table(path, synth._pieces, synth._heads, synth._pool, synth._forbidden)
        return synth

    @classmethod
    def _prepare_table(cls, loaded: LoadedTokenizer, started: float) -> Synthesizer:
        eligible = eligible_ids(loaded)
        usable = _without(eligible, loaded.added_ids)
        if usable.size == 0:  # only added (non-special) ids left: still eligible
            usable = eligible
        decoded = decode_each(loaded, usable)
        needed = min_fast_pieces(usable.size)
        pieces: list[str] | None = None
        for spaced_only in (True, False):
            pieces = prove_pieces(
                loaded, candidate_pieces(loaded, decoded, spaced_only=spaced_only)
            )
            if pieces is not None and len(pieces) >= needed:
                break
            pieces = None
        heads = choose_heads(loaded, decoded, pieces) if pieces else None
        pool, forbidden = _repair_pool(loaded, usable, decoded)
        return cls(loaded, pieces, pool, forbidden, time.perf_counter() - started, heads)

    @property
    def method(self) -> Method:
        """``fast`` when proven pieces are assembled, ``repair`` for the repair loop."""
        return "fast" if self._assembler is not None else "repair"

    @property
    def piece_count(self) -> int:
        """Number of proven fast pieces (0 when the repair loop is used)."""
        return len(self._pieces) if self._pieces else 0

    @property
    def pieces(self) -> tuple[str, ...]:
        """The proven fast pieces, in table order."""
        return tuple(self._pieces or ())

    @property
    def heads(self) -> tuple[str, ...]:
        """The proven heads (first tokens without leading whitespace), in table order."""
        return tuple(self._heads or ())

    @property
    def head_count(self) -> int:
        """Number of proven heads (0 when the repair loop is used)."""
        return len(self._heads) if self._heads else 0

    def text(self, n: int, seed: int, head: bool = True) -> str:
        """Text that re-encodes to exactly ``n`` tokens, none special; ``""`` for 0.

        With ``head`` (the default) the text is trim-stable: no leading or trailing
        whitespace. ``head=False`` gives, with the fast method, text that starts with a
        space-prefixed piece, so it can be appended right after another text without
        changing either count (a reply streamed in chunks); the repair loop's texts are
        always trim-stable and cannot be joined that way.
        """
        n = operator.index(n)
        if n < 0:
            raise ValueError(f"token count must be non-negative, got {n}")
        if n == 0:
            return ""
        if self._assembler is not None:
            return self._assembler.text(n, seed, head)
        return self.repair_text(n, seed)

    def repair_text(self, n: int, seed: int) -> str:
        """The decode, re-encode and repair loop (the fallback, and a benchmark baseline).

        In addition, a candidate that re-encodes to an added id is treated like one holding
        a special id (resampled), and every decode has its control characters replaced by
        spaces before it is measured, so the text never holds one.
        """
        n = operator.index(n)
        if n < 0:
            raise ValueError(f"token count must be non-negative, got {n}")
        if n == 0:
            return ""
        draws = _Draws(self._tokenizer, self._pool, seed)
        text = draws.decode(n).strip()
        last_count: int | None = None
        extensions = 0
        for _ in range(REPAIR_ATTEMPTS):
            encoding = self._encode(text)
            last_count = len(encoding.ids)
            if not text or not self._clean(encoding.ids):
                text = self._resample(draws, n, text)
            elif last_count == n:
                return text
            elif last_count > n:
                cut, exact = self._trim(text, encoding.offsets, n)
                if exact:
                    assert cut is not None  # an exact cut is always a text
                    return cut
                text = cut if cut is not None else self._resample(draws, n, text)
            else:
                # Extending joins with a space, but a trimmed text cannot end with one, so every
                # other extension joins directly (else one more token than a byte-level
                # vocabulary needs could never be cut back to a trim-stable text).
                extra = draws.decode(max(n - last_count, 1)).strip()
                extensions += 1
                joiner = " " if extensions % 2 else ""
                grown = text + joiner + extra if extra else text
                text = grown if len(grown) > len(text) else self._resample(draws, n, text)
        raise SynthesisError(failure_message(n, last_count))

    def _encode(self, text: str) -> Encoding:
        return self._tokenizer.encode(text, add_special_tokens=False)

    def _clean(self, ids: list[int]) -> bool:
        return self._forbidden.isdisjoint(ids)

    def _resample(self, draws: _Draws, n: int, previous: str) -> str:
        """A fresh decode of ``n`` ids, stripped, that differs from ``previous``."""
        for _ in range(IDENTICAL_RESAMPLES):
            candidate = draws.decode(n).strip()
            if candidate != previous:
                return candidate
        raise SynthesisError(SAME_CANDIDATE)

    def _trim(self, text: str, offsets: list[tuple[int, int]], n: int) -> tuple[str | None, bool]:
        """Trim repair: (exact cut, True), or (longest shorter cut or None, False)."""
        tried = 0
        previous = -1
        shorter: str | None = None
        for k in range(n - 1, -1, -1):
            end = offsets[k][1]
            if end == previous or end <= 0 or end >= len(text):
                continue
            previous = end
            cut = text[:end].rstrip()
            if not cut:
                continue
            ids = self._encode(cut).ids
            if len(ids) == n and self._clean(ids):
                return cut, True
            if len(ids) < n and (shorter is None or len(cut) > len(shorter)):
                shorter = cut
            tried += 1
            if tried == TRIM_BOUNDARIES:
                break
        return shorter, False


def choose_heads(
    loaded: LoadedTokenizer, decoded: Sequence[str], pieces: Sequence[str]
) -> list[str] | None:
    """Heads proven at the start of a text and after newlines; when too few survive the
    newline contexts, those proven at the start alone; None when there are none."""
    candidates = candidate_heads(loaded, decoded)
    strong = prove_heads(loaded, candidates, pieces)
    if len(strong) >= min(MIN_HEADS, len(candidates)) and strong:
        return strong
    plain = prove_heads(loaded, candidates, pieces, contexts=("",))
    return plain or None


def _repair_pool(
    loaded: LoadedTokenizer, usable: np.ndarray, decoded: Sequence[str]
) -> tuple[np.ndarray, frozenset[int]]:
    """Ids the repair loop draws, and ids its text must not re-encode to.

    Prefer usable ids whose own decode is non-empty and free of control characters; when
    there are none, draw from all usable ids (any non-special id is eligible).
    """
    clean = np.fromiter(
        (bool(text) and _CONTROL.search(text) is None for text in decoded),
        dtype=bool,
        count=usable.size,
    )
    pool = usable[clean] if clean.any() else usable
    excludes_added = not np.isin(pool, np.fromiter(loaded.added_ids, dtype=np.int64)).any()
    forbidden = loaded.special_ids | loaded.added_ids if excludes_added else loaded.special_ids
    return pool, frozenset(forbidden)


def _cache_key(loaded: LoadedTokenizer) -> tuple | None:
    """Identity of the tokenizer file: path plus size and mtime, or the hub id; None for
    tokenizers built in memory, which are not cached."""
    source = loaded.source
    if source.startswith("hub:"):
        return ("hub", source)
    try:
        stat = os.stat(source)
    except (OSError, ValueError):
        return None
    if not os.path.isfile(source):
        return None
    return ("file", os.path.realpath(source), stat.st_size, stat.st_mtime_ns)


# ---------------------------------------------------------------------------------------
# The on-disk table cache. Preparation is a deterministic function of the tokenizer file's
# bytes and this module's algorithm, so its result is kept per (file digest, package version,
# format) and start-up costs a file read instead of about a second and a half of proofs.

TABLE_FORMAT = 3  # bumped whenever the table a tokenizer file gets changes
NO_TABLE_CACHE_ENV = "BATCHBENCH_NO_TABLE_CACHE"
CACHE_DIR_ENV = "BATCHBENCH_CACHE_DIR"


def cache_dir() -> str:
    """``$BATCHBENCH_CACHE_DIR``, else ``$XDG_CACHE_HOME/batchbench``, else
    ``~/.cache/batchbench``."""
    explicit = os.environ.get(CACHE_DIR_ENV)
    if explicit:
        return explicit
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "batchbench")


def table_cache_path(loaded: LoadedTokenizer) -> str | None:
    """Where this tokenizer file's table lives; None for in-memory tokenizers or when
    ``BATCHBENCH_NO_TABLE_CACHE`` is set."""
    if os.environ.get(NO_TABLE_CACHE_ENV):
        return None
    key = _cache_key(loaded)
    if key is None or key[0] != "file":
        return None
    digest = hashlib.sha256()
    try:
        with open(key[1], "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    except OSError:
        return None
    library = tokenizers.__version__  # proofs hold for this library's encoder
    name = f"table-v{TABLE_FORMAT}-{__version__}-tok{library}-{digest.hexdigest()[:40]}.json"
    return os.path.join(cache_dir(), name)


def _read_table(path: str):
    try:
        with open(path, "rb") as handle:
            document = orjson.loads(handle.read())
        if not isinstance(document, dict) or document.get("format") != TABLE_FORMAT:
            return None
        pieces = document["pieces"]
        heads = document["heads"]
        pool = np.asarray(document["pool"], dtype=np.int64)
        forbidden = frozenset(int(i) for i in document["forbidden"])
        if (pieces is not None and not pieces) or (heads is not None and not heads):
            return None
    except (OSError, ValueError, KeyError, TypeError):
        return None  # missing or unreadable: prepare it again
    return pieces, heads, pool, forbidden


def _write_table(path: str, pieces, heads, pool: np.ndarray, forbidden: frozenset[int]) -> None:
    """Write atomically (temporary file, then rename); a cache that cannot be written is
    skipped silently, since it only saves time."""
    document = {
        "format": TABLE_FORMAT,
        "pieces": list(pieces) if pieces else None,
        "heads": list(heads) if heads else None,
        "pool": pool.tolist(),
        "forbidden": sorted(forbidden),
    }
    directory = os.path.dirname(path)
    try:
        os.makedirs(directory, exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=directory, prefix=".table-")
        with os.fdopen(fd, "wb") as handle:
            handle.write(orjson.dumps(document))
            os.fchmod(handle.fileno(), 0o644)
        os.replace(temporary, path)
    except OSError:
        with contextlib.suppress(OSError, UnboundLocalError):
            os.unlink(temporary)
