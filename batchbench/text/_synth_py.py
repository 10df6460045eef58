"""Pure-Python twin of ``batchbench._native._synth``: same API, same errors, same bytes.

The text RNG is a counter-based splitmix64: draw k of a stream is a pure function of
(seed, k), so numpy can compute a whole stream at once with wrapping uint64 arithmetic and
the compiled module can compute it in a C loop, both giving the same indices on every
platform and Python version (texts are reproducible). ``BATCHBENCH_NO_EXTENSIONS=1`` selects
this module; the test suite checks that both produce byte-identical output.
"""

from __future__ import annotations

import operator

import numpy as np

MASK64 = (1 << 64) - 1
GOLDEN_GAMMA = 0x9E3779B97F4A7C15
STREAM_GAMMA = 0xD1B54A32D192ED03
MIX1 = 0xBF58476D1CE4E5B9
MIX2 = 0x94D049BB133111EB
MAX_BOUND = 1 << 32

_U32 = np.uint64(32)
_S30 = np.uint64(30)
_S27 = np.uint64(27)
_S31 = np.uint64(31)
_GAMMA = np.uint64(GOLDEN_GAMMA)
_MIX1 = np.uint64(MIX1)
_MIX2 = np.uint64(MIX2)


def _check(n: int, bound: int) -> tuple[int, int]:
    """Validate like the compiled module so both raise the same errors."""
    n = operator.index(n)
    bound = operator.index(bound)
    if n < 0:
        raise ValueError(f"n must be non-negative, got {n}")
    if not 1 <= bound <= MAX_BOUND:
        raise ValueError(f"bound must be between 1 and 2**32, got {bound}")
    return n, bound


def _splitmix(seed: int, k: int) -> int:
    """Output k of the splitmix64 stream of ``seed``, with Python ints (one draw)."""
    z = ((operator.index(seed) & MASK64) + (k + 1) * GOLDEN_GAMMA) & MASK64
    z = ((z ^ (z >> 30)) * MIX1) & MASK64
    z = ((z ^ (z >> 27)) * MIX2) & MASK64
    return z ^ (z >> 31)


def _reduce(z: int, bound: int) -> int:
    """Multiply-shift range reduction of a 64-bit draw to ``[0, bound)``."""
    return ((z >> 32) * bound) >> 32


def draw_indices(seed: int, n: int, bound: int) -> np.ndarray:
    """``n`` indices in ``[0, bound)`` from the splitmix64 stream of ``seed`` (int64 array).

    Index k is ``((z >> 32) * bound) >> 32`` where z is the splitmix64 finalizer of
    ``seed + (k + 1) * 0x9E3779B97F4A7C15``: a multiply-shift range reduction, which
    needs no rejection loop and so stays vectorizable.
    """
    n, bound = _check(n, bound)
    start = np.uint64(operator.index(seed) & MASK64)
    with np.errstate(over="ignore"):
        z = np.arange(1, n + 1, dtype=np.uint64)
        z *= _GAMMA
        z += start
        z ^= z >> _S30
        z *= _MIX1
        z ^= z >> _S27
        z *= _MIX2
        z ^= z >> _S31
        z >>= _U32
        z *= np.uint64(bound)
        z >>= _U32
    return z.astype(np.int64)


class PieceAssembler:
    """Builds text by concatenating pieces chosen by :func:`draw_indices`.

    The pieces are proven (by ``batchbench.text.synth``) to give one token each however they
    are joined, so ``text(n, seed)`` is exact without re-encoding. Pieces start with a
    space; a text that must survive trimming starts with a **head** instead: a proven
    single-token word without leading whitespace.

    Token k of ``text(n, seed)`` comes from output z_k of the splitmix64 stream of ``seed``
    (the one :func:`draw_indices` uses), reduced as it reduces, r(z, b) = ((z >> 32) * b)
    >> 32. With ``head=True`` token 0 is ``heads[r(z_0, len(heads))]`` and token k >= 1 is
    ``pieces[r(z_k, len(pieces))]``, so tokens 1..n-1 are those of ``head=False``; with
    ``head=False`` (for text appended right after another one) every token is a piece.
    An assembler without heads gives pieces only.
    """

    __slots__ = ("_count", "_heads", "_pieces")

    def __init__(self, pieces: list[str], heads: list[str] | None = None) -> None:
        items = _checked(pieces, "pieces")
        if not items:
            raise ValueError("PieceAssembler needs at least one piece")
        head_items = _checked(heads, "heads") if heads is not None else []
        if len(items) + len(head_items) > MAX_BOUND:  # the compiled table's indices are uint32
            raise ValueError("PieceAssembler holds at most 2**32 pieces and heads")
        self._pieces = items
        self._heads = head_items
        self._count = len(items)

    def __len__(self) -> int:
        return self._count

    @property
    def head_count(self) -> int:
        return len(self._heads)

    def text(self, n: int, seed: int, head: bool = True) -> str:
        """The concatenation of ``n`` tokens drawn from the stream of ``seed``."""
        n = operator.index(n)
        if n < 0:
            raise ValueError(f"n must be non-negative, got {n}")
        if n == 0:
            return ""
        words = list(map(self._pieces.__getitem__, draw_indices(seed, n, self._count).tolist()))
        if head and self._heads:
            # Index 0 of the same stream, reduced by len(heads) instead of len(pieces).
            words[0] = self._heads[_reduce(_splitmix(seed, 0), len(self._heads))]
        return "".join(words)


def _checked(items, what: str) -> list[str]:
    values = list(items)
    for value in values:
        if type(value) is not str:
            raise TypeError(f"{what} must be str, got {type(value).__name__}")
    return values
