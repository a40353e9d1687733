"""The workload-profile file format: pydantic models, loading and writing.

A profile is one YAML file holding only DERIVED figures of a trace, never raw rows:

- ``source``: where the figures come from (dataset, repository @ commit and path,
  licence, citation, how they were derived). Every shipped profile names all of them.
- ``lengths``: the input and output token-length distributions as inverse-CDF tables
  (``p``: probabilities from 0 to 1, ``v``: the length at each), plus a ``summary`` of
  the source (n, mean, p10..p99, max) for people and tests. Where input and output are
  correlated (translation, summarisation under a length filter) ``joint`` keeps the
  dependence as quantised rank pairs: each pair ``[i, j]`` says "an input at quantile
  (i + jitter) / grid went with an output at quantile (j + jitter) / grid" (an
  empirical copula); the marginals still come from the two tables.
- ``arrivals``: the fitted arrival process (``poisson``, ``gamma`` with its shape, or
  ``none`` where the source has no timestamps) and burstiness statistics.
- ``prefix``: prefix-sharing structure. ``none``; ``shared`` (every request starts
  with the same ``common_tokens``, such as a system prompt); or ``sessions``
  (conversations and repeated questions on one document, fitted from prefix-block
  hash ids): ``sessions.active`` sessions are in progress at once, each a run of
  ``turns`` requests whose first prompt comes from its turn class's
  ``first_tokens`` and whose later turns follow the turn before them by a
  ``Transition`` of the cell (turn class, context class of the previous prompt):
  *extend* (resend the previous prompt whole and add ``growth_tokens``, as a chat
  does) or *branch* (keep the leading ``keep_share`` of it and add ``new_tokens``
  of its own, as a new question on the same document does). The sampler
  (:mod:`loadlab.workload.sessions`) says how requests map to sessions. With
  sessions, ``lengths.input`` is the source's marginal for reference: the sampler
  reproduces it approximately; where lengths are paired (``joint``) the output is
  drawn given the input's rank.

Errors name the file, the field path, what was wrong and the fix (exit code 2).
"""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path
from typing import Any, Final, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import ErrorDetails

from loadlab.errors import InputError

FORMAT_VERSION: Final = 1
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml is ~10x faster on the big tables


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Source(_Strict):
    dataset: str = Field(description="human name of the data the figures come from")
    origin: str = Field(description="repository @ commit and path, or a local file name")
    licence: str = Field(description="licence of the source data")
    citation: str = Field(description="paper or page to cite, or 'none'")
    derivation: str = Field(description="how the figures in this file were computed")


class Table(_Strict):
    """An inverse CDF: ``v[k]`` is the length at cumulative probability ``p[k]``."""

    p: list[float]
    v: list[float]

    @model_validator(mode="after")
    def _check(self) -> Table:
        if len(self.p) != len(self.v) or len(self.p) < 2:
            raise ValueError(
                f"p and v must have the same length >= 2 (got {len(self.p)} and {len(self.v)})"
            )
        if self.p[0] != 0.0 or self.p[-1] != 1.0:
            raise ValueError("p must start at 0 and end at 1")
        if any(b <= a for a, b in zip(self.p, self.p[1:])):
            raise ValueError("p must be strictly increasing")
        if any(b < a for a, b in zip(self.v, self.v[1:])):
            raise ValueError("v must be non-decreasing (it is a quantile function)")
        if self.v[0] < 0:
            raise ValueError("v must be >= 0")
        return self


class Summary(_Strict):
    n: float
    mean: float
    p10: float
    p25: float
    p50: float
    p75: float
    p90: float
    p99: float
    max: float


class Joint(_Strict):
    kind: Literal["rank_pairs"] = "rank_pairs"
    grid: int = Field(gt=1, description="ranks are integers in [0, grid)")
    pairs: list[list[int]] = Field(description="[input rank, output rank]")
    spearman: float = Field(description="Spearman correlation of the source (input, output)")

    @model_validator(mode="after")
    def _check(self) -> Joint:
        if not self.pairs:
            raise ValueError("pairs must not be empty")
        for pr in self.pairs:
            if len(pr) != 2:
                raise ValueError(f"rank pair {pr} must have 2 entries (input rank, output rank)")
            if not (0 <= pr[0] < self.grid and 0 <= pr[1] < self.grid):
                raise ValueError(f"rank pair {pr} is outside [0, {self.grid})")
        return self


class Lengths(_Strict):
    input: Table
    output: Table
    input_summary: Summary
    output_summary: Summary
    joint: Joint | None = None


class ArrivalStats(_Strict):
    span_s: float | None = None
    dispersion_1s: float | None = None
    dispersion_60s: float | None = None
    peak_minute_over_mean: float | None = None
    note: str | None = None


class Arrivals(_Strict):
    process: Literal["poisson", "gamma", "none"]
    rate_per_s: float | None = Field(default=None, gt=0)
    cv: float | None = Field(
        default=None, ge=0, description="coefficient of variation of inter-arrival times"
    )
    gamma_shape: float | None = Field(
        default=None, gt=0, description="1 / cv^2; below 1 is burstier than Poisson"
    )
    stats: ArrivalStats = ArrivalStats()

    @model_validator(mode="after")
    def _check(self) -> Arrivals:
        if self.process != "none" and self.rate_per_s is None:
            raise ValueError(f"process '{self.process}' needs rate_per_s")
        if self.process == "gamma" and self.gamma_shape is None:
            raise ValueError("process 'gamma' needs gamma_shape (1 / cv^2)")
        return self


class Transition(_Strict):
    """How a session's later turn follows the turn before it, in one cell."""

    samples: int = Field(ge=0, description="later turns of the source behind these figures")
    extend_share: float = Field(
        ge=0, le=1, description="share of turns that resend the previous prompt whole and add to it"
    )
    growth_tokens: Table | None = Field(
        default=None, description="tokens an extending turn adds to the previous prompt"
    )
    keep_share: Table | None = Field(
        default=None, description="leading share of the previous prompt a branching turn keeps"
    )
    new_tokens: Table | None = Field(
        default=None, description="tokens a branching turn adds after what it keeps"
    )

    @model_validator(mode="after")
    def _check(self) -> Transition:
        if self.extend_share > 0 and self.growth_tokens is None:
            raise ValueError("extend_share > 0 needs growth_tokens")
        if self.extend_share < 1 and (self.keep_share is None or self.new_tokens is None):
            raise ValueError("extend_share < 1 needs keep_share and new_tokens")
        if self.keep_share is not None and self.keep_share.v[-1] > 1:
            raise ValueError("keep_share values must lie in [0, 1]")
        return self


class TurnClass(_Strict):
    """Sessions of ``min_turns`` turns up to the next class's: first prompt and transitions."""

    min_turns: int = Field(ge=1)
    sessions: int = Field(ge=0, description="sessions of the source in this class")
    first_tokens: Table = Field(description="prompt tokens of a session's first turn")
    transitions: list[Transition] = Field(
        default=[], description="one per context class; empty for one-turn sessions"
    )


class Sessions(_Strict):
    active: int = Field(
        ge=1,
        description="sessions in progress at once: request seq is a turn of the session in slot "
        "seq % active, so a session's turns come this many requests apart",
    )
    turns: Table = Field(description="turns (requests) per session")
    context_edges: list[float] = Field(
        description="lower bounds of the context classes (the previous prompt's tokens), from 0"
    )
    classes: list[TurnClass]
    gap_s: Summary | None = Field(
        default=None, description="seconds between a turn and the one before it, in the source"
    )

    @model_validator(mode="after")
    def _check(self) -> Sessions:
        edges = self.context_edges
        if not edges or edges[0] != 0 or any(b <= a for a, b in pairwise(edges)):
            raise ValueError("context_edges must start at 0 and increase")
        mins = [c.min_turns for c in self.classes]
        if not mins or mins[0] != 1 or any(b <= a for a, b in pairwise(mins)):
            raise ValueError("classes must start at min_turns 1, in increasing min_turns")
        for k, cls in enumerate(self.classes):
            longest = mins[k + 1] - 1 if k + 1 < len(mins) else None
            if (longest is None or longest >= 2) and len(cls.transitions) != len(edges):
                raise ValueError(
                    f"class min_turns {cls.min_turns} needs one transition per context class "
                    f"({len(edges)})"
                )
        return self


class Prefix(_Strict):
    kind: Literal["none", "shared", "sessions"]
    block_tokens: int | None = Field(default=None, gt=0)
    common_tokens: int = Field(default=0, ge=0)
    sessions: Sessions | None = None
    stats: dict[str, float] = {}

    @model_validator(mode="after")
    def _check(self) -> Prefix:
        if self.kind == "shared" and self.common_tokens <= 0:
            raise ValueError("kind 'shared' needs common_tokens > 0")
        if (self.kind == "sessions") != (self.sessions is not None):
            raise ValueError("kind 'sessions' needs sessions, and only it has them")
        return self


class ProfileModel(_Strict):
    format_version: Literal[1] = FORMAT_VERSION
    name: str = Field(min_length=1)
    description: str
    source: Source
    lengths: Lengths
    arrivals: Arrivals
    prefix: Prefix = Prefix(kind="none")


def _describe(err: ErrorDetails) -> tuple[str, str]:
    field = ".".join(str(part) for part in err["loc"]) or "(top level)"
    msg = err["msg"]
    ctx = err.get("ctx") or {}
    if "expected" in ctx:
        msg += f"; allowed: {ctx['expected']}"
    return field, msg


def parse_profile(data: Any, source: str | Path) -> ProfileModel:
    """Validate a decoded profile document; raise InputError naming the first bad field."""
    if not isinstance(data, dict):
        raise InputError(
            "a profile must be a YAML mapping "
            "(name, description, source, lengths, arrivals, prefix)",
            source=source,
            fix="start from one of the files in profiles/ or run `loadlab profile build`",
        )
    try:
        return ProfileModel.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors()
        field, msg = _describe(errors[0])
        more = f" ({len(errors) - 1} more problem(s) after this one)" if len(errors) > 1 else ""
        raise InputError(
            f"{msg}{more}",
            source=source,
            field=field,
            fix="correct that field (see loadlab/workload/model.py for the format) "
            "or regenerate the file with `loadlab profile build`",
        ) from None


def read_profile_file(path: Path) -> ProfileModel:
    """Load and validate a profile file."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(
            f"cannot read profile: {exc.strerror}",
            source=path,
            fix="check the path, or run `loadlab profile list` for shipped names",
        ) from None
    try:
        data = yaml.load(text, Loader=_LOADER)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else None
        raise InputError(
            f"not valid YAML: {getattr(exc, 'problem', exc)}",
            source=path,
            field=where,
            fix="fix the YAML syntax at that line",
        ) from None
    return parse_profile(data, path)


class _FlowDumper(yaml.SafeDumper):
    """Writes short numeric lists on one line so tables stay readable."""


def _represent_list(dumper: yaml.SafeDumper, data: list[Any] | tuple[Any, ...]) -> yaml.Node:
    flow = all(isinstance(x, (int, float, list, tuple)) for x in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


_FlowDumper.add_representer(list, _represent_list)
_FlowDumper.add_representer(tuple, _represent_list)


def dump_profile(model: ProfileModel) -> str:
    """YAML text of a profile, fields in declaration order."""
    data = model.model_dump(mode="python", exclude_none=True)
    return yaml.dump(data, Dumper=_FlowDumper, sort_keys=False, width=120, allow_unicode=True)
