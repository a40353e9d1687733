"""How the live load generator walks a load plan (:class:`loadlab.spec.plan.LoadPlan`).

- closed loop: ``concurrency`` users per step, each sending its next request as soon
  as the previous one finished (:mod:`loadlab.loadgen.driver` starts them per step;
  ``locustfile.py`` turns the plan into a Locust ``LoadTestShape`` with :func:`step_at`).
- open loop: :func:`arrivals` lists every send in time order: requests arrive at
  ``target_rate`` per second from a Poisson or gamma renewal process whose absolute send
  times are cumulative sums of seeded gaps (:func:`loadlab.workload.arrivals.step_schedule`,
  the same the virtual-time replay uses), so a late send never delays the ones after it.
  The arrival index is the request's ``seq``; it continues across steps.
- trace replay: one step; request ``i`` is trace row ``i`` (time order), sent at its
  recorded offset times ``time_scale``.

The constructors below name the two step plans for ``locust -f``'s environment variables
and tests; like ``loadlab run`` and ``loadlab sim replay`` they go through
:func:`loadlab.spec.validate.plan_from_flags`, the one place a plan is built from flags.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from loadlab.errors import InputError
from loadlab.spec import plan as config
from loadlab.spec.plan import LoadPlan, Step
from loadlab.spec.validate import plan_from_flags
from loadlab.workload.arrivals import step_schedule


def parse_levels(text: str, flag: str, integer: bool = False) -> list[float]:
    """``1,2,4`` -> [1, 2, 4] (:func:`loadlab.spec.plan.parse_levels`); errors name the flag."""
    try:
        return config.parse_levels(text, integer)
    except ValueError as exc:
        raise InputError(str(exc), field=flag, fix=config.LEVELS_FIX) from None


def concurrency_steps(levels: list[int], duration_s: float, warmup_s: float) -> LoadPlan:
    return plan_from_flags(concurrency=levels, step_duration_s=duration_s, warmup_s=warmup_s)


def rate_steps(rates: list[float], duration_s: float, warmup_s: float,
               burstiness: float | None = None, max_in_flight: int = 10000) -> LoadPlan:
    return plan_from_flags(rate=rates, step_duration_s=duration_s, warmup_s=warmup_s,
                           burstiness=burstiness, max_in_flight=max_in_flight)


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
    return LoadPlan.from_description(data)


@dataclass(frozen=True)
class Arrival:
    seq: int
    offset_s: float      # seconds after the plan's start
    step: int


def arrivals(
    plan: LoadPlan, seed: int, replay_offsets: list[float] | None = None
) -> Iterator[Arrival]:
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
        sched = step_schedule(step.target_rate, plan.gamma_shape, seed, step.index)
        for offset in sched:
            if offset >= step.duration_s:
                break
            yield Arrival(seq, start + offset, step.index)
            seq += 1
        start += step.duration_s
