"""Per-process load state: what every Locust user of one worker shares.

A :class:`LoadContext` is built from :class:`RunSettings` (plain JSON the master
sends each worker; the API key is NOT in it: each process reads its own
environment variable, named by ``api_key_env``). It owns the request factory and
prefetcher, the current step, the pool of streaming clients (one kept-alive
connection each), the in-flight count, the record sink and the self-monitor.

:meth:`LoadContext.run_one` is the whole life of one request: take a client,
send, turn the outcome into a REQUESTS row with run context (step, user, seq,
targets, lags), hand the row to the sink. Every request begun gets exactly one row:
a cancellation mid-request (the run stopping, Ctrl-C) still produces one, status
``aborted`` with the times and chunks it got so far, before propagating.
:meth:`LoadContext.close` cancels whatever is still in flight (closed-loop users
Locust did not stop yet, open-loop requests of a deep backlog) before the last flush,
so those rows reach the run folder too; ``sent`` counts requests begun, which the
master compares with the rows it received.

Every finished row also goes through a :class:`~loadlab.loadgen.guards.FailureWatch`;
when one of its rules trips (target gone, every request refused) the context stops
sending and calls ``on_stop`` with the reason.

Self-monitor: a :class:`~loadlab.loadgen.meter.ClientMeter` keeps the exact in-flight
integral, sends and send lags; a greenlet (:meth:`LoadContext._monitor`) sleeps
``LAG_TICK_S`` at a time and records how much later than asked it woke (event-loop lag:
a busy loop delays every timestamp by as much). A CLIENT row is cut every ``SAMPLE_S``
and at each window edge of the plan (step start, warm-up end, step end), so the
master sums whole samples per measured window.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import gevent
from gevent.event import Event

from loadlab.loadgen.client import StreamingClient
from loadlab.loadgen.guards import FailureWatch
from loadlab.loadgen.meter import LAG_TICK_S, SAMPLE_S, ClientMeter, window_edges
from loadlab.loadgen.preflight import api_key
from loadlab.loadgen.prepare import Prefetcher, Prepared, RequestFactory
from loadlab.loadgen.shapes import LoadPlan, Step, plan_from_dict
from loadlab.loadgen.transport import SocketTransport
from loadlab.spec.tls import TlsSettings
from loadlab.workload.fit import FitCounts

FLUSH_S = 0.5
CLIENT_ERROR_BACKOFF_S = 0.1
CANCEL_TIMEOUT_S = 10.0   # close(): cancelling in-flight requests is local, this is a backstop


@dataclass
class RunSettings:
    """Everything a worker needs to send the run's requests (JSON-safe, secret-free)."""

    base_url: str
    model: str
    api: str
    seed: int
    profile: str | None
    trace: str | None
    time_scale: float
    timeout_s: float
    api_key_env: str
    point: str
    nonce: str
    calibrate: bool
    plan: dict
    n_workers: int = 1
    t0: float | None = None           # open loop: unix time of offset 0
    max_model_len: int | None = None  # the server's context window: lengths are fitted to it
    tls: dict[str, Any] | None = None  # https: TlsSettings.to_dict() (CA bundle, insecure)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def auth_headers(api_key_env: str) -> dict[str, str]:
    """``Authorization`` from the named environment variable, if set (never logged)."""
    key = api_key(api_key_env)
    return {"Authorization": f"Bearer {key}"} if key else {}


class LoadContext:
    """Shared state of the users in one load-generator process."""

    def __init__(self, settings: RunSettings, sink: Any, worker: str, worker_index: int) -> None:
        self.settings = settings
        self.plan: LoadPlan = plan_from_dict(settings.plan)
        self.sink = sink
        self.worker = worker
        self.worker_index = worker_index
        self.n_workers = settings.n_workers
        self.headers = auth_headers(settings.api_key_env)
        # One context for every connection of this process (building one reads the CA store).
        self.tls = (TlsSettings.from_dict(settings.tls).context()
                    if settings.base_url.startswith("https://") else None)
        self.factory = RequestFactory(
            api=settings.api, model=settings.model, seed=settings.seed, base_url=settings.base_url,
            profile=settings.profile, trace=settings.trace, time_scale=settings.time_scale,
            nonce=settings.nonce, calibrate=settings.calibrate, headers=self.headers,
            max_model_len=settings.max_model_len, tls=self.tls,
        )
        total = self.factory.total
        seqs = (range(worker_index, total, self.n_workers) if total is not None
                else itertools.count(worker_index, self.n_workers))
        self.prefetcher = Prefetcher(self.factory, seqs)
        self.step: Step | None = (
            None  # set by the first ll_step (a search's steps are not in the plan)
        )
        self.meter = ClientMeter(worker)
        self.draining = False
        self.released = Event()       # set when users may stop waiting (run over)
        self.started = Event()        # open loop: set once t0 is known
        self._clients: list[StreamingClient] = []
        self._live: set[gevent.Greenlet] = set()   # greenlets inside run_one
        self.on_row: Callable[[dict[str, Any]], None] | None = None  # e.g. Locust's request event
        # Told the reason when a FailureWatch rule trips (loadlab run: a message to the
        # master, which stops the run); without it the watch is off (plain Locust).
        self.on_stop: Callable[[str], None] | None = None
        self.stop_reason: str | None = None
        self.fit_counts = FitCounts()
        self._watch = FailureWatch(settings.api_key_env)
        self._user_ids = itertools.count()
        self._greenlets = [gevent.spawn(self._monitor), gevent.spawn(self._ticker)]

    @property
    def in_flight(self) -> int:
        return self.meter.in_flight

    @property
    def sent(self) -> int:
        """Requests begun by this process so far (each must have a row)."""
        return self.meter.issued

    # -- users ---------------------------------------------------------------------
    def next_user_id(self) -> int:
        return next(self._user_ids)

    def set_step(self, step: Step, t0: float | None = None) -> None:
        """Closed loop: requests sent from now on belong to ``step`` (the master's: a knee
        search chooses its steps as it runs). Open loop: ``t0`` (unix) is offset 0 of the
        schedule; dispatching starts."""
        self.step = step
        if t0 is not None:
            self.settings.t0 = t0
            self.started.set()
        self._emit_sample()  # the edge between steps (closed loop: as this worker heard of it)
        start = t0 if t0 is not None else time.time()
        self._greenlets += [gevent.spawn_later(max(0.0, edge - time.time()), self._emit_sample)
                            for edge in window_edges(self.plan, step, start)]

    def _client(self) -> StreamingClient:
        if self._clients:
            return self._clients.pop()
        transport = SocketTransport(self.settings.base_url, tls=self.tls)
        return StreamingClient(transport, self.settings.api, headers=self.headers,
                               timeout_s=self.settings.timeout_s)

    def run_one(self, prepared: Prepared, user: int, t_scheduled: float | None = None,
                step: Step | None = None) -> dict[str, Any]:
        """Send one request and record it; returns the row."""
        step = step or self.step
        assert step is not None, "a request before the first ll_step"
        client = self._client()
        client.last = None
        me = gevent.getcurrent()
        self.meter.begin(t_scheduled)
        self.fit_counts.add(prepared.fitted)
        self._live.add(me)
        try:
            outcome = client.send(prepared.body, {"X-Request-Id": prepared.request_id})
        except BaseException:
            if client.last is not None:  # cancelled: the row says how far it got
                self.sink.add_row(self._row(prepared, client.last, user, t_scheduled, step))
            raise
        finally:
            self.meter.end()
            self._live.discard(me)
        self._clients.append(client)
        row = self._row(prepared, outcome, user, t_scheduled, step)
        self.sink.add_row(row)
        if self.on_row is not None:
            self.on_row(row)
        reason = self._watch.observe(row)
        if reason is not None and self.on_stop is not None and self.stop_reason is None:
            self.stop_reason = reason
            self.draining = True   # send nothing more; the master stops the run
            self.on_stop(reason)
        if outcome.status == "client_error":
            # No connection (server down or restarting): pause so a closed-loop user does
            # not spin out thousands of error rows a second; the run itself goes on.
            with self.meter.backoff():
                gevent.sleep(CLIENT_ERROR_BACKOFF_S)
        return row

    def _row(self, prepared: Prepared, outcome: Any, user: int, t_scheduled: float | None,
             step: Step) -> dict[str, Any]:
        spec = prepared.spec
        row = outcome.fields()
        t_sent, t_first, t_done = row["t_sent"], row["t_first_token"], row["t_done"]
        sched = t_scheduled is not None
        row.update(
            point=self.settings.point,
            step=step.index,
            concurrency=step.concurrency,
            target_rate=step.target_rate,
            worker=self.worker,
            user=user,
            request_id=prepared.request_id,
            seq=prepared.seq,
            endpoint=self.settings.base_url,
            api=self.settings.api,
            t_scheduled=t_scheduled,
            send_lag_s=(t_sent - t_scheduled) if sched and t_sent is not None else None,
            ttft_from_scheduled_s=(t_first - t_scheduled)
            if sched and t_first is not None
            else None,
            e2e_from_scheduled_s=(t_done - t_scheduled) if sched and t_done is not None else None,
            target_prompt_tokens=spec.prompt_tokens,
            target_output_tokens=spec.output_tokens,
            prefix_group=spec.prefix_group,
            prefix_tokens=spec.prefix_tokens,
        )
        return row

    # -- lifecycle -----------------------------------------------------------------
    def wait_idle(self, deadline_s: float) -> bool:
        """Block until nothing is in flight or the deadline passes; True when idle."""
        end = time.monotonic() + deadline_s
        while self.in_flight and time.monotonic() < end:
            gevent.sleep(0.02)
        return self.in_flight == 0

    def fit_entry(self) -> dict[str, int]:
        """Requests sent so far that were changed to fit the server's context."""
        return asdict(self.fit_counts)

    def close(self) -> None:
        """Stop: cancel requests still in flight (each records an ``aborted`` row), flush."""
        self.released.set()
        self.prefetcher.stop()
        live = [g for g in self._live if g is not gevent.getcurrent()]
        gevent.killall(live, block=True, timeout=CANCEL_TIMEOUT_S)
        for g in self._greenlets:
            g.kill(block=False)
        self._emit_sample()
        self.sink.flush()

    def _ticker(self) -> None:
        while True:
            gevent.sleep(FLUSH_S)
            self.sink.tick()

    def _monitor(self) -> None:
        while True:
            t = time.perf_counter()
            gevent.sleep(LAG_TICK_S)
            self.meter.tick(max(0.0, time.perf_counter() - t - LAG_TICK_S))
            if self.meter.since_cut_s >= SAMPLE_S:
                self._emit_sample()

    def _emit_sample(self) -> None:
        sample = self.meter.cut()
        if sample is not None:
            self.sink.add_client(sample)
