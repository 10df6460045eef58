"""Which data-parallel rank serves a request, from its headers (first rule that applies):

1. ``x-smg-target-worker: <rank>``, the perfect-routing header batchbench sends;
2. ``x-data-parallel-rank: <rank>``, the header vLLM's DP front end honours;
3. a consistent hash of ``x-smg-routing-key`` (the user tag), so a conversation sticks to
   one rank without the client knowing the rank count;
4. otherwise the least-loaded rank: fewest requests in flight (routed and not yet fully
   answered), ties broken round-robin so idle ranks share sequential traffic.

A rank header that is not an integer in ``[0, ranks)`` is a 400 error naming the header,
rather than silently landing elsewhere.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping

TARGET_WORKER = "x-smg-target-worker"
DATA_PARALLEL_RANK = "x-data-parallel-rank"
ROUTING_KEY = "x-smg-routing-key"


class RoutingError(ValueError):
    """A rank header the simulator cannot honour (answered with HTTP 400)."""


def consistent_rank(key: str, ranks: int) -> int:
    """A stable rank for a routing key, the same in every process and run.

    Jump consistent hashing of the key's BLAKE2b digest: going from n to n+1 ranks moves
    only about 1/(n+1) of the keys, as a consistent-hash router in front of DP ranks does.
    """
    state = int.from_bytes(
        hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "big"
    )
    bucket, candidate = -1, 0
    while candidate < ranks:
        bucket = candidate
        state = (state * 2862933555777941757 + 1) & 0xFFFF_FFFF_FFFF_FFFF
        candidate = int((bucket + 1) * ((1 << 31) / ((state >> 33) + 1)))
    return bucket


def _rank_header(value: str, name: str, ranks: int) -> int:
    try:
        rank = int(value.strip())
    except ValueError:
        raise RoutingError(f"{name} must be an integer rank, got {value!r}") from None
    if not 0 <= rank < ranks:
        raise RoutingError(f"{name} {rank} is out of range: this server has {ranks} ranks")
    return rank


def choose_rank(
    headers: Mapping[str, str], ranks: int, load: Callable[[int], int], turn: int = 0
) -> int:
    """The rank for a request with these (case-insensitive) headers; see the module text."""
    value = headers.get(TARGET_WORKER)
    if value is not None:
        return _rank_header(value, TARGET_WORKER, ranks)
    value = headers.get(DATA_PARALLEL_RANK)
    if value is not None:
        return _rank_header(value, DATA_PARALLEL_RANK, ranks)
    key = headers.get(ROUTING_KEY)
    if key:
        return consistent_rank(key, ranks)
    start = turn % ranks
    return min(range(ranks), key=lambda rank: (load(rank), (rank - start) % ranks))
