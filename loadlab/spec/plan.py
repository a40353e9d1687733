"""Load plans: how much load, in which steps, for a run, a sweep point or a replay.

Pure data (pydantic models, no I/O in validation); :mod:`loadlab.spec.validate` turns
validation errors into one-line :class:`~loadlab.errors.InputError` messages (file or
flag, field, fix; exit 2).

:class:`LoadPlan` is the one plan model: ``loadlab run`` (Locust) and
``loadlab sim replay`` (virtual time) both execute it. Exactly one of

- ``concurrency``: closed loop, users per step;
- ``rate``: open loop, requests/s per step, gamma inter-arrivals of shape
  ``burstiness`` (1 = Poisson), the schedule of step k seeded from (seed, k);
- ``trace``: replay a trace's arrivals (x ``time_scale``) and lengths, one step;
- ``search``: an adaptive knee search over closed-loop users
  (:mod:`loadlab.spec.knee_search`) instead of a fixed list of levels;

each step ``step_duration_s`` long with its first ``warmup_s`` cut by the analyzer
(default :func:`default_warmup`: ``WARMUP_SHARE`` (a fifth) of the step, at most
``WARMUP_MAX_S`` (10 s); a trace replay's of the trace's length).
Level lists are read by :func:`parse_levels` alone, from a YAML list, ``"1,2,4,8"`` or
the geometric series ``"start:factor:max"`` (``"1:2:64"`` -> 1, 2, 4, ..., 64: each
level ``factor`` times the last, rounded for user counts, ending at ``max`` even when the
factor overshoots it).

Every field carries a description: it is the help text, and the fix an error shows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, model_validator

from loadlab.spec.fields import Strict, bad

WARMUP_SHARE = 0.2
WARMUP_MAX_S = 10.0
# Upper bounds, checked before anything starts: past them a plan is a typo, not a load
# test (a user is a connection and a greenlet; a billion of them exhausts memory long
# before the first step ends, and an infinite step never ends).
MAX_USERS = 100_000
MAX_RATE = 100_000.0   # requests/s
MAX_LEVELS = 1_000
MAX_STEP_S = 7 * 86_400.0   # a week
LEVELS_FIX = (
    "write a list such as [1, 2, 4, 8], the text 1,2,4,8, or start:factor:max such as 1:2:64"
)


def default_warmup(duration_s: float) -> float:
    """The warm-up cut when none is given: a fifth of the step, at most 10 s."""
    return min(WARMUP_SHARE * duration_s, WARMUP_MAX_S)


def geometric_levels(start: float, factor: float, top: float, integer: bool) -> list[float]:
    """start, start*factor, ... (rounded and strictly rising when ``integer``), ending with top."""
    levels: list[float] = []
    level = float(start)
    while (round(level) if integer else level) < top:
        value = round(level) if integer else level
        if not levels or value > levels[-1]:
            levels.append(value)
        level *= factor
    levels.append(top)
    return levels


class OutOfBounds(ValueError):
    """Levels that parse but exceed a bound; carries its own fix."""

    def __init__(self, message: str, fix: str) -> None:
        super().__init__(message)
        self.fix = fix


def parse_levels(value: Any, integer: bool = False) -> list[float]:
    """The one level parser: a list, ``"1,2,4"`` or ``"start:factor:max"``; ValueError if bad."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = [value]
    if isinstance(value, str) and ":" in value:
        try:
            start, factor, top = (float(p) for p in value.split(":"))
        except ValueError:
            raise ValueError(f"expected start:factor:max, got {value!r}") from None
        if not start > 0 or not factor > 1 or not top >= start or not math.isfinite(top):
            raise ValueError(f"need start > 0, factor > 1, max >= start; got {value!r}")
        if math.log(top / start) / math.log(factor) > MAX_LEVELS:
            raise OutOfBounds(f"{value!r} makes more than {MAX_LEVELS} levels",
                              "give fewer levels (a larger factor, or a knee search)")
        levels = geometric_levels(start, factor, top, integer)
    elif isinstance(value, str):
        try:
            levels = [float(x) for x in value.split(",") if x.strip()]
        except ValueError:
            raise ValueError(f"not a comma-separated list of numbers: {value!r}") from None
    elif isinstance(value, (list, tuple)):
        try:
            levels = [float(x) for x in value]
        except (TypeError, ValueError):
            raise ValueError(f"not a list of numbers: {value!r}") from None
    else:
        raise ValueError(f"not a list of levels: {value!r}")
    if not levels or not all(math.isfinite(v) and v > 0 for v in levels):
        raise ValueError(f"levels must be positive numbers, got {value!r}")
    if integer and any(v != int(v) for v in levels):
        raise ValueError(f"concurrency levels must be whole numbers, got {value!r}")
    most, unit = (MAX_USERS, "users") if integer else (MAX_RATE, "requests/s")
    if max(levels) > most:
        shown = f"{int(max(levels)):,}" if integer else f"{max(levels):,g}"
        raise OutOfBounds(f"{shown} {unit} is past the bound of {most:,.0f} {unit}",
                          f"give levels of at most {most:,.0f} {unit}")
    if len(levels) > MAX_LEVELS:
        raise OutOfBounds(f"{len(levels)} levels, more than the {MAX_LEVELS} a plan takes",
                          "give fewer levels (a larger factor, or a knee search)")
    return [int(v) for v in levels] if integer else levels


def _levels(integer: bool) -> BeforeValidator:
    def check(value: Any) -> Any:
        try:
            return parse_levels(value, integer)
        except ValueError as exc:
            raise bad(str(exc), getattr(exc, "fix", LEVELS_FIX)) from None

    return BeforeValidator(check)


Users = Annotated[list[int], _levels(integer=True)]
Rates = Annotated[list[float], _levels(integer=False)]


@dataclass(frozen=True)
class Step:
    """One load level. Exactly one of ``concurrency`` / ``target_rate`` is set (replay: neither)."""

    index: int
    duration_s: float
    warmup_s: float
    concurrency: int | None = None
    target_rate: float | None = None

    @property
    def level(self) -> float | None:
        return self.concurrency if self.concurrency is not None else self.target_rate


class Slo(Strict):
    """Service-level objectives: per-request latency percentiles a level must meet."""

    ttft_p50_s: float | None = Field(None, gt=0, description="median time to first token, seconds")
    ttft_p90_s: float | None = Field(None, gt=0, description="p90 time to first token, seconds")
    ttft_p99_s: float | None = Field(None, gt=0, description="p99 time to first token, seconds")
    itl_p50_s: float | None = Field(None, gt=0, description="median inter-token latency, seconds")
    itl_p90_s: float | None = Field(None, gt=0, description="p90 inter-token latency, seconds")
    itl_p99_s: float | None = Field(None, gt=0, description="p99 inter-token latency, seconds")
    e2e_p50_s: float | None = Field(None, gt=0, description="median end-to-end latency, seconds")
    e2e_p90_s: float | None = Field(None, gt=0, description="p90 end-to-end latency, seconds")
    e2e_p99_s: float | None = Field(None, gt=0, description="p99 end-to-end latency, seconds")

    def targets(self) -> dict[str, float]:
        """The objectives that are set, by name (``ttft_p99_s`` -> 2.0)."""
        return {k: v for k, v in self.model_dump().items() if v is not None}


class KneeSearch(Strict):
    """Adaptive knee search over closed-loop users: the grid start, start+resolution, ..., max."""

    start: int = Field(gt=0, description="the fewest users tried (first of the grid)")
    max: int = Field(gt=0, le=MAX_USERS, description="the most users tried (last of the grid)")
    resolution: int = Field(
        gt=0, description="grid spacing: the levels a full linear scan would run"
    )
    factor: float = Field(2.0, gt=1, description="coarse pass: each level this times the last")
    settle_s: float | None = Field(
        None,
        ge=0,
        le=MAX_STEP_S,
        description="extra seconds run and cut after a stalled "
        "step while its queue drains (default: the warm-up)",
    )

    @model_validator(mode="after")
    def _grid(self) -> KneeSearch:
        if self.max < self.start:
            raise bad("max {max} is below start {start}", "give max >= start",
                      max=self.max, start=self.start)
        return self

    def grid(self) -> list[int]:
        """Every level of the equivalent linear scan."""
        levels = list(range(self.start, self.max + 1, self.resolution))
        return levels if levels[-1] == self.max else [*levels, self.max]


class LoadPlan(Strict):
    """What load to offer, step by step (see the module docstring)."""

    concurrency: Users | None = Field(None, description=f"closed-loop users per step: {LEVELS_FIX}")
    rate: Rates | None = Field(None, description=f"open-loop requests/s per step: {LEVELS_FIX}")
    trace: str | None = Field(
        None, description="a trace file whose arrivals and lengths are replayed"
    )
    search: KneeSearch | None = Field(
        None, description="adaptive knee search: start, max, resolution"
    )
    burstiness: float = Field(
        1.0,
        gt=0,
        allow_inf_nan=False,
        description="gamma shape of open-loop gaps: 1 Poisson, <1 burstier",
    )
    time_scale: float = Field(
        1.0,
        gt=0,
        allow_inf_nan=False,
        description="trace replay: recorded offsets x this (0.5: twice as fast)",
    )
    step_duration_s: float = Field(60.0, gt=0, le=MAX_STEP_S, description="seconds per step")
    warmup_s: float = Field(
        10.0,
        ge=0,
        le=MAX_STEP_S,
        description="seconds cut from each step's start, shorter than "
        "a step (default a fifth of the step, at most 10 s)",
    )
    max_in_flight: int = Field(
        10000, ge=1, description="open loop: requests one worker keeps in flight at most"
    )
    trace_duration_s: float | None = Field(
        None,
        gt=0,
        le=MAX_STEP_S,
        description="trace replay: last arrival offset (filled in from the trace)",
    )
    slo: Slo | None = Field(
        None, description="latency objectives, e.g. {ttft_p99_s: 2.0, itl_p99_s: 0.1}"
    )

    @model_validator(mode="before")
    @classmethod
    def _default_warmup(cls, data: Any) -> Any:
        if not isinstance(data, dict) or data.get("warmup_s") is not None:
            return data
        span: Any = (data.get("trace_duration_s") if data.get("trace")
                     else data.get("step_duration_s", 60.0))
        try:
            return {**data, "warmup_s": default_warmup(float(span))}
        except (TypeError, ValueError):
            return data  # the duration's own check names the problem

    @model_validator(mode="after")
    def _one_kind(self) -> LoadPlan:
        kinds = [
            k for k in ("concurrency", "rate", "trace", "search") if getattr(self, k) is not None
        ]
        if len(kinds) != 1:
            raise bad(
                "give exactly one of concurrency, rate, trace, search; got {got}",
                "e.g. concurrency: [1, 2, 4, 8] or rate: 1,2,4",
                got=", ".join(kinds) or "none",
            )
        if self.trace is None and not self.warmup_s < self.step_duration_s:
            raise bad("warm-up {warmup} s must be shorter than a step ({step} s)",
                      "use a warm-up of about a fifth of the step", warmup=self.warmup_s,
                      step=self.step_duration_s)
        return self

    @property
    def mode(self) -> Literal["closed", "rate", "replay"]:
        if self.trace is not None:
            return "replay"
        if self.rate is not None:
            return "rate"
        return "closed"

    @property
    def gamma_shape(self) -> float | None:
        """The renewal process's gamma shape; None for Poisson."""
        return None if self.burstiness == 1.0 else self.burstiness

    def step(self, index: int, level: float | None, settle_s: float = 0.0) -> Step:
        """Step ``index`` of this plan at ``level`` (users or requests/s; replay: None),
        ``settle_s`` longer with that much more cut (a knee search's step after a stall)."""
        if self.mode == "replay":
            duration = (self.trace_duration_s or 0.0) + 1e-3
            return Step(index, duration, min(self.warmup_s, duration / 2))
        duration, warmup = self.step_duration_s + settle_s, self.warmup_s + settle_s
        if self.mode == "closed":
            return Step(index, duration, warmup, concurrency=int(level or 0))
        return Step(index, duration, warmup, target_rate=float(level or 0))

    @property
    def steps(self) -> tuple[Step, ...]:
        """The fixed steps; a search plan's steps are chosen as it runs (empty here)."""
        if self.mode == "replay":
            return (self.step(0, None),)
        levels = self.concurrency or self.rate or []
        return tuple(self.step(i, level) for i, level in enumerate(levels))

    def describe(self) -> dict[str, Any]:
        """JSON-ready summary for the manifest: the fields, the mode and the steps."""
        data = self.model_dump(mode="json")
        data["mode"] = self.mode
        data["steps"] = [vars(s) for s in self.steps]
        return data

    @classmethod
    def from_description(cls, data: dict[str, Any]) -> LoadPlan:
        """Inverse of :meth:`describe` (plans travel to Locust workers as JSON)."""
        return cls.model_validate({k: v for k, v in data.items() if k in cls.model_fields})
