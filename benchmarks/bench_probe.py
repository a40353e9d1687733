"""What loadlab's scheduler probe costs a REAL vLLM: step time with and without it.

Needs ``bash tools/install_vllm.sh``; run it under ``flock /tmp/loadlab-vllm.lock``. About
6 minutes on 2 cores with the default three pairs.

Two servers of one config (the seq-cap server of tests/vllm: tiny model, ``--max-num-seqs
4``, a 512-block pool, ``--gpu-memory-utilization 0.2`` so both fit beside each other),
``plain`` and ``probe`` (``--scheduler-cls loadlab_probe.ProbeScheduler``), both pinned to
the server CPUs, are started once and stay up; the same closed-loop load (tiny-short
profile, ``--workers 0``, on the client CPUs) goes to them in turn, plain, probe, plain,
probe, ... so drift on a shared host (other jobs, thermal) falls on both alike. The idle
server of the two waits on its request queue and takes no CPU.

Levels: 2 users (no refusals: the probe only counts steps, and steps are shortest, so a
fixed cost per ``schedule()`` shows most) and 8 users (twice the cap: every step refused,
the probe classifies each).

vLLM exports no step-time histogram (tests/fixtures/vllm-0.32-cpu lists its families);
``vllm:inter_token_latency_seconds``, stamped by the engine per decode step of each
request, is the nearest: its mean over a step's window (after the warm-up) is the server
ITL. Beside it the client ITL (mean of the requests' ``itl_mean_s``, the same requests
vLLM's histograms counted) and requests/s. Per pair (a plain run and the probe run after
it) the ratio probe / plain; printed per level with the median and the range of the pairs.

Wall-clock figures on a shared 2-core host swing by tens of percent from one run to the
next (other jobs share the server's core), so beside them the engine core's CPU time per
engine step: the CPU seconds of vLLM's ``EngineCore`` process (the scheduler and, on the
CPU backend, the model) over the whole load, over the steps vLLM counted in that time
(the ``vllm:iteration_tokens_total`` histogram's count). The model runs in a separate
``VLLM::Worker`` process, so this is the scheduler's side of a step, where the probe runs.
Time spent waiting for the core does not enter it; shared caches and cores still move it
(0.63-1.00 ms per step between runs of one server at load average 4.5-8 on 2 cores).

Usage: ``flock /tmp/loadlab-vllm.lock python benchmarks/bench_probe.py [--pairs 3]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "vllm"))  # reuse the e2e tests' server and load helpers

import psutil
from loadrun import LoadResult, run_steps
from realvllm import ISOLATION, missing_reason, tiny_vllm

SERVER = {"max_num_seqs": 4, "num_gpu_blocks_override": 512, "gpu_memory_utilization": 0.2}
LEVELS = [2, 8]
STEP_S, WARMUP_S = 12.0, 3.0
FIGURES = ("server_itl_ms", "client_itl_ms", "req_s")
ENGINE_CORE = "VLLM::EngineCor"   # the engine-core process title, as ps shows it (15 chars)


def figures(res: LoadResult) -> dict[int, dict[str, float]]:
    """Per level: vLLM's ITL mean, the client's over the same requests, requests/s."""
    server_itl = res.histogram("vllm:inter_token_latency_seconds")["mean"]
    counted = res.counted_requests()
    out = {}
    for s in res.steps.itertuples():
        c = int(s.concurrency)
        rows = counted[c]
        out[c] = {
            "server_itl_ms": float(server_itl[c]) * 1e3,
            "client_itl_ms": float(rows.itl_mean_s.mean()) * 1e3,
            "req_s": len(rows) / float(s.t_end - s.t_start),
        }
    return out


def engine_core(server_pid: int) -> psutil.Process:
    return next(p for p in psutil.Process(server_pid).children(recursive=True)
                if p.name().startswith(ENGINE_CORE))


def cpu_s(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return times.user + times.system


def engine_steps(res: LoadResult) -> float:
    """Engine steps over the run: the increase of the iteration histogram's count."""
    count = res.metrics[res.metrics.metric == "vllm:iteration_tokens_total_count"].value
    return float(count.max() - count.min())


def pair_ratios(runs: list[dict]) -> dict[int, dict[str, list[float]]]:
    """probe / plain for each pair of consecutive runs, per level and figure."""
    out: dict[int, dict[str, list[float]]] = {c: {f: [] for f in FIGURES} for c in LEVELS}
    for plain, probe in zip(runs[::2], runs[1::2]):
        for c in LEVELS:
            for f in FIGURES:
                out[c][f].append(probe["levels"][c][f] / plain["levels"][c][f])
    return out


def cpu_ratios(runs: list[dict]) -> list[float]:
    return [probe["cpu_ms_per_step"] / plain["cpu_ms_per_step"]
            for plain, probe in zip(runs[::2], runs[1::2])]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=3, help="plain/probe runs, alternating")
    args = ap.parse_args()
    reason = missing_reason()
    if reason:
        sys.exit(reason)
    if ISOLATION.client_cpus is None:
        sys.exit("needs 2 usable CPUs")
    work = Path(tempfile.mkdtemp(prefix="bench-probe-"))
    runs = []
    with ExitStack() as stack:
        servers = {name: stack.enter_context(tiny_vllm(work / name, probe=name == "probe",
                                                       **SERVER))
                   for name in ("plain", "probe")}
        for i in range(2 * args.pairs):
            name = ("plain", "probe")[i % 2]
            core = engine_core(servers[name].pid)
            cpu0 = cpu_s(core)
            res = run_steps(servers[name], work / f"load-{i}", "tiny-short", LEVELS, STEP_S,
                            WARMUP_S, client_limited_ok=True)
            cpu_ms = (cpu_s(core) - cpu0) * 1e3
            runs.append({"server": name, "load_avg": round(os.getloadavg()[0], 1),
                         "cpu_ms_per_step": cpu_ms / engine_steps(res), "levels": figures(res)})
            print(json.dumps(runs[-1]), flush=True)
    print(f"\n{'server':6} {'load':>5} {'cpu ms/step':>11} {'users':>5} "
          + " ".join(f"{f:>14}" for f in FIGURES))
    for r in runs:
        for c, row in r["levels"].items():
            print(f"{r['server']:6} {r['load_avg']:5.1f} {r['cpu_ms_per_step']:11.4f} {c:5d} "
                  + " ".join(f"{row[f]:14.3f}" for f in FIGURES))
    print("\nprobe / plain per pair: median [min, max]")
    ratios = pair_ratios(runs)
    for c in LEVELS:
        print(f"{c:3d} users  " + "  ".join(
            f"{f} {statistics.median(v):.4f} [{min(v):.4f}, {max(v):.4f}]"
            for f, v in ratios[c].items()))
    cpu = cpu_ratios(runs)
    print(f"engine-core CPU per step {statistics.median(cpu):.4f} [{min(cpu):.4f}, {max(cpu):.4f}]")
    (work / "probe.json").write_text(json.dumps({"runs": runs, "ratios": ratios}, indent=2))
    print(f"written {work / 'probe.json'}")


if __name__ == "__main__":
    main()
