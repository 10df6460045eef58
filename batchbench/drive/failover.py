"""Which DP ranks are down, and where their agents go next (``--rank-failover``).

Under perfect routing every agent keeps its rank: the slot it was admitted into names it.
When the worker behind a rank goes away, each freed slot would send the next agent to the
same dead rank, so a run could fail half its trajectories while the other ranks idle. A
rank counts as down once one of its requests fails (its retries spent) because no worker
behind it could be reached, as the gateway says: smg answers 500
``call_upstream_connection_failed`` when it cannot connect to the rank's worker, and 503
``no_available_workers`` once its health check has dropped it (or for an index past its
last worker). The client's own connection failures say nothing about one rank: it
connects only to ``--host``, the gateway, for every rank alike.

With ``none`` (the default, the behaviour before this option) the agents of a down rank
fail as they did; the summary names the rank. With ``rehash`` an agent whose rank is down
continues on the next live rank: its failed request is sent again there, and so is the
rest of its trajectory. It carries a routing key (its user tag) and, for engines that
number their own ranks (``X-data-parallel-rank``), the new rank's index, but no
``X-SMG-Target-Worker``: smg numbers only the workers it still holds healthy, so after a
worker is dropped an index no longer names the worker it named before, while its
consistent hash of the routing key always lands on a live one.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from batchbench.drive.wire import DP_RANK_HEADERS, request_headers, user_tag, valid_header_value
from batchbench.results.failures import AttemptError

RANK_FAILOVER_POLICIES = ("none", "rehash")
DEFAULT_RANK_FAILOVER = "none"
SMG_TARGET_HEADER = "x-smg-target-worker"
# A gateway's error codes that mean "no worker behind this rank answers".
WORKER_DOWN_CODES = (b"no_available_workers", b"call_upstream_connection_failed")
ROUTING_KEY_HEADER = "x-smg-routing-key"  # as request_headers names it


def down_code(status: int, raw: bytes) -> str | None:
    """The gateway's code when a 5xx answer says the rank's worker is unreachable (found in
    the body's ``error.code``, where smg puts it as well as in ``x-smg-error-code``)."""
    if status < 500 or not any(code in raw for code in WORKER_DOWN_CODES):
        return None
    try:
        error = orjson.loads(raw).get("error")
    except (orjson.JSONDecodeError, AttributeError):
        return None
    code = error.get("code") if isinstance(error, dict) else None
    return code if isinstance(code, str) and code.encode() in WORKER_DOWN_CODES else None


def down_reason(error: AttemptError) -> str | None:
    """The gateway's code when a failed attempt says its rank's worker is unreachable, or
    None when it says nothing about the rank."""
    return error.down_code


@dataclass(frozen=True, slots=True)
class RankDown:
    """When a rank was first seen down (seconds on the benchmark clock), and why."""

    at_seconds: float
    reason: str


class RankFailover:
    """The run's view of which ranks are down, shared by every agent of one process."""

    def __init__(
        self,
        ranks: int,
        policy: str,
        rank_header: str,
        api_key: str | None,
        seed: int | None,
        user_prefix: str | None,
    ) -> None:
        self.ranks = ranks
        self.rehash = policy == "rehash"
        self.down: dict[int, RankDown] = {}
        self._rank_header = rank_header
        self._keeps_index = tuple(
            name for name in DP_RANK_HEADERS[rank_header] if name != SMG_TARGET_HEADER
        )
        self._api_key = api_key
        self._seed = seed
        self._user_prefix = user_prefix

    def mark_down(self, rank: int, reason: str, at_seconds: float) -> bool:
        """Record ``rank`` as down; True the first time."""
        if rank in self.down:
            return False
        self.down[rank] = RankDown(at_seconds, reason)
        return True

    def live_rank_after(self, rank: int) -> int | None:
        """The next rank after ``rank`` (cyclically) that is not down; None when all are."""
        for step in range(1, self.ranks + 1):
            candidate = (rank + step) % self.ranks
            if candidate not in self.down:
                return candidate
        return None

    @property
    def sends_index(self) -> bool:
        """Whether a moved agent's requests still name their rank (X-data-parallel-rank)."""
        return bool(self._keeps_index)

    def headers(self, agent: int, rank: int, key: str | None) -> dict[str, str]:
        """A moved agent's headers: its routing key (``key``, the one it sent before, else
        the user tag it would have; left out if it cannot travel as a header) and the rank
        index only in headers whose engines keep their numbering."""
        if key is None:
            key = user_tag(agent, self._seed, self._user_prefix)
        headers = request_headers(self._api_key, key if valid_header_value(key) else None, None)
        for name in self._keeps_index:
            headers[name] = str(rank)
        return headers
