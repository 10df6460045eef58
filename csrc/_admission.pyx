# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: binding=False, embedsignature=True
# binding=False makes methods plain builtin methods, which CPython calls ~1.5x faster than
# the cyfunctions Cython 3 makes by default; embedsignature keeps the signatures in help().
"""Compiled admission primitives: the FIFO trajectory ring and the routing-slot allocator.

Both run once per admission or finish, for every trajectory of a run, so they are plain C
arrays behind a thin Python surface. ``batchbench._admission_py`` is the readable twin with
the same API and errors; the test suite runs the same cases against both.
"""

cimport cython
from cpython.long cimport PyLong_AsSsize_t, PyLong_CheckExact, PyLong_FromSsize_t
from cpython.mem cimport PyMem_Free, PyMem_Malloc, PyMem_Realloc
from cpython.object cimport PyObject
from cpython.ref cimport Py_DECREF, Py_INCREF
from libc.stdint cimport SIZE_MAX, uintptr_t

cdef Py_ssize_t _INITIAL_SLOTS = 16


cdef inline Py_ssize_t _as_index(object i) except? -1:
    """``i`` as a C index, converted as a ``Py_ssize_t`` argument is (``__index__``;
    ``TypeError``, or ``OverflowError`` beyond the C range)."""
    cdef Py_ssize_t value = i
    return value


@cython.final
cdef class FifoRing:
    """Fixed-capacity FIFO of non-negative trajectory indices, stored in a C ring buffer.

    ``push`` raises ``OverflowError`` when full (the capacity is the plan count, so a
    full ring is a bug, not back-pressure); ``pop`` raises ``IndexError`` when empty.

    A cell holds either a reference to the exact ``int`` pushed (so ``pop`` returns it
    without allocating a new one, as ``deque.popleft`` does) or, tagged with a set low
    bit, a C index ``(i << 1) | 1`` (``range`` fills a ring with those, so a million
    plans take 8 MB, not the 40 MB of as many int objects and their cells). Object
    pointers are aligned, so their low bit is always clear. The ring holds only exact
    ints, which reference nothing, so it needs no part in garbage collection.
    """

    cdef uintptr_t *_buf
    cdef Py_ssize_t _capacity
    cdef Py_ssize_t _head
    cdef Py_ssize_t _size

    def __cinit__(self, Py_ssize_t capacity):
        if capacity < 0:
            raise ValueError(f"FifoRing capacity must be non-negative, got {capacity}")
        if <size_t>capacity > SIZE_MAX // sizeof(uintptr_t) - 1:
            raise MemoryError()
        # One spare cell so a zero capacity still gets a valid pointer.
        self._buf = <uintptr_t *>PyMem_Malloc((capacity + 1) * sizeof(uintptr_t))
        if self._buf == NULL:
            raise MemoryError()
        self._capacity = capacity
        self._head = 0
        self._size = 0

    def __dealloc__(self):
        cdef Py_ssize_t pos = self._head
        cdef Py_ssize_t left = self._size
        cdef uintptr_t cell
        if self._buf == NULL:
            return
        while left > 0:
            cell = self._buf[pos]
            if not (cell & 1):
                Py_DECREF(<object><PyObject *>cell)
            pos += 1
            if pos == self._capacity:
                pos = 0
            left -= 1
        PyMem_Free(self._buf)

    @classmethod
    def range(cls, Py_ssize_t n):
        """A full ring holding 0 .. n-1 in order: the closed-loop queue of every plan."""
        cdef FifoRing ring = cls(n)
        cdef Py_ssize_t i = 0
        while i < n:
            ring._buf[i] = ((<uintptr_t>i) << 1) | 1  # n < SIZE_MAX / 8: no bit lost
            i += 1
        ring._size = n
        return ring

    @property
    def capacity(self):
        """How many indices the ring can hold at once."""
        return self._capacity

    def push(self, i):
        """Append trajectory index ``i`` (must be >= 0) at the tail."""
        cdef Py_ssize_t value
        cdef object stored
        if PyLong_CheckExact(i):
            value = PyLong_AsSsize_t(i)  # OverflowError beyond the C range, as before
            stored = i
        else:  # bool, int subclasses, __index__: kept as the plain int they stand for
            value = _as_index(i)
            stored = None
        if value < 0:
            raise ValueError(f"trajectory index must be non-negative, got {value}")
        if self._size == self._capacity:
            raise OverflowError(f"FifoRing is full (capacity {self._capacity})")
        if stored is None:
            stored = PyLong_FromSsize_t(value)
        cdef Py_ssize_t tail = self._head + self._size
        if tail >= self._capacity:
            tail -= self._capacity
        Py_INCREF(stored)
        self._buf[tail] = <uintptr_t><PyObject *>stored
        self._size += 1

    def pop(self):
        """Remove and return the index at the head (the oldest one)."""
        if self._size == 0:
            raise IndexError("pop from an empty FifoRing")
        cdef uintptr_t cell = self._buf[self._head]
        self._head += 1
        if self._head == self._capacity:
            self._head = 0
        self._size -= 1
        if cell & 1:
            return PyLong_FromSsize_t(<Py_ssize_t>(cell >> 1))
        value = <object><PyObject *>cell  # a new reference: hand over the ring's one
        Py_DECREF(value)
        return value

    def __len__(self):
        return self._size

    def __repr__(self):
        return f"FifoRing(len={self._size}, capacity={self._capacity})"


@cython.final
cdef class SlotAllocator:
    """Hands out the lowest free routing slot; remembers how many distinct slots were used.

    Freed slots live in a C min-heap and held slots in a byte map, so ``acquire`` and
    ``release`` are O(log freed) and a double release is caught, not silently corrupting.
    Because the lowest free slot is always taken, ``peak`` (distinct slots ever
    allocated) equals the peak number of slots held at once.
    """

    cdef Py_ssize_t *_heap
    cdef unsigned char *_held
    cdef Py_ssize_t _n_free
    cdef Py_ssize_t _peak
    cdef Py_ssize_t _cap

    def __cinit__(self):
        self._heap = <Py_ssize_t *>PyMem_Malloc(_INITIAL_SLOTS * sizeof(Py_ssize_t))
        self._held = <unsigned char *>PyMem_Malloc(_INITIAL_SLOTS)
        if self._heap == NULL or self._held == NULL:
            raise MemoryError()
        self._cap = _INITIAL_SLOTS
        self._n_free = 0
        self._peak = 0

    def __dealloc__(self):
        PyMem_Free(self._heap)
        PyMem_Free(self._held)

    cdef int _grow(self) except -1:
        """Double both arrays; the heap never holds more than ``peak`` slots."""
        cdef Py_ssize_t new_cap = self._cap * 2
        if <size_t>new_cap > SIZE_MAX // sizeof(Py_ssize_t):
            raise MemoryError()
        cdef Py_ssize_t *heap = <Py_ssize_t *>PyMem_Realloc(
            self._heap, new_cap * sizeof(Py_ssize_t)
        )
        if heap == NULL:
            raise MemoryError()
        self._heap = heap
        cdef unsigned char *held = <unsigned char *>PyMem_Realloc(self._held, new_cap)
        if held == NULL:
            raise MemoryError()
        self._held = held
        self._cap = new_cap
        return 0

    def acquire(self):
        """Take the lowest free slot, or a new one above every slot used so far."""
        cdef Py_ssize_t slot, last, pos, child, n
        cdef Py_ssize_t *heap = self._heap
        if self._n_free == 0:
            if self._peak == self._cap:
                self._grow()
            slot = self._peak
            self._peak += 1
            self._held[slot] = 1
            return slot
        slot = heap[0]
        self._n_free -= 1
        n = self._n_free
        if n > 0:
            # Sift the last element down from the root.
            last = heap[n]
            pos = 0
            child = 1
            while child < n:
                if child + 1 < n and heap[child + 1] < heap[child]:
                    child += 1
                if heap[child] >= last:
                    break
                heap[pos] = heap[child]
                pos = child
                child = 2 * pos + 1
            heap[pos] = last
        self._held[slot] = 1
        return slot

    def release(self, Py_ssize_t slot):
        """Give ``slot`` back; ``ValueError`` if it is not held now."""
        cdef Py_ssize_t pos, parent
        cdef Py_ssize_t *heap = self._heap
        if slot < 0 or slot >= self._peak or not self._held[slot]:
            raise ValueError(f"slot {slot} is not held")
        self._held[slot] = 0
        # Sift up from the end; capacity suffices because n_free < peak <= cap.
        pos = self._n_free
        self._n_free += 1
        while pos > 0:
            parent = (pos - 1) >> 1
            if heap[parent] <= slot:
                break
            heap[pos] = heap[parent]
            pos = parent
        heap[pos] = slot

    @property
    def active(self):
        """Slots held right now."""
        return self._peak - self._n_free

    @property
    def peak(self):
        """Distinct slots ever allocated, which equals the peak concurrency."""
        return self._peak

    def __len__(self):
        return self._peak - self._n_free

    def __contains__(self, slot):
        if not isinstance(slot, int):
            return False
        if slot < 0 or slot >= self._peak:
            return False
        return self._held[<Py_ssize_t>slot] != 0

    def __repr__(self):
        return f"SlotAllocator(active={self._peak - self._n_free}, peak={self._peak})"
