"""The simulated engine in virtual time: a step load through it, written as a run folder.

A discrete-event loop (after vidur's ``simulator.py``): a heap of (time, priority, n,
handler, argument); each handler may push follow-up events. Events at the same time
run in priority order: a step's end, a metrics sample, a load-step boundary, arrivals.
Once no event is left at the current time and the engine is idle with work queued, the
next engine step starts; its StepOutput is applied (metrics, records, closed-loop
re-sends) at its end time, so a sample taken mid-step sees the state before it. A lone
replica's steps that end before the heap's next event are applied as they come, without
the heap (:meth:`_Replay.inline_steps`): the same order, a push and a pop less a step.

Plans: the load generator's own :class:`~loadlab.spec.plan.LoadPlan`, closed or open loop:

- closed loop, ``concurrency``: step k keeps ``concurrency[k]`` users busy for
  ``step_duration_s`` seconds; a user sends its next request the moment the previous one
  ends (no think time); users above a lowered concurrency finish their request and stop.
- open loop, ``rate``: step k sends at ``rate[k]`` requests/s, gamma inter-arrivals
  with shape ``burstiness`` (1 = Poisson), the live load generator's schedule
  (:func:`loadlab.workload.arrivals.step_schedule`).

Requests come from ``loadlab.workload.load_profile(workload.profile).sampler(workload.seed)``,
request ``seq`` being the run's ``seq``-th send. Prompt token ids are built so the
prefix cache sees real sharing: the profile's common tokens (ids 0..), then the prefix
group's tokens, then ids unique to the request; their block hashes come precomputed from
runs of ids (:mod:`loadlab.replay.prompts`, same hits as hashing the ids). Lengths that do
not fit the model are clipped as a careful client would (prompt <= max_model_len - 1,
prompt + output <= max_model_len); targets keep the drawn values. ``max_tokens`` = output
length.

A recorded run's requests replace the sampler and the plan's levels through three hooks
(``load_requests``, ``start_step``, ``user_free``; :mod:`loadlab.replay.trace`).

A fleet (:class:`~loadlab.sim.fleet.config.FleetConfig`, ``--replicas``/``--router``)
runs one engine per replica on the same clock: its router picks each request's replica
at send time, each replica steps on its own as soon as it is idle with work, and each
writes its own metrics series (:mod:`loadlab.replay.replicas`). Requests are clipped to
the largest max_model_len of the fleet, then to their replica's.

When the plan ends, requests still in flight are aborted (status "aborted"), as a load
generator that stops. Output in ``out_dir``: requests.parquet (REQUESTS, worker
"sim-replay", times = ``start_epoch`` + virtual seconds, written column-wise by
:class:`~loadlab.replay.records.RequestRows`; token times as pointers into the replicas'
step-end timelines, in step_ends.parquet), metrics.parquet (METRICS,
source "sim", every ``metrics_interval_s`` virtual seconds, the same samples the
simulator's /metrics would serve, written column-wise by the collector's MetricsSink) and
manifest.json (kind "sim-replay", steps, resolved server flags, vLLM's start-up lines, wall
time and speed); each table compacted into one part once the run is complete.
"""

from __future__ import annotations

import gc
import heapq
import platform
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from loadlab.collect.parse import ExpositionParser, describe_endpoint
from loadlab.errors import InputError
from loadlab.replay.prompts import prompt_ids, replay_request
from loadlab.replay.records import ENDPOINT, WORKER, RequestRows, SentRequest, TokenTimes
from loadlab.replay.replicas import ReplayReplica, build_replicas
from loadlab.runstore import (
    REQUESTS,
    STEP_ENDS,
    PartWriter,
    compact_run,
    update_manifest,
    write_manifest,
)
from loadlab.runstore.claim import owner_entry
from loadlab.runstore.layout import REQUESTS_TABLE, STEP_ENDS_TABLE
from loadlab.runstore.manifest import Launch, MetricsInfo, RunManifest, TargetInfo, WorkloadInfo
from loadlab.sim.engine.config import SimConfig
from loadlab.sim.engine.metrics import Sample
from loadlab.sim.engine.step_model import Delays
from loadlab.sim.engine.types import EngineRequest, StepOutput
from loadlab.sim.fleet.config import FleetConfig
from loadlab.sim.fleet.router import make_router
from loadlab.spec.knee_search import LevelWalk, SearchResult
from loadlab.spec.plan import LoadPlan
from loadlab.spec.scenario import Workload
from loadlab.version import __version__
from loadlab.workload import load_profile
from loadlab.workload.arrivals import RenewalSchedule, step_schedule
from loadlab.workload.sampler import RequestSpec

__all__ = ["ReplayOptions", "ReplaySummary", "TokenTimes", "gc_relaxed", "prompt_ids", "run_replay"]

_STEP_END, _SAMPLE, _BOUNDARY, _ARRIVAL = range(4)
Progress = Callable[[float, "float | None"], None]   # (virtual seconds, total or None)
Judge = Callable[[int], bool]                        # step index -> did it stall


@dataclass(frozen=True)
class ReplayOptions:
    """How one replay runs, besides its plan and workload."""

    point: str = ""
    metrics_interval_s: float = 1.0        # virtual seconds between metrics samples
    start_epoch: float | None = None       # unix time of virtual 0; None = now


def check_plan(plan: LoadPlan, opts: ReplayOptions) -> None:
    """InputError for what a replay cannot run."""
    if plan.mode == "replay":
        raise InputError("a replay runs concurrency or rate steps, or a knee search", field="plan",
                         fix="e.g. --concurrency 8,16,32 or --rate 1,2,4")
    if not opts.metrics_interval_s > 0:
        raise InputError(f"must be > 0, got {opts.metrics_interval_s}", field="metrics_interval_s",
                         fix="pass a positive number")


@dataclass(frozen=True)
class ReplaySummary:
    run_dir: Path
    requests: int                # rows written (ok + aborted)
    completed: int
    aborted: int
    engine_steps: int
    metrics_rows: int
    virtual_s: float
    wall_s: float
    steps: int = 0
    search: SearchResult | None = None   # what the level source found (lower, upper, steps run)

    @property
    def speed(self) -> float:
        """Virtual seconds simulated per wall second."""
        return self.virtual_s / self.wall_s if self.wall_s > 0 else float("inf")


class _Replay:
    """One replay's clock, event heap, engine, metrics and writers (no class-level state)."""

    def __init__(self, fleet: FleetConfig, plan: LoadPlan, workload: Workload, out_dir: Path,
                 opts: ReplayOptions, progress: Progress | None, judge: Judge | None,
                 observer: Callable[[StepOutput], None] | None = None) -> None:
        check_plan(plan, opts)
        self.plan = plan
        self.opts = opts
        self.out_dir = out_dir
        self.seed = workload.seed
        self.walk = LevelWalk(plan, judge)
        self.steps = self.walk.steps()
        self.windows: list[dict[str, Any]] = []
        self.level = 0.0
        self.total_s = plan.step_duration_s * len(plan.steps) if plan.search is None else None
        self.replicas = build_replicas(fleet, out_dir, observer)
        self.resolved = self.replicas[0].resolved
        cal = self.resolved.calibration   # its front end and turnaround, drawn per request
        self.delays = Delays(cal, self.seed) if cal is not None else None
        self.fleet_mml = max(r.resolved.max_model_len for r in self.replicas)
        self.router = make_router(fleet.router, self.resolved.block_size, fleet.refresh_ms)
        self.views = [r.view for r in self.replicas]
        self.common = self.load_requests(workload)
        self.epoch = time.time() if opts.start_epoch is None else opts.start_epoch
        self.progress = progress
        self.requests = RequestRows(
            PartWriter(out_dir / REQUESTS_TABLE, REQUESTS, writer_id=WORKER),
            PartWriter(out_dir / STEP_ENDS_TABLE, STEP_ENDS, writer_id=WORKER),
            [r.token_times for r in self.replicas], opts.point, self.epoch)
        self.now = 0.0
        self.heap: list[tuple[float, int, int, Callable[[Any], None], Any]] = []
        self.n_events = 0
        self.seq = 0
        self.step = 0
        self.ended = False
        self.live: dict[str, SentRequest] = {}
        self.busy_users: set[int] = set()
        # Replicas that may step: only a step's end or a new request makes one so, and
        # checking just those keeps a fleet's loop from visiting every replica per event.
        self.ready: set[int] = set()
        self.counts = {"completed": 0, "aborted": 0, "engine_steps": 0, "metrics_rows": 0}

    # ---- the loop ------------------------------------------------------------------------
    def push(
        self, t: float, priority: int, handler: Callable[[Any], None], arg: Any = None
    ) -> None:
        self.n_events += 1
        heapq.heappush(self.heap, (t, priority, self.n_events, handler, arg))

    def run(self) -> None:
        self.push(0.0, _BOUNDARY, self.on_boundary, 0)
        self.push(0.0, _SAMPLE, self.on_sample, 0)
        # Once per event (tens of thousands a run): the loop's state in locals, and a
        # step's end pushed inline (this loop was ~5% of a replay's own work).
        heap, ready, replicas = self.heap, self.ready, self.replicas
        pop, push, on_step_end = heapq.heappop, heapq.heappush, self.on_step_end
        inline = self.inline_steps if len(replicas) == 1 else None
        steps = 0
        while heap and not self.ended:
            now, _, _, handler, arg = pop(heap)
            self.now = now
            handler(arg)
            if not ready or self.ended or (heap and heap[0][0] <= now):
                continue
            for index in sorted(ready):  # in replica order, as all replicas were once checked
                replica = replicas[index]
                if replica.busy or not replica.engine.has_unfinished_requests():
                    ready.discard(index)
                    continue
                out = replica.engine.step(now)
                if out is not None:  # (None: nothing schedulable; tried again after next event)
                    ready.discard(index)
                    steps += 1
                    if inline is not None and (not heap or heap[0][0] > out.t_end):
                        steps, out = inline(replica, out, steps)
                        if out is None:
                            continue
                    replica.busy = True
                    self.n_events += 1
                    push(heap, (out.t_end, _STEP_END, self.n_events, on_step_end, (replica, out)))
        self.counts["engine_steps"] += steps

    def inline_steps(self, replica: ReplayReplica, out: StepOutput,
                     steps: int) -> tuple[int, StepOutput | None]:
        """One replica's steps that end before the heap's next event, applied here without
        the heap: the order is the heap's (nothing else falls due before such a step's end,
        and its end is applied, then the next step started, as the loop would), minus a
        push, a pop and the loop's checks per step, most of a closed loop's steps.

        Returns the step count and the step whose end is next on the heap (to push), or
        None where the replica stopped: idle, nothing schedulable (tried again after the
        next event, as the loop does), an event due now, or the run ended."""
        heap, engine, ready, index = self.heap, replica.engine, self.ready, replica.view.index
        on_step_end = self.on_step_end
        while True:
            self.now = now = out.t_end
            on_step_end((replica, out))
            if self.ended or (heap and heap[0][0] <= now):
                return steps, None
            if not engine.has_unfinished_requests():
                ready.discard(index)
                return steps, None
            nxt = engine.step(now)
            if nxt is None:
                return steps, None
            out = nxt
            ready.discard(index)
            steps += 1
            if heap and heap[0][0] <= out.t_end:
                return steps, out

    # ---- handlers ------------------------------------------------------------------------
    def on_boundary(self, k: int) -> None:
        """Step ``k`` begins at the level the walk chose (a search: after judging step
        k - 1, whose records are flushed first); past the last step the run is finished."""
        if self.walk.judging:
            self.requests.flush()
            for replica in self.replicas:
                replica.sink.flush()
        step = next(self.steps, None)
        if step is None:
            self.finish_run()
            return
        self.step = k
        self.level = float(step.level or 0.0)
        # The virtual client sends exactly on plan: it is never short of the asked load.
        self.windows.append(
            {
                "step": k,
                "t_start": self.epoch + self.now,
                "t_end": self.epoch + self.now + step.duration_s,
                "warmup_s": step.warmup_s,
                "client_limited": False,
                **(
                    {"concurrency": step.concurrency}
                    if self.closed
                    else {"target_rate": step.target_rate, "burstiness": self.plan.burstiness}
                ),
            }
        )
        update_manifest(self.out_dir, steps=self.windows)
        self.push(self.now + step.duration_s, _BOUNDARY, self.on_boundary, k + 1)
        self.start_step(k, step.duration_s)

    # ---- where requests come from (a recorded trace overrides these) -------------------
    def load_requests(self, workload: Workload) -> int:
        """The workload profile's seeded sampler; returns its common prefix length."""
        profile = load_profile(workload.profile)
        self.sampler = profile.sampler(workload.seed)
        return profile.common_prefix_tokens

    def start_step(self, k: int, duration_s: float) -> None:
        """Closed loop: each idle user of the level sends; open loop: the step's arrivals."""
        if self.closed:
            for user in range(int(self.level)):
                if user not in self.busy_users:
                    self.send(user)
        else:
            schedule = step_schedule(self.level, self.plan.gamma_shape, self.seed, k)
            self.push(
                self.now,
                _ARRIVAL,
                self.on_open_arrival,
                (k, self.now, duration_s, 0, schedule),
            )

    def user_free(self, user: int) -> None:
        """A user's request ended: it sends its next one unless the level dropped below it."""
        if user < self.level:
            self.send(user)

    @property
    def closed(self) -> bool:
        return self.plan.mode == "closed"

    def on_open_arrival(self, arg: tuple[int, float, float, int, RenewalSchedule]) -> None:
        k, t0, duration_s, n, schedule = arg
        self.send(None)
        t_next = t0 + schedule.offset(n + 1)
        if t_next < t0 + duration_s:
            self.push(t_next, _ARRIVAL, self.on_open_arrival, (k, t0, duration_s, n + 1, schedule))

    def on_step_end(self, arg: tuple[ReplayReplica, StepOutput]) -> None:
        replica, out = arg
        replica.busy = False
        self.ready.add(replica.view.index)
        replica.metrics.observe_step(out)
        replica.token_times.observe(out, replica.metrics.stopped)
        for fin in out.finished:
            req = self.live.pop(fin.request_id)
            replica.view.outstanding -= 1
            self.record(req, fin.request_id, "ok", out.t_end)
            self.counts["completed"] += 1
            if req.user is not None and self.delays is not None:
                turnaround = self.delays.turnaround(self.in_flight())
                self.push(self.now + turnaround, _ARRIVAL, self.resend, req.user)
            elif req.user is not None:
                self.resend(req.user)

    def in_flight(self) -> float:
        """Requests at the server, as a calibration's delays count them: a closed loop's
        users, an open loop's live requests."""
        return self.level if self.closed else float(len(self.live))

    def resend(self, user: int) -> None:
        """A closed-loop user is free again (after the calibrated turnaround, if any)."""
        self.busy_users.discard(user)
        self.user_free(user)

    def on_sample(self, tick: int) -> None:
        """One metrics.parquet sample of every replica."""
        for replica in self.replicas:
            self.counts["metrics_rows"] += replica.sample(self.epoch + self.now)
        if self.progress is not None:
            self.progress(self.now, self.total_s)
        self.push((tick + 1) * self.opts.metrics_interval_s, _SAMPLE, self.on_sample, tick + 1)

    # ---- requests ------------------------------------------------------------------------
    def send(self, user: int | None, spec: RequestSpec | None = None) -> None:
        """Send ``spec`` (default: the sampler's next) for ``user`` (None: open loop)."""
        spec = self.sampler.spec(self.seq) if spec is None else spec
        rid = f"{self.seed}-{self.seq}"
        req, prefix = self.request(rid, spec, self.fleet_mml, self.resolved.block_size)
        index = 0
        if len(self.replicas) > 1:
            if self.router.reads_waiting:
                for view, replica in zip(self.views, self.replicas, strict=True):
                    view.waiting = replica.engine.num_waiting
            index = self.router.choose(req, self.views, self.now)
        replica = self.replicas[index]
        own = replica.resolved
        if own.max_model_len < self.fleet_mml or own.block_size != self.resolved.block_size:
            req, prefix = self.request(rid, spec, own.max_model_len, own.block_size)
        prompt_len = len(req.prompt_token_ids)
        self.live[rid] = SentRequest(
            seq=self.seq,
            user=user,
            step=self.step,
            t_sent=self.now,
            prompt_len=prompt_len,
            target_prompt=spec.prompt_tokens,
            target_output=spec.output_tokens,
            group=spec.prefix_group,
            prefix=prefix,
            replica=index,
        )
        self.seq += 1
        if user is not None:
            self.busy_users.add(user)
        replica.view.outstanding += 1
        front = self.delays.front(self.in_flight()) if self.delays is not None else 0.0
        if front > 0:  # the API server's share: the engine sees the request later
            req.arrival_time += front
            self.push(self.now + front, _ARRIVAL, self.admit, (replica, req))
        else:
            self.admit((replica, req))

    def admit(self, arg: tuple[ReplayReplica, EngineRequest]) -> None:
        replica, req = arg
        replica.engine.add_request(req)
        self.ready.add(replica.view.index)
        replica.metrics.observe_arrival(req, self.now)

    def request(self, rid: str, spec: RequestSpec, mml: int,
                block_size: int) -> tuple[EngineRequest, int]:
        """The engine request of ``spec`` clipped to ``mml`` as a careful client would
        (see the module docstring), and its shared prefix length."""
        output_len = min(spec.output_tokens, mml - 1)
        prompt_len = min(spec.prompt_tokens, mml - output_len)
        prefix = min(spec.prefix_tokens, prompt_len - 1)
        req = replay_request(rid, self.seq, prompt_len, spec.prefix_group, prefix, self.common,
                             output_len, self.now, block_size)
        return req, prefix

    def finish_run(self) -> None:
        """End of plan: abort what is in flight, as a stopping load generator does."""
        self.ended = True
        for rid, req in list(self.live.items()):
            replica = self.replicas[req.replica]
            fin = replica.engine.abort_request(rid, self.now)
            if fin is not None:
                replica.metrics.observe_abort(fin)
            self.record(req, rid, "aborted", self.now)
            self.counts["aborted"] += 1
        self.live.clear()

    def record(self, req: SentRequest, rid: str, status: str, t_done: float) -> None:
        window = self.windows[req.step]
        times, first = self.replicas[req.replica].token_times.pop(rid)
        self.requests.add(req, rid, status == "ok", t_done, window.get("concurrency"),
                          window.get("target_rate"), times, first)


@contextmanager
def gc_relaxed() -> Iterator[None]:
    """No garbage collection while a replay runs; the collector is restored after.

    A replay allocates millions of objects, nearly all freed by reference counting, and
    keeps hundreds of thousands alive: a fleet's KV blocks (8 pools of 65k blocks in
    benchmarks/bench_fleet_replay.py). Even with a young-generation threshold of 50,000
    allocations, each pass walked every block made since the last one: 6% of a fleet
    replay's CPU, and those 25 passes found 67 objects in cycles. What cycles a replay
    leaves wait for the next full collection.

    Everything the replay allocated is still in the young generation when it ends, so the
    first young pass after ``gc.enable()`` walked it all (96 ms of a 2-minute 8 x 256
    replay, 17 ms of one replica). ``gc.freeze()`` then ``gc.unfreeze()`` moves every
    tracked object into the oldest generation first, two list splices (CPython's
    ``gc_freeze_impl`` / ``gc_unfreeze_impl``, Modules/gcmodule.c); skipped when a caller
    has frozen objects of its own, which unfreezing would release.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            if not gc.get_freeze_count():
                gc.freeze()
                gc.unfreeze()
            gc.enable()


def run_replay(cfg: SimConfig | FleetConfig, plan: LoadPlan, workload: Workload,
               out_dir: str | Path, opts: ReplayOptions | None = None,
               progress: Progress | None = None, judge: Judge | None = None,
               observer: Callable[[StepOutput], None] | None = None,
               notice: Callable[[str], None] | None = None,
               replay_cls: Callable[..., _Replay] = _Replay) -> ReplaySummary:
    """Run ``plan`` through the simulator of ``cfg`` in virtual time; write a run folder.

    ``progress(virtual_s, total_s)`` is called at every metrics sample (``total_s`` None
    for a search, whose length is not known ahead). A search plan asks ``judge(step)``
    after each step whether it stalled, once that step's records are on disk;
    ``observer(out)`` sees every engine step's StepOutput (the engine's own state: ground
    truth for tests of the analyzer, which sees only the run folder; in a fleet, every
    replica's). ``cfg`` is one engine's config or a fleet's. The
    garbage collector is off meanwhile (:func:`gc_relaxed`). Once complete, the
    folder's tables are compacted (:func:`loadlab.runstore.compact_run`; ``notice(line)``
    hears about it when that takes a while). ``replay_cls`` makes the loop (one that sends
    a recorded trace: :mod:`loadlab.replay.trace`). Raises InputError for a bad plan or an
    impossible configuration (before writing anything).
    """
    opts = opts or ReplayOptions()
    out = Path(out_dir)
    fleet = cfg if isinstance(cfg, FleetConfig) else FleetConfig.single(cfg)
    replay = replay_cls(fleet, plan, workload, out, opts, progress, judge, observer)
    flags = replay.resolved.server_flags()
    pages: dict[tuple[Sample, ...], dict[str, Any]] = {}  # replicas alike start alike
    endpoints = {r.endpoint: _describe(tuple(r.metrics.samples()), pages, r.parser)
                 for r in replay.replicas}
    info = endpoints[replay.replicas[0].endpoint]
    write_manifest(
        out,
        RunManifest(
            kind="sim-replay",
            point=opts.point,
            status="running",
            owner=owner_entry(),
            created=time.time(),
            start_epoch=replay.epoch,
            target=TargetInfo(
                base_url=ENDPOINT,
                model=replay.resolved.served_model_name,
                launch=Launch(kind="sim-replay", flags=flags),
            ),
            server=flags,
            steps=[],
            plan=plan.describe(),
            workload=WorkloadInfo(**workload.model_dump()),
            metrics=MetricsInfo(
                source="sim",
                interval_s=opts.metrics_interval_s,
                endpoints=endpoints,
                names_found=info["names_found"],
                vllm_engine=info["vllm_engine"],
                cache_config_info=info["cache_config_info"],
            ),
            sim={
                "config": asdict(fleet.configs[0]) | {"api_key": None},
                "startup_lines": replay.resolved.startup_lines(),
                **({"fleet": _fleet_entry(fleet, replay.replicas)} if fleet.size > 1 else {}),
            },
            host={"hostname": socket.gethostname(), "python": platform.python_version()},
            versions={"loadlab": __version__},
        ),
    )
    wall0 = time.perf_counter()
    with gc_relaxed():
        try:
            replay.run()
        finally:
            replay.requests.close()
            for replica in replay.replicas:
                replica.sink.close()
    wall = time.perf_counter() - wall0
    c = replay.counts
    summary = ReplaySummary(out, c["completed"] + c["aborted"], c["completed"], c["aborted"],
                            c["engine_steps"], c["metrics_rows"], replay.now, wall,
                            len(replay.windows), replay.walk.result)
    update_manifest(out, status="complete", finished=time.time(),
                    sim={"wall_s": wall, "speed": summary.speed, "engine_steps": c["engine_steps"]},
                    **replay.walk.manifest_entry())
    compact_run(out, progress=notice)
    return summary


def _describe(page: tuple[Sample, ...], seen: dict[tuple[Sample, ...], dict[str, Any]],
              sampler: ExpositionParser) -> dict[str, Any]:
    """The manifest's entry for an endpoint whose page has the samples ``page``, learnt
    once per distinct page.

    The first page is learnt by ``sampler``, the replicas' own parser, still empty: its
    series are known before the first sample. Any other distinct page gets a fresh
    parser, so that each entry lists its own page's families only.
    """
    if page not in seen:
        parser = ExpositionParser() if seen else sampler
        seen[page] = describe_endpoint(parser, parser.learn(page).ids)
    return seen[page]


def _fleet_entry(fleet: FleetConfig, replicas: list[ReplayReplica]) -> dict[str, Any]:
    """The manifest's ``sim.fleet``: the router and each replica's endpoint, pool and flags."""
    return {"router": fleet.router, "refresh_ms": fleet.refresh_ms,
            "replicas": [{"endpoint": r.endpoint, "pool": r.view.pool,
                          "flags": r.resolved.server_flags()} for r in replicas]}
