"""How fast `loadlab sim replay --replicas 8` simulates a fleet: virtual s per wall second.

Scenario (goal: >= 50x real time): a fleet of 8 replicas, each at concurrency 256 (a
closed loop of 8 x 256 users, round-robin), Qwen2.5-7B on H100s with vLLM's defaults,
the sharegpt profile. The single-replica figure (one engine at 256) comes from the same
run, side by side, so the ratio of the two is the fleet's cost per replica.

    python benchmarks/bench_fleet_replay.py [--minutes 2] [--replicas 8] [--per-replica 256]
        [--router round-robin]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import loadlab
from loadlab.replay.driver import run_replay
from loadlab.sim.fleet.config import fleet_config
from loadlab.spec.scenario import Workload
from loadlab.spec.validate import plan_from_flags


def speed(replicas: int, per_replica: int, minutes: float, router: str) -> tuple[float, int]:
    """(virtual seconds per wall second, engine steps) of one replay."""
    fleet = fleet_config({"model": "qwen2.5-7b", "gpu": "h100", "replicas": replicas,
                          "router": router})
    plan = plan_from_flags(concurrency=str(replicas * per_replica),
                           step_duration_s=minutes * 60)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        summary = run_replay(fleet, plan, Workload(profile="sharegpt"), Path(tmp) / "run")
        wall = time.perf_counter() - t0
    return summary.virtual_s / wall, summary.engine_steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=2.0)
    ap.add_argument("--replicas", type=int, default=8)
    ap.add_argument("--per-replica", type=int, default=256)
    ap.add_argument("--router", default="round-robin")
    args = ap.parse_args()
    print(f"loadlab tree: {Path(loadlab.__file__).parent}")
    one, one_steps = speed(1, args.per_replica, args.minutes, args.router)
    print(f"1 replica  x {args.per_replica}: {one:8.1f}x real time ({one_steps} engine steps)")
    fleet, steps = speed(args.replicas, args.per_replica, args.minutes, args.router)
    print(f"{args.replicas} replicas x {args.per_replica}: {fleet:8.1f}x real time "
          f"({steps} engine steps; goal >= 50x)")
    print(f"fleet / single: {fleet / one:.3f} (ideal 1/{args.replicas} = "
          f"{1 / args.replicas:.3f})")


if __name__ == "__main__":
    main()
