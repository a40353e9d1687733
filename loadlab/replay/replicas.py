"""The engines of one replay: one, or a fleet behind a router, each with its own metrics.

Each replica has its engine, its :class:`~loadlab.sim.engine.metrics.EngineMetrics` and
its own metrics.parquet writer under its own endpoint label, as the live collector
labels each scraped server: ``sim://replay`` alone, ``sim://replay/replica/<i>`` in a
fleet (the path ``loadlab sim serve --replicas`` serves that replica's /metrics on).
So per-replica series stay apart in one table and a one-engine replay reads as before.
Token times are kept per replica too: :class:`~loadlab.replay.records.TokenTimes` reads
each request's times off its own engine's step-end timeline, and one timeline shared by
replicas stepping at different times sent every request down its slow path (a list per
request, appended at every step): the fleet replay ran at half the speed per step.
The replicas share one :class:`~loadlab.collect.parse.ExpositionParser`: it learns the
series of each replica's samples (:meth:`~loadlab.collect.parse.ExpositionParser.learn`,
no page rendered or parsed), the same series once whichever replica has them, and each
replica's writer takes the series' strings from it by id.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from loadlab.collect.parse import ExpositionParser, Scrape
from loadlab.collect.sink import MetricsSink
from loadlab.replay.records import ENDPOINT, WORKER, TokenTimes
from loadlab.runstore.layout import METRICS_TABLE
from loadlab.sim.engine.core import Engine
from loadlab.sim.engine.hardware import ResolvedConfig, resolve
from loadlab.sim.engine.metrics import EngineMetrics
from loadlab.sim.engine.step_model import step_time_for
from loadlab.sim.engine.types import StepOutput
from loadlab.sim.fleet.config import FleetConfig
from loadlab.sim.fleet.router import ReplicaView

# Metrics rows a replay buffers before writing a part, shared by its replicas: ~16 MB of
# sample values (EngineMetrics.values), ~1.9 hours of 1 s samples of one engine. A replay
# of one engine shorter than that writes one part, which compaction leaves as it is; any
# more parts (a fleet's replicas write their own) are read back and rewritten as one.
SAMPLES_PER_PART = 2_000_000


def replica_path(index: int) -> str:
    """The URL path of replica ``index`` in a fleet (``/metrics`` appended by scrapers)."""
    return f"/replica/{index}"


class ReplayReplica:
    """One engine of a replay, its metrics and their writer."""

    def __init__(self, resolved: ResolvedConfig, metrics_names: str, out_dir: Path,
                 view: ReplicaView, fleet_size: int,
                 observer: Callable[[StepOutput], None] | None, parser: ExpositionParser) -> None:
        self.resolved = resolved
        self.view = view
        self.metrics = EngineMetrics(resolved, names=metrics_names)
        self.engine = Engine(resolved, step_time_for(resolved), observer)
        alone = fleet_size == 1
        self.endpoint = ENDPOINT if alone else ENDPOINT + replica_path(view.index)
        self.parser = parser
        self.sink = MetricsSink(out_dir / METRICS_TABLE, self.parser, endpoint=self.endpoint,
                                source="sim",
                                writer_id=WORKER if alone else f"{WORKER}-r{view.index}",
                                flush_interval_s=30.0,
                                flush_rows=SAMPLES_PER_PART // fleet_size)
        self.series_ids: list[int] = []
        self.token_times = TokenTimes()
        self.busy = False

    def sample(self, t: float) -> int:
        """One metrics.parquet sample at unix time ``t``; the series are learnt once from
        the engine's samples. Returns the rows written."""
        values = self.metrics.values()
        if len(values) != len(self.series_ids):
            scrape = self.parser.learn(self.metrics.samples())
            self.series_ids = scrape.ids
        else:
            scrape = Scrape(self.series_ids, values)
        self.sink.add_scrape(t, None, scrape)
        return len(values)


def build_replicas(fleet: FleetConfig, out_dir: Path,
                   observer: Callable[[StepOutput], None] | None) -> list[ReplayReplica]:
    """The fleet's replicas (InputError from ``resolve`` for an impossible config)."""
    resolved = [resolve(cfg) for cfg in fleet.configs]     # all checked before any writer
    parser = ExpositionParser()
    return [ReplayReplica(r, cfg.metrics_names, out_dir, ReplicaView(i, pool), fleet.size,
                          observer, parser)
            for i, (r, cfg, pool) in enumerate(zip(resolved, fleet.configs, fleet.pools,
                                                   strict=True))]
