"""The manifest's step entries, completed with the load each step achieved.

A step's entry (window, level, warm-up) is written the moment the step ends. The load it
achieved (:mod:`loadlab.loadgen.achieved`) needs every worker's CLIENT samples up to its
end: each worker cuts one there (:mod:`loadlab.loadgen.meter`) and ships it within its
flush interval, so a greenlet waits until the samples reach the end (at most
``COVER_WAIT_S``, then it sums what came) while the next step already runs, then adds
the figures, ``client_limited`` and its reasons to the entry, updates
``client_limited_steps`` and says so on the progress line. Open-loop windows are judged
against the arrivals their schedule had due (:func:`schedule`).

A knee search judges each step before choosing the next: :meth:`StepEntries.settle` waits
until every entry so far is complete and flushes the records, so the analyzer sees the
whole step (its rows: a worker ships a request's row before the sample cut after it
finished, so samples reaching the step's end mean its finished requests are in).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gevent
from gevent.event import Event

from loadlab.loadgen.achieved import due_in, step_fields, step_name
from loadlab.loadgen.context import RunSettings
from loadlab.loadgen.meter import SAMPLE_S
from loadlab.loadgen.prepare import TraceSpecs
from loadlab.loadgen.records import Recorder
from loadlab.loadgen.shapes import LoadPlan, Step, arrivals
from loadlab.runstore import update_manifest

# A worker ships its edge sample within its flush interval (0.5 s) or, if it missed the
# edge, the next 1 s sample; EDGE_TOLERANCE_S: how far a worker's view of an edge may
# precede the master's.
COVER_WAIT_S = 2 * SAMPLE_S + 1.0
EDGE_TOLERANCE_S = 0.05


def step_window(step: Step, t_start: float, t_end: float) -> dict[str, Any]:
    """A step's manifest entry as it ran; :class:`StepEntries` adds the load it achieved."""
    return {"step": step.index, "concurrency": step.concurrency, "target_rate": step.target_rate,
            "t_start": t_start, "t_end": t_end, "warmup_s": step.warmup_s}


class StepEntries:
    """The manifest's step entries: written when a step ends, completed with the load it
    achieved once every worker's samples reach its end (meanwhile the next step runs)."""

    def __init__(self, out: Path, recorder: Recorder, schedule: list[float] | None,
                 n_workers: int, stop: Event, progress: Callable[[str], None]) -> None:
        self.out, self.recorder, self.schedule = out, recorder, schedule
        self.n_workers, self.stop, self.progress = n_workers, stop, progress
        self.t0 = 0.0
        self.entries: list[dict[str, Any]] = []
        self._pending: list[gevent.Greenlet] = []

    def add(self, window: dict[str, Any]) -> None:
        self.entries.append(window)
        update_manifest(self.out, steps=self.entries)
        self._pending.append(gevent.spawn(self._complete, window))

    def join(self) -> None:
        gevent.joinall(self._pending)

    def settle(self) -> None:
        """Every entry so far complete in the manifest, every record received on disk."""
        self.join()
        self.recorder.flush()

    def _complete(self, window: dict[str, Any]) -> None:
        start, end = window["t_start"] + window["warmup_s"], window["t_end"]
        deadline = time.monotonic() + COVER_WAIT_S
        while (not self.recorder.covers(end - EDGE_TOLERANCE_S, self.n_workers)
               and time.monotonic() < deadline and not self.stop.is_set()):
            gevent.sleep(0.1)
        due = (
            None if self.schedule is None else due_in(self.schedule, start - self.t0, end - self.t0)
        )
        concurrency = window["concurrency"]
        window.update(
            step_fields(self.recorder.client_achieved(start, end, concurrency, due), concurrency)
        )
        open_starts = [
            w["t_start"] + w["warmup_s"] for w in self.entries if "client_limited" not in w
        ]
        self.recorder.forget_before(min(open_starts, default=end))
        update_manifest(
            self.out,
            steps=self.entries,
            client_limited_steps=[w["step"] for w in self.entries if w.get("client_limited")],
        )
        if window["client_limited"]:
            self.progress(
                f"{step_name(window)}: client limited: "
                + "; ".join(window["client_limited_reasons"])
            )


def schedule(settings: RunSettings, plan: LoadPlan) -> list[float] | None:
    """Open loop: every arrival's offset from t0, sorted (what each window had due)."""
    if plan.mode == "closed":
        return None
    replay = None
    if plan.mode == "replay":
        replay = [
            s.arrival_s or 0.0 for s in TraceSpecs(settings.trace or "", settings.time_scale).specs
        ]
    return [a.offset_s for a in arrivals(plan, settings.seed, replay)]
