"""How fast this host's CPUs run, sampled beside a real-vLLM load, and times scaled by it.

Why: on the shared 2-core host the real-vLLM benchmarks run on, one idle CPU does 0.6 to
1.7 times its median work per second from one 15 s window to the next, with both CPUs
moving together (correlation 0.84 over 0.5 s windows, 2026-12-06). A latency measured in
a slow window says as much about the neighbours as about the server, so two servers of
one configuration, or two runs on one server, differ by 30-100% on the same load
(benchmarks/README.md). No step-time model can be judged within 15% on such figures.

The meter: one process per CPU, pinned to it at ``SCHED_IDLE`` (it runs only when the
server has nothing to run, and a waking server thread preempts it at once; it took 2-5%
of the busy server CPU), doing a fixed mix of interpreter and small-matmul work and
writing, every 0.25 s, the units done and the CPU time they took. Units per CPU-second
is the host's speed whatever share of the CPU the meter got. Measured on the server's
own CPU it explains most of the run-to-run spread: ITL p50 of one configuration over six
runs, coefficient of variation 17-26% raw, 3-4% scaled by it (``time x speed / ref``).

    python benchmarks/hostspeed.py CPU OUT.csv      # the meter itself (runs until killed)
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from loadlab.calibrate.runs import Level, Run

SAMPLE_S = 0.25
COLUMNS = ["t0", "t1", "units", "cpu_s"]
MIN_CPU_S = 0.05     # a level's meter CPU time below this says too little about its speed
# a level is kept when its speed over the reference's lies in this band: past it the
# meter's linear scaling leaves 15-30% between two runs of one load (benchmarks/README.md)
GATE = (0.8, 1.25)


def meter(cpu: int, out: Path) -> None:
    """Sample the host's speed on ``cpu`` into ``out`` until killed."""
    os.sched_setaffinity(0, {cpu})
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    matrix = np.random.default_rng(0).random((64, 64))
    with out.open("w", buffering=1) as f:
        while True:
            t0, cpu0, units = time.time(), time.thread_time(), 0
            while time.time() - t0 < SAMPLE_S:
                total = 0
                for i in range(2000):
                    total += i * i
                matrix @ matrix
                units += 1
            f.write(f"{t0:.3f},{time.time():.3f},{units},{time.thread_time() - cpu0:.6f}\n")


@contextmanager
def metering(cpus: Iterable[int], folder: Path) -> Iterator[None]:
    """A meter on each of ``cpus``, writing ``folder/hostspeed-<cpu>.csv``, while in the block."""
    folder.mkdir(parents=True, exist_ok=True)
    procs = [subprocess.Popen([sys.executable, __file__, str(c),
                               str(folder / f"hostspeed-{c}.csv")]) for c in sorted(cpus)]
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def read_speed(folder: Path) -> pd.DataFrame:
    """Every sample of every meter under ``folder``: COLUMNS."""
    parts = [pd.read_csv(p, names=COLUMNS) for p in sorted(folder.glob("hostspeed-*.csv"))]
    if not parts:
        raise FileNotFoundError(f"no hostspeed-*.csv in {folder}: collect with the meter")
    return pd.concat(parts, ignore_index=True).dropna()   # a line the meter is still writing


def level_speeds(samples: pd.DataFrame, run: Run) -> dict[int, float]:
    """Units per CPU-second over each level's measured window (after its warm-up, as
    :func:`loadlab.calibrate.runs.read_run` measures it), by concurrency."""
    out = {}
    for level in run.levels:
        t0, t1 = level.t_start, level.t_start + level.duration_s
        inside = samples[(samples.t0 >= t0) & (samples.t1 <= t1)]
        cpu_s = float(inside.cpu_s.sum())
        out[level.concurrency] = inside.units.sum() / cpu_s if cpu_s >= MIN_CPU_S else np.nan
    return out


def reference_speed(speeds: Iterable[dict[int, float]]) -> float:
    """The median speed over every level of ``speeds`` (the fit's runs): the one host
    speed every time is scaled to."""
    return float(np.nanmedian([v for by_level in speeds for v in by_level.values()]))


def off_gate(speeds: dict[int, float], ref: float) -> dict[int, float]:
    """The levels whose speed over ``ref`` lies outside :data:`GATE` (or that the meter did
    not see), with that ratio: the levels to measure again."""
    ratios = {users: v / ref for users, v in speeds.items()}
    return {users: r for users, r in ratios.items() if not GATE[0] <= r <= GATE[1]}


def at_speed(run: Run, speeds: dict[int, float], ref: float) -> Run:
    """``run`` with every time of each level as the host at speed ``ref`` would have taken:
    time x level speed / ref (a faster window's times lengthen)."""
    for level in run.levels:
        if not speeds.get(level.concurrency, np.nan) > 0:
            raise ValueError(f"{run.path}: no host speed for {level.concurrency} users (the "
                             f"meter had under {MIN_CPU_S} CPU-s there, or was not running)")
    return replace(run, levels=[_scaled(lv, speeds[lv.concurrency] / ref) for lv in run.levels])


def _scaled(level: Level, f: float) -> Level:
    return replace(level, duration_s=level.duration_s * f,
                   hist={k: v * f for k, v in level.hist.items()},
                   client={k: v * f for k, v in level.client.items()})


if __name__ == "__main__":
    meter(int(sys.argv[1]), Path(sys.argv[2]))
