"""A run's own requests as a workload to send again (``loadlab sim replay --trace RUN``).

A what-if that resamples the profile answers for a workload like the run's; one that
re-sends the run's requests answers for the run's workload itself, so the difference
from the measured run is the server's, not the sample's. :func:`read_recorded` reads a
run folder's ``requests.parquet`` and the step windows of its ``manifest.json`` into a
:class:`RecordedWorkload`:

- lengths: the token counts the server reported (``prompt_tokens``, and
  ``output_tokens`` of a request that ended ``ok``); a request cut short (aborted at the
  end of the plan, failed) keeps the lengths it asked for (``target_*``), since what it
  would have produced is what it asked for (``max_tokens``);
- when: each request's send time (``t_sent``) as an offset from its step's start, so
  gaps between a live run's steps do not shift the arrivals;
- who: closed loop, the user that sent it (``worker`` and ``user``, numbered from 0 in
  the order users first sent), so each user can re-send its own sequence.

Requests never written to the server (``t_sent`` null) put no load on it and are left
out.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Literal

import pandas as pd
import pyarrow.parquet as pq

from loadlab.errors import InputError
from loadlab.runstore import REQUESTS, read_manifest, read_table
from loadlab.runstore.compaction import live_parts
from loadlab.runstore.layout import MANIFEST, REQUESTS_TABLE
from loadlab.spec.plan import LoadPlan

Loop = Literal["closed", "open"]
REQUIRED = ("step", "t_sent", "status", "prompt_tokens", "output_tokens")
"""Columns a trace cannot do without; the others read as null where a run lacks them."""
_COLUMNS = (*REQUIRED, "seq", "worker", "user", "target_prompt_tokens", "target_output_tokens",
            "prefix_group", "prefix_tokens")


@dataclass(frozen=True)
class RecordedStep:
    """One load step as the run ran it."""

    index: int
    duration_s: float
    warmup_s: float
    concurrency: int | None
    target_rate: float | None


@dataclass(frozen=True)
class RecordedRequest:
    """One request to send again: when, by whom, and its lengths in tokens."""

    step: int
    offset_s: float          # sent this long after its step began
    user: int | None         # closed loop: the recorded user, numbered from 0
    prompt_tokens: int
    output_tokens: int
    prefix_group: int | None
    prefix_tokens: int


@dataclass(frozen=True)
class RecordedWorkload:
    """A run's steps and requests, in send order within each step."""

    source: Path                      # the requests table read
    loop: Loop                        # how the run was driven
    steps: tuple[RecordedStep, ...]
    requests: tuple[RecordedRequest, ...]
    profile: str                      # the run's workload profile and seed (manifest)
    seed: int

    @cached_property
    def _by_step(self) -> dict[int, list[RecordedRequest]]:
        steps: dict[int, list[RecordedRequest]] = {s.index: [] for s in self.steps}
        for req in self.requests:
            steps[req.step].append(req)
        return steps

    def in_step(self, step: int) -> list[RecordedRequest]:
        """Step ``step``'s requests in send order."""
        return self._by_step[step]

    def by_user(self, step: int) -> dict[int, list[RecordedRequest]]:
        """Step ``step``'s requests per user, users in the order they first sent."""
        users: dict[int, list[RecordedRequest]] = {}
        for req in self.in_step(step):
            if req.user is not None:
                users.setdefault(req.user, []).append(req)
        return users

    def plan(self, loop: Loop) -> LoadPlan:
        """The run's levels as a plan (per-step durations: :attr:`steps`). Open loop of a
        closed-loop run: each step's rate is the requests it sent over its length."""
        first = self.steps[0]
        timing = {"step_duration_s": first.duration_s, "warmup_s": first.warmup_s}
        if loop == "closed":
            return LoadPlan(concurrency=[s.concurrency or 0 for s in self.steps], **timing)
        return LoadPlan(rate=[self.rate(s) for s in self.steps], **timing)

    def rate(self, step: RecordedStep) -> float:
        """The step's recorded target rate, else the rate it sent at (a floor keeps an empty
        step a valid level)."""
        if step.target_rate is not None:
            return step.target_rate
        return max(len(self.in_step(step.index)) / step.duration_s, 1e-3)


def requests_dir(path: str | Path, field: str) -> Path:
    """The requests table of ``path``: a run folder or its ``requests.parquet``."""
    path = Path(path)
    table = path if path.name == REQUESTS_TABLE else path / REQUESTS_TABLE
    if not live_parts(table):
        raise InputError(f"no {REQUESTS_TABLE} with rows in {path}", source=path, field=field,
                         fix="give a run folder written by `loadlab run` or `loadlab sim replay`")
    return table


def _check_columns(table: Path) -> None:
    for part in live_parts(table):
        names = set(pq.read_schema(part).names)
        for column in REQUIRED:
            if column not in names:
                raise InputError(f"the column {column!r} is missing", source=part, field=column,
                                 fix="record the run with this loadlab (its requests table "
                                     "has every column a trace needs)")


def read_recorded(path: str | Path, field: str = "--trace") -> RecordedWorkload:
    """The workload of the run at ``path``; InputError naming ``field`` (the flag or the
    scenario field that gave the path) when it is not a run, or naming the file and the
    column that is missing."""
    table = requests_dir(path, field)
    _check_columns(table)
    run_dir = table.parent
    manifest = read_manifest(run_dir)
    windows = manifest.get("steps") or []
    if not windows:
        raise InputError("the run has no load steps", source=run_dir / MANIFEST, field="steps",
                         fix="give a run folder whose manifest lists its steps (a finished run)")
    steps = tuple(RecordedStep(int(w["step"]), float(w["t_end"]) - float(w["t_start"]),
                               float(w.get("warmup_s") or 0.0), w.get("concurrency"),
                               w.get("target_rate")) for w in windows)
    frame = read_table(table, REQUESTS, columns=list(_COLUMNS))
    workload = manifest.get("workload") or {}
    return RecordedWorkload(
        source=table,
        loop="closed" if steps[0].concurrency is not None else "open",
        steps=steps,
        requests=_requests(frame, {int(w["step"]): float(w["t_start"]) for w in windows}, table),
        profile=str(workload.get("profile", "")),
        seed=int(workload.get("seed", 0)),
    )


def _requests(frame: pd.DataFrame, starts: dict[int, float],
              table: Path) -> tuple[RecordedRequest, ...]:
    frame = frame[frame.t_sent.notna()]
    unknown = sorted(set(frame.step.dropna().astype(int)) - set(starts))
    if unknown or frame.step.isna().any():
        raise InputError(f"requests of steps the manifest does not list: {unknown or 'null'}",
                         source=table, field="step",
                         fix="give the run folder these requests were recorded in")
    frame = frame.sort_values(["step", "t_sent", "seq"], kind="stable")
    ok = frame.status == "ok"
    prompt = frame.prompt_tokens.where(frame.prompt_tokens.notna(), frame.target_prompt_tokens)
    output = frame.output_tokens.where(ok & frame.output_tokens.notna(),
                                       frame.target_output_tokens)
    output = output.where(output.notna(), frame.output_tokens)
    users: dict[tuple[str, int], int] = {}
    out = []
    for row, p, o in zip(frame.itertuples(index=False), prompt, output, strict=True):
        if pd.isna(p) or pd.isna(o) or int(p) < 1:
            continue   # no length known: nothing to send again
        user = None
        if not pd.isna(row.user):
            user = users.setdefault((str(row.worker), int(row.user)), len(users))
        group = None if pd.isna(row.prefix_group) else int(row.prefix_group)
        out.append(RecordedRequest(
            step=int(row.step), offset_s=float(row.t_sent) - starts[int(row.step)], user=user,
            prompt_tokens=int(p), output_tokens=max(int(o), 1), prefix_group=group,
            prefix_tokens=0 if group is None or pd.isna(row.prefix_tokens)
            else int(row.prefix_tokens)))
    return tuple(out)
