"""Which trajectories and routing slots one shard of a run owns (``--shard``, ``--workers``).

A run split into N shards must behave like the one run: the same trajectories, the same
routing slots, the same active-agent cap in total. Shard i owns the routing slots
i, i+N, i+2N, … below the cap, so its cap is exactly its number of slots and the global
slot (and DP-rank) layout is the one a single process would use.

Closed loop: a single process with cap M admits trajectory j into slot j mod M when agents
finish in admission order (every dry run does), so shard i takes the trajectories whose
slot j mod M it owns, in their order. Each shard's own FIFO admission then gives every
trajectory the slot a single process gives it: dry-run lines are identical, and so are
live per-rank counts whenever a single process would also fill slots in order.

Open loop: arrivals in start-time order are dealt round-robin (position p to shard p mod
N), so every shard sees an even share of the arrival process; shard i's slots are again
i, i+N, … (its local lowest free slot l is global slot i + l·N).

Splitting is associative: shard i/N split into W workers gives worker w the shard
(i + w·N)/(N·W), which owns exactly the slots of i/N that are w mod W among them.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from batchbench.errors import UsageError

_SHARD = re.compile(r"^\s*([^/\s]+)\s*/\s*(\d+)\s*$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` (0-based) of ``count``."""

    index: int
    count: int

    def __post_init__(self) -> None:
        if self.count < 1 or not 0 <= self.index < self.count:
            raise UsageError(f"--shard {self.index}/{self.count}: the index must be 0 to count - 1")

    @property
    def label(self) -> str:
        return f"{self.index}/{self.count}"

    def split(self, workers: int, worker: int) -> Shard:
        """Worker ``worker`` of ``workers`` inside this shard, as a shard of the whole run."""
        return Shard(self.index + worker * self.count, self.count * workers)


def parse_shard(text: str, environ: Mapping[str, str] | None = None) -> Shard:
    """``I/N``: I a number, or the name of an environment variable holding it (such as
    ``JOB_COMPLETION_INDEX``, which a Kubernetes Indexed Job sets in each pod)."""
    match = _SHARD.match(text)
    if match is None:
        raise UsageError(
            f"--shard {text!r}: expected INDEX/COUNT, e.g. 0/4, or JOB_COMPLETION_INDEX/4 "
            "to read the index from that environment variable"
        )
    index_text, count = match.group(1), int(match.group(2))
    if count < 1:
        raise UsageError(f"--shard {text!r}: the shard count must be at least 1")
    if index_text.isdigit():
        index = int(index_text)
    elif _ENV_NAME.match(index_text):
        env = os.environ if environ is None else environ
        value = env.get(index_text)
        if value is None:
            raise UsageError(
                f"--shard {text}: the environment variable {index_text} is not set "
                "(in a Kubernetes Indexed Job every pod has JOB_COMPLETION_INDEX)"
            )
        if not value.strip().isdigit():
            raise UsageError(
                f"--shard {text}: {index_text}={value!r} is not a non-negative integer"
            )
        index = int(value)
    else:
        raise UsageError(
            f"--shard {text!r}: the index must be a number or an environment variable name"
        )
    if index >= count:
        raise UsageError(f"--shard {text}: index {index} is not below the shard count {count}")
    return Shard(index, count)


@dataclass(frozen=True)
class Share:
    """What one shard runs: global trajectory ids in its admission order, the global routing
    slot of each of its local slots (a function for open loop's unbounded slots), its cap
    and, in open loop, each trajectory's start offset."""

    shard: Shard
    agents: tuple[int, ...]
    slots: tuple[int, ...]  # closed loop: global slot of local slot l
    cap: int | None
    offsets: tuple[float, ...] | None = None  # open loop: start offset of each local agent

    def global_slot(self, local: int) -> int:
        if self.offsets is None:
            return self.slots[local]
        return self.shard.index + local * self.shard.count


def closed_loop_share(n_plans: int, max_active: int | None, shard: Shard) -> Share:
    """Shard ``shard``'s trajectories and slots under closed-loop admission."""
    cap = n_plans if max_active is None else min(max_active, n_plans)
    i, n = shard.index, shard.count
    slots = tuple(range(i, cap, n))
    agents = tuple(j for j in range(n_plans) if (j % cap) % n == i) if cap else ()
    return Share(shard, agents, slots, len(slots))


def open_loop_share(offsets: Sequence[float], max_active: int | None, shard: Shard) -> Share:
    """Shard ``shard``'s arrivals (every N-th in start order) and its part of the cap."""
    order = sorted(range(len(offsets)), key=offsets.__getitem__)  # stable, as the engine
    mine = sorted(order[shard.index :: shard.count])
    cap = None if max_active is None else len(range(shard.index, max_active, shard.count))
    return Share(shard, tuple(mine), (), cap, tuple(offsets[j] for j in mine))


def ramp_delays(share: Share, total_slots: int, ramp_seconds: float) -> list[float]:
    """Closed loop: when each local slot's first agent starts, spread evenly over the ramp
    by global slot (slot s at s/total·ramp), so shards together ramp like one process."""
    if ramp_seconds <= 0 or total_slots <= 0:
        return [0.0] * len(share.slots)
    return [ramp_seconds * slot / total_slots for slot in share.slots]


RAMP_FREE_AGENTS = 256  # up to this many active agents start together by default
RAMP_AGENTS_PER_SECOND = 1000.0  # above it, the default ramp starts this many per second


def default_ramp_seconds(active: int) -> float:
    """No ramp up to ``RAMP_FREE_AGENTS`` active agents; above, one second per
    ``RAMP_AGENTS_PER_SECOND``: 10,000 agents start over 10 s instead of one instant."""
    return 0.0 if active <= RAMP_FREE_AGENTS else active / RAMP_AGENTS_PER_SECOND


def ramp_up_seconds(config, n_plans: int) -> float:
    """--ramp-up, or the default for the run's active agents (closed-loop live runs only)."""
    if config.admission_mode == "open-loop" or config.dry_run:
        return 0.0
    if config.ramp_up is not None:
        return float(config.ramp_up)
    return default_ramp_seconds(min(config.max_active_agents or n_plans, n_plans))
