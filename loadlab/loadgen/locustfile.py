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
``loadlab run`` does all of this headless with step windows in a manifest; prefer it
for measurements.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from locust import LoadTestShape, events
from locust.runners import MasterRunner, WorkerRunner

from loadlab.loadgen.context import LoadContext, RunSettings
from loadlab.loadgen.records import BatchSender, LocalSink, Recorder
from loadlab.loadgen.shapes import concurrency_steps, parse_levels, step_at
from loadlab.loadgen.user import STEP_MSG, LLMUser, locust_link

__all__ = ["LLMUser"]

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
    return RunSettings(
        base_url=host.rstrip("/"), model=model, api=os.environ.get("LOADLAB_API", "completions"),
        seed=int(os.environ.get("LOADLAB_SEED", "0")), profile=os.environ.get("LOADLAB_PROFILE", "sharegpt"),
        trace=None, time_scale=1.0, timeout_s=float(os.environ.get("LOADLAB_TIMEOUT", "600")),
        api_key_env=os.environ.get("LOADLAB_API_KEY_ENV", "LOADLAB_API_KEY"), point="",
        nonce=f"s{os.environ.get('LOADLAB_SEED', '0')}", calibrate=os.environ.get("LOADLAB_CALIBRATE", "1") != "0",
        plan=PLAN.describe(),
    )


if _STEPS:
    class StepShape(LoadTestShape):
        """LOADLAB_CONCURRENCY steps; tells every process when a new step begins."""

        last_step = -1

        def tick(self) -> tuple[int, float] | None:
            step = step_at(PLAN, self.get_run_time())
            if step is None:
                return None
            assert step.concurrency is not None  # concurrency_steps sets it on every step
            if step.index != self.last_step:
                self.last_step = step.index
                _announce_step(self.runner, step.index)
            return step.concurrency, 100.0


def _announce_step(runner: Any, index: int) -> None:
    if isinstance(runner, MasterRunner):
        runner.send_message(STEP_MSG, {"index": index})
    else:
        _set_step(runner.environment, index)


def _set_step(environment: Any, index: int) -> None:
    """Apply now, or when the context is built (a step message can beat test_start)."""
    environment.loadlab_step = index
    if getattr(environment, "loadlab", None) is not None:
        ctx = environment.loadlab
        ctx.set_step(ctx.plan.steps[index])


def _report(environment: Any, row: dict[str, Any]) -> None:
    """Feed Locust's UI (its own rounded stats); the raw row is already recorded."""
    ok = row["status"] == "ok"
    environment.events.request.fire(
        request_type="POST", name=f"{row['api']} TTFT" if ok else row["api"],
        response_time=1000.0 * ((row["ttft_s"] if ok else row["e2e_s"]) or 0.0),
        response_length=row["n_chunks"] or 0, exception=None if ok else RuntimeError(row["error"] or row["status"]),
        context={},
    )


@events.init.add_listener
def _on_init(environment: Any, **_: Any) -> None:
    runner = environment.runner
    if isinstance(runner, WorkerRunner):
        link = locust_link(runner)
        link.on(STEP_MSG, lambda d: _set_step(environment, d["index"]))
        sink_factory: Callable[[], BatchSender | LocalSink] = lambda: BatchSender(link.send)
        n_workers = lambda: int(getattr(environment.parsed_options, "expect_workers", 1) or 1)
        worker, index = runner.client_id, lambda: runner.worker_index
    else:
        out = Path(os.environ.get("LOADLAB_OUT") or f"reports/locust-{time.strftime('%Y%m%d-%H%M%S')}")
        recorder = Recorder(out)
        if isinstance(runner, MasterRunner):
            link = locust_link(runner)
            link.on("ll_rows", recorder.add_rows)
            link.on("ll_client", recorder.add_client)
            link.on("ll_done", lambda d: recorder.mark_done(d["worker"], d["rows"], d.get("issued")))
        events.quitting.add_listener(lambda **_: recorder.close())
        if isinstance(runner, MasterRunner):
            return
        sink_factory = lambda: LocalSink(recorder)
        n_workers, worker, index = (lambda: 1), "local", (lambda: 0)

    def on_test_start(**_: Any) -> None:
        settings = settings_from_env(environment.host)
        settings.n_workers = n_workers()
        ctx = LoadContext(settings, sink_factory(), worker, index())
        ctx.on_row = lambda row: _report(environment, row)
        ctx.set_step(ctx.plan.steps[getattr(environment, "loadlab_step", 0)])
        environment.loadlab = ctx

    def on_test_stop(**_: Any) -> None:
        ctx: LoadContext | None = getattr(environment, "loadlab", None)
        if ctx is not None:
            ctx.close()
            if isinstance(runner, WorkerRunner):
                runner.send_message("ll_done", {"worker": worker, "rows": ctx.sink.rows_sent,
                                                 "issued": ctx.sent})
            environment.loadlab = None

    environment.events.test_start.add_listener(on_test_start)
    environment.events.test_stop.add_listener(on_test_stop)
