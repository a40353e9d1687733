"""A fleet's analysis on real ``sim replay --replicas 2`` folders (virtual time): each
replica's knee and table, the routing imbalance, and the cause ``routing_imbalance``.

The workload is skewed (profile long-document-tail: a 4% tail of 40k-token documents) on
two replicas of 4000 blocks each. Round-robin keeps sending a replica its turn while it
prefills a document, so requests queue there while the other replica has room: the
fleet's knee is routing's. Least-waiting sends them to the emptier queue: the fleet
stalls later, when both replicas' KV pools are full, and the cause is the pool's.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from loadlab.analyze.analysis import analyze_run
from loadlab.analyze.fleet import CAUSE, MATERIAL_SHARE
from loadlab.analyze.steps import measured_windows
from loadlab.replay.driver import run_replay
from loadlab.runstore.analysis_model import Analysis, read_analysis, write_analysis_file
from loadlab.sim.fleet.config import fleet_config
from loadlab.spec.scenario import Workload
from loadlab.spec.validate import plan_from_flags

ENDPOINTS = ["sim://replay/replica/0", "sim://replay/replica/1"]


def replay(out: Path, router: str) -> Path:
    fleet = fleet_config({"replicas": 2, "router": router, "num_gpu_blocks_override": 4000,
                          "max_model_len": 45056})
    plan = plan_from_flags(concurrency="8,16,32,64", step_duration_s=60.0)
    run_replay(fleet, plan, Workload(profile="long-document-tail"), out)
    return out


@pytest.fixture(scope="module")
def round_robin(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Analysis]:
    run = replay(tmp_path_factory.mktemp("rr") / "run", "round-robin")
    return run, analyze_run(run)


@pytest.fixture(scope="module")
def least_waiting(tmp_path_factory: pytest.TempPathFactory) -> Analysis:
    return analyze_run(replay(tmp_path_factory.mktemp("lw") / "run", "least-waiting"))


def test_round_robin_on_a_long_tail_stalls_on_routing_with_replica_evidence(
        round_robin: tuple[Path, Analysis]) -> None:
    _, a = round_robin
    assert a.knee.found
    assert a.cause.name == CAUSE
    assert a.cause.knob is not None and "least-waiting" in a.cause.knob
    assert a.imbalance is not None and a.imbalance.chosen
    assert a.imbalance.stalled_share is not None
    assert a.imbalance.stalled_share >= MATERIAL_SHARE
    assert a.cause.evidence
    for ev in a.cause.evidence:
        extra = ev.model_extra or {}
        assert {extra["queued"], extra["room"]} == set(ENDPOINTS)   # one queued, one had room
        assert ev.step is not None and ev.value is not None
    assert "routing imbalance" in (a.verdict or "")


def test_least_waiting_on_the_same_load_is_not_routing_imbalance(
        round_robin: tuple[Path, Analysis], least_waiting: Analysis) -> None:
    rr, lw = round_robin[1], least_waiting
    assert lw.knee.found                                  # it stalls too, higher up
    assert lw.cause.name not in (CAUSE, "unknown")
    assert lw.imbalance is not None and not lw.imbalance.chosen
    assert lw.knee.upper is not None and rr.knee.upper is not None
    assert lw.knee.upper >= rr.knee.upper
    # the scheduler refuses the head less often at every level (its own measured series;
    # at 32 users round-robin's refusals are 2% of steps: a queue now and then, not yet
    # the knee, which the inferred knee follows since a tie of votes goes to occupancy)
    assert rr.knee.measured is not None and lw.knee.measured is not None
    rr_share = {x.level: x.share for x in rr.knee.measured.refused_share}
    for x in lw.knee.measured.refused_share:
        assert x.share <= rr_share[x.level], (x, rr_share)
    by_step = {s.step: s.stranded_mean for s in rr.imbalance.steps} if rr.imbalance else {}
    for s in lw.imbalance.steps:        # less of the queue sits where another has room
        assert s.stranded_mean is not None and s.stranded_mean <= (by_step[s.step] or 0)


def test_each_replica_has_its_knee_cause_and_table(round_robin: tuple[Path, Analysis]) -> None:
    _, a = round_robin
    assert a.replicas is not None
    assert [r.endpoint for r in a.replicas] == ENDPOINTS
    for r in a.replicas:
        assert r.knee.unit == "concurrency"
        assert r.cause.name is not None
        assert [s.step for s in r.steps] == [s.step for s in a.steps]
        assert [s.level for s in r.steps] == [s.level for s in a.steps]   # the fleet's load
        assert r.capacity.num_gpu_blocks == 4000
    fits = [r.capacity.formula_max_concurrency for r in a.replicas]
    assert a.imbalance is not None and all(f is not None for f in fits)
    assert a.imbalance.fleet_capacity == pytest.approx(sum(f for f in fits if f is not None))


def test_replica_tables_agree_with_each_replicas_own_counters(
        round_robin: tuple[Path, Analysis]) -> None:
    """Round-robin sends request k (send order) to replica k mod 2: count those that
    finished between the samples bracketing each step, and compare with the table."""
    run, a = round_robin
    requests = pd.read_parquet(run / "requests.parquet").sort_values("seq")
    requests["replica"] = np.arange(len(requests)) % 2
    metrics = pd.read_parquet(run / "metrics.parquet")
    times = np.sort(metrics["t"].unique())
    wins = measured_windows(json.loads((run / "manifest.json").read_text()))
    assert a.replicas is not None
    for i, replica in enumerate(a.replicas):
        mine = requests[(requests["replica"] == i) & (requests["status"] == "ok")]
        for row, w in zip(replica.steps, wins.itertuples(index=False), strict=True):
            lo, hi = times[times <= w.t_start].max(), times[times <= w.t_end].max()
            done = int(((mine["t_done"] > lo) & (mine["t_done"] <= hi)).sum())
            assert row.requests_done is not None
            assert abs(row.requests_done - done) <= 1, (i, row.step, row.requests_done, done)


def test_the_fleet_analysis_round_trips_and_old_folders_still_load(
        round_robin: tuple[Path, Analysis], tmp_path: Path) -> None:
    _, a = round_robin
    write_analysis_file(tmp_path, a)
    back = read_analysis(tmp_path)
    assert back.replicas is not None and len(back.replicas) == 2
    assert back.imbalance is not None and back.imbalance.chosen
    old = a.as_json()
    del old["replicas"], old["imbalance"]
    assert Analysis.model_validate(old).replicas is None
