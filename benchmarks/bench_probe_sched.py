"""What the scheduler probe adds to one engine step, measured in-process where noise is small.

Runs INSIDE the vLLM venv: ``.vllm-venv/bin/python benchmarks/bench_probe_sched.py``
(about 30 s on 2 cores, 10 of them vLLM's import). No server and no model: vLLM's own V1
``Scheduler`` + ``KVCacheManager`` are driven as tools/vllm_sched_trace.py drives them
(its helpers build the schedulers, the requests and the fake model runner's outputs).

Why not two live servers (benchmarks/bench_probe.py): on a shared 2-core host their step
times swing by tens of percent between runs, far more than the <= 2% the probe is allowed,
so that comparison can neither confirm nor rule the goal out. Here the probe's cost is
isolated: in one process, the plain ``Scheduler`` and ``loadlab_probe.ProbeScheduler`` are
built on the same case and driven through the same steps, in blocks that alternate plain,
probe, plain, probe, ... (each pair of blocks covers the same step indices, and the probe
passes every result through, so both schedulers hold the same state in a pair). Only
``schedule()`` + ``update_from_output()`` are timed, the parts of an engine step the probe
wraps, in the thread's CPU time (``time.thread_time_ns``: time spent waiting for a core
shared with other jobs does not count, wall time would); a block's figure is its median
step, so a step that a GC pause or a cache-cold start lengthened does not move it. A
control case pits a second plain scheduler against the first, the same way: its ratio
is the method's own bias and spread.

Cases: every request's output is longer than the run, so none finishes and the batch
stays as set up. ``no queue``: 64 running, none waiting (the probe only counts the
step). ``seq_cap N``: ``max_num_seqs`` N running and N/4 more waiting, so the head is
refused at every step and the probe classifies every step (the reasons it counted over
the timed steps are printed as a check).

The probe's added microseconds per step are then put beside a real step: 1 ms (the tiny
CPU model's step here, from vLLM's ITL histogram, 0.7-1.5 ms: benchmarks/bench_probe.py)
and 20 ms (a typical GPU decode step of a 7-8B model at a large batch), and per running
request (the probe's ``allocate_slots`` wrapper runs once per scheduled request a step).

Usage: ``.vllm-venv/bin/python benchmarks/bench_probe_sched.py [--pairs 12] [--steps 25]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))  # reuse the trace tool's scheduler driving

import vllm_sched_trace as trace  # sets vLLM's environment before vLLM loads

PROMPT_LEN = 32
BLOCK_SIZE = 16
WARMUP_STEPS = 16              # every prompt prefilled (1,280 x 32 tokens at 8,192 a step)
REAL_STEPS_MS = {"the tiny CPU model's step": 1.0, "a GPU decode step": 20.0}


@dataclass(frozen=True)
class Case:
    name: str
    running: int
    waiting: int
    max_num_seqs: int


CASES = [
    Case("no queue", 64, 0, 256),
    Case("seq_cap 64", 64, 16, 64),
    Case("seq_cap 256", 256, 64, 256),
    Case("seq_cap 1024", 1024, 256, 1024),
]
CONTROL = CASES[2]


def trace_case(case: Case, total_steps: int) -> dict[str, Any]:
    """The case in the trace tool's format, with a block pool no running request exhausts
    (a preemption would change what both schedulers do mid-run)."""
    n = case.running + case.waiting
    per_request = -(-(PROMPT_LEN + total_steps + 1) // BLOCK_SIZE)
    requests = [{"id": f"r{i}", "arrival_step": 0, "output_len": 100_000,
                 "prompt_token_ids": [10 + (i * 31 + j) % 4000 for j in range(PROMPT_LEN)]}
                for i in range(n)]
    return {"scheduler": {"max_num_seqs": case.max_num_seqs, "max_num_batched_tokens": 8192},
            "cache": {"block_size": BLOCK_SIZE, "num_gpu_blocks": n * per_request + 64},
            "max_model_len": 4096, "requests": requests}


class Driven:
    """One scheduler of a case, stepped block by block."""

    def __init__(self, case: dict[str, Any], probe: bool) -> None:
        self.scheduler, config = trace.build_scheduler(case, trace.DEFAULT_MODEL, probe)
        hasher = trace.make_hasher(config, BLOCK_SIZE)
        for spec in case["requests"]:
            self.scheduler.add_request(trace.new_request(spec, hasher, 0))

    def block(self, steps: int) -> list[int]:
        """Nanoseconds of ``schedule()`` + ``update_from_output()`` for each of ``steps``."""
        times = []
        clock = time.thread_time_ns
        sched = self.scheduler
        for _ in range(steps):
            t0 = clock()
            out = sched.schedule()
            t1 = clock()
            runner_output = trace.model_output(sched, out)
            t2 = clock()
            sched.update_from_output(out, runner_output)
            times.append(t1 - t0 + clock() - t2)
        return times


def measure(case: Case, pairs: int, steps: int, control: bool = False) -> dict[str, Any]:
    """Per pair of blocks: the plain scheduler's median step and the probe's; with
    ``control``, a second plain scheduler stands in for the probe (the method's own bias)."""
    spec = trace_case(case, WARMUP_STEPS + pairs * steps)
    plain, probe = Driven(spec, probe=False), Driven(spec, probe=not control)
    plain.block(WARMUP_STEPS)
    probe.block(WARMUP_STEPS)
    counters = getattr(probe.scheduler, "probe", None)
    refused0 = dict(counters.refused) if counters else {}
    plain_us, probe_us = [], []
    for _ in range(pairs):
        plain_us.append(statistics.median(plain.block(steps)) / 1e3)
        probe_us.append(statistics.median(probe.block(steps)) / 1e3)
    running = {len(d.scheduler.running) for d in (plain, probe)}
    if running != {case.running}:
        sys.exit(f"{case.name}: {running} running, not {case.running}: the case drifted")
    refused = {r: n - refused0[r] for r, n in counters.refused.items()
               if n > refused0[r]} if counters else None
    return {"plain": plain_us, "probe": probe_us, "refused": refused,
            "ratios": [b / a for a, b in zip(plain_us, probe_us)],
            "added": [b - a for a, b in zip(plain_us, probe_us)]}


def spread(values: list[float], fmt: str) -> str:
    return (f"{statistics.median(values):{fmt}} "
            f"[{min(values):{fmt}}, {max(values):{fmt}}]")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=12, help="plain/probe block pairs (A B A B ...)")
    ap.add_argument("--steps", type=int, default=25, help="engine steps per block")
    args = ap.parse_args()
    load0 = os.getloadavg()[0]
    results = {c.name: measure(c, args.pairs, args.steps) for c in CASES}
    results[f"{CONTROL.name}: plain vs plain"] = measure(CONTROL, args.pairs, args.steps,
                                                          control=True)
    print(f"{args.pairs} pairs of {args.steps}-step blocks per case; load average "
          f"{load0:.1f} -> {os.getloadavg()[0]:.1f}. Per step: schedule() + "
          "update_from_output(), a block's median step; median [min, max] over the blocks.")
    head = (f"{'case':27} {'plain us/step':>24} {'probe us/step':>24} "
            f"{'probe / plain':>24} {'added us/step':>22}  probe's reasons (timed steps)")
    print(head)
    for name, r in results.items():
        if r["refused"] is None:
            reasons = "(control: both plain)"
        else:
            reasons = ", ".join(f"{k} {v}" for k, v in r["refused"].items()) or "none refused"
        print(f"{name:27} {spread(r['plain'], '7.1f'):>24} {spread(r['probe'], '7.1f'):>24} "
              f"{spread(r['ratios'], '7.4f'):>24} {spread(r['added'], '6.1f'):>22}  {reasons}")
    print("\nThe added median beside a real engine step (share of the step):")
    for label, ms in REAL_STEPS_MS.items():
        shares = ", ".join(f"{name} {statistics.median(r['added']) / (ms * 10):.3f}%"
                           for name, r in results.items() if r["refused"] is not None)
        print(f"  {label}, {ms:g} ms: {shares}")
    per_request = ", ".join(
        f"{c.name} {statistics.median(results[c.name]['added']) * 1e3 / c.running:.0f} ns"
        for c in CASES)
    print(f"  per running request a step: {per_request}")


if __name__ == "__main__":
    main()
