"""How fast `loadlab sim replay` simulates: virtual seconds per wall second.

Scenario (the brief's goal is >= 200x real time): 10 simulated minutes, closed loop at
concurrency 256, Qwen2.5-7B on one H100 with vLLM's defaults, the sharegpt profile.
Side by side, the same closed loop driven straight through the Engine (no metrics, no
records, no event heap) shows how much of the time is the engine's and how much the
replay's. Speeds are given per wall second and per CPU second of this process (the
machine is shared: CPU time is the steadier figure). Also times EngineMetrics.render()
(served up to 10 Hz by the HTTP front) beside prometheus_client's generate_latest over
the same families, and samples().

    python benchmarks/bench_sim_replay.py [--minutes 10] [--concurrency 256] [--profile]
        [--max-num-seqs N] [--num-gpu-blocks N] [--against TREE [--repeats 5]]

The split (goal: the replay's own work <= 30% of the engine's): during the timed replay
the engine's methods (``Engine.step``, ``Engine.add_request``, and the engine's metrics,
``EngineMetrics.observe_step``/``observe_arrival``/``observe_abort``: the engine is
``loadlab/sim/engine``, metrics.py included) and the making of requests
(``RequestSampler.spec``, ``_Replay.request``: lengths drawn, prompts and their block
hashes built) are wrapped with ``time.perf_counter``; the rest of the replay's time is
its overhead: records, token times, metrics sampling, the event heap, the parquet writes.
Printed as a share of the engine's time, with and without the making of requests counted
in it. The replay is one thread that never waits, so its wall time is its CPU time
(printed beside it: a gap means the machine took the core away, and the split is not to
be read). Wrapping costs ~0.15 us a call outside the timed span, which lands in the
overhead (~60k calls in ten minutes: ~0.015 of the ratio). Not ``time.thread_time``: the
thread's CPU clock is a system call, not a vDSO read, and two per call (~120k) cost
~50 ms of a 0.85 s replay, most of it counted as overhead (0.35 against 0.32).

``--profile`` runs under cProfile and prints where the wall time went, by module
(engine/scheduler/blocks = the engine; replay/metrics/timing = the replay side).
``--num-gpu-blocks`` sets the KV pool (default: vLLM's memory formula, 65,459 blocks;
not with ``--against``): the same requests in the same steps, over a larger or smaller
set of Block objects. The
allocator hands out the least recently used block, so every allocation touches the
coldest of them, and the engine's cost per step grows with the pool (a fleet of 8
holds 8 pools).
``--max-num-seqs`` below the concurrency keeps requests waiting at every step, so every
step records a refusal (the scheduler's worst case for that bookkeeping).
``--against TREE`` times the same replay with another loadlab tree (a directory holding
``loadlab/``, e.g. ``git archive main loadlab | tar -x -C /tmp/main``) in fresh
processes, the two trees alternating ``--repeats`` times, and prints the median CPU
seconds of each and their ratio: a change's cost measured side by side in one run.

The first line names the loadlab tree measured: run from another checkout of an
editable install, the script imports the installed tree unless PYTHONPATH names it.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from trees import tree_env

import loadlab
from loadlab.replay.driver import ReplayOptions, ReplaySummary, _Replay, run_replay
from loadlab.replay.prompts import replay_request
from loadlab.sim.engine.config import SimConfig
from loadlab.sim.engine.core import Engine
from loadlab.sim.engine.hardware import resolve
from loadlab.sim.engine.metrics import EngineMetrics
from loadlab.sim.engine.timing import StepTimeModel
from loadlab.sim.fleet.config import FleetConfig
from loadlab.spec.plan import LoadPlan
from loadlab.spec.scenario import Workload
from loadlab.workload import load_profile
from loadlab.workload.sampler import RequestSampler


def engine_only(cfg: SimConfig, plan: LoadPlan, workload: Workload) -> tuple[float, float, int]:
    """(wall s, CPU s, steps) of the bare engine under the same closed loop and requests."""
    resolved = resolve(cfg)
    engine = Engine(resolved, StepTimeModel(resolved).step_time)
    profile = load_profile(workload.profile)
    sampler, common, mml = (
        profile.sampler(workload.seed),
        profile.common_prefix_tokens,
        resolved.max_model_len,
    )
    seq, now, steps = 0, 0.0, 0

    def send() -> None:
        nonlocal seq
        spec = sampler.spec(seq)
        out_len = min(spec.output_tokens, mml - 1)
        p_len = min(spec.prompt_tokens, mml - out_len)
        engine.add_request(replay_request(str(seq), seq, p_len, spec.prefix_group,
                                          min(spec.prefix_tokens, p_len - 1), common, out_len, now,
                                          resolved.block_size))
        seq += 1

    w0, c0 = time.perf_counter(), time.process_time()
    for _ in range(plan.steps[0].concurrency or 0):
        send()
    while now < plan.step_duration_s:
        out = engine.step(now)
        assert out is not None
        steps += 1
        now = out.t_end
        for _ in out.finished:
            send()
    return time.perf_counter() - w0, time.process_time() - c0, steps


def by_module(prof: cProfile.Profile) -> dict[str, float]:
    """Self time per source file, in seconds."""
    totals: dict[str, float] = defaultdict(float)
    for (path, _, _), (_, _, tottime, _, _) in pstats.Stats(prof).stats.items():  # type: ignore[attr-defined]
        totals[Path(path).name if "loadlab" in path else "(numpy, pyarrow, builtins)"] += tottime
    return dict(sorted(totals.items(), key=lambda kv: -kv[1]))


def time_exposition(cfg: SimConfig, out: Path) -> tuple[float, float, float, int]:
    """(render ms, prometheus_client ms, samples ms, samples) after a one-minute replay."""
    replay = _Replay(
        FleetConfig.single(cfg),
        LoadPlan(concurrency=[64], step_duration_s=60, warmup_s=0),
        Workload(),
        out,
        ReplayOptions(),
        None,
        None,
    )
    replay.run()
    metrics = replay.replicas[0].metrics

    n = 50
    t0 = time.perf_counter()
    for _ in range(n):
        metrics.render()
    t1 = time.perf_counter()
    for _ in range(n):
        metrics.render_with_prometheus_client()
    t2 = time.perf_counter()
    for _ in range(n):
        rows = metrics.samples()
    t3 = time.perf_counter()
    return (t1 - t0) / n * 1e3, (t2 - t1) / n * 1e3, (t3 - t2) / n * 1e3, len(rows)


class Split:
    """Seconds inside the engine's methods and inside the making of requests, accumulated
    by wrappers on their classes while :meth:`timed` runs."""

    def __init__(self) -> None:
        self.engine = 0.0
        self.requests = 0.0

    def _wrap(self, cls: type, name: str, bucket: str) -> None:
        inner = getattr(cls, name)
        clock = time.perf_counter

        def timed(*a: Any, **kw: Any) -> Any:
            t0 = clock()
            try:
                return inner(*a, **kw)
            finally:
                setattr(self, bucket, getattr(self, bucket) + clock() - t0)

        setattr(cls, name, timed)

    @contextmanager
    def timed(self) -> Iterator[Split]:
        wrapped = [(Engine, "step", "engine"), (Engine, "add_request", "engine"),
                   (EngineMetrics, "observe_step", "engine"),
                   (EngineMetrics, "observe_arrival", "engine"),
                   (EngineMetrics, "observe_abort", "engine"),
                   (RequestSampler, "spec", "requests"), (_Replay, "request", "requests")]
        saved = [(cls, name, cls.__dict__[name]) for cls, name, _ in wrapped]
        for cls, name, bucket in wrapped:
            self._wrap(cls, name, bucket)
        try:
            yield self
        finally:
            for cls, name, inner in saved:
                setattr(cls, name, inner)


def split_replay(cfg: SimConfig, plan: LoadPlan, workload: Workload,
                 out: Path) -> tuple[ReplaySummary, float, float, Split]:
    """(summary, CPU s and wall s of the whole replay, its split) of one replay."""
    with Split().timed() as split:
        c0, w0 = time.process_time(), time.perf_counter()
        summary = run_replay(cfg, plan, workload, out)
        cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    return summary, cpu, wall, split


def shares(wall: float, split: Split) -> tuple[float, float]:
    """(overhead / engine, overhead with the making of requests / engine), all on the
    split's clock."""
    rest = wall - split.engine - split.requests
    return rest / split.engine, (rest + split.requests) / split.engine


CHILD = """
import sys, tempfile
from pathlib import Path
sys.path.insert(0, sys.argv[5])
from bench_sim_replay import split_replay
from loadlab.sim.engine.config import SimConfig
from loadlab.spec.plan import LoadPlan
from loadlab.spec.scenario import Workload
minutes, concurrency, seqs, profile = float(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
cfg = SimConfig(model="qwen2.5-7b", gpu="h100", max_num_seqs=int(seqs) if seqs else None)
plan = LoadPlan(concurrency=[concurrency], step_duration_s=minutes * 60, warmup_s=60)
with tempfile.TemporaryDirectory() as tmp:
    summary, cpu, wall, split = split_replay(cfg, plan, Workload(profile=profile),
                                             Path(tmp) / "run")
    print(cpu, wall, summary.engine_steps, split.engine, split.requests)
"""


def replay_cpu_s(tree: Path, args: argparse.Namespace) -> tuple[float, float, int, Split]:
    """(CPU s, wall s, engine steps, split) of one replay in a fresh process importing ``tree``'s
    loadlab (``-P``: with ``-c``, the working directory would come first on the path, and
    run from a checkout's root its loadlab would stand in for ``tree``'s)."""
    env = tree_env(tree)
    argv = [sys.executable, "-P", "-c", CHILD, str(args.minutes), str(args.concurrency),
            str(args.max_num_seqs or ""), args.profile_name, str(Path(__file__).parent)]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
    cpu, wall, steps, engine, requests = done.stdout.split()
    split = Split()
    split.engine, split.requests = float(engine), float(requests)
    return float(cpu), float(wall), int(steps), split


def against(base: Path, args: argparse.Namespace) -> None:
    """This tree and ``base`` alternating, so both see the same load on a shared machine."""
    here = Path(loadlab.__file__).resolve().parents[1]
    times: dict[Path, list[float]] = {here: [], base: []}
    overheads: dict[Path, list[tuple[float, float]]] = {here: [], base: []}
    lost: list[float] = []   # wall / CPU - 1 of every replay: the core taken away
    steps: dict[Path, int] = {}
    for i in range(args.repeats):
        for tree in (here, base) if i % 2 == 0 else (base, here):  # ABBA: neither always first
            cpu, wall, steps[tree], split = replay_cpu_s(tree, args)
            times[tree].append(cpu)
            overheads[tree].append(shares(wall, split))
            lost.append(wall / cpu - 1)
    this, other = statistics.median(times[here]), statistics.median(times[base])
    fastest = min(times[here]) / min(times[base])
    print(f"replay CPU s, median of {args.repeats}: this tree {this:.2f} "
          f"({steps[here]} steps), {base}: {other:.2f} ({steps[base]} steps); "
          f"ratio {this / other:.3f} (of the fastest runs: {fastest:.3f})")
    print(f"  this tree: {', '.join(f'{t:.2f}' for t in times[here])}")
    print(f"  {base}: {', '.join(f'{t:.2f}' for t in times[base])}")
    print(f"  wall over CPU: {statistics.median(lost):.1%} median, {max(lost):.1%} at most "
          "(the overhead split is on the wall clock)")
    v = args.minutes * 60
    for tree, name in ((here, "this tree"), (base, str(base))):
        own = statistics.median(o for o, _ in overheads[tree])
        with_requests = statistics.median(w for _, w in overheads[tree])
        print(f"  {name}: {v / statistics.median(times[tree]):.0f}x real time per CPU s; "
              f"replay overhead / engine {own:.3f} (goal <= 0.30; each run: "
              f"{', '.join(f'{o:.3f}' for o, _ in overheads[tree])}), "
              f"{with_requests:.2f} counting the making of requests")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--profile-name", default="sharegpt")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--max-num-seqs", type=int, default=None)
    ap.add_argument("--num-gpu-blocks", type=int, default=None)
    ap.add_argument("--against", type=Path, default=None)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    print(f"loadlab: {Path(loadlab.__file__).parent}")
    if args.against is not None:
        against(args.against.resolve(), args)
        return
    cfg = SimConfig(model="qwen2.5-7b", gpu="h100", max_num_seqs=args.max_num_seqs,
                    num_gpu_blocks_override=args.num_gpu_blocks)
    plan = LoadPlan(concurrency=[args.concurrency], step_duration_s=args.minutes * 60, warmup_s=60)
    workload = Workload(profile=args.profile_name)
    with tempfile.TemporaryDirectory() as tmp:
        prof = cProfile.Profile() if args.profile else None
        if prof:
            prof.enable()
        if prof:
            c0 = time.process_time()
            summary = run_replay(cfg, plan, workload, Path(tmp) / "run")
            cpu = time.process_time() - c0
            prof.disable()
        else:
            summary, cpu, wall, split = split_replay(cfg, plan, workload, Path(tmp) / "run")
        bare_wall, bare_cpu, bare_steps = engine_only(cfg, plan, workload)
        render_ms, client_ms, samples_ms, n_samples = time_exposition(cfg, Path(tmp) / "expo")
    v = summary.virtual_s
    print(f"replay: {v:.0f} virtual s in {summary.wall_s:.2f} wall s / {cpu:.2f} CPU s = "
          f"{summary.speed:.0f}x / {v / cpu:.0f}x real time (goal >= 200x)"
          f"{' [under cProfile]' if prof else ''}")
    print(
        f"  engine steps {summary.engine_steps} "
        f"({cpu / summary.engine_steps * 1e6:.0f} CPU us per step), "
        f"requests {summary.requests}, metrics rows {summary.metrics_rows}"
    )
    print(
        f"bare engine, same loop: {bare_wall:.2f} wall s / {bare_cpu:.2f} CPU s "
        f"= {v / bare_cpu:.0f}x "
        f"({bare_steps} steps, {bare_cpu / bare_steps * 1e6:.0f} CPU us per step); "
        f"replay adds {(cpu - bare_cpu) / cpu:.0%} of the replay's CPU time"
    )
    if not prof:
        own, with_requests = shares(wall, split)
        print(f"split (wall s; the replay's wall is {wall / cpu - 1:.1%} over its CPU): engine "
              f"{split.engine:.2f}, making requests {split.requests:.2f}, "
              f"the rest (records, metrics, events, writes) "
              f"{wall - split.engine - split.requests:.2f}; replay overhead / engine "
              f"{own:.2f} (goal <= 0.30), {with_requests:.2f} counting the making of requests")
    print(
        f"metrics page of {n_samples} samples: render() {render_ms:.2f} ms, prometheus_client "
        f"generate_latest {client_ms:.2f} ms ({client_ms / render_ms:.1f}x), "
        f"samples() {samples_ms:.2f} ms"
    )
    if prof:
        total = sum(by_module(prof).values())
        print("self time by module:")
        for name, seconds in list(by_module(prof).items())[:10]:
            print(f"  {name:32s} {seconds:7.2f} s  {seconds / total:5.1%}")


if __name__ == "__main__":
    main()
