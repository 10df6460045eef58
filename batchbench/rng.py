"""The package's random numbers: counter-based splitmix64, vectorized with numpy.

Counter-based means draw k of a stream is a pure function of (stream seed, k), so samples
never depend on generation order, thread scheduling or the numpy version; the same
construction backs the text synthesizer, whose texts must be reproducible.
"""

from __future__ import annotations

import hashlib
import operator

import numpy as np

MASK64 = (1 << 64) - 1
GOLDEN_GAMMA = 0x9E3779B97F4A7C15
STREAM_GAMMA = 0xD1B54A32D192ED03
_TWO_POW_53 = float(1 << 53)


def mix_seed(root: int, agent_id: int, stream_id: int) -> int:
    """Seed of one (agent, field) stream: root + agent·0x9E3779B97F4A7C15 +
    stream·0xD1B54A32D192ED03, wrapping at 2^64. The one home of seed mixing: sampling,
    text synthesis, the simulator's replies and its fault draws all derive seeds here."""
    return (
        operator.index(root)
        + operator.index(agent_id) * GOLDEN_GAMMA
        + operator.index(stream_id) * STREAM_GAMMA
    ) & MASK64


def finalize64(value: int) -> int:
    """The splitmix64 finalizer of one 64-bit value: a bijection that scatters nearby inputs."""
    z = value & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


# Separates the salt's scrambling from every other use of the finalizer.
_SALT_DOMAIN = 0x5A17_C0DE_5A17_C0DE


def salt_value(salt: str) -> int:
    """A content salt string as 64 bits (first 8 bytes of its SHA-256, little-endian)."""
    return int.from_bytes(hashlib.sha256(salt.encode("utf-8")).digest()[:8], "little")


def content_root(root_seed: int, salt: str) -> int:
    """Root of every private text stream: the run's seed scrambled with its content salt.

    Sizes keep using the bare root seed, so a new salt changes the bytes of every
    trajectory's own text but none of its token counts; equal (seed, salt) give equal text.
    Scrambling (instead of adding) keeps nearby salts from sharing streams between agents.
    """
    return finalize64(root_seed ^ finalize64(salt_value(salt) ^ _SALT_DOMAIN))


def splitmix64(seed: int, count: int, start: int = 0) -> np.ndarray:
    """Outputs ``start .. start+count-1`` of the splitmix64 sequence seeded with ``seed``."""
    with np.errstate(over="ignore"):
        counters = np.arange(start + 1, start + count + 1, dtype=np.uint64)
        z = np.uint64(seed & MASK64) + counters * np.uint64(GOLDEN_GAMMA)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def uniform_open(seed: int, count: int, start: int = 0) -> np.ndarray:
    """Uniform floats in the open interval (0, 1), 53 bits each."""
    bits = splitmix64(seed, count, start) >> np.uint64(11)
    return (bits.astype(np.float64) + 0.5) / _TWO_POW_53


def standard_normal(seed: int, count: int) -> np.ndarray:
    """``count`` N(0, 1) draws by Box-Muller; draw k uses uniforms 2k and 2k+1."""
    u = uniform_open(seed, 2 * count)
    radius = np.sqrt(-2.0 * np.log(u[0::2]))
    return radius * np.cos(2.0 * np.pi * u[1::2])
