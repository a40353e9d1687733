"""Load plans: what load to offer, step by step, as plain data.

Kinds (one :class:`Step` per load level; a run is a list of steps, each
``duration_s`` long, the first ``warmup_s`` of each cut by the analyzer):

- closed loop (:func:`concurrency_steps`): ``concurrency`` users, each sending its
  next request as soon as the previous one finished. Levels come from a list
  (``1,2,4,8``) or a geometric series ``start:factor:max`` (``1:2:64`` ->
  1, 2, 4, ..., 64; the last level is ``max`` even when the factor overshoots).
- open loop (:func:`rate_steps`): requests arrive at ``target_rate`` per second from
  a Poisson (``burstiness`` None or 1) or gamma renewal process whose absolute send
  times are cumulative sums of seeded gaps (:mod:`loadlab.workload.arrivals`), so a
  late send never delays the ones after it. The arrival index is the request's
  ``seq``; it continues across steps.
- trace replay (:func:`replay_plan`): one step; request ``i`` is trace row ``i``
  (time order), sent at its recorded offset times ``time_scale``.

Warm-up: when not given, :func:`default_warmup` cuts ``WARMUP_SHARE`` (20%) of each
step, at most ``WARMUP_MAX_S`` (10 s): a 60 s step keeps its first 10 s out, a 5 s
step its first second.

``locustfile.py`` turns a closed-loop plan into a Locust ``LoadTestShape`` for the
web UI; ``loadlab run`` drives the steps itself (:mod:`loadlab.loadgen.driver`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Literal

from loadlab.errors import InputError
from loadlab.workload.arrivals import RenewalSchedule

Mode = Literal["closed", "rate", "replay"]


@dataclass(frozen=True)
class Step:
    """One load level. Exactly one of ``concurrency`` / ``target_rate`` is set (replay: neither)."""

    index: int
    duration_s: float
    warmup_s: float
    concurrency: int | None = None
    target_rate: float | None = None


@dataclass(frozen=True)
class LoadPlan:
    mode: Mode
    steps: tuple[Step, ...]
    burstiness: float | None = None      # gamma shape for rate plans; None = Poisson
    time_scale: float = 1.0              # replay only
    trace: str | None = None             # replay only
    max_in_flight: int = 10000           # open loop: per-worker cap; waiting for it counts as latency

    def describe(self) -> dict:
        """JSON-ready summary for the manifest."""
        data = asdict(self)
        data["steps"] = [asdict(s) for s in self.steps]
        return data


def parse_levels(text: str, flag: str) -> list[float]:
    """``1,2,4`` -> [1, 2, 4]; errors name the flag."""
    try:
        levels = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InputError(f"not a comma-separated list of numbers: {text!r}", field=flag,
                         fix="write e.g. 1,2,4,8") from None
    if not levels or any(v <= 0 for v in levels):
        raise InputError(f"levels must be positive numbers, got {text!r}", field=flag,
                         fix="write e.g. 1,2,4,8")
    return levels


def geometric_levels(text: str) -> list[int]:
    """``start:factor:max`` -> start, start*factor, ... capped at and ending with max."""
    parts = text.split(":")
    try:
        start, factor, top = int(parts[0]), float(parts[1]), int(parts[2])
        if len(parts) != 3:
            raise ValueError
    except (ValueError, IndexError):
        raise InputError(f"expected start:factor:max, got {text!r}", field="--geometric",
                         fix="write e.g. 1:2:64") from None
    if start < 1 or factor <= 1 or top < start:
        raise InputError(f"need start >= 1, factor > 1, max >= start; got {text!r}",
                         field="--geometric", fix="write e.g. 1:2:64")
    levels: list[int] = []
    level = float(start)
    while round(level) < top:
        if not levels or round(level) > levels[-1]:
            levels.append(round(level))
        level *= factor
    levels.append(top)
    return levels


WARMUP_SHARE = 0.2
WARMUP_MAX_S = 10.0


def default_warmup(duration_s: float) -> float:
    """The warm-up cut when none is given: a fifth of the step, at most 10 s."""
    return min(WARMUP_SHARE * duration_s, WARMUP_MAX_S)


def _check_durations(duration_s: float, warmup_s: float) -> None:
    if duration_s <= 0:
        raise InputError(f"step duration must be > 0 s, got {duration_s}", field="--step-duration")
    if not 0 <= warmup_s < duration_s:
        raise InputError(f"warm-up must be >= 0 and shorter than the step ({duration_s} s), got {warmup_s}",
                         field="--warmup", fix="use a warm-up of about a fifth of the step")


def concurrency_steps(levels: list[int], duration_s: float, warmup_s: float) -> LoadPlan:
    _check_durations(duration_s, warmup_s)
    steps = tuple(Step(i, duration_s, warmup_s, concurrency=int(c)) for i, c in enumerate(levels))
    return LoadPlan("closed", steps)


def rate_steps(rates: list[float], duration_s: float, warmup_s: float,
               burstiness: float | None = None, max_in_flight: int = 10000) -> LoadPlan:
    _check_durations(duration_s, warmup_s)
    if burstiness is not None and burstiness <= 0:
        raise InputError(f"burstiness must be > 0, got {burstiness}", field="--burstiness",
                         fix="1 is Poisson, < 1 burstier, > 1 smoother")
    steps = tuple(Step(i, duration_s, warmup_s, target_rate=r) for i, r in enumerate(rates))
    shape = None if burstiness in (None, 1.0) else burstiness
    return LoadPlan("rate", steps, burstiness=shape, max_in_flight=max_in_flight)


def replay_plan(trace: str, last_offset_s: float, time_scale: float, warmup_s: float | None,
                max_in_flight: int = 10000) -> LoadPlan:
    """One step over the whole trace; ``warmup_s`` None: :func:`default_warmup` of its length."""
    if time_scale <= 0:
        raise InputError(f"time scale must be > 0, got {time_scale}", field="--time-scale",
                         fix="1 replays in real time, 0.5 twice as fast")
    duration = last_offset_s + 1e-3
    warmup = default_warmup(duration) if warmup_s is None else min(warmup_s, duration / 2)
    step = Step(0, duration, warmup)
    return LoadPlan("replay", (step,), time_scale=time_scale, trace=trace, max_in_flight=max_in_flight)


def step_at(plan: LoadPlan, elapsed_s: float) -> Step | None:
    """The step running ``elapsed_s`` after the start; None once the plan is over."""
    t = 0.0
    for step in plan.steps:
        t += step.duration_s
        if elapsed_s < t:
            return step
    return None


def plan_from_dict(data: dict) -> LoadPlan:
    """Inverse of :meth:`LoadPlan.describe` (plans travel to workers as JSON)."""
    fields = dict(data)
    fields["steps"] = tuple(Step(**s) for s in data["steps"])
    return LoadPlan(**fields)


@dataclass(frozen=True)
class Arrival:
    seq: int
    offset_s: float      # seconds after the plan's start
    step: int


def arrivals(plan: LoadPlan, seed: int, replay_offsets: list[float] | None = None) -> Iterator[Arrival]:
    """Every open-loop arrival of the plan in time order (the same in every process).

    Rate steps: step ``k`` draws a renewal process at its own rate, seeded from
    (seed, k), starting at the step's start; arrivals past the step's end are cut.
    Replay: ``replay_offsets[seq]`` (already scaled, sorted).
    """
    if plan.mode == "replay":
        for seq, offset in enumerate(replay_offsets or []):
            yield Arrival(seq, offset, 0)
        return
    seq = 0
    start = 0.0
    for step in plan.steps:
        assert step.target_rate is not None
        sched = RenewalSchedule(step.target_rate, plan.burstiness, seed * 1_000_003 + step.index)
        for offset in sched:
            if offset >= step.duration_s:
                break
            yield Arrival(seq, start + offset, step.index)
            seq += 1
        start += step.duration_s
