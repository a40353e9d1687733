"""Run a load plan headless with Locust as a library, into one run folder.

Steps of :func:`run_load`:

1. Open the run folder: manifest (status ``running``; target without credentials;
   plan; workload; host; versions) and a :class:`~loadlab.loadgen.records.Recorder`;
   then ``on_open()`` (:mod:`loadlab.experiment.point` starts its ``/metrics`` scraper there:
   one started before the manifest is written would see its manifest keys replaced).
2. Runners. ``workers == 0`` (and no remote workers): one process, Locust ``LocalRunner``,
   the worker side wired in-process (handy for ``locust -f`` parity and debugging;
   recording shares the event loop with timing). ``workers >= 1`` (default 1): a
   ``MasterRunner`` that only records, plus ``workers`` local worker processes
   (``loadlab run --join``) and ``remote_workers`` more that the user starts on other
   machines with ``loadlab run --join MASTER_HOST:PORT`` (the master binds ``master_bind``).
3. Send every worker ``ll_config`` with its index; wait for ``ll_ready``.
4. Closed loop: the steps of a :class:`~loadlab.spec.knee_search.LevelWalk` (the
   plan's levels, or a knee search's as it goes): per step, ``ll_step`` (the step itself)
   then ``runner.start(concurrency)``, sleep to the step's absolute end, write the step
   window to the manifest. A search then judges the step before choosing the next one:
   its entry is completed and its records flushed (:meth:`StepEntries.settle`; the
   users keep the step's level meanwhile, outside every window), ``opts.judge(k)`` says
   whether it stalled (:func:`loadlab.experiment.verdicts.step_judge`: the analyzer over the
   folder; a client-limited step is not a stall), and the manifest's ``search`` gets the
   bracket at the end. Open loop: ``ll_step`` with ``t0`` = now + ``START_LEAD_S``, one
   dispatcher user per worker, windows at ``t0`` + cumulative durations. The load each
   step achieved and whether the client fell short join its entry as soon as every
   worker's samples reach its end (:mod:`loadlab.loadgen.step_entries`), the next step
   already running (a search: before it starts).
5. Drain: ``ll_drain`` (no new requests; in-flight ones get ``drain_s`` to finish),
   then ``runner.stop()`` (anything left is recorded ``aborted``), wait for every
   worker's ``ll_done`` and check the row counts, close the tables.
6. Manifest ``complete``, or ``interrupted`` on SIGINT/SIGTERM (then
   :class:`~loadlab.errors.RunInterrupted`, exit 130) after the same flushing, or
   ``failed`` with ``stop_reason`` when the run stopped early (then
   :class:`~loadlab.errors.TargetError`, exit 1): a worker's guard tripped
   (:mod:`loadlab.loadgen.guards`: target unreachable, every request refused) or
   ``target_check`` (the launched server's process) says the target is gone. Both
   are checked every 0.2 s of a step; the step's window is kept as far as it ran.
7. The load's tables (requests, client) are compacted into one part each
   (:func:`loadlab.runstore.compact_run`, "compacting N part files..." on ``progress``
   when that takes a while; interrupted, it loses nothing).

A progress line goes to ``progress`` every ``progress_s`` seconds: the running step
(of how many: a search does not know), its level, requests, errors, the client's load.
With ``workers`` 0 a search's judging pauses the in-process users (the analyzer runs on
the one event loop); with workers (the default) the load goes on in their processes.
"""

from __future__ import annotations

import logging
import os
import platform
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gevent
from gevent.event import Event
from locust.env import Environment
from locust.runners import LocalRunner, MasterRunner

from loadlab.errors import RunInterrupted, StorageError, TargetError
from loadlab.lifeline import PARENT_ENV
from loadlab.loadgen.achieved import limited_reasons
from loadlab.loadgen.context import RunSettings
from loadlab.loadgen.preflight import split_address
from loadlab.loadgen.records import CLIENT_MSG, DONE_MSG, ROWS_MSG, LocalSink, Recorder
from loadlab.loadgen.shapes import LoadPlan, Step
from loadlab.loadgen.step_entries import StepEntries, schedule, step_window
from loadlab.loadgen.user import (
    CONFIG_MSG,
    DRAIN_MSG,
    DRAINED_MSG,
    FAILED_MSG,
    HELLO_MSG,
    READY_MSG,
    STEP_MSG,
    STOP_MSG,
    Link,
    LLMUser,
    OpenLoopUser,
    locust_link,
    serve_worker,
    step_message,
)
from loadlab.pystart import module_argv
from loadlab.runstore import compact_run, update_manifest, write_manifest
from loadlab.runstore.claim import owner_entry
from loadlab.runstore.layout import CLIENT_TABLE, LOADGEN_TABLES
from loadlab.runstore.manifest import RunManifest, TargetInfo, WorkloadInfo
from loadlab.spec.knee_search import LevelWalk
from loadlab.version import __version__

START_LEAD_S = 0.3
JOIN_TIMEOUT_S = 60.0

# A step starts all its users at once on purpose (the warm-up cut absorbs the ramp);
# Locust's "spawn rate is very high" warning would repeat at every step.
logging.getLogger("locust.runners").addFilter(
    lambda rec: "spawn rate is very high" not in rec.getMessage()
)


@dataclass
class RunOptions:
    out: Path
    workers: int = 1
    remote_workers: int = 0
    master_bind: str = "127.0.0.1:0"
    drain_s: float = 30.0
    progress_s: float = 5.0
    # Called once the manifest is written, before any load (the point starts its scraper).
    on_open: Callable[[], object] | None = None
    # Why the target is gone (e.g. the launched server's process exited), or None; polled.
    target_check: Callable[[], str | None] | None = None
    # A knee search's verdict: did step k stall? (its records are on disk when asked)
    judge: Callable[[int], bool] | None = None
    progress: Callable[[str], None] = field(
        default=lambda line: print(line, file=sys.stderr, flush=True)
    )


class _Master:
    """Master-side bookkeeping: handlers for worker messages, events to wait on."""

    def __init__(
        self, recorder: Recorder, target_check: Callable[[], str | None] | None = None
    ) -> None:
        self.recorder = recorder
        self.joined: list[str] = []   # workers that said hello, in order: their indices
        self.ready: set[str] = set()
        self.drained: set[str] = set()
        self.failures: list[str] = []
        self.changed = Event()
        self.stop_reason: str | None = None
        self.step: Step | None = None    # the step running now
        self._target_check = target_check

    def halted(self) -> bool:
        """True once the run must stop early: a worker's guard tripped, or the target died."""
        if self.stop_reason is None and self._target_check is not None:
            self.stop_reason = self._target_check()
        return self.stop_reason is not None

    def _halt(self, reason: str) -> None:
        self.stop_reason = self.stop_reason or reason
        self.changed.set()

    def attach(self, link: Link) -> None:
        def hello(d: dict[str, Any]) -> None:
            self.joined.append(d["worker"])
            self.changed.set()

        def ready(d: dict[str, Any]) -> None:
            self.recorder.note_calibration(d)
            self._note(self.ready, d["worker"])

        def failed(d: dict[str, Any]) -> None:
            self.failures.append(d["error"])
            self.changed.set()

        def done(d: dict[str, Any]) -> None:
            self.recorder.mark_done(d["worker"], d["rows"], d.get("issued"), d.get("fit"))
            self.recorder.note_calibration(d)
            self.changed.set()

        link.on(ROWS_MSG, self.recorder.add_rows)
        link.on(CLIENT_MSG, self.recorder.add_client)
        link.on(HELLO_MSG, hello)
        link.on(READY_MSG, ready)
        link.on(DRAINED_MSG, lambda d: self._note(self.drained, d["worker"]))
        link.on(FAILED_MSG, failed)
        link.on(STOP_MSG, lambda d: self._halt(d["reason"]))
        link.on(DONE_MSG, done)

    def _note(self, group: set[str], worker: str) -> None:
        group.add(worker)
        self.changed.set()

    def wait_for(
        self, cond: Callable[[], bool], timeout_s: float, stop: Event | None = None
    ) -> bool:
        end = time.monotonic() + timeout_s
        while not cond():
            left = end - time.monotonic()
            if left <= 0 or (stop is not None and stop.is_set()):
                return cond()
            self.changed.clear()
            self.changed.wait(min(left, 0.2))
        return True


def _local_links() -> tuple[Link, Link]:
    """Two in-process Links wired to each other (master side, worker side)."""
    handlers: dict[str, dict[str, Callable]] = {"master": {}, "worker": {}}

    def sender(to: str) -> Callable[[str, Any], None]:
        return lambda kind, data: handlers[to][kind](data)

    master = Link(sender("worker"), lambda k, h: handlers["master"].__setitem__(k, h))
    worker = Link(sender("master"), lambda k, h: handlers["worker"].__setitem__(k, h))
    return master, worker


def run_load(settings: RunSettings, plan: LoadPlan, opts: RunOptions,
             manifest_extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run the plan; returns the final manifest. See the module docstring."""
    out = Path(opts.out)
    walk = LevelWalk(plan, opts.judge)
    recorder = Recorder(out)
    write_manifest(out, run_manifest(settings, plan, opts, manifest_extra or {}))
    stop = Event()
    stopped_by: list[str] = []   # the signal that stopped the run, for the manifest and exit code

    def on_signal(sig: signal.Signals) -> None:
        stopped_by.append(sig.name)
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        gevent.signal_handler(sig, on_signal, sig)
    user_class = LLMUser if plan.mode == "closed" else OpenLoopUser
    env = Environment(user_classes=[user_class])
    master = _Master(recorder, opts.target_check)
    procs: list[subprocess.Popen] = []
    status, error = "complete", None
    try:
        if opts.on_open is not None:
            opts.on_open()
        if opts.workers == 0 and opts.remote_workers == 0:
            runner: LocalRunner | MasterRunner = env.create_local_runner()
            mlink, wlink = _local_links()
            master.attach(mlink)
            serve_worker(env, wlink, "local", sink_factory=lambda: LocalSink(recorder))
        else:
            host, port = split_address(opts.master_bind)
            runner = env.create_master_runner(
                master_bind_host=host, master_bind_port=port or _free_port(host)
            )
            mlink = locust_link(runner)
            master.attach(mlink)
            procs = _spawn_workers(
                opts.workers,
                host if host not in ("*", "0.0.0.0") else "127.0.0.1",
                runner.master_bind_port,
            )
            expected = opts.workers + opts.remote_workers
            if not master.wait_for(lambda: len(master.joined) >= expected, JOIN_TIMEOUT_S, stop):
                raise TargetError(
                    f"only {len(master.joined)} of {expected} workers joined the master "
                    f"within {JOIN_TIMEOUT_S:.0f} s"
                )
        workers = list(master.joined)
        settings.n_workers = len(workers)
        for index, cid in enumerate(workers):
            data = {"settings": settings.to_dict(), "worker_index": index}
            if cid == "local":
                mlink.send(CONFIG_MSG, data)
            else:
                runner.send_message(CONFIG_MSG, data, client_id=cid)
        master.wait_for(
            lambda: len(master.ready) >= len(workers) or bool(master.failures), JOIN_TIMEOUT_S, stop
        )
        if master.failures:
            raise TargetError(f"a worker could not start: {master.failures[0]}")
        if len(master.ready) < len(workers):
            raise TargetError(
                f"only {len(master.ready)} of {len(workers)} workers got ready within "
                f"{JOIN_TIMEOUT_S:.0f} s"
            )
        ticker = gevent.spawn(_progress_loop, runner, recorder, master, plan, opts)
        windows = StepEntries(
            out, recorder, schedule(settings, plan), len(workers), stop, opts.progress
        )
        interrupted = _drive(runner, mlink, master, walk, len(workers), stop, windows)
        ticker.kill(block=False)
        if not interrupted:
            mlink.send(DRAIN_MSG, {"deadline_s": opts.drain_s})
            master.wait_for(lambda: len(master.drained) >= len(workers), opts.drain_s + 10, stop)
        windows.join()
        runner.stop()
        master.wait_for(lambda: len(recorder.done_workers) >= len(workers), 15.0)
        if stop.is_set():
            status = "interrupted"
        elif master.halted():
            status, error = "failed", master.stop_reason
    except BaseException as exc:  # record why, flush, re-raise
        status, error = (
            ("interrupted", None) if isinstance(exc, KeyboardInterrupt) else ("failed", str(exc))
        )
        raise
    finally:
        recorder.close()
        unwritten = recorder.unwritten()
        if unwritten and status != "failed":
            status, error = "failed", unwritten
        try:
            manifest = update_manifest(
                out, status=status, error=error, finished=time.time(),
                stop_reason=master.stop_reason, records=recorder.records_entry(),
                workload=WorkloadInfo(fit=_fit_entry(settings, recorder.fit_counts),
                                      **recorder.workload_summary()),
                stopped_by=stopped_by[0] if stopped_by else None, **walk.manifest_entry())
        except StorageError as exc:
            unwritten = f"{unwritten or 'the run ended'}; {exc} (it still says 'running')"
        try:
            env.runner.quit() if env.runner else None
        finally:
            _reap(procs)
        if not unwritten:
            compact_run(out, tables=LOADGEN_TABLES, progress=opts.progress)
    if unwritten:
        raise StorageError(unwritten, rows=recorder.requests.pending())
    if status == "interrupted":
        by = stopped_by[0] if stopped_by else "SIGINT"
        raise RunInterrupted(f"run interrupted by {by}; everything measured is in {out}", by)
    if master.stop_reason is not None:
        raise TargetError(f"run stopped early: {master.stop_reason}; what was measured is in {out}")
    return manifest


def _drive(runner: Any, link: Link, master: _Master, walk: LevelWalk, n_workers: int, stop: Event,
           windows: StepEntries) -> bool:
    """Execute the plan's steps (step 4 of the module docstring); True when interrupted or
    halted (no drain then)."""
    plan = walk.plan
    t0 = time.time() + START_LEAD_S
    windows.t0 = t0
    step_start = t0
    for step in walk.steps() if plan.mode == "closed" else plan.steps:
        if stop.is_set() or master.halted():
            return True
        master.step = step
        step_end = step_start + step.duration_s
        if plan.mode == "closed":
            link.send(STEP_MSG, step_message(step))
            assert step.concurrency is not None
            runner.start(step.concurrency, spawn_rate=max(1000.0, step.concurrency * 100.0))
            step_start = time.time()
            step_end = step_start + step.duration_s
        elif step.index == 0:
            link.send(STEP_MSG, step_message(step, t0))
            runner.start(n_workers, spawn_rate=1000.0)
        while time.time() < step_end and not stop.is_set() and not master.halted():
            stop.wait(min(0.2, max(0.0, step_end - time.time())))
        windows.add(step_window(step, step_start, min(step_end, time.time())))
        if stop.is_set() or master.halted():
            return True
        if walk.judging:
            windows.settle()   # the judge, asked for the next step, sees this one whole
        step_start = step_end
    return False


def _progress_loop(runner: Any, recorder: Recorder, master: _Master, plan: LoadPlan,
                   opts: RunOptions) -> None:
    t_begin = time.time()
    of = "" if plan.search is not None else f"/{len(plan.steps)}"
    while True:
        gevent.sleep(opts.progress_s)
        step = master.step
        if step is None:
            continue
        p50 = recorder.ttft_p50(step.index)
        users = step.concurrency
        now = time.time()
        live = recorder.client_achieved(now - opts.progress_s, now, users)
        load = (
            "-"
            if live.inflight_mean is None
            else (
                f"in_flight={live.inflight_mean:.1f}/{users}"
                if users
                else f"sent={live.achieved_rate:.1f}/s"
            )
        )
        lag = "-" if live.loop_lag_mean_s is None else f"{live.loop_lag_mean_s * 1000:.1f}ms"
        opts.progress(
            f"[{now - t_begin:6.1f}s] step {step.index + 1}{of} level={step.level} "
            f"users={runner.user_count} ok={recorder.ok[step.index]} "
            f"err={recorder.errors[step.index]} "
            f"{load} loop_lag={lag} ttft_p50={'-' if p50 is None else f'{p50 * 1000:.1f}ms'}"
            + (" CLIENT LIMITED" if limited_reasons(live, users) else "")
        )


def run_manifest(settings: RunSettings, plan: LoadPlan, opts: RunOptions,
                 extra: dict[str, Any]) -> RunManifest:
    """The manifest a run starts with, whether ``loadlab run`` or plain ``locust -f`` drives it."""
    import locust

    extra = dict(extra)
    return RunManifest(
        kind="run", point=settings.point, created=time.time(), status="running",
        owner=owner_entry(), stop_reason=None,
        target=TargetInfo(base_url=settings.base_url, model=settings.model, api=settings.api,
                          **extra.pop("target", {})),
        plan=plan.describe(),
        workload=WorkloadInfo(profile=settings.profile, trace=settings.trace, seed=settings.seed,
                              nonce=settings.nonce, calibrate=settings.calibrate,
                              time_scale=settings.time_scale),
        loadgen={"workers": opts.workers, "remote_workers": opts.remote_workers,
                 "timeout_s": settings.timeout_s, "drain_s": opts.drain_s,
                 "api_key_env": settings.api_key_env,
                 "client_table": f"{CLIENT_TABLE} (per-worker samples, cut every 1 s and at window "
                                 "edges); steps[] carry the load each step achieved"},
        host={"hostname": socket.gethostname(), "cpus": os.cpu_count(),
              "python": platform.python_version()},
        versions={"loadlab": __version__, "locust": locust.__version__},
        # the caller's keys (the point's isolation, server, scenario) win over these
        **{"steps": [], "client_limited_steps": [], "isolation": None, **extra},
    )


def _fit_entry(settings: RunSettings, counts: dict[str, int]) -> dict[str, Any] | None:
    """The manifest's ``workload.fit`` (loadlab.workload.fit), None when lengths were not fitted."""
    if not settings.max_model_len:
        return None
    return {
        "max_model_len": settings.max_model_len,
        "policy": "clip" if settings.trace else "resample",
        "clipped": counts.get("clipped", 0),
        "resampled": counts.get("resampled", 0),
    }


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host if host not in ("*",) else "0.0.0.0", 0))
        return s.getsockname()[1]


def _spawn_workers(n: int, host: str, port: int) -> list[subprocess.Popen]:
    """Local worker processes in their own session, so a terminal Ctrl-C reaches only the master;
    each is killed by the kernel should this process die (:mod:`loadlab.lifeline`)."""
    argv = module_argv("loadlab", "run", "--join", f"{host}:{port}")
    env = {**os.environ, PARENT_ENV: str(os.getpid())}
    return [subprocess.Popen(argv, start_new_session=True, env=env) for _ in range(n)]


def _reap(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
