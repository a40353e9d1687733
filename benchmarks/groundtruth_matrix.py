"""The analyzer's accuracy against the simulator's own truth: a confusion matrix.

Every ground-truth scenario of ``tests/analyze/groundtruth.py`` (one per cause the
simulator can produce) at scrape intervals of 1 s and 15 s, jittered step times (10%),
seeds 0..N-1. Per case: the true knee and cause from the engine's state, the analyzer's
from the run folder alone. Prints one line per case, the cause confusion matrix (rows
truth, columns verdict), the share of knees within one step of the truth and the share
of right causes (the issue's goal: >= 90% each).

    PYTHONPATH=. python benchmarks/groundtruth_matrix.py [--seeds 5] [--intervals 1,15]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "analyze"))

from groundtruth import SCENARIOS, run_scenario
from test_groundtruth import within_one_step

from loadlab.analyze.analysis import analyze_run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--intervals", default="1,15")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    args = ap.parse_args()
    intervals = [float(x) for x in args.intervals.split(",")]
    confusion: Counter[tuple[str, str]] = Counter()
    knee_ok = cause_ok = total = 0
    for name in args.scenarios.split(","):
        sc = SCENARIOS[name]
        for interval in intervals:
            for seed in range(args.seeds):
                with tempfile.TemporaryDirectory() as tmp:
                    truth = run_scenario(sc, Path(tmp), seed=seed, metrics_interval_s=interval)
                    t0 = time.perf_counter()
                    a = analyze_run(tmp).as_json()
                    wall = time.perf_counter() - t0
                k = a["knee"]
                got = k["upper"] if k["found"] else None
                near = within_one_step(sc.levels, got, truth.upper)
                confusion[(truth.cause, a["cause"]["name"])] += 1
                knee_ok += near
                cause_ok += truth.cause == a["cause"]["name"]
                total += 1
                print(
                    f"{name:18s} scrape {interval:4g} s seed {seed}: "
                    f"truth ({truth.lower}, {truth.upper}] "
                    f"{truth.cause:17s} verdict ({k['lower']}, {k['upper']}] "
                    f"{a['cause']['name']:17s} "
                    f"{k['confidence']:6s} {'ok' if near else 'KNEE OFF'} analysis {wall:.1f} s",
                    flush=True,
                )
    causes = sorted({t for t, _ in confusion} | {v for _, v in confusion})
    width = max(len(c) for c in causes) + 2
    print("\nconfusion (rows: truth, columns: verdict)")
    print(" " * width + "".join(c[:10].rjust(12) for c in causes))
    for t in causes:
        if any(confusion[(t, v)] for v in causes):
            print(t.ljust(width) + "".join(str(confusion[(t, v)]).rjust(12) for v in causes))
    print(f"\nknee within one step: {knee_ok}/{total} ({knee_ok / total:.0%}); "
          f"right cause: {cause_ok}/{total} ({cause_ok / total:.0%})")


if __name__ == "__main__":
    main()
