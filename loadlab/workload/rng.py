"""Counter-based random numbers: a uniform is a pure function of (seed, stream, seq, k).

Why not a stateful generator: the load generator asks for request ``seq`` from any
worker in any order, and the same seed must give the same request sequence byte for
byte. Hashing the counter with SplitMix64 (Steele et al., 2014) gives independent,
well-mixed 64-bit values at ~1 µs each in pure Python, cheaper than building a numpy
Generator per request.
"""

from __future__ import annotations

_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


def _mix(z: int) -> int:
    z = (z + _GOLDEN) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def key(*parts: int) -> int:
    """A 64-bit key from integers (negative values allowed)."""
    return key_after(0, *parts)


def key_after(h: int, *parts: int) -> int:
    """``key(*head, *parts)`` given ``h = key(*head)``: a caller drawing many keys under
    one prefix (seed, stream) hashes that prefix once."""
    for part in parts:
        h = _mix(h ^ (part & _MASK))
    return h


# _mix(i + 1) of the first uniforms of a key, the counters every draw hashes again.
_COUNTERS = tuple(_mix(i + 1) for i in range(8))


def uniforms(k: int, n: int) -> list[float]:
    """``n`` uniforms in [0, 1) for key ``k``."""
    counters = _COUNTERS if n <= len(_COUNTERS) else tuple(_mix(i + 1) for i in range(n))
    return [(_mix(k ^ counters[i]) >> 11) * (1.0 / (1 << 53)) for i in range(n)]
