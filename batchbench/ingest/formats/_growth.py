"""Sizing the content a request appends to its predecessor when the trace gives only the
prompt's total: the growth is split over the appended parts in proportion to their
characters (TraceLab, Claude Code)."""

from __future__ import annotations

from batchbench.ingest.record import Segment


def apportion(total: int, weights: list[int]) -> list[int]:
    """``total`` split in proportion to ``weights`` (equal shares when all are zero), by
    largest remainder so the parts sum to ``total`` exactly; ties go to the earlier part."""
    if not weights:
        return []
    if not any(weights):
        weights = [1] * len(weights)
    whole = sum(weights)
    parts = [total * weight // whole for weight in weights]
    order = sorted(range(len(weights)), key=lambda i: (-(total * weights[i] % whole), i))
    for index in order[: total - sum(parts)]:
        parts[index] += 1
    return parts


def growth_segments(growth: int, items: list[tuple[str, int]]) -> tuple[Segment, ...] | None:
    """``growth`` tokens split over (role, characters) items; None when nothing grew or
    nothing says what was added. Parts that round to no tokens are left out."""
    if growth <= 0 or not items:
        return None
    sizes = apportion(growth, [chars for _, chars in items])
    return tuple(Segment(role, size) for (role, _), size in zip(items, sizes, strict=True) if size)
