"""How fast `loadlab sim replay --replicas 8` simulates a fleet: virtual s per wall second.

Scenario (goal: >= 50x real time): a fleet of 8 replicas, each at concurrency 256 (a
closed loop of 8 x 256 users, round-robin), Qwen2.5-7B on H100s with vLLM's defaults,
the sharegpt profile. The single-replica figure (one engine at 256) comes from the same
run, side by side, so the ratio of the two is the fleet's cost per replica. Speeds are
given per wall second and per CPU second of the replay (this 2-core machine is shared:
CPU time is the steadier figure, wall time what a user waits).

    python benchmarks/bench_fleet_replay.py [--minutes 2] [--replicas 8] [--per-replica 256]
        [--router round-robin] [--against TREE [--repeats 3]]

``--against TREE`` times the same two replays with another loadlab tree (a directory
holding ``loadlab/`` and ``profiles/``, e.g. ``git archive main loadlab profiles | tar -x
-C /tmp/main``), each replay in a fresh process, the trees alternating ``--repeats``
times; medians per tree.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from trees import tree_env

import loadlab
from loadlab.replay.driver import run_replay
from loadlab.sim.fleet.config import fleet_config
from loadlab.spec.scenario import Workload
from loadlab.spec.validate import plan_from_flags


def speed(replicas: int, per_replica: int, minutes: float,
          router: str) -> tuple[float, float, int]:
    """(virtual s per wall s, virtual s per CPU s, engine steps) of one replay."""
    fleet = fleet_config({"model": "qwen2.5-7b", "gpu": "h100", "replicas": replicas,
                          "router": router})
    plan = plan_from_flags(concurrency=str(replicas * per_replica),
                           step_duration_s=minutes * 60)
    with tempfile.TemporaryDirectory() as tmp:
        t0, c0 = time.perf_counter(), time.process_time()
        summary = run_replay(fleet, plan, Workload(profile="sharegpt"), Path(tmp) / "run")
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return summary.virtual_s / wall, summary.virtual_s / cpu, summary.engine_steps


CHILD = """
import sys
sys.path.insert(0, sys.argv[1])
from bench_fleet_replay import speed
print(*speed(int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]))
"""


def speed_in(tree: Path, replicas: int, args: argparse.Namespace) -> tuple[float, float, int]:
    """:func:`speed` in a fresh process importing ``tree``'s loadlab (``-P``: not the
    working directory's)."""
    argv = [sys.executable, "-P", "-c", CHILD, str(Path(__file__).parent), str(replicas),
            str(args.per_replica), str(args.minutes), args.router]
    done = subprocess.run(argv, env=tree_env(tree),
                          capture_output=True, text=True, check=True)
    wall, cpu, steps = done.stdout.split()
    return float(wall), float(cpu), int(steps)


def against(base: Path, args: argparse.Namespace) -> None:
    """Both trees, one replica and the fleet, alternating; medians per tree."""
    here = Path(loadlab.__file__).resolve().parents[1]
    runs: dict[tuple[Path, int], list[tuple[float, float, int]]] = {}
    for i in range(args.repeats):
        for tree in (here, base) if i % 2 == 0 else (base, here):  # ABBA: neither always first
            for n in (1, args.replicas):
                runs.setdefault((tree, n), []).append(speed_in(tree, n, args))
    for tree, name in ((here, "this tree"), (base, str(base))):
        one, fleet = runs[(tree, 1)], runs[(tree, args.replicas)]
        one_wall, one_cpu = (statistics.median(r[i] for r in one) for i in (0, 1))
        fleet_wall, fleet_cpu = (statistics.median(r[i] for r in fleet) for i in (0, 1))
        print(f"{name}: 1 replica {one_wall:.1f}x wall / {one_cpu:.1f}x CPU; "
              f"{args.replicas} x {args.per_replica} {fleet_wall:.1f}x wall / {fleet_cpu:.1f}x "
              f"CPU (goal >= 50x); fleet / single (CPU) {fleet_cpu / one_cpu:.3f} "
              f"(ideal {1 / args.replicas:.3f}); {fleet[0][2]} engine steps")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=2.0)
    ap.add_argument("--replicas", type=int, default=8)
    ap.add_argument("--per-replica", type=int, default=256)
    ap.add_argument("--router", default="round-robin")
    ap.add_argument("--against", type=Path, default=None)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    print(f"loadlab tree: {Path(loadlab.__file__).parent}")
    if args.against is not None:
        against(args.against.resolve(), args)
        return
    one, one_cpu, one_steps = speed(1, args.per_replica, args.minutes, args.router)
    print(f"1 replica  x {args.per_replica}: {one:8.1f}x real time, {one_cpu:8.1f}x per CPU s "
          f"({one_steps} engine steps)")
    fleet, fleet_cpu, steps = speed(args.replicas, args.per_replica, args.minutes, args.router)
    print(f"{args.replicas} replicas x {args.per_replica}: {fleet:8.1f}x real time, "
          f"{fleet_cpu:8.1f}x per CPU s ({steps} engine steps; goal >= 50x)")
    print(f"fleet / single: {fleet / one:.3f} wall, {fleet_cpu / one_cpu:.3f} CPU "
          f"(ideal 1/{args.replicas} = {1 / args.replicas:.3f})")


if __name__ == "__main__":
    main()
