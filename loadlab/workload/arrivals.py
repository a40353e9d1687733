"""Drift-free arrival schedules: absolute send offsets (seconds from the start).

A schedule never sleeps and never measures elapsed time: offset ``n`` is the sum of
the first ``n`` inter-arrival gaps, so a sender that falls behind catches up instead
of stretching the whole run. The first request is at offset 0.

Processes
- ``poisson_schedule(rate, seed)``: exponential gaps, mean ``1 / rate`` (CV 1).
- ``gamma_schedule(rate, burstiness, seed)``: gamma gaps with shape ``burstiness``
  and scale ``1 / (rate * burstiness)``, so the mean rate stays ``rate`` and the gap CV
  is ``1 / sqrt(burstiness)``. Shape < 1 is burstier than Poisson (Azure code's CV of
  13 is shape 0.006); shape > 1 is smoother.
- ``step_schedule(rate, shape, seed, step)``: step ``step`` of an open-loop run.
- ``replay_schedule(timestamps_s, time_scale)``: recorded timestamps, shifted to start
  at 0 and multiplied by ``time_scale`` (0.5 replays twice as fast).

Determinism: gaps are drawn in chunks of ``CHUNK`` from numpy generators seeded by
``SeedSequence([seed, STREAM, chunk])``, so ``offset(n)`` is a pure function of
(process, rate, shape, seed, n) whichever worker asks and in whatever order.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from itertools import count

import numpy as np

from loadlab.errors import InputError

CHUNK = 1024
STREAM = 0xA7
_CACHE_CHUNKS = 8
_MASK64 = (1 << 64) - 1  # SeedSequence wants non-negative ints; negative seeds wrap


class RenewalSchedule:
    """Offsets of a renewal process (i.i.d. gaps); iterate it or ask ``offset(n)``."""

    def __init__(self, rate: float, shape: float | None, seed: int) -> None:
        if not rate > 0:
            raise InputError(
                f"arrival rate must be > 0 requests/s, got {rate}",
                field="rate",
                fix="give a positive rate such as 2.5",
            )
        if shape is not None and not shape > 0:
            raise InputError(
                f"gamma burstiness (shape) must be > 0, got {shape}",
                field="burstiness",
                fix="use 1 for Poisson-like, <1 for bursty, >1 for smooth arrivals",
            )
        self.rate = float(rate)
        self.shape = None if shape is None else float(shape)
        self.seed = int(seed)
        self._starts: list[float] = [0.0]
        self._cum: dict[int, np.ndarray] = {}

    def _gaps(self, chunk: int) -> np.ndarray:
        gen = np.random.Generator(
            np.random.PCG64(np.random.SeedSequence([self.seed & _MASK64, STREAM, chunk]))
        )
        if self.shape is None:
            return gen.exponential(1.0 / self.rate, CHUNK)
        return gen.gamma(self.shape, 1.0 / (self.rate * self.shape), CHUNK)

    def _cumulative(self, chunk: int) -> np.ndarray:
        """Offsets of the chunk's requests relative to the chunk start (first is 0)."""
        cum = self._cum.get(chunk)
        if cum is None:
            gaps = self._gaps(chunk)
            cum = np.concatenate(([0.0], np.cumsum(gaps)))
            if len(self._cum) >= _CACHE_CHUNKS:
                self._cum.pop(next(iter(self._cum)))
            self._cum[chunk] = cum
        return cum

    def offset(self, n: int) -> float:
        """Seconds from the start at which request ``n`` (0-based) is due."""
        if n < 0:
            raise ValueError("request index must be >= 0")
        chunk, i = divmod(n, CHUNK)
        while len(self._starts) <= chunk:
            c = len(self._starts) - 1
            self._starts.append(self._starts[c] + float(self._cumulative(c)[CHUNK]))
        return self._starts[chunk] + float(self._cumulative(chunk)[i])

    def __iter__(self) -> Iterator[float]:
        for n in count():
            yield self.offset(n)


def step_schedule(rate: float, shape: float | None, seed: int, step: int) -> RenewalSchedule:
    """Open-loop step ``step`` of a run seeded ``seed``: the live load generator and the
    virtual-time replay draw the same arrivals from it."""
    return RenewalSchedule(rate, shape, seed * 1_000_003 + step)


def poisson_schedule(rate: float, seed: int) -> RenewalSchedule:
    """Poisson arrivals at ``rate`` requests/s."""
    return RenewalSchedule(rate, None, seed)


def gamma_schedule(rate: float, burstiness: float, seed: int) -> RenewalSchedule:
    """Gamma-renewal arrivals at ``rate`` requests/s with shape ``burstiness``
    (CV = 1/sqrt(shape))."""
    return RenewalSchedule(rate, burstiness, seed)


def replay_schedule(timestamps_s: Iterable[float], time_scale: float = 1.0) -> Iterator[float]:
    """Recorded timestamps as offsets from the first one, times ``time_scale``."""
    if not time_scale > 0:
        raise InputError(
            f"time scale must be > 0, got {time_scale}",
            field="time_scale",
            fix="use 1 for real time, 0.5 for twice as fast",
        )
    t0: float | None = None
    for t in timestamps_s:
        if t0 is None:
            t0 = float(t)
        yield (float(t) - t0) * time_scale
