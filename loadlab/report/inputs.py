"""What a report or a comparison reads: a run folder or a sweep folder, as points.

A *single run* (manifest kind "run" or "sim-replay") is one point. A *sweep*
(manifest kind "sweep", layout in the sweep runner's contract) lists its points
with a status ("complete" | "failed" | "skipped" | "running"), an error, the vLLM
flags of the point and a relative folder holding a normal run folder.

Each point's verdict comes from its ``analysis.json``; a run folder without one is
analysed in memory (:func:`loadlab.analyze.analysis.analyze_run`, no SLOs: run
``loadlab analyze RUN --slo ...`` beforehand to judge them). Nothing is written into
the folders read, so a read-only run (an archive, a mounted share) reads as well as
a writable one. Nothing here raises for one bad point of a sweep: the point carries
``problems`` and the report shows them, so a partial or half-broken sweep still
reports. A single run that cannot be judged (a damaged part file, an unreadable
analysis.json) and a folder that is neither a run nor a sweep are an
:class:`~loadlab.errors.InputError`: there is nothing else to show.

Manifests, flags and errors are read through :func:`loadlab.spec.secrets.redact`: a
folder written before loadlab redacted its secrets (or by hand) still shows ``***``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import pandas as pd

from loadlab.errors import InputError, LoadlabError
from loadlab.runstore.analysis_model import Analysis, read_analysis
from loadlab.runstore.layout import ANALYSIS, MANIFEST
from loadlab.runstore.manifest import (
    RUN_KINDS,
    SWEEP_KIND,
    PointRecord,
    SweepManifest,
    load_manifest,
    read_manifest,
)
from loadlab.spec.secrets import redact


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
    analysis: Analysis | None = None
    problems: list[str] = field(default_factory=list)  # what could not be read, and why

    @cached_property
    def steps(self) -> pd.DataFrame:
        """analysis.json ``steps[]`` as a frame (empty when there is no analysis); read once."""
        rows = self.analysis.steps if self.analysis else []
        return pd.DataFrame([row.model_dump(exclude_unset=True) for row in rows])

    @property
    def unit(self) -> str:
        """"concurrency" (closed loop) or "rate" (open loop)."""
        if self.analysis and self.analysis.knee.unit:
            return self.analysis.knee.unit
        steps = self.manifest.get("steps") or []
        return "rate" if steps and steps[0].get("concurrency") is None else "concurrency"

    @property
    def level_column(self) -> str:
        return "target_rate" if self.unit == "rate" else "concurrency"

    def section(self, key: str) -> dict[str, Any]:
        """One top-level block of the analysis as JSON ({} when absent)."""
        return self.analysis.block(key) if self.analysis else {}


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


def load(root: str | Path) -> RunSet:
    """Read a run folder or a sweep folder; InputError when it is neither."""
    root = Path(root)
    typed = load_manifest(root)
    manifest = redact(read_manifest(root))
    if isinstance(typed, SweepManifest):
        points = [_sweep_point(root, record) for record in typed.points]
        return RunSet(root=root, kind="sweep", manifest=manifest, points=points,
                      mode=typed.sweep.mode, baseline=typed.sweep.baseline)
    if typed.kind is None:
        raise InputError("no kind: only a collector wrote this folder", source=root / MANIFEST,
                         field="kind",
                         fix=f"expected {SWEEP_KIND!r} or one of {', '.join(RUN_KINDS)}: point at "
                         "a run folder (loadlab run / sim replay) or a sweep folder")
    point = _run_point(root, manifest)
    return RunSet(root=root, kind="run", manifest=manifest, points=[point])


def _sweep_point(root: Path, record: PointRecord) -> Point:
    run_dir = root / record.dir if record.dir else None
    point = Point(name=record.name, status=record.status, run_dir=run_dir,
                  error=redact(record.error), flags=redact(dict(record.flags)),
                  what_if=record.what_if)
    if run_dir is None or not (run_dir / MANIFEST).is_file():
        if point.status not in ("failed", "skipped"):
            point.problems.append("no run folder was written for this point")
        return point
    try:
        _fill(point, run_dir, read_manifest(run_dir))
    except LoadlabError as exc:      # this point cannot be judged: say why, show the others
        point.problems.append(str(exc))
    return point


def _run_point(root: Path, manifest: dict[str, Any]) -> Point:
    launch = (manifest.get("target") or {}).get("launch") or {}
    flags = launch.get("flags") or manifest.get("server") or {}
    point = Point(name=str(manifest.get("point") or root.name), status="unknown", run_dir=root,
                  flags=dict(flags))
    _fill(point, root, manifest)
    return point


def _fill(point: Point, run_dir: Path, manifest: dict[str, Any]) -> None:
    """Manifest, status and analysis of a point that has a run folder."""
    point.manifest = manifest = redact(manifest)
    own = manifest.get("status")
    if own and point.status in ("unknown", "complete", "running"):  # the folder knows better
        point.status = str(own)
    point.error = point.error or manifest.get("error") or manifest.get("stop_reason")
    point.analysis = analysis_of(run_dir)


def analysis_of(run_dir: Path) -> Analysis:
    """The run folder's analysis.json, or the analyzer's verdict in memory when it has none."""
    if (run_dir / ANALYSIS).is_file():
        return read_analysis(run_dir)
    from loadlab.analyze.analysis import analyze_run

    return analyze_run(run_dir)
