"""The load a step achieved, and whether the client fell short of the load asked for.

A knee found on load that was never applied is worthless, so every step records what
the client actually did in its measured window (after the warm-up) and is marked
*client limited* when that falls short. Pure functions over CLIENT samples
(:mod:`loadlab.loadgen.meter`), used by the driver for the manifest and the console.

Figures (:func:`summarise`; workers are added up, each over the part of the window its
samples cover; a sample straddling an edge counts by its overlap):

- ``inflight_mean``: time-mean requests in flight, all workers summed (exact integral).
  ``backoff_mean``: users pausing on purpose after a failed connection (the server
  refused; the client did not hold them back).
- ``achieved_rate``: requests begun per second. ``scheduled_count`` / ``scheduled_rate``
  (open loop): the schedule's own arrivals due in the window, and per second.
- ``achieved_ratio``: closed loop ``inflight_mean / users``; open loop
  ``achieved_rate / scheduled_rate``. The schedule's rate rather than the nominal one:
  a Poisson schedule itself holds 20 +- 4.5 arrivals in 4 s at 5/s, no fault of the
  client's.
- ``send_lag_p50_s`` / ``p99`` / ``max`` (open loop): how late requests were begun.
- ``loop_lag_mean_s`` / ``max``: event-loop oversleep, the worst worker's (one starved
  worker of four under-drives its share of the users).

Verdict (:func:`limited_reasons`). Thresholds sit between the regimes measured on this
2-core box: a healthy client keeps in flight 99-100% of its users, loop lag 0.5-3 ms
mean (up to ~6 ms in a 1 s window beside other busy processes) and send lag p99 under
~80 ms; a starved one (sharing vLLM's cores, or below busy processes on its CPU) shows
1.9-2.7 of 8 users, loop lag 10-860 ms, sends late by as much.

- closed loop: ``inflight_mean + backoff_mean < INFLIGHT_MIN_RATIO x users`` (90%). A
  closed-loop user is out of flight only between one response's end and its next send,
  well under a millisecond here against requests of tens of milliseconds or more.
- open loop: ``achieved_ratio < RATE_MIN_RATIO`` (90%) once the window had at least
  ``RATE_MIN_DUE`` (50) arrivals due (with fewer, the one or two due right at its end
  and sent a millisecond late decide the ratio); or send lag p99 above
  ``SEND_LAG_P99_MAX_S`` (100 ms: past that, arrivals bunch up far beyond the asked
  process).
- both: loop lag mean above ``LOOP_LAG_MEAN_MAX_S`` (10 ms: every timestamp the client
  takes is late by about as much, a third to a half of a small model's TTFT).

Failed requests are never the client's shortfall: when at least
:data:`~loadlab.runstore.failures.SERVER_FAILURE_SHARE` of the window's requests failed
server-side (``server_failed_share``, from the recorder), users were out of flight because
the server answered in milliseconds with a failure, and the in-flight rule says nothing.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from loadlab.runstore.failures import SERVER_FAILURE_SHARE

INFLIGHT_MIN_RATIO = 0.9
RATE_MIN_RATIO = 0.9
RATE_MIN_DUE = 50
SEND_LAG_P99_MAX_S = 0.1
LOOP_LAG_MEAN_MAX_S = 0.010


@dataclass
class Achieved:
    """What the client did in one measured window (None: no data for it)."""

    inflight_mean: float | None = None
    backoff_mean: float | None = None
    achieved_ratio: float | None = None
    achieved_rate: float | None = None
    scheduled_rate: float | None = None
    scheduled_count: int | None = None
    send_lag_p50_s: float | None = None
    send_lag_p99_s: float | None = None
    send_lag_max_s: float | None = None
    loop_lag_mean_s: float | None = None
    loop_lag_max_s: float | None = None
    client_cpu_cores: float | None = None
    client_cpu_max_worker: float | None = None
    server_failed_share: float | None = None


@dataclass
class _Sums:
    covered: float = 0.0
    inflight: float = 0.0
    backoff: float = 0.0
    sent: float = 0.0
    cpu: float = 0.0
    lag_sum: float = 0.0
    ticks: float = 0.0
    lag_max: float = 0.0


def due_in(offsets: Sequence[float], start_s: float, end_s: float) -> int:
    """Arrivals of a sorted schedule with ``start_s <= offset < end_s``."""
    return bisect.bisect_left(offsets, end_s) - bisect.bisect_left(offsets, start_s)


def summarise(samples: Iterable[dict[str, Any]], t_start: float, t_end: float, *,
              concurrency: int | None = None, due: int | None = None) -> Achieved:
    """Figures of the window ``[t_start, t_end]`` from CLIENT samples (module docstring);
    ``due``: the schedule's arrivals in the window (open loop)."""
    sums: dict[str, _Sums] = defaultdict(_Sums)
    lags: list[float] = []
    for s in samples:
        t1, interval = s["t"], s["interval_s"]
        overlap = min(t1, t_end) - max(t1 - interval, t_start)
        if overlap <= 0 or interval <= 0:
            continue
        f = overlap / interval
        acc = sums[s["worker"]]
        acc.covered += overlap
        acc.inflight += s["inflight_s"] * f
        acc.backoff += s["backoff_s"] * f
        acc.sent += s["sent"] * f
        acc.cpu += s["cpu_s"] * f
        acc.lag_sum += s["loop_lag_mean_s"] * s["loop_lag_ticks"] * f
        acc.ticks += s["loop_lag_ticks"] * f
        if f >= 0.5:  # mostly inside: its maximum and its sends' lags belong here
            acc.lag_max = max(acc.lag_max, s["loop_lag_max_s"])
            lags += s["send_lags_s"] or []
    live = {w: a for w, a in sums.items() if a.covered > 0}
    if not live:
        return Achieved()
    length = max(t_end - t_start, 1e-9)
    inflight_mean = sum(a.inflight / a.covered for a in live.values())
    achieved_rate = sum(a.sent / a.covered for a in live.values())
    out = Achieved(
        inflight_mean=inflight_mean,
        backoff_mean=sum(a.backoff / a.covered for a in live.values()),
        achieved_rate=achieved_rate,
        loop_lag_mean_s=max(
            (a.lag_sum / a.ticks for a in live.values() if a.ticks > 0), default=None
        ),
        loop_lag_max_s=max(a.lag_max for a in live.values()),
        client_cpu_cores=sum(a.cpu / a.covered for a in live.values()),
        client_cpu_max_worker=max(a.cpu / a.covered for a in live.values()),
    )
    if concurrency:
        out.achieved_ratio = inflight_mean / concurrency
    elif due is not None:
        out.scheduled_rate, out.scheduled_count = due / length, due
        out.achieved_ratio = achieved_rate / out.scheduled_rate if due else None
    if lags:
        p50, p99 = np.percentile(lags, [50, 99])
        out.send_lag_p50_s, out.send_lag_p99_s, out.send_lag_max_s = (
            float(p50),
            float(p99),
            max(lags),
        )
    return out


def limited_reasons(a: Achieved, concurrency: int | None = None) -> list[str]:
    """Why a window's load fell short of the plan (empty: it did not). See the module docstring."""
    reasons = []
    busy = (a.inflight_mean or 0.0) + (a.backoff_mean or 0.0)
    failing = (a.server_failed_share or 0.0) >= SERVER_FAILURE_SHARE
    if concurrency and a.inflight_mean is not None and not failing \
            and busy < INFLIGHT_MIN_RATIO * concurrency:
        backoff = f" (+{a.backoff_mean:.2f} in error backoff)" if a.backoff_mean else ""
        reasons.append(f"in flight {a.inflight_mean:.2f}{backoff} of {concurrency} users "
                       f"({busy / concurrency:.1%} < {INFLIGHT_MIN_RATIO:.0%})")
    if not concurrency and a.achieved_ratio is not None and a.achieved_ratio < RATE_MIN_RATIO \
            and (a.scheduled_count or 0) >= RATE_MIN_DUE:
        reasons.append(f"sent {a.achieved_rate:.2f} req/s of {a.scheduled_rate:.2f} scheduled "
                       f"({a.achieved_ratio:.1%} < {RATE_MIN_RATIO:.0%})")
    if a.send_lag_p99_s is not None and a.send_lag_p99_s > SEND_LAG_P99_MAX_S:
        reasons.append(
            f"send lag p99 {a.send_lag_p99_s * 1e3:.0f} ms > {SEND_LAG_P99_MAX_S * 1e3:.0f} ms"
        )
    if a.loop_lag_mean_s is not None and a.loop_lag_mean_s > LOOP_LAG_MEAN_MAX_S:
        reasons.append(f"event-loop lag mean {a.loop_lag_mean_s * 1e3:.1f} ms > "
                       f"{LOOP_LAG_MEAN_MAX_S * 1e3:.0f} ms")
    return reasons


def step_fields(a: Achieved, concurrency: int | None = None) -> dict[str, Any]:
    """The manifest keys of one step: the figures, ``client_limited`` and its reasons."""
    reasons = limited_reasons(a, concurrency)
    fields = {k: (round(v, 6) if isinstance(v, float) else v) for k, v in asdict(a).items()}
    return {**fields, "client_limited": bool(reasons), "client_limited_reasons": reasons}


def _level(step: dict[str, Any]) -> str:
    if step.get("concurrency"):
        return f"{step['concurrency']} users"
    if step.get("target_rate"):
        return f"{step['target_rate']:g} req/s"
    return "replay"


def step_name(step: dict[str, Any]) -> str:
    """``step 1 (8 users)``: the manifest's index (as ``loadlab analyze`` shows it) and level."""
    return f"step {step['step']} ({_level(step)})"


def limited_message(steps: list[dict[str, Any]]) -> str | None:
    """One line naming the client-limited steps and why, or None when there are none."""
    parts = [f"{step_name(s)}: {'; '.join(s['client_limited_reasons'])}"
             for s in steps if s.get("client_limited")]
    if not parts:
        return None
    return ("the client did not apply the load asked for at " + " | ".join(parts)
            + ": those steps measured the client, not the server (run the client on CPUs of its own"
              " with --server-cpus/--client-cpus, or spread it with --workers)")


def format_summary(steps: list[dict[str, Any]]) -> str:
    """Console table of the load each step achieved."""
    head = ("step", "level", "in flight", "achieved", "send lag p99", "loop lag", "client")
    rows = [head]
    for s in steps:
        rows.append(
            (
                str(s["step"]),
                _level(s),
                _num(s.get("inflight_mean"), "{:.1f}"),
                _num(s.get("achieved_ratio"), "{:.0%}"),
                _num(s.get("send_lag_p99_s"), "{:.1f} ms", 1e3),
                _num(s.get("loop_lag_mean_s"), "{:.1f} ms", 1e3),
                "LIMITED" if s.get("client_limited") else "ok",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(v.rjust(w) for v, w in zip(r, widths)) for r in rows]
    return "load achieved per step (measured window):\n" + "\n".join(lines)


def _num(value: float | None, fmt: str, scale: float = 1.0) -> str:
    return "-" if value is None else fmt.format(value * scale)
