"""When trajectories start under an arrival rate (``--arrival-rate``): their start offsets.

Why an arrival process: closed-loop admission starts a new agent only when one finishes,
so a slow server is offered less work and looks better than it is. Open-loop admission
starts agents on their own schedule, whatever the server does; without a manifest's own
start times, that schedule comes from here:

- ``"poisson"``: agents arrive independently of each other, as users do; the gaps between
  arrivals are exponential with mean 1/rate, so bursts and lulls occur as in real traffic.
- ``"constant"``: one arrival every 1/rate seconds exactly (agent i at i/rate), for load
  that is the same from run to run and from second to second.

The first agent arrives at 0 in both. The Poisson gaps are drawn from a numpy ``Generator``
on PCG64, seeded with the run's seed mixed (``batchbench.rng.mix_seed``) into a stream of
its own, so equal seeds give equal offsets on every run and platform, and the arrival
times are independent of every sampled size and text, which draw from other streams.
(numpy does not promise a ``Generator`` method the same stream in every future release;
the tests pin the first offsets of a seed, so such a change would not pass unnoticed.)
"""

from __future__ import annotations

import math
import operator

import numpy as np

from batchbench.rng import mix_seed

ARRIVAL_PROCESSES = ("poisson", "constant")
DEFAULT_ARRIVAL_PROCESS = "poisson"
# The arrival stream's id for mix_seed: far from the per-agent sampling streams (0 .. 5)
# and from the text streams (0x1000..., 0x2000...).
STREAM_ARRIVALS = 0x3000_0000_0000_0000
_SEED_LIMIT = 1 << 64


def arrival_offsets(count: int, rate: float, process: str, seed: int) -> np.ndarray:
    """Start offsets in seconds (float64, non-decreasing, the first at 0) of ``count``
    trajectories arriving at ``rate`` per second by ``process`` ("poisson" or "constant");
    ``seed`` (0 .. 2^64-1) fixes the Poisson draws. Bad arguments raise ValueError."""
    if isinstance(count, bool) or not isinstance(count, int | np.integer) or count < 0:
        raise ValueError(f"the arrival count must be a non-negative integer, not {count!r}")
    if (
        isinstance(rate, bool)
        or not isinstance(rate, int | float | np.integer | np.floating)
        or not (math.isfinite(rate) and rate > 0)
    ):
        raise ValueError(f"the arrival rate must be a positive finite number, not {rate!r}")
    if process not in ARRIVAL_PROCESSES:
        raise ValueError(f"unknown arrival process {process!r} (poisson or constant)")
    if (
        isinstance(seed, bool)
        or not isinstance(seed, int | np.integer)
        or not 0 <= seed < _SEED_LIMIT
    ):
        raise ValueError(f"the arrival seed must be an integer in 0..2^64-1, not {seed!r}")
    count, rate = operator.index(count), float(rate)
    if process == "constant":
        return np.arange(count, dtype=np.float64) / rate
    offsets = np.zeros(count, dtype=np.float64)
    if count > 1:
        generator = np.random.Generator(np.random.PCG64(mix_seed(int(seed), 0, STREAM_ARRIVALS)))
        np.cumsum(generator.standard_exponential(count - 1) / rate, out=offsets[1:])
    return offsets
