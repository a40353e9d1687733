"""loadlab's LLM user under plain Locust (web UI, or ``--headless``).

Single process, web UI on http://localhost:8089::

    LOADLAB_MODEL=my-model locust -f loadlab/loadgen/locustfile.py --host http://127.0.0.1:8000

Across machines (set the same LOADLAB_* variables on every machine)::

    locust -f loadlab/loadgen/locustfile.py --master --expect-workers 4 --host http://vllm:8000
    locust -f loadlab/loadgen/locustfile.py --worker --master-host MASTER_HOST      # on each worker

Settings (environment variables; defaults in brackets):

- ``LOADLAB_MODEL`` (required), ``LOADLAB_API`` [completions] or chat,
  ``LOADLAB_PROFILE`` [sharegpt] or a profile file, ``LOADLAB_SEED`` [0],
  ``LOADLAB_TIMEOUT`` [600] s per request, ``LOADLAB_CALIBRATE`` [1] (0: no /tokenize),
  ``LOADLAB_API_KEY_ENV`` [LOADLAB_API_KEY]: the variable holding the key.
- ``LOADLAB_OUT`` [reports/locust-<time>]: the run folder, written only by the master
  (or the single process); workers ship their rows to it.
- ``LOADLAB_CONCURRENCY`` (e.g. ``1,2,4,8``) with ``LOADLAB_STEP_DURATION`` [60] and
  ``LOADLAB_WARMUP`` [10]: closed-loop steps driven by a LoadTestShape (the UI's user
  count is then ignored) and tagged in every row. Without it the UI decides.

Locust's own charts show its rounded statistics (reported per request, e2e time);
the measurements are the raw rows in ``<LOADLAB_OUT>/requests.parquet``. Workers
number their seq strides from Locust's worker index and ``--expect-workers``.

The master (or the single process) keeps the run folder as ``loadlab run`` does, so
``loadlab analyze <LOADLAB_OUT>`` judges it: the manifest :mod:`loadlab.loadgen.driver`
writes (at the test's start, when the host is known) and one step window per
LOADLAB_CONCURRENCY step, from the moment the shape announced it to the next, completed
with the load it achieved (:mod:`loadlab.loadgen.step_entries`). At the end the manifest
says ``complete`` when the shape ran every step, ``interrupted`` when the run stopped
before (Ctrl-C, ``--run-time``, the UI's stop). Without LOADLAB_CONCURRENCY the manifest
lists no steps (the UI changed the load as it pleased): the analyzer has nothing to judge.
One test per process: a second start in the UI adds to the same folder.
``loadlab run`` also drains in-flight requests at the end and stops on a dead target;
prefer it for unattended measurements.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gevent
from gevent.event import Event
from locust import LoadTestShape, events
from locust.runners import STATE_STOPPED, MasterRunner, WorkerRunner

from loadlab.loadgen.context import LoadContext, RunSettings
from loadlab.loadgen.driver import RunOptions, run_manifest
from loadlab.loadgen.records import CLIENT_MSG, DONE_MSG, ROWS_MSG, BatchSender, LocalSink, Recorder
from loadlab.loadgen.shapes import Step, concurrency_steps, parse_levels, step_at
from loadlab.loadgen.step_entries import StepEntries, step_window
from loadlab.loadgen.user import STEP_MSG, LLMUser, locust_link, step_message, step_of
from loadlab.runstore import compact_run, update_manifest, write_manifest
from loadlab.runstore.layout import LOADGEN_TABLES

__all__ = ["LLMUser"]
_log = logging.getLogger(__name__)

_STEPS = os.environ.get("LOADLAB_CONCURRENCY")
PLAN = concurrency_steps(
    [int(v) for v in parse_levels(_STEPS or "1", "LOADLAB_CONCURRENCY")],
    float(os.environ.get("LOADLAB_STEP_DURATION", "60")),
    float(os.environ.get("LOADLAB_WARMUP", "10")),
)


def settings_from_env(host: str | None) -> RunSettings:
    """RunSettings from LOADLAB_* variables (see the module docstring)."""
    model = os.environ.get("LOADLAB_MODEL")
    if not model or not host:
        raise SystemExit("set LOADLAB_MODEL and pass --host (the server's base URL)")
    env = os.environ
    return RunSettings(
        base_url=host.rstrip("/"), model=model, api=env.get("LOADLAB_API", "completions"),
        seed=int(env.get("LOADLAB_SEED", "0")), profile=env.get("LOADLAB_PROFILE", "sharegpt"),
        trace=None, time_scale=1.0, timeout_s=float(env.get("LOADLAB_TIMEOUT", "600")),
        api_key_env=env.get("LOADLAB_API_KEY_ENV", "LOADLAB_API_KEY"), point="",
        nonce=f"s{env.get('LOADLAB_SEED', '0')}",
        calibrate=env.get("LOADLAB_CALIBRATE", "1") != "0", plan=PLAN.describe(),
    )


class RunFolder:
    """The run folder of the master (or the single process): tables, manifest, step windows."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.recorder = Recorder(out)
        self.entries: StepEntries | None = None     # from the test's start
        self.running: tuple[Step, float] | None = None   # the step under way, since when

    def open(self, environment: Any) -> None:
        """At the test's start (the host is known now): the manifest, the step entries."""
        if self.entries is not None:
            return
        runner = environment.runner
        master = isinstance(runner, MasterRunner)
        n_workers = runner.worker_count if master else 1
        settings = settings_from_env(environment.host)
        settings.n_workers = n_workers
        opts = RunOptions(self.out, workers=0, remote_workers=n_workers if master else 0,
                          drain_s=0.0)
        runner_kind = "master" if master else "local"
        extra = {"locust": {"runner": runner_kind}}
        write_manifest(self.out, run_manifest(settings, PLAN, opts, extra))
        self.entries = StepEntries(self.out, self.recorder, None, n_workers, Event(), _log.info)

    def step_begins(self, step: Step | None) -> None:
        """The shape moved on: the step under way ends now (its window is written), ``step``
        (None: none, the plan is over) begins."""
        now = time.time()
        if self.running is not None and self.entries is not None:
            self.entries.add(step_window(*self.running, now))
        self.running = None if step is None else (step, now)

    def close(self, environment: Any) -> None:
        """At quitting: stop the users first (on Ctrl-C Locust quits before it stops them),
        end the open window, wait for the windows' achieved load, finish the manifest."""
        if environment.runner is not None and environment.runner.state != STATE_STOPPED:
            environment.runner.stop()
        cut_short = self.running is not None
        self.step_begins(None)
        if self.entries is not None:
            self.entries.join()
        self.recorder.close()
        if self.entries is None:   # no test ran: nothing to describe
            return
        update_manifest(self.out, status="interrupted" if cut_short else "complete",
                        finished=time.time(), records=self.recorder.records_entry())
        compact_run(self.out, tables=LOADGEN_TABLES, progress=_log.info)


if _STEPS:
    class StepShape(LoadTestShape):
        """LOADLAB_CONCURRENCY steps; tells every process and the run folder when one begins."""

        last_step = -1

        def tick(self) -> tuple[int, float] | None:
            step = step_at(PLAN, self.get_run_time())
            if step is None:
                self.last_step = -1
                _step_begins(self.runner, None)
                return None
            assert step.concurrency is not None  # concurrency_steps sets it on every step
            if step.index != self.last_step:
                self.last_step = step.index
                _step_begins(self.runner, step)
            return step.concurrency, 100.0


def _step_begins(runner: Any, step: Step | None) -> None:
    runner.environment.loadlab_run.step_begins(step)
    if step is None:
        return
    if isinstance(runner, MasterRunner):
        runner.send_message(STEP_MSG, step_message(step))
    else:
        _set_step(runner.environment, step)


def _set_step(environment: Any, step: Step) -> None:
    """Apply now, or when the context is built (a step message can beat test_start)."""
    environment.loadlab_step = step
    ctx: LoadContext | None = getattr(environment, "loadlab", None)
    if ctx is not None:
        ctx.set_step(step)


def _report(environment: Any, row: dict[str, Any]) -> None:
    """Feed Locust's UI (its own rounded stats); the raw row is already recorded."""
    ok = row["status"] == "ok"
    environment.events.request.fire(
        request_type="POST", name=f"{row['api']} TTFT" if ok else row["api"],
        response_time=1000.0 * ((row["ttft_s"] if ok else row["e2e_s"]) or 0.0),
        response_length=row["n_chunks"] or 0,
        exception=None if ok else RuntimeError(row["error"] or row["status"]), context={},
    )


def _ctrl_c_to_the_main_greenlet() -> None:
    """Locust stops on the KeyboardInterrupt a Ctrl-C raises in its main greenlet. Python
    raises it in whichever greenlet runs at that moment: in one completing a step's window or
    writing rows, that work dies half done. Caught as a signal, it goes the way gevent sends
    an error to the main greenlet (:meth:`gevent.hub.Hub.handle_system_error`)."""
    hub = gevent.get_hub()
    gevent.signal_handler(signal.SIGINT, hub.handle_system_error, KeyboardInterrupt,
                          KeyboardInterrupt())


@events.init.add_listener
def _on_init(environment: Any, **_: Any) -> None:
    _ctrl_c_to_the_main_greenlet()
    runner = environment.runner
    if isinstance(runner, WorkerRunner):
        link = locust_link(runner)
        link.on(STEP_MSG, lambda d: _set_step(environment, step_of(d)[0]))

        def worker_place() -> tuple[int, int]:
            expect = getattr(environment.parsed_options, "expect_workers", 1)
            return runner.worker_index, int(expect or 1)

        _build_context_per_test(environment, lambda: BatchSender(link.send), runner.client_id,
                                worker_place, lambda done: link.send(DONE_MSG, done))
        return
    default_out = f"reports/locust-{time.strftime('%Y%m%d-%H%M%S')}"
    folder = environment.loadlab_run = RunFolder(Path(os.environ.get("LOADLAB_OUT") or default_out))
    environment.events.test_start.add_listener(lambda **_: folder.open(environment))
    events.quitting.add_listener(lambda **_: folder.close(environment))
    recorder = folder.recorder

    def mark_done(done: dict[str, Any]) -> None:
        recorder.mark_done(done["worker"], done["rows"], done.get("issued"), done.get("fit"))

    if isinstance(runner, MasterRunner):
        link = locust_link(runner)
        link.on(ROWS_MSG, recorder.add_rows)
        link.on(CLIENT_MSG, recorder.add_client)
        link.on(DONE_MSG, mark_done)
        return
    _build_context_per_test(environment, lambda: LocalSink(recorder), "local", lambda: (0, 1),
                            mark_done)


def _build_context_per_test(environment: Any, sink_factory: Callable[[], Any], worker: str,
                            place: Callable[[], tuple[int, int]],
                            done: Callable[[dict[str, Any]], None]) -> None:
    """The users' LoadContext, built at each test's start (``place``: this process's worker
    index and the number of workers, known only then) and closed at its stop, when ``done``
    gets the ``ll_done`` data (the rows shipped against the requests begun)."""
    def on_test_start(**_: Any) -> None:
        index, n_workers = place()
        settings = settings_from_env(environment.host)
        settings.n_workers = n_workers
        ctx = LoadContext(settings, sink_factory(), worker, index)
        ctx.on_row = lambda row: _report(environment, row)
        ctx.set_step(getattr(environment, "loadlab_step", None) or ctx.plan.steps[0])
        environment.loadlab = ctx

    def on_test_stop(**_: Any) -> None:
        ctx: LoadContext | None = getattr(environment, "loadlab", None)
        if ctx is None:
            return
        ctx.close()
        done({"worker": worker, "rows": ctx.sink.rows_sent, "issued": ctx.sent,
              "fit": ctx.fit_entry()})
        environment.loadlab = None

    environment.events.test_start.add_listener(on_test_start)
    environment.events.test_stop.add_listener(on_test_stop)
