"""Locust users and the worker side of the master <-> worker protocol.

Users find their shared state at ``environment.loadlab`` (a
:class:`~loadlab.loadgen.context.LoadContext`), built when the worker gets the
``ll_config`` message (or directly, in a single-process run):

- :class:`LLMUser` (closed loop): sends its next request the moment the previous
  one finished (no wait time), until the run drains.
- :class:`OpenLoopUser` (rate / replay): one per worker; dispatches this worker's
  stride of the arrival schedule. Each arrival is due at ``t0 + offset`` (absolute,
  so lateness never accumulates); a request goes out in its own greenlet, at most
  ``plan.max_in_flight`` at once. When the cap is full the dispatcher waits, the
  request is sent late, and ``send_lag_s`` / ``*_from_scheduled_s`` carry the wait
  (a client that queues must not hide the queue: vLLM issue 54101).

Protocol (message names; data JSON/msgpack-safe):

- master -> worker: ``ll_config`` (RunSettings), ``ll_step`` ({"step": the Step's fields,
  "t0": open loop's start}; :func:`step_message` / :func:`step_of`),
  ``ll_drain`` ({"deadline_s"}): stop starting requests, report when idle.
- worker -> master: ``ll_hello`` ({"worker"}) once its handlers are installed (a Locust
  worker is counted by its master while it is still connecting, before it could handle
  ``ll_config``: the master configures only workers that said hello), ``ll_ready``
  ({"worker", "calibration"}; or ``ll_failed`` with the reason), ``ll_rows`` / ``ll_client``
  (record batches), ``ll_stop`` ({"worker", "reason"}: a :mod:`~loadlab.loadgen.guards` rule
  tripped, stop the run), ``ll_drained``, ``ll_done`` ({"worker", "rows", "issued", "fit",
  "calibration"}: rows shipped, requests begun, requests fitted to the context, how prompts
  were sized) after Locust's ``test_stop``; "calibration" is the worker's
  :class:`~loadlab.loadgen.prepare.Calibration` as a dict.

:class:`Link` hides whether the other side is a message away (Locust runners) or
in this process (a local run), so both paths run the same handlers.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import gevent
from gevent.pool import Pool
from locust import User, constant, task
from locust.exception import StopUser

from loadlab.loadgen.context import LoadContext, RunSettings
from loadlab.loadgen.records import DONE_MSG, BatchSender
from loadlab.loadgen.shapes import Step, arrivals

CONFIG_MSG, READY_MSG, FAILED_MSG, STEP_MSG = "ll_config", "ll_ready", "ll_failed", "ll_step"
STOP_MSG, HELLO_MSG = "ll_stop", "ll_hello"
DRAIN_MSG, DRAINED_MSG = "ll_drain", "ll_drained"


def step_message(step: Step, t0: float | None = None) -> dict[str, Any]:
    """The ``ll_step`` data telling a worker that ``step`` begins (open loop: at ``t0``)."""
    return {"step": vars(step), "t0": t0}


def step_of(data: dict[str, Any]) -> tuple[Step, float | None]:
    """The step (and open loop's ``t0``) an ``ll_step`` message carries."""
    return Step(**data["step"]), data.get("t0")


class LLMUser(User):
    """Closed-loop user: one request at a time, back to back."""

    wait_time = constant(0)

    def on_start(self) -> None:
        self.ctx: LoadContext = self.environment.loadlab
        self.uid = self.ctx.next_user_id()

    @task
    def request(self) -> None:
        ctx = self.ctx
        if ctx.draining:
            ctx.released.wait()
            raise StopUser()
        prepared = ctx.prefetcher.take()
        if prepared is None:
            ctx.released.wait()
            raise StopUser()
        ctx.run_one(prepared, self.uid)


class OpenLoopUser(User):
    """Dispatches one worker's share of an open-loop (rate or replay) schedule."""

    wait_time = constant(0)

    @task
    def dispatch(self) -> None:
        ctx: LoadContext = self.environment.loadlab
        dispatch_open_loop(ctx)
        ctx.released.wait()
        raise StopUser()


def dispatch_open_loop(ctx: LoadContext) -> None:
    """Send every arrival of this worker's stride at its absolute time."""
    ctx.started.wait()
    plan, settings = ctx.plan, ctx.settings
    assert settings.t0 is not None
    replay = None
    if plan.mode == "replay":
        replay = [s.arrival_s or 0.0 for s in ctx.factory.specs.specs]
    pool = Pool(plan.max_in_flight)
    for arrival in arrivals(plan, settings.seed, replay):
        if arrival.seq % ctx.n_workers != ctx.worker_index:
            continue
        if ctx.draining:
            break
        prepared = ctx.prefetcher.take()
        if prepared is None:
            break
        assert prepared.seq == arrival.seq, "prefetcher and schedule disagree on the stride"
        due = settings.t0 + arrival.offset_s
        delay = due - time.time()
        if delay > 0:
            gevent.sleep(delay)
        pool.spawn(ctx.run_one, prepared, 0, due, plan.steps[arrival.step])
    pool.join()


class Link:
    """Message endpoint: ``send(kind, data)`` to the other side, ``on(kind, fn)`` to receive."""

    def __init__(
        self, send: Callable[[str, Any], None], register: Callable[[str, Callable], None]
    ) -> None:
        self.send = send
        self._register = register

    def on(self, kind: str, handler: Callable[[Any], None]) -> None:
        self._register(kind, handler)


def locust_link(runner: Any) -> Link:
    """A Link over a Locust runner's custom messages."""
    def register(kind: str, handler: Callable[[Any], None]) -> None:
        runner.register_message(
            kind, lambda environment, msg, **_: handler(msg.data), concurrent=True
        )

    return Link(lambda kind, data: runner.send_message(kind, data), register)


def serve_worker(environment: Any, link: Link, worker: str,
                 sink_factory: Callable[[], Any] | None = None) -> None:
    """Install the worker-side handlers: build the context on ``ll_config``, then obey.

    ``ll_config`` carries {"settings": RunSettings, "worker_index": i}: the master
    numbers its workers itself, so seq strides never collide. ``sink_factory`` gives
    the record sink; default: batches shipped over ``link``.
    """
    def on_config(data: dict) -> None:
        sink = sink_factory() if sink_factory else BatchSender(link.send)
        settings = RunSettings(**data["settings"])
        try:
            ctx = LoadContext(settings, sink, worker, data["worker_index"])
        except Exception as exc:  # tell the master why, so it stops at once with the reason
            link.send(FAILED_MSG, {"worker": worker, "error": f"{type(exc).__name__}: {exc}"})
            raise
        ctx.on_stop = lambda reason: link.send(STOP_MSG, {"worker": worker, "reason": reason})
        environment.loadlab = ctx
        link.send(READY_MSG, {"worker": worker, "calibration": ctx.factory.calibration.to_dict()})

    def on_step(data: dict) -> None:
        environment.loadlab.set_step(*step_of(data))

    def on_drain(data: dict) -> None:
        ctx: LoadContext = environment.loadlab
        ctx.draining = True
        idle = ctx.wait_idle(data["deadline_s"])
        ctx.sink.tick()
        link.send(DRAINED_MSG, {"worker": worker, "idle": idle})

    def on_test_stop(**_: Any) -> None:
        ctx: LoadContext | None = getattr(environment, "loadlab", None)
        if ctx is None:
            return
        ctx.close()
        link.send(
            DONE_MSG,
            {
                "worker": worker,
                "rows": ctx.sink.rows_sent,
                "issued": ctx.sent,
                "fit": ctx.fit_entry(),
                "calibration": ctx.factory.calibration.to_dict(),
            },
        )

    link.on(CONFIG_MSG, on_config)
    link.on(STEP_MSG, on_step)
    link.on(DRAIN_MSG, on_drain)
    environment.events.test_stop.add_listener(on_test_stop)
    link.send(HELLO_MSG, {"worker": worker})
