"""Client and REAL vLLM on one host: the seq-cap load with and without CPU isolation.

Needs ``bash tools/install_vllm.sh``; run it under ``flock /tmp/loadlab-vllm.lock``. About
90 s per placement on 2 cores (a server start, two 15 s steps, the drain).

One server per placement, the seq-cap server of tests/vllm (tiny model, ``--max-num-seqs 4``,
a roomy 512-block pool), closed loop at 8 and 16 users, tiny-short profile (64-token
prompts, 32-token outputs), ``--workers 0``, 15 s steps with 3 s of warm-up:

- ``shared``: nothing pinned (vLLM's CPU backend still binds its worker to one core);
- ``shared+nice``: the engine core's threads at nice 10, the workaround the real-vLLM
  tests used before;
- ``isolated``: every vLLM thread on the server CPUs (``--server-cpus``), the load
  generator and the scraper on the client CPUs (``--client-cpus``): on 2 cores 0 and 1;
- ``isolated+nice``: both.

Per step: the client's in-flight mean and event-loop lag mean (the run's manifest),
``running`` max (gauge), client TTFT p50 and mean and vLLM's TTFT histogram mean (over
the same requests: ``LoadResult.counted_requests``), bursts (share of streams whose
chunks all arrived within 2 ms: held back by a starved API server and delivered whole),
requests/s, and whether
loadlab marked the step client limited, with the machine's load average after each run.
Printed as a table; written to isolation.json.

Usage: ``flock /tmp/loadlab-vllm.lock python benchmarks/bench_isolation.py
[--only isolated,isolated+nice] [--repeat 2]``
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "vllm"))  # reuse the e2e tests' server and load helpers

from loadrun import LoadResult, run_steps
from realvllm import ISOLATION, missing_reason, tiny_vllm

from loadlab.analyze.steps import step_table
from loadlab.experiment.launcher import LaunchedTarget

SERVER = {"max_num_seqs": 4, "num_gpu_blocks_override": 512}
LEVELS = [8, 16]
STEP_S, WARMUP_S = 15.0, 3.0
ENGINE_CORE_NICE = 10
PLACEMENTS = {  # name: (isolated, engine core at nice ENGINE_CORE_NICE)
    "shared": (False, False),
    "shared+nice": (False, True),
    "isolated": (True, False),
    "isolated+nice": (True, True),
}


@contextmanager
def server(work: Path, isolated: bool, renice: bool) -> Iterator[LaunchedTarget]:
    with tiny_vllm(
        work, server_cpus=ISOLATION.server_cpus if isolated else None, **SERVER
    ) as target:
        if renice:
            renice_engine_core(target.pid, ENGINE_CORE_NICE)
        yield target


def renice_engine_core(server_pid: int, nice: int) -> int:
    """Every thread of the server's engine-core process to ``nice``; returns how many."""
    count = 0
    for child in psutil.Process(server_pid).children(recursive=True):
        if child.name().startswith("VLLM::EngineCor"):
            for thread in child.threads():
                os.setpriority(os.PRIO_PROCESS, thread.id, nice)
                count += 1
    return count


def figures(res: LoadResult) -> dict[int, dict]:
    """Per level: what the client applied and saw beside what vLLM counted."""
    running = res.gauge("vllm:num_requests_running")["max"]
    server_ttft = res.histogram("vllm:time_to_first_token_seconds")["mean"]
    table = step_table(res.run / "load").set_index("concurrency")
    counted = res.counted_requests()
    out = {}
    for s in res.steps.itertuples():
        c = int(s.concurrency)
        inside = counted[c].ttft_s
        out[c] = {
            "inflight": round(float(s.inflight_mean), 2),
            "loop_lag_ms": round(s.loop_lag_mean_s * 1e3, 2),
            "running_max": float(running[c]),
            "client_ttft_p50_ms": round(float(inside.median()) * 1e3, 1),
            "client_ttft_mean_ms": round(float(inside.mean()) * 1e3, 1),
            "server_ttft_mean_ms": round(float(server_ttft[c]) * 1e3, 1),
            "ttft_diff_ms": round((float(inside.mean()) - float(server_ttft[c])) * 1e3, 1),
            "bursts": round(float(table.loc[c, "burst_share"]), 3),
            "req_s": round(float(table.loc[c, "rps"]), 1),
            "client_limited": bool(s.client_limited),
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", help="comma-separated placement names (default: all)")
    ap.add_argument(
        "--repeat", type=int, default=1, help="run the placements this many times, alternating"
    )
    args = ap.parse_args()
    reason = missing_reason()
    if reason:
        sys.exit(reason)
    if ISOLATION.client_cpus is None:
        sys.exit("needs 2 usable CPUs")
    names = (args.only.split(",") if args.only else list(PLACEMENTS)) * args.repeat
    work = Path(tempfile.mkdtemp(prefix="isolation-"))
    results = []
    for i, name in enumerate(names):
        isolated, renice = PLACEMENTS[name]
        with server(work / f"server-{i}", isolated, renice) as target:
            res = run_steps(
                target,
                work / f"load-{i}",
                "tiny-short",
                LEVELS,
                STEP_S,
                WARMUP_S,
                client_cpus=ISOLATION.client_cpus if isolated else None,
                client_limited_ok=True,
            )
        # the machine's load average beside each run: on a shared host it moves the figures
        results.append(
            {"placement": name, "load_avg": round(os.getloadavg()[0], 1), "levels": figures(res)}
        )
        print(results[-1], flush=True)
    cols = ["inflight", "loop_lag_ms", "running_max", "client_ttft_p50_ms", "client_ttft_mean_ms",
            "server_ttft_mean_ms", "ttft_diff_ms", "bursts", "req_s", "client_limited"]
    print(f"\n{'placement':30} {'load':>5} {'users':>5} " + " ".join(f"{c:>19}" for c in cols))
    for r in results:
        for c, row in r["levels"].items():
            print(
                f"{r['placement']:30} {r['load_avg']:5.1f} {c:5d} "
                + " ".join(f"{row[k]!s:>19}" for k in cols)
            )
    (work / "isolation.json").write_text(json.dumps(results, indent=2))
    print(f"written {work / 'isolation.json'}")


if __name__ == "__main__":
    main()
