"""Fast, deterministic integer hashing for seeds (SplitMix64).

Used where a seed must be derived per request or per draw without the cost of
building a NumPy generator (a few microseconds each, which the runner's hot path
cannot afford).
"""

from __future__ import annotations

_MASK = (1 << 64) - 1
_GAMMA = 0x9E3779B97F4A7C15


def splitmix64(x: int) -> int:
    """One SplitMix64 output for state `x` (Steele, Lea & Flood 2014).

    >>> splitmix64(0)
    16294208416658607535
    """
    z = (x + _GAMMA) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def stream(seed: int, k: int) -> int:
    """The k-th output of a SplitMix64 stream started at `seed` (k = 0, 1, ...): one hash.

    >>> stream(7, 0) != stream(7, 1)
    True
    """
    z = (seed + (k + 1) * _GAMMA) & _MASK  # splitmix64 inlined: the runner's hot path
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def mix(*values: int) -> int:
    """Hash a sequence of integers into one 64-bit seed; order matters.

    >>> mix(1, 2) != mix(2, 1)
    True
    """
    h = 0x243F6A8885A308D3
    for v in values:
        h = splitmix64(h ^ (v & _MASK))
    return h


def unit(x: int) -> float:
    """Map a 64-bit integer to a float in [0, 1) using its top 53 bits."""
    return (x >> 11) * (1.0 / (1 << 53))
