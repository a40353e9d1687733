"""The live driver: runs the simulated engine against the wall clock for the HTTP front.

Clock. Engine time is modelled seconds since start: ``engine_now = (wall - t0) x
time_scale`` (``--time-scale`` > 1 runs faster than modelled). A step that starts at
engine time ``s`` ends at ``e = s + step_time(batch)``; the driver sleeps until the wall
time of ``e`` and only then publishes the step (tokens to clients, metrics), so a
client sees each token when the modelled GPU would have produced it.

Loop
1. No unfinished request: wait for a submit.
2. Start the step at the previous step's end when the loop is less than ``MAX_LAG_S``
   (20 ms wall) behind it, else at ``engine_now``. Starting back-to-back steps on the model
   clock absorbs the event loop's millisecond timer granularity and per-step CPU cost,
   so the average period equals the modelled one while the server keeps up; once it
   falls further behind, the clock re-anchors to the wall and the lag is real (and
   counted in :class:`StepPeriods`).
3. ``engine.step(start)``; sleep until the wall time of its end; feed
   ``EngineMetrics.observe_step``; add the new tokens to each request's
   :class:`RequestStream` and wake its reader when vLLM would emit: on the first token,
   every ``stream_interval`` tokens, and at the finish.

Arrivals are stamped ``min(engine_now, end of the step in flight)`` so a request never
arrives after the step that admits it starts.

Output length (the simulator samples no text, so it decides how long each reply is):
``ignore_eos`` -> ``max_tokens``; else ``min(max_tokens, max(min_tokens, L))`` with L a
log-normal draw (mean ``output_len_mean``, sigma ``output_len_sigma``, seeded by
``--seed``, drawn in arrival order), at least 1, and never past ``max_model_len``.
"""

from __future__ import annotations

import asyncio
import math
import random
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from loadlab.sim.engine.config import SimConfig
from loadlab.sim.engine.core import Engine
from loadlab.sim.engine.hardware import ResolvedConfig
from loadlab.sim.engine.metrics import EngineMetrics
from loadlab.sim.engine.step_model import step_time_for
from loadlab.sim.engine.types import BatchShape, EngineRequest, FinishedRequest, StepOutput

_T = TypeVar("_T")

MAX_LAG_S = 0.02


class RequestStream:
    """One request's mailbox: the driver counts tokens in, the HTTP handler reads them.

    Only counts travel: the ``k``-th output token's id and text follow from
    ``(seed, k)`` (see :func:`loadlab.sim.serve.tokenizer.output_token`). A reader either
    awaits :meth:`next`, or installs a ``sink`` that the driver calls synchronously when
    an emission is due, so a step's writes to all streams happen in one pass without
    waking a coroutine per token (the server's streaming fast path).
    """

    __slots__ = ("_waiter", "delivered", "finish_reason", "generated", "interval",
                 "max_tokens", "output_len", "prompt_len", "request_id", "seed", "sink",
                 "streaming")

    def __init__(self, request_id: str, prompt_len: int, max_tokens: int, output_len: int,
                 seed: int, streaming: bool, interval: int) -> None:
        self.request_id = request_id
        self.prompt_len = prompt_len
        self.max_tokens = max_tokens
        self.output_len = output_len
        self.seed = seed
        self.generated = 0            # tokens produced by the engine so far
        self.delivered = 0            # tokens handed to the reader so far
        self.finish_reason: str | None = None
        self.streaming = streaming
        self.interval = interval
        self.sink: Callable[[RequestStream], None] | None = None
        self._waiter: asyncio.Future[None] | None = None

    def ready(self) -> bool:
        """Whether vLLM would emit now: finish, first token, or a full interval."""
        if self.finish_reason is not None:
            return True
        if not self.streaming:
            return False
        pending = self.generated - self.delivered
        return pending > 0 and (self.delivered == 0 or pending >= self.interval)

    def take(self) -> tuple[int, int, str | None]:
        """Consume what is due: (first position, count, finish_reason or None)."""
        start = self.delivered
        self.delivered = self.generated
        return start, self.generated - start, self.finish_reason

    def _wake(self) -> None:
        if not self.ready():
            return
        if self.sink is not None:
            self.sink(self)
            if self.finish_reason is None:
                return
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _wait(self, until: Callable[[], bool]) -> None:
        while not until():
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    async def next(self) -> tuple[int, int, str | None]:
        """Wait for the next emission and consume it."""
        await self._wait(self.ready)
        return self.take()

    async def wait_finished(self) -> None:
        """Wait until the request finished (for readers that use a ``sink``)."""
        await self._wait(lambda: self.finish_reason is not None)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class StepPeriods:
    """Modelled vs measured step periods (wall seconds), for the live benchmark.

    Counted over steps that follow a step while the engine stayed busy: measured is the
    wall time between their publications (so any lag or re-anchoring shows), modelled
    the step's duration / time_scale. ``measured_s / modelled_s`` close to 1 means the
    server keeps the modelled pace.
    """

    steps: int = 0
    modelled_s: float = 0.0
    measured_s: float = 0.0
    late_steps: int = 0               # published more than MAX_LAG_S after their modelled end
    max_lag_s: float = 0.0
    reanchors: int = 0                # times the clock fell behind and restarted at the wall

    @property
    def ratio(self) -> float:
        return self.measured_s / self.modelled_s if self.modelled_s else math.nan


class LiveDriver:
    """Binds an :class:`Engine` to asyncio in real time; one per server."""

    def __init__(self, cfg: SimConfig, resolved: ResolvedConfig,
                 metrics: EngineMetrics | None = None,
                 step_time: Callable[[BatchShape], float] | None = None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.cfg = cfg
        self.resolved = resolved
        self.metrics = metrics
        self.engine = Engine(resolved, step_time or step_time_for(resolved))
        self.periods = StepPeriods()
        self._scale = float(cfg.time_scale)
        self._interval = max(1, int(cfg.stream_interval))
        self._clock = clock
        self._t0 = clock()
        self._rng = random.Random(cfg.seed)
        sigma = float(cfg.output_len_sigma)
        self._mu = math.log(max(cfg.output_len_mean, 1.0)) - sigma * sigma / 2
        self._sigma = sigma
        self._streams: dict[str, RequestStream] = {}
        self._wake = asyncio.Event()
        self._step_end: float | None = None     # engine time; set while a step is in flight
        self._deferred_aborts: list[str] = []
        self._task: asyncio.Task[None] | None = None
        self.turns: asyncio.Lock | None = None   # a fleet's, shared: see _in_turn

    # ------------------------------------------------------------ clock
    def engine_now(self) -> float:
        return (self._clock() - self._t0) * self._scale

    def _wall(self, engine_t: float) -> float:
        return self._t0 + engine_t / self._scale

    # ------------------------------------------------------------ requests
    def output_len(self, prompt_len: int, max_tokens: int, min_tokens: int,
                   ignore_eos: bool) -> int:
        """How many tokens a request generates (see the module docstring)."""
        if ignore_eos:
            n = max_tokens
        else:
            draw = max(1, round(self._rng.lognormvariate(self._mu, self._sigma)))
            n = min(max_tokens, max(min_tokens, draw))
        return max(1, min(n, self.resolved.max_model_len - prompt_len))

    def submit(self, request_id: str, prompt_token_ids: list[int], max_tokens: int,
               min_tokens: int = 0, ignore_eos: bool = False,
               streaming: bool = True) -> RequestStream:
        """Hand a request to the engine; read its tokens from the returned stream."""
        prompt_len = len(prompt_token_ids)
        out_len = self.output_len(prompt_len, max_tokens, min_tokens, ignore_eos)
        now = self.engine_now()
        if self._step_end is not None:
            now = min(now, self._step_end)
        req = EngineRequest(request_id=request_id, prompt_token_ids=prompt_token_ids,
                            output_len=out_len, max_tokens=max_tokens, arrival_time=now)
        stream = RequestStream(request_id, prompt_len, max_tokens, out_len,
                               seed=self._rng.randrange(1 << 30), streaming=streaming,
                               interval=self._interval)
        self._streams[request_id] = stream
        if self.metrics is not None:
            self.metrics.observe_arrival(req, now)
        self.engine.add_request(req)
        self._wake.set()
        return stream

    def abort(self, stream: RequestStream) -> None:
        """The client went away: free the request's slots, count it as aborted.

        During a step in flight the abort waits for the step to be published, as vLLM
        handles aborts between steps (the step's state already includes the request).
        """
        if self._streams.pop(stream.request_id, None) is None:
            return
        stream.finish_reason = "abort"
        if self._step_end is None:
            self._abort_now(stream.request_id, self.engine_now())
        else:
            self._deferred_aborts.append(stream.request_id)

    def _abort_now(self, request_id: str, now: float) -> None:
        fin = self.engine.abort_request(request_id, now)
        if fin is not None and self.metrics is not None:
            self.metrics.observe_abort(fin)
            # No step may follow (the engine can go idle), so refresh the gauges here
            # rather than leave them at the last step's figures.
            engine, m = self.engine, self.metrics
            m.running, m.waiting, m.kv_usage = (
                engine.num_running,
                engine.num_waiting,
                engine.kv_usage,
            )

    @property
    def num_streams(self) -> int:
        return len(self._streams)

    # ------------------------------------------------------------ loop
    def start(self) -> None:
        """Start the loop task on the running event loop."""
        self._task = asyncio.get_running_loop().create_task(self._run(), name="sim-engine")
        self._task.add_done_callback(_report_crash)

    @property
    def alive(self) -> bool:
        return self._task is not None and not self._task.done()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    async def _run(self) -> None:
        prev_end: float | None = None        # engine time the previous busy step ended
        prev_pub: float | None = None        # wall time it was published
        max_lag = MAX_LAG_S * self._scale
        while True:
            if not self.engine.has_unfinished_requests():
                self._wake.clear()
                await self._wake.wait()
                prev_end = prev_pub = None
                continue
            now = self.engine_now()
            if prev_end is not None and now - prev_end < max_lag:
                start = prev_end
            else:
                if prev_end is not None:
                    self.periods.reanchors += 1
                start = now
            out = await self._in_turn(self.engine.step, start)
            if out is None:           # work exists but nothing is runnable now
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), timeout=MAX_LAG_S)
                except asyncio.TimeoutError:
                    pass
                prev_end = prev_pub = None
                continue
            self._step_end = out.t_end
            # Always yield, even when late, so handlers write between steps.
            await asyncio.sleep(max(0.0, self._wall(out.t_end) - self._clock()))
            published = self._clock()
            self._step_end = None
            self._account(out, published, prev_pub)
            prev_end, prev_pub = out.t_end, published
            await self._in_turn(self._publish, out)
            for request_id in self._deferred_aborts:
                self._abort_now(request_id, out.t_end)
            self._deferred_aborts.clear()

    async def _in_turn(self, work: Callable[[Any], _T], arg: Any) -> _T:
        """``work(arg)`` now, or in a fleet (``turns`` set) when this replica's turn comes.

        A fleet's replicas share one event loop, and asyncio runs every ready callback of a
        loop pass before it polls the sockets again. Eight replicas running late each step
        and publish (a write per stream) in the same pass, so a request waits behind all of
        them: at 8 x 64 streams a /metrics scrape, and /health alike, waited ~50 ms at the
        median (benchmarks/bench_fleet_front.py). Holding the turn over one more pass lets
        at most one replica's step or publish into each pass, so the sockets are polled
        between any two.
        """
        if self.turns is None:
            return work(arg)
        async with self.turns:
            result = work(arg)
            await asyncio.sleep(0)
        return result

    def _account(self, out: StepOutput, published: float, prev_pub: float | None) -> None:
        lag = published - self._wall(out.t_end)
        p = self.periods
        if lag > MAX_LAG_S:
            p.late_steps += 1
        p.max_lag_s = max(p.max_lag_s, lag)
        if prev_pub is not None:
            p.steps += 1
            p.modelled_s += (out.t_end - out.t_start) / self._scale
            p.measured_s += published - prev_pub

    def _publish(self, out: StepOutput) -> None:
        if self.metrics is not None:
            self.metrics.observe_step(out)
        streams = self._streams
        touched = []
        for rid, n in out.new_tokens.items():
            if n:
                s = streams.get(rid)
                if s is not None:
                    s.generated += n
                    touched.append(s)
        for fin in out.finished:
            self._finish(fin)       # wakes its reader once, with the last tokens
        for s in touched:
            if s.finish_reason is None:
                s._wake()

    def _finish(self, fin: FinishedRequest) -> None:
        s = self._streams.pop(fin.request_id, None)
        if s is not None:
            s.generated = fin.output_len
            s.finish_reason = fin.finish_reason
            s._wake()


def _report_crash(task: asyncio.Task[None]) -> None:
    """A dead engine loop must be loud: print why (the server then answers 503 on /health)."""
    if not task.cancelled() and task.exception() is not None:
        traceback.print_exception(task.exception(), file=sys.stderr)
