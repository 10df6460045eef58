"""Deterministic trajectory sampling (COMPAT §7.7)."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from batchbench.errors import InputError

T = TypeVar("T")


def check_fraction(fraction: float | None) -> None:
    if fraction is not None and not (math.isfinite(fraction) and 0.0 <= fraction <= 1.0):
        raise InputError("sample fraction must be between 0 and 1")


def sample_key(seed: int, trajectory_id: str) -> int:
    """The first 16 hex digits of SHA-256("<seed>:<trajectory_id>") as an integer."""
    return int(hashlib.sha256(f"{seed}:{trajectory_id}".encode()).hexdigest()[:16], 16)


def length_bucket(n_requests: int) -> int:
    """The power-of-two bucket of a request count: 1 → 0, 2–3 → 1, 4–7 → 2, ..."""
    return max(n_requests, 1).bit_length() - 1


def _smallest_keys(items: Sequence[T], ident: Callable[[T], str], seed: int, keep: int) -> list[T]:
    ranked = sorted(items, key=lambda item: (sample_key(seed, ident(item)), ident(item)))
    return ranked[:keep]


def sample(
    items: Sequence[T],
    fraction: float | None,
    seed: int,
    ident: Callable[[T], str],
    length: Callable[[T], int],
    *,
    stratify: bool = False,
) -> list[T]:
    """The kept items, in no particular order (the caller sorts them for output): all when
    ``fraction`` is None or 1, round(f · n) of the smallest keys, or ceil(f · n_bucket)
    per length bucket when ``stratify``."""
    check_fraction(fraction)
    if fraction is None or fraction == 1.0:
        return list(items)
    if not stratify:
        return _smallest_keys(items, ident, seed, round(fraction * len(items)))
    buckets: dict[int, list[T]] = {}
    for item in items:
        buckets.setdefault(length_bucket(length(item)), []).append(item)
    kept: list[T] = []
    for bucket in sorted(buckets):
        members = buckets[bucket]
        kept.extend(_smallest_keys(members, ident, seed, math.ceil(fraction * len(members))))
    return kept


def sample_plans(
    plans: Sequence[dict[str, Any]], fraction: float | None, seed: int, stratify: bool
) -> list[dict[str, Any]]:
    """The kept plans, by trajectory id and request count, sorted for output by
    (start_after_ms, trajectory_id)."""
    kept = sample(
        plans,
        fraction,
        seed,
        ident=lambda plan: plan["trajectory_id"],
        length=lambda plan: len(plan["requests"]),
        stratify=stratify,
    )
    kept.sort(key=lambda plan: (plan["start_after_ms"], plan["trajectory_id"]))
    return kept
