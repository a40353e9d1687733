"""A fleet behind one HTTP front: N live drivers, one router choosing each request's.

:class:`FleetDriver` answers the HTTP handlers as a single
:class:`~loadlab.sim.serve.live.LiveDriver` does (``submit``, ``abort``, ``alive``, ...),
so the server's handlers do not know a fleet from one engine. Each replica is a
LiveDriver with its own engine, clock loop and :class:`EngineMetrics`; the router
(:mod:`loadlab.sim.fleet.router`) sees each replica's open streams (``outstanding``) and
its engine's queue (``waiting``), and picks at arrival, as a proxy in front of N vLLM
servers would. Time is the modelled clock of replica 0 (all replicas start together).
"""

from __future__ import annotations

import asyncio

from loadlab.sim.engine.hardware import resolve
from loadlab.sim.engine.metrics import EngineMetrics
from loadlab.sim.engine.types import EngineRequest
from loadlab.sim.fleet.config import FleetConfig
from loadlab.sim.fleet.router import ReplicaView, make_router
from loadlab.sim.serve.live import LiveDriver, RequestStream, StepPeriods


class FleetDriver:
    """N LiveDrivers behind a router, with the LiveDriver surface the handlers use."""

    def __init__(self, fleet: FleetConfig) -> None:
        resolved = [resolve(cfg) for cfg in fleet.configs]
        self.metrics = [EngineMetrics(r, names=cfg.metrics_names)
                        for r, cfg in zip(resolved, fleet.configs, strict=True)]
        self.replicas = [LiveDriver(cfg, r, metrics=m) for cfg, r, m in
                         zip(fleet.configs, resolved, self.metrics, strict=True)]
        self.views = [ReplicaView(i, pool) for i, pool in enumerate(fleet.pools)]
        self.router = make_router(fleet.router, resolved[0].block_size, fleet.refresh_ms)

    def submit(self, request_id: str, prompt_token_ids: list[int], max_tokens: int,
               min_tokens: int = 0, ignore_eos: bool = False,
               streaming: bool = True) -> RequestStream:
        for view, driver in zip(self.views, self.replicas, strict=True):
            view.outstanding = driver.num_streams
            if self.router.reads_waiting:
                view.waiting = driver.engine.num_waiting
        probe = EngineRequest(request_id, prompt_token_ids, 1, max_tokens, 0.0)
        driver = self.replicas[self.router.choose(probe, self.views,
                                                  self.replicas[0].engine_now())]
        return driver.submit(request_id, prompt_token_ids, max_tokens, min_tokens, ignore_eos,
                             streaming)

    def abort(self, stream: RequestStream) -> None:
        """Abort in the replica that holds the stream (the others do not know its id)."""
        for driver in self.replicas:
            driver.abort(stream)

    def start(self) -> None:
        turns = asyncio.Lock()     # one replica's step or publish per loop pass (LiveDriver)
        for driver in self.replicas:
            driver.turns = turns
            driver.start()

    async def stop(self) -> None:
        for driver in self.replicas:
            await driver.stop()

    @property
    def alive(self) -> bool:
        return all(driver.alive for driver in self.replicas)

    @property
    def num_streams(self) -> int:
        return sum(driver.num_streams for driver in self.replicas)

    @property
    def periods(self) -> StepPeriods:
        """Replica 0's step periods (each replica keeps its own pace)."""
        return self.replicas[0].periods
