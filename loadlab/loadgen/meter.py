"""What one load-generator process applied, kept exactly and cut into CLIENT samples.

A :class:`ClientMeter` lives in every process that sends requests (one per
:class:`~loadlab.loadgen.context.LoadContext`). It keeps, since its last cut:

- ``inflight_s``: the time integral of the number of requests in flight
  (request-seconds), advanced at every begin and end of a request, so the mean over any
  union of samples is exact. A count read once a second would see a closed loop at
  whatever instant the sampler woke, and a starved client wakes late.
- ``backoff_s``: the same integral of users pausing on purpose after a failed
  connection (not in flight, yet not held back by the client either).
- ``sent``: requests begun; ``send_lags_s``: for scheduled (open-loop) requests, how
  late each was begun after its scheduled time (the client's own lateness, before any
  connect; the REQUESTS row's ``send_lag_s`` runs to the first byte written).
- loop lag: the monitor greenlet sleeps ``LAG_TICK_S`` at a time and :meth:`tick`
  records how much longer it took (every timestamp the process takes is late by as
  much): sum, count and maximum.
- CPU time of the process (``os.times``).

:meth:`ClientMeter.cut` closes the sample and starts the next. The context cuts every
``SAMPLE_S`` and at every window edge it knows of (:func:`window_edges`: a step's start,
its warm-up end and its end), so the master can add up whole samples per measured
window (:mod:`loadlab.loadgen.achieved`) with no interpolation but for the few
milliseconds between the master's and a worker's view of an edge.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from loadlab.loadgen.shapes import LoadPlan, Step

LAG_TICK_S = 0.05
SAMPLE_S = 1.0


def _cpu_s() -> float:
    t = os.times()
    return t.user + t.system


class ClientMeter:
    """In-flight integral, sends, send lags, loop lag and CPU of one process, per sample."""

    def __init__(self, worker: str, clock: Callable[[], float] = time.time,
                 cpu: Callable[[], float] = _cpu_s) -> None:
        self.worker = worker
        self._clock = clock
        self._cpu = cpu
        self.in_flight = 0
        self.backing_off = 0
        self.issued = 0                  # requests begun since the start (never reset)
        self._t_change = self._t_cut = clock()
        self._cpu_cut = cpu()
        self._reset()

    def _reset(self) -> None:
        self._area = 0.0
        self._backoff_area = 0.0
        self._sent = 0
        self._send_lags: list[float] = []
        self._lag_sum = 0.0
        self._lag_max = 0.0
        self._ticks = 0

    def _advance(self, now: float) -> None:
        self._area += self.in_flight * (now - self._t_change)
        self._backoff_area += self.backing_off * (now - self._t_change)
        self._t_change = now

    def begin(self, t_scheduled: float | None = None) -> None:
        """A request is begun (before connecting); ``t_scheduled``: when the plan wanted it."""
        now = self._clock()
        self._advance(now)
        self.in_flight += 1
        self.issued += 1
        self._sent += 1
        if t_scheduled is not None:
            self._send_lags.append(now - t_scheduled)

    def end(self) -> None:
        """A request is over (whatever its outcome)."""
        self._advance(self._clock())
        self.in_flight -= 1

    @contextmanager
    def backoff(self) -> Iterator[None]:
        """A user pauses on purpose inside this block (after a failed connection)."""
        self._advance(self._clock())
        self.backing_off += 1
        try:
            yield
        finally:
            self._advance(self._clock())
            self.backing_off -= 1

    def tick(self, lag_s: float) -> None:
        """One monitor sleep overslept by ``lag_s``."""
        self._lag_sum += lag_s
        self._lag_max = max(self._lag_max, lag_s)
        self._ticks += 1

    @property
    def since_cut_s(self) -> float:
        return self._clock() - self._t_cut

    def cut(self) -> dict[str, Any] | None:
        """Close the current sample (a CLIENT row) and start the next; None if no time passed."""
        now, cpu = self._clock(), self._cpu()
        interval = now - self._t_cut
        if interval <= 0:
            return None
        self._advance(now)
        used = cpu - self._cpu_cut
        sample = {
            "t": now, "worker": self.worker, "interval_s": interval, "cpu_s": used,
            "cpu_frac": used / interval,
            "loop_lag_mean_s": self._lag_sum / self._ticks if self._ticks else 0.0,
            "loop_lag_max_s": self._lag_max, "loop_lag_ticks": self._ticks,
            "in_flight": self.in_flight, "inflight_s": self._area,
            "backoff_s": self._backoff_area, "sent": self._sent,
            "send_lags_s": self._send_lags,
        }
        self._t_cut, self._cpu_cut = now, cpu
        self._reset()
        return sample


def window_edges(plan: LoadPlan, step: Step, t_start: float) -> list[float]:
    """Unix times at which samples must be cut for ``step`` begun at ``t_start``
    (closed loop: when the worker heard of it) or for the whole schedule from ``t_start``
    = t0 (open loop, step 0): each step's warm-up end and end."""
    steps = [step] if plan.mode == "closed" else plan.steps
    edges, start = [], t_start
    for each in steps:
        edges += [start + each.warmup_s, start + each.duration_s]
        start += each.duration_s
    return edges
