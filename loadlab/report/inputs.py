"""What a report or a comparison reads: a run folder or a sweep folder, as points.

A *single run* (manifest kind "run" or "sim-replay") is one point. A *sweep*
(manifest kind "sweep", layout in the sweep runner's contract) lists its points
with a status ("complete" | "failed" | "skipped" | "running"), an error, the vLLM
flags of the point and a relative folder holding a normal run folder.

Each point's verdict comes from its ``analysis.json``; a run folder without one is
analysed first (:func:`loadlab.analyze.analysis.write_analysis`, no SLOs: run
``loadlab analyze RUN --slo ...`` beforehand to judge them). Nothing here
raises for one bad point of a sweep: the point carries ``problems`` and the
report shows them, so a partial or half-broken sweep still reports. A folder that
is neither a run nor a sweep is an :class:`~loadlab.errors.InputError`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import pandas as pd

from loadlab.errors import InputError, LoadlabError

ANALYSIS = "analysis.json"
MANIFEST = "manifest.json"
RUN_KINDS = ("run", "sim-replay", "sweep-point")


@dataclass
class Point:
    """One load test: a sweep point or the whole of a single run."""

    name: str
    status: str                      # complete | failed | skipped | running | interrupted
    run_dir: Path | None             # None when the point never got a folder
    error: str | None = None         # why it failed, as the runner or load generator said
    flags: dict[str, Any] = field(default_factory=dict)
    what_if: bool = False
    manifest: dict[str, Any] = field(default_factory=dict)
    analysis: dict[str, Any] | None = None
    problems: list[str] = field(default_factory=list)  # what could not be read, and why

    @cached_property
    def steps(self) -> pd.DataFrame:
        """analysis.json ``steps[]`` as a frame (empty when there is no analysis); read once."""
        return pd.DataFrame((self.analysis or {}).get("steps") or [])

    @property
    def unit(self) -> str:
        """"concurrency" (closed loop) or "rate" (open loop)."""
        knee = (self.analysis or {}).get("knee") or {}
        if knee.get("unit"):
            return str(knee["unit"])
        steps = self.manifest.get("steps") or []
        return "rate" if steps and steps[0].get("concurrency") is None else "concurrency"

    @property
    def level_column(self) -> str:
        return "target_rate" if self.unit == "rate" else "concurrency"

    def section(self, key: str) -> dict[str, Any]:
        """One top-level dict of the analysis ({} when absent)."""
        value = (self.analysis or {}).get(key)
        return value if isinstance(value, dict) else {}


@dataclass
class RunSet:
    """Everything one report (or one side of a comparison) is made of."""

    root: Path
    kind: str                        # "run" | "sweep"
    manifest: dict[str, Any]
    points: list[Point]
    mode: str = "single"             # sweep mode: "ab" | "matrix" | "single"
    baseline: str | None = None      # name of the A/B baseline point

    @property
    def status(self) -> str:
        return str(self.manifest.get("status") or "unknown")

    def point(self, name: str) -> Point | None:
        return next((p for p in self.points if p.name == name), None)


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object from ``path``; InputError naming the file when it is not one."""
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read it: {exc}", source=path) from exc
    except json.JSONDecodeError as exc:
        raise InputError(f"not valid JSON (line {exc.lineno}, column {exc.colno}): {exc.msg}",
                         source=path, fix="rewrite it, or rerun the stage that writes it") from exc
    if not isinstance(data, dict):
        raise InputError("expected a JSON object at the top", source=path)
    return data


def load(root: str | Path) -> RunSet:
    """Read a run folder or a sweep folder; InputError when it is neither."""
    root = Path(root)
    path = root / MANIFEST
    if not path.is_file():
        raise InputError("no manifest.json here", source=root,
                         fix="point at a run folder (loadlab run / sim replay) or a sweep folder")
    manifest = read_json(path)
    kind = manifest.get("kind")
    if kind == "sweep":
        return _sweep(root, manifest)
    if kind in RUN_KINDS:
        point = _run_point(root, manifest)
        return RunSet(root=root, kind="run", manifest=manifest, points=[point])
    raise InputError(f"unknown kind {kind!r}", source=path, field="kind",
                     fix=f"expected 'sweep' or one of {', '.join(RUN_KINDS)}")


def _sweep(root: Path, manifest: dict[str, Any]) -> RunSet:
    sweep = manifest.get("sweep") or {}
    entries = manifest.get("points")
    if not isinstance(entries, list):
        raise InputError("a sweep manifest needs a list of points", source=root / MANIFEST,
                         field="points")
    points = [_sweep_point(root, entry, k) for k, entry in enumerate(entries)]
    return RunSet(root=root, kind="sweep", manifest=manifest, points=points,
                  mode=str(sweep.get("mode") or "matrix"), baseline=sweep.get("baseline"))


def _sweep_point(root: Path, entry: dict[str, Any], k: int) -> Point:
    name = str(entry.get("name") or f"point {k + 1}")
    run_dir = root / entry["dir"] if entry.get("dir") else None
    point = Point(name=name, status=str(entry.get("status") or "unknown"), run_dir=run_dir,
                  error=entry.get("error"), flags=dict(entry.get("flags") or {}),
                  what_if=bool(entry.get("what_if")))
    if run_dir is None or not (run_dir / MANIFEST).is_file():
        if point.status not in ("failed", "skipped"):
            point.problems.append("no run folder was written for this point")
        return point
    try:
        _fill(point, run_dir, read_json(run_dir / MANIFEST))
    except InputError as exc:
        point.problems.append(str(exc))
    return point


def _run_point(root: Path, manifest: dict[str, Any]) -> Point:
    flags = (manifest.get("target") or {}).get("launch", {}).get("flags") or manifest.get("server") or {}
    point = Point(name=str(manifest.get("point") or root.name), status="unknown", run_dir=root,
                  flags=dict(flags))
    _fill(point, root, manifest)
    return point


def _fill(point: Point, run_dir: Path, manifest: dict[str, Any]) -> None:
    """Manifest, status and analysis of a point that has a run folder."""
    point.manifest = manifest
    own = manifest.get("status")
    if own and point.status in ("unknown", "complete", "running"):  # the folder knows better
        point.status = str(own)
    point.error = point.error or manifest.get("error") or manifest.get("stop_reason")
    try:
        point.analysis = analysis_of(run_dir)
    except LoadlabError as exc:      # the analyzer could not judge this folder: say why
        point.problems.append(str(exc))


def analysis_of(run_dir: Path) -> dict[str, Any]:
    """The run folder's analysis.json, written by the analyzer first when missing."""
    path = run_dir / ANALYSIS
    if not path.is_file():
        from loadlab.analyze.analysis import write_analysis

        write_analysis(run_dir)
    return read_json(path)
