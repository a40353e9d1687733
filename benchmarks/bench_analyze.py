"""What analysing an hour-long run costs: wall time, CPU time and peak memory per stage.

Goal: 1M request records and an hour of 1 Hz metrics from 4 endpoints analysed in
< 15 s and < 2 GB peak RSS. The run folder (``hour_run.py``: ~720 request parts, one
per 5 s as the Recorder flushes, ``--request-flush-s 1`` for the ~3,600 of runs written
before; ~2,900 metrics parts, 4.75M metric samples, 2e8 chunk offsets, ~2 GB on disk)
is generated once and cached under ``--cache`` (default: the system temp folder).
Two layouts: ``parts`` as the writers leave it, and ``compacted`` (a hard-linked copy
after ``runstore.compact_run``, the end-of-run step; its own cost is a row).

Each stage runs in a fresh Python process, so its peak RSS (``ru_maxrss``) is its own;
``imports`` is the floor every stage starts from (pandas, pyarrow, loadlab). Stages:

- ``read requests`` / ``read metrics`` / ``read scrapes+client``: the tables as the
  analyzer reads them (``analyze.tables.read_requests`` / ``read_metrics``, ``read_table``);
- ``gauge_lag``: reads as above, then :func:`loadlab.analyze.gauge_lag.gauge_lag` over
  the step windows (its own time shown as ``work``);
- ``step_table``: :func:`loadlab.analyze.steps.step_table` on the folder;
- ``analyze_run``: :func:`loadlab.analyze.analysis.analyze_run` when that module exists.

The machine is shared: CPU seconds are the steadier figure; the load average is printed.

    python benchmarks/bench_analyze.py [--requests 1000000] [--steps 30] [--cache DIR]
        [--stages step_table,analyze_run] [--layouts parts,compacted] [--profile STAGE]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STAGES = ("imports", "read requests", "read metrics", "read scrapes+client", "gauge_lag",
          "step_table", "analyze_run")
LAYOUTS = ("parts", "compacted")


def run_stage(name: str, run_dir: Path) -> dict[str, float | str]:
    """Run one stage in this process; figures of its own work (reads included unless split)."""
    import pandas as pd  # noqa: F401  (imports are the floor: count them before the clock)

    from loadlab.analyze import steps
    from loadlab.analyze.tables import METRIC_COLUMNS, read_metrics, read_requests
    from loadlab.runstore import CLIENT, SCRAPES, compact_run, read_manifest, read_table

    w0, c0 = time.perf_counter(), time.process_time()
    extra: dict[str, float | str] = {}
    if name == "compact_run":
        extra["parts"] = len(compact_run(run_dir))
    elif name == "read requests":
        extra["rows"] = len(read_requests(run_dir))
    elif name == "read metrics":
        extra["rows"] = len(read_metrics(run_dir, columns=METRIC_COLUMNS))
    elif name == "read scrapes+client":
        extra["rows"] = (len(read_table(run_dir / "scrapes.parquet", SCRAPES))
                         + len(read_table(run_dir / "client.parquet", CLIENT)))
    elif name == "gauge_lag":
        from loadlab.analyze.gauge_lag import gauge_lag

        requests, metrics = read_requests(run_dir), read_metrics(run_dir, columns=METRIC_COLUMNS)
        wins = steps.measured_windows(read_manifest(run_dir))
        w1 = time.perf_counter()
        gauge_lag(metrics, requests, wins[["t_start", "t_end"]])
        extra["work_s"] = time.perf_counter() - w1
    elif name == "step_table":
        extra["rows"] = len(steps.step_table(run_dir))
    elif name == "analyze_run":
        try:
            from loadlab.analyze.analysis import analyze_run
        except ImportError:
            return {"skipped": "loadlab.analyze.analysis not in this tree"}
        extra["keys"] = ",".join(sorted(analyze_run(run_dir).as_json()))
    return {"wall_s": time.perf_counter() - w0, "cpu_s": time.process_time() - c0, **extra}


def child(name: str, run_dir: Path, profile: bool) -> None:
    """Entry point of a stage process: prints one JSON line."""
    if profile:
        prof = cProfile.Profile()
        result = prof.runcall(run_stage, name, run_dir)
        pstats.Stats(prof, stream=sys.stderr).sort_stats("cumulative").print_stats(30)
    else:
        result = run_stage(name, run_dir)
    result["peak_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(result))


def measure(name: str, run_dir: Path, profile: bool = False) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, __file__, "--child", name, "--run", str(run_dir)]
    if profile:
        argv.append("--profile-child")
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "failed"}
    if profile:
        sys.stderr.write(proc.stderr)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def folder_figures(run_dir: Path) -> str:
    parts = {t: len(list((run_dir / t).glob("part-*.parquet")))
             for t in ("requests.parquet", "metrics.parquet", "scrapes.parquet", "client.parquet")}
    size = sum(p.stat().st_size for p in run_dir.rglob("*.parquet") if p.is_file())
    return (", ".join(f"{t.split('.')[0]} {n} parts" for t, n in parts.items())
            + f"; {size / 2**30:.2f} GiB on disk")


def compacted_copy(run_dir: Path) -> tuple[Path, dict]:
    """A hard-linked copy of the run folder, compacted by a measured ``compact_run``."""
    dest = run_dir.with_name(run_dir.name + "-compacted")
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(
        run_dir, dest, copy_function=os.link
    )  # compaction unlinks only the copy's names
    return dest, measure("compact_run", dest)


def print_row(layout: str, name: str, r: dict) -> None:
    if "error" in r or "skipped" in r:
        print(
            f"{layout:<10}{name:<22}{'-':>9}{'-':>9}{'-':>10}  {r.get('error') or r.get('skipped')}"
        )
        return
    note = next((f"work {r[k]:.2f} s" if k == "work_s" else f"{r[k]} {k}"
                 for k in ("work_s", "rows", "parts") if k in r), "")
    print(
        f"{layout:<10}{name:<22}{r['wall_s']:>9.2f}{r['cpu_s']:>9.2f}{r['peak_mb']:>10.0f}  {note}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--endpoints", type=int, default=4)
    ap.add_argument("--request-flush-s", type=float, default=None,
                    help="seconds of completions per requests part (default: the Recorder's, 5 s; "
                         "1 for runs written before it flushed every 5 s)")
    ap.add_argument(
        "--cache", type=Path, default=Path(tempfile.gettempdir()) / "loadlab-bench-analyze"
    )
    ap.add_argument(
        "--stages", default=",".join(STAGES), help="comma-separated subset of: " + ", ".join(STAGES)
    )
    ap.add_argument(
        "--layouts", default=",".join(LAYOUTS), help="parts (as written), compacted, or both"
    )
    ap.add_argument("--profile", metavar="STAGE", help="run one stage on the parts under cProfile")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--run", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--profile-child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.run, args.profile_child)
        return

    sys.path.insert(0, str(ROOT))
    from hour_run import HourRun, ensure

    import loadlab

    print(f"loadlab tree: {Path(loadlab.__file__).parent}")
    flush = {} if args.request_flush_s is None else {"request_flush_s": args.request_flush_s}
    spec = HourRun(requests=args.requests, steps=args.steps, endpoints=args.endpoints, **flush)
    run_dir = ensure(spec, args.cache)
    print(f"run folder: {run_dir}\n  {folder_figures(run_dir)}")
    if args.profile:
        print(json.dumps(measure(args.profile, run_dir, profile=True)))
        return
    stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    print(
        f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} "
        f"on {os.cpu_count()} cores"
    )
    print(f"{'layout':<10}{'stage':<22}{'wall s':>9}{'cpu s':>9}{'peak MB':>10}  note")
    for layout in [x.strip() for x in args.layouts.split(",") if x.strip()]:
        folder = run_dir
        if layout == "compacted":
            folder, result = compacted_copy(run_dir)
            print_row(layout, "compact_run", result)
        for name in stages:
            print_row(layout, name, measure(name, folder))
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
