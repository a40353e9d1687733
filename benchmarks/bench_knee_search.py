"""The adaptive knee search against a full linear scan, in virtual time.

For each ``--max-num-seqs`` cap (the simulator's knee sits just above it): a closed-loop
linear scan of every grid level (4, 8, ..., 128 users; 30 s steps, 6 s warm-up) and the
adaptive search over the same grid (:mod:`loadlab.spec.knee_search`, its per-step
verdicts from the analyzer), both as `sim replay` runs of Llama-3.1-8B on one H100 with
the azure-conv profile. Printed per cap: the scan's knee (its analysis), the search's
bracket, the steps each ran, and the load time each needed: virtual seconds, which is
what a live search spends in wall time. The replay's own wall time is printed too: it
includes the analysis that judges each step of the search (seconds on this machine).

    python benchmarks/bench_knee_search.py [--caps 12,24,50,100,120]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import loadlab
from loadlab.analyze.analysis import analyze_run
from loadlab.experiment.verdicts import step_judge
from loadlab.replay.driver import run_replay
from loadlab.sim.engine.config import SimConfig
from loadlab.spec.plan import KneeSearch, LoadPlan
from loadlab.spec.scenario import Workload

SEARCH = KneeSearch(start=4, max=128, resolution=4)
STEP = {"step_duration_s": 30.0, "warmup_s": 6.0}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--caps", default="12,24,50,100,120")
    args = ap.parse_args()
    print(f"loadlab: {Path(loadlab.__file__).parent}")
    print(
        f"grid {SEARCH.grid()[0]}..{SEARCH.grid()[-1]} by {SEARCH.resolution:g} "
        f"({len(SEARCH.grid())} levels), "
        f"{STEP['step_duration_s']:g} s steps"
    )
    print(
        f"{'cap':>4}  {'scan knee':>10}  {'search':>10}  {'steps':>7}  "
        f"{'virtual s':>11}  {'share':>5}  "
        f"{'wall s (scan / search)':>22}"
    )
    workload = Workload(profile="azure-conv", seed=1)
    for cap in (int(c) for c in args.caps.split(",")):
        cfg = SimConfig(max_num_seqs=cap, model="llama-3.1-8b", gpu="h100")
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            scan = run_replay(
                cfg, LoadPlan(concurrency=SEARCH.grid(), **STEP), workload, Path(tmp) / "scan"
            )
            knee = analyze_run(Path(tmp) / "scan").knee
            t1 = time.perf_counter()
            out = Path(tmp) / "search"
            search = run_replay(
                cfg, LoadPlan(search=SEARCH, **STEP), workload, out, judge=step_judge(out)
            )
            t2 = time.perf_counter()
        found = search.search
        assert found is not None
        print(
            f"{cap:>4}  {_bracket(knee.lower, knee.upper):>10}  "
            f"{_bracket(found.lower, found.upper):>10}  "
            f"{search.steps:>3}/{scan.steps:<3}  {search.virtual_s:>5.0f}/{scan.virtual_s:<5.0f}  "
            f"{search.virtual_s / scan.virtual_s:>5.0%}  {t1 - t0:>10.1f} / {t2 - t1:<9.1f}"
        )


def _bracket(lower: float | None, upper: float | None) -> str:
    return f"({'-' if lower is None else f'{lower:g}'}, {'-' if upper is None else f'{upper:g}'}]"


if __name__ == "__main__":
    main()
