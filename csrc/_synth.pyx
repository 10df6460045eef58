# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: binding=False, embedsignature=True
# binding=False makes methods plain builtin methods, which CPython calls faster than the
# cyfunctions Cython 3 makes by default; embedsignature keeps the signatures in help().
"""Compiled text RNG and piece assembler for exact-length synthesis.

``batchbench._synth_py`` is the readable twin with the same API, errors and output bytes.
The assembler packs every piece into one UTF-8 buffer with an offset table, draws indices
with a counter-based splitmix64 in C, copies the chosen pieces into the result and builds
the ``str`` once. The copy runs without the GIL so generation workers scale across cores.
"""

cimport cython
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from libc.stdint cimport int64_t, uint32_t, uint64_t
from libc.string cimport memcpy

import operator

import numpy as np


cdef extern from "Python.h":
    object PyUnicode_New(Py_ssize_t size, Py_UCS4 maxchar)
    void *PyUnicode_DATA(object unicode)
    object PyUnicode_DecodeUTF8(const char *s, Py_ssize_t size, const char *errors)


MASK64 = (1 << 64) - 1
GOLDEN_GAMMA = 0x9E3779B97F4A7C15
STREAM_GAMMA = 0xD1B54A32D192ED03
MIX1 = 0xBF58476D1CE4E5B9
MIX2 = 0x94D049BB133111EB
MAX_BOUND = 1 << 32

cdef uint64_t _GAMMA = 0x9E3779B97F4A7C15ULL
cdef uint64_t _MIX1 = 0xBF58476D1CE4E5B9ULL
cdef uint64_t _MIX2 = 0x94D049BB133111EBULL


cdef inline uint64_t _index(uint64_t seed, uint64_t k, uint64_t bound) noexcept nogil:
    """Index k of the stream: splitmix64 of seed + (k+1)*gamma, multiply-shift reduced."""
    cdef uint64_t z = seed + (k + 1) * _GAMMA
    z = (z ^ (z >> 30)) * _MIX1
    z = (z ^ (z >> 27)) * _MIX2
    z = z ^ (z >> 31)
    return ((z >> 32) * bound) >> 32


cdef inline uint64_t _seed64(object seed) except? 0:
    """Any Python int reduced mod 2**64, as the twin does."""
    return <uint64_t>(operator.index(seed) & MASK64)


cdef tuple _check(object n, object bound):
    n = operator.index(n)
    bound = operator.index(bound)
    if n < 0:
        raise ValueError(f"n must be non-negative, got {n}")
    if not 1 <= bound <= MAX_BOUND:
        raise ValueError(f"bound must be between 1 and 2**32, got {bound}")
    return n, bound


def draw_indices(seed, n, bound):
    """``n`` indices in ``[0, bound)`` from the splitmix64 stream of ``seed`` (int64 array)."""
    n, bound = _check(n, bound)
    cdef uint64_t s = _seed64(seed)
    cdef uint64_t b = <uint64_t>bound
    cdef Py_ssize_t count = n
    out = np.empty(count, dtype=np.int64)
    cdef int64_t[::1] view = out
    cdef Py_ssize_t k
    with nogil:
        for k in range(count):
            view[k] = <int64_t>_index(s, <uint64_t>k, b)
    return out


cdef inline void _copy(
    char *out, const char *data, const Py_ssize_t *offsets, const uint32_t *chosen, Py_ssize_t count
) noexcept nogil:
    cdef Py_ssize_t k
    cdef Py_ssize_t start
    cdef Py_ssize_t size
    for k in range(count):
        start = offsets[chosen[k]]
        size = offsets[chosen[k] + 1] - start
        memcpy(out, data + start, size)
        out += size


@cython.final
cdef class PieceAssembler:
    """Builds text by concatenating pieces chosen by :func:`draw_indices`.

    The pieces are proven (by ``batchbench.synth``) to give one token each however they
    are joined, so ``text(n, seed)`` is exact without re-encoding. With ``head=True`` the
    first token is one of ``heads`` (single-token words without leading whitespace, so the
    text survives trimming); the twin documents the index derivation.
    """

    cdef bytes _data            # every piece's UTF-8, then every head's, back to back
    cdef Py_ssize_t *_offsets   # entry i is _data[_offsets[i]:_offsets[i + 1]]
    cdef unsigned char *_ascii  # 1 when entry i is pure ASCII
    cdef Py_ssize_t _count      # pieces; heads follow them in the table
    cdef Py_ssize_t _heads

    def __cinit__(self, pieces, heads=None):
        items = list(pieces)
        head_items = list(heads) if heads is not None else []
        cdef Py_ssize_t count = len(items)
        cdef Py_ssize_t head_count = len(head_items)
        if count == 0:
            raise ValueError("PieceAssembler needs at least one piece")
        if count + head_count > MAX_BOUND:  # table indices are uint32
            raise ValueError("PieceAssembler holds at most 2**32 pieces and heads")
        encoded = []
        for what, group in (("pieces", items), ("heads", head_items)):
            for piece in group:
                if type(piece) is not str:
                    raise TypeError(f"{what} must be str, got {type(piece).__name__}")
                encoded.append((<str>piece).encode("utf-8"))
        cdef Py_ssize_t total = count + head_count
        self._offsets = <Py_ssize_t *>PyMem_Malloc((total + 1) * sizeof(Py_ssize_t))
        self._ascii = <unsigned char *>PyMem_Malloc(total * sizeof(unsigned char))
        if self._offsets == NULL or self._ascii == NULL:
            raise MemoryError()
        cdef Py_ssize_t i
        cdef Py_ssize_t position = 0
        everything = items + head_items
        for i in range(total):
            self._offsets[i] = position
            position += PyBytes_GET_SIZE(encoded[i])
            self._ascii[i] = (<str>everything[i]).isascii()
        self._offsets[total] = position
        self._data = b"".join(encoded)
        self._count = count
        self._heads = head_count

    def __dealloc__(self):
        PyMem_Free(self._offsets)
        PyMem_Free(self._ascii)

    def __len__(self):
        return self._count

    @property
    def head_count(self):
        return self._heads

    def text(self, n, seed, head=True):
        """The concatenation of ``n`` tokens drawn from the stream of ``seed``."""
        n = operator.index(n)
        if n < 0:
            raise ValueError(f"n must be non-negative, got {n}")
        if n == 0:
            return ""
        cdef Py_ssize_t count = n
        cdef uint64_t s = _seed64(seed)
        cdef uint64_t bound = <uint64_t>self._count
        cdef bint with_head = bool(head) and self._heads > 0
        cdef uint32_t *chosen = <uint32_t *>PyMem_Malloc(count * sizeof(uint32_t))
        if chosen == NULL:
            raise MemoryError()
        cdef const char *data = PyBytes_AS_STRING(self._data)
        cdef Py_ssize_t *offsets = self._offsets
        cdef unsigned char *ascii = self._ascii
        cdef Py_ssize_t total = 0
        cdef unsigned char all_ascii = 1
        cdef Py_ssize_t k
        cdef uint32_t j
        cdef Py_ssize_t first = 0
        cdef char *out
        cdef char *buffer = NULL
        try:
            with nogil:
                if with_head:
                    j = <uint32_t>(self._count + _index(s, 0, <uint64_t>self._heads))
                    chosen[0] = j
                    total += offsets[j + 1] - offsets[j]
                    all_ascii &= ascii[j]
                    first = 1
                for k in range(first, count):
                    j = <uint32_t>_index(s, <uint64_t>k, bound)
                    chosen[k] = j
                    total += offsets[j + 1] - offsets[j]
                    all_ascii &= ascii[j]
            if all_ascii:
                # ASCII: byte length == character length, so write straight into the str.
                result = PyUnicode_New(total, 127)
                out = <char *>PyUnicode_DATA(result)
                with nogil:
                    _copy(out, data, offsets, chosen, count)
                return result
            buffer = <char *>PyMem_Malloc(total)
            if buffer == NULL:
                raise MemoryError()
            with nogil:
                _copy(buffer, data, offsets, chosen, count)
            return PyUnicode_DecodeUTF8(buffer, total, NULL)
        finally:
            PyMem_Free(chosen)
            PyMem_Free(buffer)
