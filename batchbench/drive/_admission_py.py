"""Pure-Python twin of ``batchbench._native._admission``: same API, same errors.

This is the readable reference: the compiled module implements the same ring buffer and
min-heap with C arrays. ``BATCHBENCH_NO_EXTENSIONS=1`` selects this module.
"""

from __future__ import annotations

import heapq
import operator
import sys
from typing import Self

_SSIZE_MAX = sys.maxsize
_SSIZE_MIN = -sys.maxsize - 1


def _ssize(value: int) -> int:
    """Convert as a C ``Py_ssize_t`` argument does: TypeError, or OverflowError if too big."""
    number = operator.index(value)
    if not _SSIZE_MIN <= number <= _SSIZE_MAX:
        raise OverflowError("Python int too large to convert to C ssize_t")
    return number


class FifoRing:
    """Fixed-capacity FIFO of non-negative trajectory indices, stored in a ring buffer.

    ``push`` raises ``OverflowError`` when full (the capacity is the plan count, so a
    full ring is a bug, not back-pressure); ``pop`` raises ``IndexError`` when empty.
    """

    __slots__ = ("_buf", "_capacity", "_head", "_size")

    def __init__(self, capacity: int) -> None:
        capacity = _ssize(capacity)
        if capacity < 0:
            raise ValueError(f"FifoRing capacity must be non-negative, got {capacity}")
        self._buf: list[int] = [0] * capacity
        self._capacity = capacity
        self._head = 0
        self._size = 0

    @classmethod
    def range(cls, n: int) -> Self:
        """A full ring holding 0 .. n-1 in order: the closed-loop queue of every plan."""
        ring = cls(n)
        ring._buf = list(range(ring._capacity))
        ring._size = ring._capacity
        return ring

    @property
    def capacity(self) -> int:
        """How many indices the ring can hold at once."""
        return self._capacity

    def push(self, i: int) -> None:
        """Append trajectory index ``i`` (must be >= 0) at the tail."""
        i = _ssize(i)
        if i < 0:
            raise ValueError(f"trajectory index must be non-negative, got {i}")
        if self._size == self._capacity:
            raise OverflowError(f"FifoRing is full (capacity {self._capacity})")
        tail = self._head + self._size
        if tail >= self._capacity:
            tail -= self._capacity
        self._buf[tail] = i
        self._size += 1

    def pop(self) -> int:
        """Remove and return the index at the head (the oldest one)."""
        if self._size == 0:
            raise IndexError("pop from an empty FifoRing")
        value = self._buf[self._head]
        self._head += 1
        if self._head == self._capacity:
            self._head = 0
        self._size -= 1
        return value

    def __len__(self) -> int:
        return self._size

    def __repr__(self) -> str:
        return f"FifoRing(len={self._size}, capacity={self._capacity})"


class SlotAllocator:
    """Hands out the lowest free routing slot; remembers how many distinct slots were used.

    Freed slots live in a min-heap and held slots in a byte map, so ``acquire`` and
    ``release`` are O(log freed) and a double release is caught, not silently corrupting.
    Because the lowest free slot is always taken, ``peak`` (distinct slots ever
    allocated) equals the peak number of slots held at once.
    """

    __slots__ = ("_free", "_held")

    def __init__(self) -> None:
        self._free: list[int] = []  # min-heap of released slots below peak
        self._held = bytearray()  # one byte per slot ever allocated; len == peak

    def acquire(self) -> int:
        """Take the lowest free slot, or a new one above every slot used so far."""
        if self._free:
            slot = heapq.heappop(self._free)
            self._held[slot] = 1
            return slot
        self._held.append(1)
        return len(self._held) - 1

    def release(self, slot: int) -> None:
        """Give ``slot`` back; ``ValueError`` if it is not held now."""
        slot = _ssize(slot)
        if slot < 0 or slot >= len(self._held) or not self._held[slot]:
            raise ValueError(f"slot {slot} is not held")
        self._held[slot] = 0
        heapq.heappush(self._free, slot)

    @property
    def active(self) -> int:
        """Slots held right now."""
        return len(self._held) - len(self._free)

    @property
    def peak(self) -> int:
        """Distinct slots ever allocated, which equals the peak concurrency."""
        return len(self._held)

    def __len__(self) -> int:
        return len(self._held) - len(self._free)

    def __contains__(self, slot: object) -> bool:
        if not isinstance(slot, int) or slot < 0 or slot >= len(self._held):
            return False
        return self._held[slot] != 0

    def __repr__(self) -> str:
        return f"SlotAllocator(active={self.active}, peak={self.peak})"
