"""Scenarios and load plans: the declarative inputs of a run, a sweep or a replay.

Pure data (pydantic models, no I/O in validation); :mod:`loadlab.spec.validate` reads a
scenario YAML file into :class:`Scenario` and turns validation errors into one-line
:class:`~loadlab.errors.InputError` messages (file, field, fix; exit 2).

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
import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    model_validator,
)
from pydantic_core import PydanticCustomError

from loadlab.spec.cpulist import FIX as CPU_FIX
from loadlab.spec.cpulist import format_cpu_list, parse_cpu_list

_SAFE_NAME = re.compile(r"[A-Za-z0-9._-]+")
WARMUP_SHARE = 0.2
WARMUP_MAX_S = 10.0
SCRAPE_INTERVAL_MIN_S = 0.1   # the collector's finest interval
LEVELS_FIX = (
    "write a list such as [1, 2, 4, 8], the text 1,2,4,8, or start:factor:max such as 1:2:64"
)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _bad(message: str, fix: str, **ctx: Any) -> PydanticCustomError:
    """A validation error whose fix travels with it (read by loadlab.scenario_file)."""
    return PydanticCustomError("loadlab", message, {"fix": fix, **ctx})


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


def parse_levels(value: Any, integer: bool = False) -> list[float]:
    """The one level parser: a list, ``"1,2,4"`` or ``"start:factor:max"``; ValueError if bad."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = [value]
    if isinstance(value, str) and ":" in value:
        try:
            start, factor, top = (float(p) for p in value.split(":"))
        except ValueError:
            raise ValueError(f"expected start:factor:max, got {value!r}") from None
        if start <= 0 or factor <= 1 or top < start:
            raise ValueError(f"need start > 0, factor > 1, max >= start; got {value!r}")
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
    return [int(v) for v in levels] if integer else levels


def _scalar(value: Any) -> Any:
    if not isinstance(value, (bool, int, float, str)):
        raise _bad(
            "a flag value is a number, a word or true/false, got {value}",
            "write one value (a matrix lists them: {max-num-seqs: [8, 16]})",
            value=repr(value),
        )
    return value


Scalar = Annotated[bool | int | float | str, BeforeValidator(_scalar)]


def _levels(integer: bool) -> BeforeValidator:
    def check(value: Any) -> Any:
        try:
            return parse_levels(value, integer)
        except ValueError as exc:
            raise _bad(str(exc), LEVELS_FIX) from None

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


class Slo(_Strict):
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


class KneeSearch(_Strict):
    """Adaptive knee search over closed-loop users: the grid start, start+resolution, ..., max."""

    start: int = Field(gt=0, description="the fewest users tried (first of the grid)")
    max: int = Field(gt=0, description="the most users tried (last of the grid)")
    resolution: int = Field(
        gt=0, description="grid spacing: the levels a full linear scan would run"
    )
    factor: float = Field(2.0, gt=1, description="coarse pass: each level this times the last")
    settle_s: float | None = Field(
        None,
        ge=0,
        description="extra seconds run and cut after a stalled "
        "step while its queue drains (default: the warm-up)",
    )

    @model_validator(mode="after")
    def _grid(self) -> KneeSearch:
        if self.max < self.start:
            raise _bad("max {max} is below start {start}", "give max >= start",
                       max=self.max, start=self.start)
        return self

    def grid(self) -> list[int]:
        """Every level of the equivalent linear scan."""
        levels = list(range(self.start, self.max + 1, self.resolution))
        return levels if levels[-1] == self.max else [*levels, self.max]


class LoadPlan(_Strict):
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
        1.0, gt=0, description="gamma shape of open-loop gaps: 1 Poisson, <1 burstier"
    )
    time_scale: float = Field(
        1.0, gt=0, description="trace replay: recorded offsets x this (0.5: twice as fast)"
    )
    step_duration_s: float = Field(60.0, gt=0, description="seconds per step")
    warmup_s: float = Field(
        10.0,
        ge=0,
        description="seconds cut from each step's start, shorter than "
        "a step (default a fifth of the step, at most 10 s)",
    )
    max_in_flight: int = Field(
        10000, ge=1, description="open loop: requests one worker keeps in flight at most"
    )
    trace_duration_s: float | None = Field(
        None, gt=0, description="trace replay: last arrival offset (filled in from the trace)"
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
            raise _bad(
                "give exactly one of concurrency, rate, trace, search; got {got}",
                "e.g. concurrency: [1, 2, 4, 8] or rate: 1,2,4",
                got=", ".join(kinds) or "none",
            )
        if self.trace is None and not self.warmup_s < self.step_duration_s:
            raise _bad("warm-up {warmup} s must be shorter than a step ({step} s)",
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


class Workload(_Strict):
    """Which requests are sent: the same seeded sequence goes to every point of a sweep."""

    profile: str = Field("sharegpt", description="workload profile: a shipped name "
                         "(`loadlab profile list`) or a profile file")
    seed: int = Field(0, ge=0, description="seed of lengths, prefixes and arrivals")
    calibrate: bool = Field(
        True, description="fit prompt text to exact token counts with /tokenize"
    )


class Target(_Strict):
    """The server under test: a URL to load, or a server loadlab starts per point."""

    url: str | None = Field(None, description="base URL of a running server, e.g. http://10.0.0.5:8000")
    launch: Literal["sim", "vllm"] | None = Field(
        None,
        description="start this server for each point: "
        "sim (built-in simulator) or vllm (vllm serve)",
    )
    model: str | None = Field(None, description="vllm: model path or name; sim: model profile "
                              "(llama-3.1-8b, qwen2.5-7b, ...); url: the served name")
    api: Literal["completions", "chat"] = Field(
        "completions", description="OpenAI API the requests use"
    )
    api_key_env: str = Field(
        "LOADLAB_API_KEY", description="environment variable holding the API key"
    )
    startup_timeout_s: float | None = Field(None, gt=0, description="seconds a launched server has "
                                            "to answer /health (sim 60, vllm 300)")

    @model_validator(mode="after")
    def _one_target(self) -> Target:
        if (self.url is None) == (self.launch is None):
            raise _bad(
                "give exactly one of url and launch", "url: http://HOST:PORT, or launch: sim|vllm"
            )
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise _bad("url '{url}' is not an http(s) URL", "write e.g. http://127.0.0.1:8000",
                       url=self.url)
        if self.launch == "vllm" and not self.model:
            raise _bad(
                "a launched vllm needs a model",
                "name a model path or name (scenario: target.model; "
                "loadlab run: --model, or first after --)",
            )
        return self


def _cpus(value: Any) -> Any:
    if value is None:
        return None
    try:
        return parse_cpu_list(value)
    except (TypeError, ValueError) as exc:
        raise _bad(str(exc), CPU_FIX) from None


Cpus = Annotated[
    frozenset[int], BeforeValidator(_cpus), PlainSerializer(sorted, return_type=list[int])
]


class Isolation(_Strict):
    """Server and load generator on disjoint CPUs (taskset syntax: 0, 0,2, 0-3).

    Checked here: the syntax and that the sets do not overlap; whether this machine has
    the CPUs is :func:`loadlab.experiment.cpus.check_available`'s question."""

    server_cpus: Cpus | None = Field(None, description="CPUs of the launched server, e.g. 0-2 "
                                     "(taskset syntax; a launched target only)")
    client_cpus: Cpus | None = Field(None, description="CPUs of the load generator and its local "
                                     "worker processes, e.g. 3 (taskset syntax)")

    @model_validator(mode="after")
    def _disjoint(self) -> Isolation:
        both = (self.server_cpus or frozenset()) & (self.client_cpus or frozenset())
        if both:
            raise _bad(
                "server and client CPUs overlap on {cpus}",
                "give each side its own CPUs, e.g. server 0 and client 1",
                cpus=format_cpu_list(both),
            )
        return self

    def manifest_entry(self) -> dict[str, list[int] | None] | None:
        """The manifest's ``isolation`` block, or None when nothing is pinned."""
        if self.server_cpus is None and self.client_cpus is None:
            return None
        return self.model_dump()


def _scrape_interval(value: float) -> float:
    if not value >= SCRAPE_INTERVAL_MIN_S:
        raise _bad("must be at least {least} s, got {value}", "e.g. 1 (seconds between scrapes)",
                   least=SCRAPE_INTERVAL_MIN_S, value=f"{value:g}")
    return value


class LoadgenSettings(_Strict):
    """How the load generator runs."""

    workers: int = Field(1, ge=0, description="local Locust worker processes (0: in-process)")
    timeout_s: float = Field(600.0, gt=0, description="per-request deadline, seconds")
    drain_s: float = Field(30.0, ge=0, description="seconds in-flight requests get at the end")
    collect_interval_s: Annotated[float, AfterValidator(_scrape_interval)] = Field(
        1.0, description=f"seconds between /metrics scrapes (at least {SCRAPE_INTERVAL_MIN_S})")


def flag_name(name: str) -> str:
    """vLLM flag names in either spelling (``max-num-seqs``, ``--max-num-seqs``) -> ``max_num_seqs``."""
    return name.lstrip("-").replace("-", "_")


def _flags(value: Any) -> Any:
    if not isinstance(value, dict):
        return value
    out = {flag_name(str(k)): v for k, v in value.items()}
    owned = sorted({"host", "port"} & set(out))
    if owned:
        raise _bad("flag {flags}: loadlab chooses it (a free port per point)", "remove it",
                   flags=", ".join(owned))
    return out


Flags = Annotated[dict[str, Scalar], BeforeValidator(_flags)]
FlagMatrix = Annotated[dict[str, list[Scalar]], BeforeValidator(_flags)]


def _arm_names(arms: Any) -> Any:
    for name in arms if isinstance(arms, dict) else ():
        if not isinstance(name, str):
            raise _bad("arm name {name} is not text: YAML reads on/off/yes/no as true/false",
                       "quote the name ('on') or choose another", name=repr(name))
    return arms


Arms = Annotated[dict[str, Flags], BeforeValidator(_arm_names)]


class Sweep(_Strict):
    """The points of a sweep: a matrix of flag values, or named A/B arms."""

    matrix: FlagMatrix | None = Field(
        None,
        description="flag -> values; every combination is a point, e.g. {max-num-seqs: [8, 16]}",
    )
    arms: Arms | None = Field(None, description="arm name -> flags, e.g. "
                                          "{caching-on: {enable-prefix-caching: true}, ...}")
    baseline: str | None = Field(None, description="the arm the others are compared with "
                                 "(default: the first)")

    @model_validator(mode="after")
    def _one_kind(self) -> Sweep:
        if (self.matrix is None) == (self.arms is None):
            raise _bad("give exactly one of matrix and arms",
                       "matrix: {max-num-seqs: [8, 16]} or arms: {a: {...}, b: {...}}")
        if self.matrix is not None and (not self.matrix or not all(self.matrix.values())):
            raise _bad(
                "every matrix flag needs at least one value", "e.g. max-num-seqs: [8, 16, 32]"
            )
        if self.arms is not None and len(self.arms) < 2:
            raise _bad("an A/B sweep needs at least two arms", "add a second arm")
        bad = [name for name in self.arms or {} if not _SAFE_NAME.fullmatch(name)]
        if bad:
            raise _bad(
                "arm name '{name}' cannot name a folder",
                "use letters, digits, '.', '_', '-'",
                name=bad[0],
            )
        if self.baseline is not None and self.baseline not in (self.arms or {}):
            raise _bad(
                "baseline '{name}' is not an arm",
                "name one of the arms (matrix sweeps have none)",
                name=self.baseline,
            )
        return self


class WhatIf(_Strict):
    """How ``--what-if`` models the server on the simulator (needed for a vllm or url target)."""

    model: str = Field("llama-3.1-8b", description="simulator model profile: llama-3.1-8b, "
                       "qwen2.5-7b, qwen2.5-72b")
    gpu: str = Field(
        "h100", description="simulator GPU profile: h100, h200, a100-80g, a100-40g, l40s"
    )
    flags: Flags = Field(
        default_factory=dict, description="simulator flags added to the scenario's"
    )


@dataclass(frozen=True)
class Point:
    """One server configuration of a sweep: its folder name and its full flag set."""

    name: str
    flags: dict[str, Scalar]


class Scenario(_Strict):
    """A scenario file: what to run against what, and which configurations to compare."""

    name: str = Field("scenario", description="the scenario's name (default: the file name)")
    description: str = Field("", description="what the scenario is for")
    target: Target = Field(description="url: a running server, or launch: sim|vllm")
    flags: Flags = Field(default_factory=dict, description="server flags by vLLM's names, "
                         "e.g. {max-num-seqs: 64, enable-prefix-caching: true}")
    workload: Workload = Field(default_factory=Workload, description="profile and seed")
    load: LoadPlan = Field(description="the load plan: concurrency, rate, trace or search")
    loadgen: LoadgenSettings = Field(default_factory=LoadgenSettings, description="load generator")
    isolation: Isolation | None = Field(
        None,
        description="server_cpus and client_cpus: each side on "
        "CPUs of its own (taskset syntax, e.g. server_cpus: 0-2)",
    )
    sweep: Sweep | None = Field(None, description="matrix of flag values, or named A/B arms")
    what_if: WhatIf = Field(default_factory=WhatIf, description="simulator model for --what-if")

    @model_validator(mode="after")
    def _launch_for_flags(self) -> Scenario:
        if self.target.url is not None and (self.flags or self.sweep is not None):
            raise _bad(
                "flags and sweeps need a server loadlab launches; a url target is loaded as is",
                "use target.launch: sim|vllm, or drop flags and sweep",
            )
        if (
            self.target.url is not None
            and self.isolation is not None
            and self.isolation.server_cpus
        ):
            raise _bad("server_cpus needs a launched server", "drop isolation.server_cpus")
        return self

    @property
    def sweep_mode(self) -> Literal["ab", "matrix", "single"]:
        if self.sweep is None:
            return "single"
        return "ab" if self.sweep.arms is not None else "matrix"

    @property
    def baseline(self) -> str | None:
        if self.sweep is None or self.sweep.arms is None:
            return None
        return self.sweep.baseline or next(iter(self.sweep.arms))

    def points(self) -> list[Point]:
        """Every server configuration, in run order (A/B arms, or the matrix row by row)."""
        if self.sweep is None:
            return [Point("run", dict(self.flags))]
        if self.sweep.arms is not None:
            return [Point(name, {**self.flags, **arm}) for name, arm in self.sweep.arms.items()]
        points = [Point("", dict(self.flags))]
        for flag, values in (self.sweep.matrix or {}).items():  # arms is None: matrix is set
            points = [
                Point(_join(p.name, f"{flag.replace('_', '-')}-{_text(v)}"), {**p.flags, flag: v})
                for p in points
                for v in values
            ]
        return points


def _join(a: str, b: str) -> str:
    return f"{a}_{b}" if a else b


def _text(value: Scalar) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return re.sub(r"[^A-Za-z0-9._-]", "_", str(value))
