"""Run a sweep: every point of a scenario into one sweep folder, whatever befalls one of them.

Steps of :func:`run_sweep`:

1. The folder: a new one (``reports/sweep-<name>-<time>`` by default; a folder that
   already holds a sweep is refused unless resumed), or, with ``resume``, the folder of
   an earlier run of the same scenario (same points, same flags; anything else is an
   InputError naming the difference). It is held for the whole sweep
   (:func:`loadlab.runstore.claim.lock_run_dir`): a second sweep or resume into it is
   refused (exit 2) naming the one running.
2. The sweep manifest (:class:`~loadlab.runstore.manifest.SweepManifest`) lists every
   point from the start, ``skipped`` with "not run yet" until its turn, so the folder
   can be read (and reported) at any moment.
3. Each point not yet ``complete``: an earlier attempt's folder is moved aside to
   ``<point>.attempt-N`` (kept, never deleted); the point is marked ``running``; it runs
   live (:func:`loadlab.experiment.point.run_point`: a fresh server on a free port, its log in
   the point's folder; server and load generator on the scenario's ``isolation`` CPUs,
   checked against this machine before the first point) or, with ``what_if``, on the
   simulator in virtual time (:mod:`loadlab.experiment.whatif`); its ``analysis.json`` is
   written with the scenario's SLOs and its verdict printed. Every point gets the same
   seeded workload.
4. A point that fails (its server never becomes healthy or dies mid-step, a flag it
   refuses, anything raised) is recorded ``failed`` with the reason and the sweep goes on.
   Ctrl-C (or SIGTERM) marks the point ``interrupted`` (its records are already flushed),
   leaves the rest ``skipped`` and stops the loop.
5. The report (:mod:`loadlab.report`), partial or not, then the verdicts and its path.
   An interrupted sweep raises :class:`~loadlab.errors.RunInterrupted` (exit 130) after that.

Progress goes to ``progress`` (stderr): point i of n, then the load generator's lines
(step, level, requests, errors) prefixed with the point and the sweep's ETA, estimated
from the plan and, once a point has finished, from the time points really took.

Secrets (an ``api-key`` flag, the key in ``target.api_key_env``) reach the launched
server as given, but the manifest, the progress lines and a point's recorded error hold
``***`` instead (:mod:`loadlab.spec.secrets`). So a resumed sweep that launches servers
needs the scenario file again when its recorded flags hide one.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from loadlab.analyze.display import replica_lines
from loadlab.errors import InputError, LoadlabError, RunInterrupted
from loadlab.experiment.fdlimit import ensure_open_files
from loadlab.experiment.point import STDERR_LINE
from loadlab.experiment.verdicts import analyze_point, step_judge
from loadlab.runstore.claim import lock_run_dir
from loadlab.runstore.layout import MANIFEST
from loadlab.runstore.manifest import (
    PointRecord,
    SweepInfo,
    SweepManifest,
    load_manifest,
    write_manifest,
)
from loadlab.spec.scenario import Point, Scenario
from loadlab.spec.secrets import REDACTED, Redactor, redactor

NOT_RUN = "not run yet"
STARTUP_GUESS_S = {"sim": 5.0, "vllm": 90.0, None: 0.0}


@dataclass
class SweepResult:
    out: Path
    manifest: SweepManifest
    verdicts: dict[str, str] = field(default_factory=dict)   # point -> the analyzer's one line
    report: Path | None = None


@dataclass
class _Clock:
    """The sweep's ETA: planned seconds per point until points have really run."""

    planned_s: float
    remaining: int
    spent: list[float] = field(default_factory=list)
    point_start: float = 0.0

    def per_point_s(self) -> float:
        return sum(self.spent) / len(self.spent) if self.spent else self.planned_s

    def eta_s(self) -> float:
        into = time.monotonic() - self.point_start
        return max(0.0, self.per_point_s() - into) + (self.remaining - 1) * self.per_point_s()


def planned_point_s(scenario: Scenario, what_if: bool) -> float:
    """A first guess of one point's wall time, from its plan."""
    plan = scenario.load
    steps = len(plan.steps) or _search_steps(scenario)
    if what_if:
        return 0.05 * steps * plan.step_duration_s
    startup = STARTUP_GUESS_S[scenario.target.launch]
    return startup + steps * plan.step_duration_s + scenario.loadgen.drain_s / 2


def _search_steps(scenario: Scenario) -> int:
    import math

    search = scenario.load.search
    if search is None:
        return 1
    n = len(search.grid())
    return (
        math.ceil(math.log(n, search.factor)) + math.ceil(math.log2(max(n / search.factor, 2))) + 1
    )


def _fmt_s(seconds: float) -> str:
    seconds = round(seconds)
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def secrets_of(scenario: Scenario) -> Redactor:
    """What the sweep must not write: the scenario's secret flags, the keys in the environment."""
    return redactor(scenario.model_dump(mode="json"), api_key_env=scenario.target.api_key_env)


def new_manifest(scenario: Scenario, what_if: bool) -> SweepManifest:
    hide = secrets_of(scenario)
    return SweepManifest(
        status="running", created=time.time(), scenario=hide(scenario.model_dump(mode="json")),
        sweep=SweepInfo(mode=scenario.sweep_mode, baseline=scenario.baseline),
        points=[PointRecord(name=p.name, dir=p.name, status="skipped", error=NOT_RUN,
                            flags=hide(p.flags), what_if=what_if) for p in scenario.points()],
    )


def _resumed(out: Path, scenario: Scenario | None) -> tuple[Scenario, SweepManifest]:
    """The earlier sweep in ``out`` and its scenario; the given one must have the same points."""
    manifest = load_manifest(out)
    if not isinstance(manifest, SweepManifest):
        raise InputError(
            "not a sweep folder", source=out, fix="give --resume the folder `loadlab sweep` wrote"
        )
    recorded = Scenario.model_validate(manifest.scenario)
    if scenario is None and not any(p.what_if for p in manifest.points) and any(
        REDACTED in p.flags.values() for p in recorded.points()
    ):
        raise InputError(
            "the sweep's manifest keeps its server flags' secrets as ***",
            source=out,
            field="flags",
            fix=f"resume with the scenario file: loadlab sweep SCENARIO --resume {out}",
        )
    if scenario is not None:
        hide = secrets_of(scenario)
        mine = [(p.name, hide(p.flags)) for p in scenario.points()]
        theirs = [(p.name, p.flags) for p in recorded.points()]
        if mine != theirs:
            raise InputError(
                "the scenario's points differ from the ones this sweep ran",
                source=out,
                field="sweep",
                fix="resume with the same scenario file, or start a new sweep",
            )
    return scenario or recorded, manifest


def _check_runnable(scenario: Scenario, what_if: bool) -> None:
    """What would fail every point the same way fails the sweep before it starts (exit 2)."""
    if what_if and scenario.load.trace is not None:
        raise InputError(
            "--what-if replays concurrency or rate steps, not a trace",
            field="load.trace",
            fix="give the scenario a concurrency, rate or search plan",
        )
    if what_if:
        from loadlab.experiment.whatif import recorded_workload

        recorded_workload(scenario)
    if not what_if:
        ensure_open_files(scenario.load, scenario.loadgen.workers, 0,
                          field="load.concurrency/load.search")
    if not what_if and scenario.isolation is not None:
        from loadlab.experiment.cpus import check_available

        check_available(scenario.isolation, ("isolation.server_cpus", "isolation.client_cpus"))
    if not what_if and scenario.target.launch == "vllm":
        from loadlab.experiment.launcher import find_vllm

        if find_vllm() is None:
            raise InputError(
                "vLLM is not installed",
                field="target.launch",
                fix="run `bash tools/install_vllm.sh`, set LOADLAB_VLLM_BIN, or try --what-if",
            )


def _fresh(out: Path) -> None:
    if (out / MANIFEST).exists():
        raise InputError("this folder already holds a run", source=out,
                         fix=f"continue it with --resume {out}, or give another --out")


def _set_aside(folder: Path) -> None:
    """Keep an earlier attempt's folder under a new name."""
    if not folder.exists():
        return
    n = 1
    while folder.with_name(f"{folder.name}.attempt-{n}").exists():
        n += 1
    folder.rename(folder.with_name(f"{folder.name}.attempt-{n}"))


def run_sweep(scenario: Scenario | None, out: Path, *, what_if: bool = False, resume: bool = False,
              progress: Callable[[str], None] = STDERR_LINE) -> SweepResult:
    """Run every point of ``scenario`` into ``out`` (see the module docstring)."""
    given = scenario
    scenario, manifest, what_if = _start(out, given, what_if, resume)   # refused: no trace
    _check_runnable(scenario, what_if)
    with lock_run_dir(out, "--resume" if resume else "--out"):
        # Again under the lock: another sweep may have written the folder since.
        scenario, manifest, what_if = _start(out, given, what_if, resume)
        write_manifest(out, manifest)
        return _run_points(scenario, manifest, out, what_if, progress)


def _start(out: Path, scenario: Scenario | None, what_if: bool,
           resume: bool) -> tuple[Scenario, SweepManifest, bool]:
    """The scenario, the manifest to start from and whether the points are what-ifs."""
    if resume:
        scenario, manifest = _resumed(out, scenario)
        manifest.status, manifest.finished = "running", None
        return scenario, manifest, any(p.what_if for p in manifest.points)
    assert scenario is not None
    _fresh(out)
    return scenario, new_manifest(scenario, what_if), what_if


def _run_points(scenario: Scenario, manifest: SweepManifest, out: Path, what_if: bool,
                progress: Callable[[str], None]) -> SweepResult:
    """Steps 3 to 5 of the module docstring, the folder held."""
    hide = secrets_of(scenario)

    def say(line: str) -> None:
        progress(hide.text(line))

    points = {p.name: p for p in scenario.points()}
    todo = [r for r in manifest.points if r.status != "complete"]
    clock = _Clock(planned_point_s(scenario, what_if), len(todo))
    result = SweepResult(out, manifest)
    interrupted, stopped_by = False, "SIGINT"
    for record in todo:
        index = manifest.points.index(record) + 1
        clock.point_start = time.monotonic()
        tag = f"[point {index}/{len(manifest.points)} {record.name}]"
        say(f"{tag} {'what-if on the simulator' if what_if else 'starting'}; "
            f"sweep ETA {_fmt_s(clock.eta_s())}")
        _set_aside(record.folder(out))
        record.status, record.error = "running", None
        write_manifest(out, manifest)

        def point_progress(line: str, tag: str = tag) -> None:
            say(f"{tag} ETA {_fmt_s(clock.eta_s())} {line}")

        try:
            _run_point(scenario, points[record.name], record.folder(out), what_if, point_progress)
            record.status = "complete"
            result.verdicts[record.name], replicas = _verdict(record.folder(out), scenario,
                                                              record)
            say(f"{tag} complete in {_fmt_s(time.monotonic() - clock.point_start)}: "
                f"{result.verdicts[record.name]}")
            for line in replicas:
                say(f"{tag} {line}")
        except (KeyboardInterrupt, RunInterrupted) as exc:
            stopped_by = exc.signal_name if isinstance(exc, RunInterrupted) else "SIGINT"
            record.status, record.error = (
                "interrupted",
                f"interrupted ({stopped_by}); its records are kept",
            )
            interrupted = True
        except LoadlabError as exc:
            record.status, record.error = "failed", hide.text(str(exc))
            say(f"{tag} failed: {record.error.splitlines()[0]}; the sweep goes on")
        except Exception as exc:
            record.status, record.error = "failed", hide.text(f"{type(exc).__name__}: {exc}")
            say(f"{tag} failed: {record.error}; the sweep goes on")
        clock.spent.append(time.monotonic() - clock.point_start)
        clock.remaining -= 1
        write_manifest(out, manifest)
        if interrupted:
            break
    manifest.status = "interrupted" if interrupted else "complete"
    manifest.finished = time.time()
    write_manifest(out, manifest)
    result.report = write_sweep_report(out, manifest)
    if interrupted:
        raise RunInterrupted(f"sweep interrupted by {stopped_by}; finished points and a partial "
                             f"report are in {out}"
                             + (f" ({result.report})" if result.report else "")
                             + f"; continue with `loadlab sweep --resume {out}`", stopped_by)
    return result


def _verdict(folder: Path, scenario: Scenario, record: PointRecord) -> tuple[str, list[str]]:
    """analysis.json of a finished point, its one-line verdict and a fleet's line per
    replica; a failed analysis is noted on the point, whose load stays complete."""
    try:
        analysis = analyze_point(folder, scenario.load.slo)
    except Exception as exc:
        record.error = f"analysis failed: {type(exc).__name__}: {exc}"
        return record.error, []
    return analysis.verdict or "", replica_lines(analysis.as_json())


def _run_point(scenario: Scenario, point: Point, out: Path, what_if: bool,
               progress: Callable[[str], None]) -> None:
    if what_if:
        from loadlab.experiment.whatif import run_whatif_point

        shown = [-1.0]

        def replay_progress(virtual_s: float, total_s: float | None) -> None:
            if virtual_s - shown[0] >= scenario.load.step_duration_s:
                shown[0] = virtual_s
                progress(f"replay at {virtual_s:,.0f}" + (f" / {total_s:,.0f}" if total_s else "")
                         + " virtual s")

        judge = step_judge(out) if scenario.load.search is not None else None
        run_whatif_point(scenario, point, out, judge, replay_progress)
        return
    from loadlab.experiment.point import point_spec, run_point

    run_point(point_spec(scenario, point, out, progress))


def write_sweep_report(out: Path, manifest: SweepManifest) -> Path | None:
    """The HTML report of the sweep folder; written also for a partial sweep."""
    from loadlab.report.page import write_report  # plotly and jinja2: only now

    try:
        path = write_report(out, None)
    except Exception as exc:
        STDERR_LINE(f"report not written: {type(exc).__name__}: {exc} (try `loadlab report {out}`)")
        return None
    manifest.report = str(path.relative_to(out)) if path.is_relative_to(out) else str(path)
    write_manifest(out, manifest)
    return path
