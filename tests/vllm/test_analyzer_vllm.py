"""The analyzer on a REAL vLLM (tiny model, CPU): the verdicts the issue asks for.

Run folders come from ``loadlab run --collect`` (requests and /metrics in one folder)
against a server started with flags the run does not know (a URL only), so the
sequence cap is inferred from the running plateau. Short steps keep the added time
modest; servers are shared through the ``vllm_server`` factory (conftest: one start per
flag set).

- ``--max-num-seqs 4``, steps 1-12: knee (4, 6] or (4, 8], cause seq_cap, the same
  verdict in three repeated runs.
- a 64-block pool with 700-token requests: kv_exhausted.
- after its first step, the client moved to a core a busy loop keeps at 100%, at the
  lowest priority: the load generator falls short of its users, and the verdict is
  client_limited, not a knee.

The server runs on the server CPUs and the load generator on the client CPUs
(realvllm.ISOLATION: on 2 cores 0 and 1), as every real-vLLM test here does.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from realvllm import ISOLATION, SEQ_CAP, SMALL_POOL

from loadlab.analyze.analysis import analyze_run
from loadlab.experiment.cpus import format_cpu_list
from loadlab.runstore import read_manifest

pytestmark = pytest.mark.vllm

PROFILES = Path(__file__).parent / "profiles"
LEVELS = [1, 2, 4, 6, 8, 12]


def step_flags(out: Path, profile: str, levels: list[int], step_s: float,
               warmup_s: float) -> list[str]:
    """``loadlab run``'s flags for a collected closed-loop step load, whatever the target."""
    return ["--profile", str(PROFILES / f"{profile}.yaml"), "--concurrency",
            ",".join(map(str, levels)), "--step-duration", str(step_s), "--warmup",
            str(warmup_s), "--workers", "0", "--drain", "10", "--collect", "--interval", "0.5",
            "--out", str(out)]


def load_argv(target, out: Path, profile: str, levels: list[int], step_s: float,
              warmup_s: float) -> list[str]:
    return [sys.executable, "-m", "loadlab", "run", "--target", target.base_url,
            "--model", target.model, *step_flags(out, profile, levels, step_s, warmup_s)] + (
        ["--client-cpus", format_cpu_list(ISOLATION.client_cpus)] if ISOLATION.client_cpus else [])


def run_load(argv: list[str], out: Path, timeout_s: float,
             env: dict[str, str] | None = None) -> Path:
    proc = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=timeout_s,
                          env=env)
    # exit 3: complete, but some step was client-limited (the load generator says so)
    assert proc.returncode in (0, 3), (
        f"loadlab run failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    )
    return out


def load(
    target, out: Path, profile: str, levels: list[int], step_s: float, warmup_s: float
) -> Path:
    return run_load(load_argv(target, out, profile, levels, step_s, warmup_s), out,
                    step_s * len(levels) + 180)


def test_small_pool_with_long_requests_is_kv_exhausted(vllm_server, tmp_path_factory):
    target = vllm_server(**SMALL_POOL)
    run = load(target, tmp_path_factory.mktemp("kv"), "tiny-long", [1, 2, 4, 8], step_s=8.0,
               warmup_s=2.0)
    a = analyze_run(run).as_json()
    print(f"\n{a['verdict']}")
    assert a["knee"]["found"], a["verdict"]
    assert a["cause"]["name"] == "kv_exhausted", (a["cause"]["ranked"], a["verdict"])
    assert a["cause"]["facts"]["kv_max"] >= 0.9


def test_seq_cap_verdict_is_the_same_in_three_runs(vllm_server, tmp_path_factory):
    target = vllm_server(**SEQ_CAP)
    verdicts = []
    for i in range(3):
        run = load(target, tmp_path_factory.mktemp(f"seqcap-{i}"), "tiny-short", LEVELS,
                   step_s=5.0, warmup_s=1.5)
        a = analyze_run(run).as_json()
        knee, cause = a["knee"], a["cause"]
        print(f"\nrun {i}: {a['verdict']}")
        assert knee["found"] and knee["lower"] == 4 and knee["upper"] in (6, 8), a["verdict"]
        assert cause["name"] == "seq_cap", (cause["ranked"], a["verdict"])
        assert cause["facts"]["cap"] == 4
        verdicts.append((knee["lower"], knee["upper"], cause["name"]))
    assert len(set(verdicts)) == 1, verdicts


@pytest.mark.skipif(ISOLATION.client_cpus is None, reason="needs 2 CPUs")
def test_starved_client_is_client_limited_not_a_knee(vllm_server, tmp_path_factory):
    """After its first step, the load generator drops (every thread) to the lowest priority
    and a busy loop takes its core: it falls far short of its users."""
    target = vllm_server(**SEQ_CAP)
    out = tmp_path_factory.mktemp("starved")
    proc = subprocess.Popen(load_argv(target, out, "tiny-short", [1, 2, 4, 8], 5.0, 1.5),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    hog = None
    try:
        while not (read_manifest(out) if (out / "manifest.json").exists() else {}).get("steps"):
            with pytest.raises(subprocess.TimeoutExpired):  # the load must still be running
                proc.wait(timeout=0.2)
        cpu = min(ISOLATION.client_cpus)  # the client's own core, away from the server's
        spin = f"import os\nos.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"
        hog = subprocess.Popen([sys.executable, "-c", spin])
        # the load runs in the process that owns the run folder: `loadlab run`'s child
        # (loadlab.experiment.child), not `loadlab run` itself
        client = psutil.Process(read_manifest(out)["owner"]["pid"])
        for thread in client.threads():
            os.sched_setaffinity(thread.id, {cpu})
            os.setpriority(os.PRIO_PROCESS, thread.id, 19)
        _, err = proc.communicate(timeout=600)
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode in (0, 3), err[-3000:]
    a = analyze_run(out).as_json()
    print(f"\n{a['verdict']}")
    states = [s["state"] for s in a["steps"]]
    assert states[0] == "ok" and "client_limited" in states[1:], a["steps"]
    assert not a["knee"]["found"] and a["cause"]["name"] == "client_limited", a["verdict"]
