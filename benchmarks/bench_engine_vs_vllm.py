"""loadlab's simulated engine beside vLLM's own V1 Scheduler + KVCacheManager: CPU per step.

The cases are benchmarks/bench_probe_sched.py's queued ones (64, 256 and 1,024 running at
``max_num_seqs``, a quarter as many more waiting, 32-token prompts whose outputs outlast
the run, so every step after the warm-up is pure decode and refuses the queue's head for
``seq_cap``), built once by its ``trace_case`` and run two ways:

- vLLM: its ``Scheduler`` driven as tools/vllm_sched_trace.py drives it (no model, the
  fake runner's sampled tokens), ``schedule()`` + ``update_from_output()`` timed; in a
  child process of the vLLM venv (``.vllm-venv/bin/python``, under
  ``flock /tmp/realvllm.lock`` so one real-vLLM job runs on the machine at a time).
- loadlab: :class:`~loadlab.sim.engine.core.Engine` on the same scheduler and cache
  settings (its pool from ``num_gpu_blocks_override``), with the step-time model of
  Qwen2.5-7B on an H100 and :class:`~loadlab.sim.engine.metrics.EngineMetrics` as the
  observer, so a step costs all of the engine: scheduler, blocks, timing, metrics.

Both run in blocks of ``--steps`` steps that alternate loadlab, vLLM, loadlab, ... (the
child answers one block per request on its stdin), so both see the same machine load;
a block's figure is its mean step in thread CPU time (``time.thread_time_ns``: waiting
for a core shared with other jobs does not count). The mean, not the median: loadlab's
cost comes in bursts (every request of these cases crosses a block boundary in the same
step, once per ``block_size`` = 16 steps), so blocks are 32 steps long by default and a
burst is paid where it falls. Printed per case: the median and range over the blocks of
each, and loadlab / vLLM (goal <= 0.1).

    python3 benchmarks/bench_engine_vs_vllm.py [--pairs 8] [--steps 32] [--vllm-python P]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_probe_sched as probe_bench  # the cases (importing it loads no vLLM)

CASES = [c for c in probe_bench.CASES if c.waiting]
LOCK = "/tmp/realvllm.lock"


def case_spec(case: probe_bench.Case, pairs: int, steps: int) -> dict[str, Any]:
    return probe_bench.trace_case(case, probe_bench.WARMUP_STEPS + pairs * steps)


# ---- the vLLM side (runs in the vLLM venv) ----------------------------------------------
def vllm_child() -> None:
    """Answer ``{"case", "steps", "spec"?}`` lines with the nanoseconds of each step."""
    drivers: dict[str, Any] = {}
    for line in sys.stdin:
        ask = json.loads(line)
        name = ask["case"]
        if name not in drivers:
            drivers[name] = probe_bench.Driven(ask["spec"], probe=False)
            drivers[name].block(probe_bench.WARMUP_STEPS)
        times = drivers[name].block(ask["steps"])
        running = len(drivers[name].scheduler.running)
        sys.stdout.write(json.dumps({"ns": times, "running": running}) + "\n")
        sys.stdout.flush()


# ---- the loadlab side ---------------------------------------------------------------------
class LoadlabDriven:
    """loadlab's Engine on a trace case, stepped block by block on a virtual clock."""

    def __init__(self, spec: dict[str, Any]) -> None:
        from loadlab.sim.engine.config import SimConfig
        from loadlab.sim.engine.core import Engine
        from loadlab.sim.engine.hardware import resolve
        from loadlab.sim.engine.metrics import EngineMetrics
        from loadlab.sim.engine.timing import StepTimeModel
        from loadlab.sim.engine.types import EngineRequest

        sched, cache = spec["scheduler"], spec["cache"]
        resolved = resolve(SimConfig(
            model="qwen2.5-7b", gpu="h100", max_num_seqs=sched["max_num_seqs"],
            max_num_batched_tokens=sched["max_num_batched_tokens"],
            block_size=cache["block_size"], num_gpu_blocks_override=cache["num_gpu_blocks"],
            max_model_len=spec["max_model_len"]))
        self.metrics = EngineMetrics(resolved)
        self.engine = Engine(resolved, StepTimeModel(resolved).step_time,
                             self.metrics.observe_step)
        for r in spec["requests"]:
            req = EngineRequest(r["id"], list(r["prompt_token_ids"]), r["output_len"],
                                r["output_len"], 0.0)
            self.engine.add_request(req)
            self.metrics.observe_arrival(req, 0.0)
        self.now = 0.0
        self.block(probe_bench.WARMUP_STEPS)

    def block(self, steps: int) -> list[int]:
        """Nanoseconds of each of ``steps`` engine steps."""
        times = []
        clock = time.thread_time_ns
        engine = self.engine
        for _ in range(steps):
            t0 = clock()
            out = engine.step(self.now)
            times.append(clock() - t0)
            assert out is not None
            self.now = out.t_end
        return times


def spread(values: list[float], fmt: str) -> str:
    return f"{statistics.median(values):{fmt}} [{min(values):{fmt}}, {max(values):{fmt}}]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=8, help="loadlab/vLLM block pairs per case")
    ap.add_argument("--steps", type=int, default=32, help="engine steps per block")
    ap.add_argument("--vllm-python", type=Path, default=ROOT / ".vllm-venv" / "bin" / "python")
    ap.add_argument("--vllm-child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.vllm_child:
        vllm_child()
        return
    import loadlab

    if not args.vllm_python.exists():
        sys.exit(f"{args.vllm_python} not found: install vLLM with tools/install_vllm.sh")
    child = subprocess.Popen(
        ["flock", LOCK, str(args.vllm_python), __file__, "--vllm-child"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": ""})
    assert child.stdin is not None and child.stdout is not None

    def vllm_block(name: str, spec: dict[str, Any], steps: int, first: bool) -> list[int]:
        ask = {"case": name, "steps": steps, **({"spec": spec} if first else {})}
        child.stdin.write(json.dumps(ask) + "\n")  # type: ignore[union-attr]
        child.stdin.flush()  # type: ignore[union-attr]
        answer = json.loads(child.stdout.readline())  # type: ignore[union-attr]
        if answer["running"] != running:
            sys.exit(f"{name}: vLLM has {answer['running']} running, not {running}")
        return answer["ns"]

    load0 = os.getloadavg()[0]
    print(f"loadlab: {Path(loadlab.__file__).parent}; vLLM: {args.vllm_python}")
    rows = []
    for case in CASES:
        spec = case_spec(case, args.pairs, args.steps)
        running = case.running
        ours = LoadlabDriven(spec)
        sim_us: list[float] = []
        vllm_us: list[float] = []
        for i in range(args.pairs):
            sim_us.append(statistics.mean(ours.block(args.steps)) / 1e3)
            vllm_us.append(statistics.mean(vllm_block(case.name, spec, args.steps, i == 0))
                           / 1e3)
        if ours.engine.num_running != running:
            sys.exit(f"{case.name}: loadlab has {ours.engine.num_running} running, not {running}")
        rows.append((case, sim_us, vllm_us, [s / v for s, v in zip(sim_us, vllm_us)]))
    child.stdin.close()
    child.wait()
    print(f"{args.pairs} pairs of {args.steps}-step blocks per case, alternating; load average "
          f"{load0:.1f} -> {os.getloadavg()[0]:.1f}. Per step, thread CPU, a block's mean; "
          "median [min, max] over the blocks.")
    print(f"{'case':14} {'running':>7} {'loadlab us/step':>26} {'vLLM us/step':>28} "
          f"{'loadlab / vLLM (goal <= 0.1)':>30}")
    for case, sim_us, vllm_us, ratios in rows:
        print(f"{case.name:14} {case.running:7d} {spread(sim_us, '8.1f'):>26} "
              f"{spread(vllm_us, '9.1f'):>28} {spread(ratios, '7.4f'):>30}")


if __name__ == "__main__":
    main()
