"""The adaptive knee search against a full linear scan, both in virtual time (sim replay)."""

from __future__ import annotations

from loadlab.analyze.analysis import analyze_run
from loadlab.experiment.verdicts import step_judge
from loadlab.replay.driver import run_replay
from loadlab.runstore import read_manifest, update_manifest
from loadlab.sim.engine.config import SimConfig
from loadlab.spec.plan import KneeSearch, LoadPlan
from loadlab.spec.scenario import Workload

SEARCH = KneeSearch(start=4, max=128, resolution=4)     # a linear scan: 4, 8, ..., 128 (32 steps)
STEP = {"step_duration_s": 20.0, "warmup_s": 5.0}


def test_same_knee_as_a_full_scan_in_a_fraction_of_its_time(tmp_path):
    cfg = SimConfig(max_num_seqs=50, model="llama-3.1-8b", gpu="h100")
    workload = Workload(profile="azure-conv", seed=1)
    scan = run_replay(cfg, LoadPlan(concurrency=SEARCH.grid(), **STEP), workload, tmp_path / "scan")
    knee = analyze_run(tmp_path / "scan").knee
    assert knee.found and scan.steps == 32

    adaptive = run_replay(cfg, LoadPlan(search=SEARCH, **STEP), workload, tmp_path / "adaptive",
                          judge=step_judge(tmp_path / "adaptive"))
    found = adaptive.search
    assert found is not None and found.upper is not None
    assert abs(found.upper - knee.upper) <= SEARCH.resolution      # the same knee, +-1 step
    assert found.lower is not None and found.upper - found.lower == SEARCH.resolution
    # the load itself (what a live search spends wall time on): at most 40% of the scan's
    assert adaptive.virtual_s <= 0.4 * scan.virtual_s, (adaptive.virtual_s, scan.virtual_s)
    assert adaptive.steps == len(found.steps) <= 0.4 * scan.steps
    # the run folder of the search is a normal run folder whose own analysis agrees
    again = analyze_run(tmp_path / "adaptive").knee
    assert (again.lower, again.upper) == (found.lower, found.upper)


def test_a_client_limited_flag_does_not_hide_a_queue_at_the_cap(tmp_path):
    """The judge counts the server's stalls: a step the load generator flagged client limited
    whose server still queued requests with running at its cap is a stall all the same (the
    server, not the client, was the bottleneck; the flag alone does not move the search)."""
    cfg = SimConfig(max_num_seqs=6, model="llama-3.1-8b", gpu="h100")
    run_replay(
        cfg, LoadPlan(concurrency=[2, 12], **STEP), Workload(profile="azure-conv", seed=1), tmp_path
    )
    judge = step_judge(tmp_path)
    assert judge(1) and not judge(0), "12 users against 6 seqs stall, 2 do not"
    # the same step, had the load generator fallen short of it (as the live driver records)
    steps = read_manifest(tmp_path)["steps"]
    steps[1].update(client_limited=True, client_limited_reasons=["in flight 5.1 of 12 users"])
    update_manifest(tmp_path, steps=steps, client_limited_steps=[1])
    assert judge(1)
