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
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from loadlab.analyze.analysis import analyze_run
from loadlab.analyze.display import replica_lines
from loadlab.analyze.fleet import CAUSE, MATERIAL_SHARE
from loadlab.analyze.fleet_measured import fleet_measured
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
    # it stalls later than round-robin or not at all up to 64 users, as the scheduler's
    # own refusals say (knee.measured: a queue present in under half its steps)
    assert lw.knee.measured is not None and rr.knee.upper is not None
    assert (lw.knee.found, lw.knee.upper) == (lw.knee.measured.found, lw.knee.measured.upper)
    assert not lw.knee.found or (lw.knee.upper or 0) >= rr.knee.upper
    assert lw.cause.name not in (CAUSE, "unknown")
    assert lw.imbalance is not None and not lw.imbalance.chosen
    # the scheduler refuses the head less often at every level (its own measured series;
    # at 32 users round-robin's refusals are 2% of steps: a queue now and then, not yet
    # the knee, which the inferred knee follows since occupancy decides)
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


def test_the_fleet_table_adds_its_replicas_up(round_robin: tuple[Path, Analysis]) -> None:
    """Running and waiting are the replicas' sums; KV is the fleet's used blocks over its
    total (equal pools here: the replicas' mean); the in-flight count the client kept
    agrees with the summed running gauge, not with one replica's."""
    _, a = round_robin
    assert a.replicas is not None
    for k, row in enumerate(a.steps):
        fleet = row.model_extra or {}
        each = [r.steps[k].model_extra or {} for r in a.replicas]
        for column in ("running_mean", "waiting_mean"):
            assert fleet[column] == pytest.approx(sum(e[column] for e in each), rel=0.02)
        assert fleet["kv_mean"] == pytest.approx(np.mean([e["kv_mean"] for e in each]),
                                                 rel=0.02)
        assert fleet["running_max"] > max(e["running_max"] for e in each) * 1.1
        assert fleet["running_mean"] <= fleet["inflight"] + 0.5
    assert a.capacity.num_gpu_blocks == 8000                    # the fleet's pool


def test_each_replica_is_measured_and_the_fleet_takes_its_most_refused(
        round_robin: tuple[Path, Analysis]) -> None:
    _, a = round_robin
    assert a.replicas is not None and a.knee.measured is not None
    per = [r.knee.measured for r in a.replicas]
    assert all(m is not None for m in per)
    assert [r.cause.measured is not None for r in a.replicas] == [True, True]
    for k, level in enumerate(a.knee.measured.refused_share):
        shares = [m.refused_share[k] for m in per if m is not None]
        assert all(s.level == level.level for s in shares)
        assert level.share == max(s.share for s in shares)
    # the summed counters would have read less than the most refused replica
    assert a.knee.measured.refused_share[-1].share > 0.3


def _measured(upper: int | None, shares: list[float], name: str) -> dict:
    levels = [8, 16, 32]
    return {"knee": {"found": upper is not None, "upper": upper,
                     "refused_share": [{"level": lv, "share": s}
                                       for lv, s in zip(levels, shares, strict=True)]},
            "cause": {"name": name, "reason_share": {}, "refused_steps": 1, "engine_steps": 2}}


def test_a_fleet_is_stalled_where_any_replica_is_and_routing_when_a_peer_was_not() -> None:
    lopsided = fleet_measured([_measured(16, [0.0, 0.9, 0.95], "head_blocked"),
                               _measured(None, [0.0, 0.1, 0.2], "none")], ENDPOINTS, ["", ""])
    assert lopsided is not None
    assert (lopsided["knee"]["found"], lopsided["knee"]["upper"]) == (True, 16)
    assert [s["share"] for s in lopsided["knee"]["refused_share"]] == [0.0, 0.9, 0.95]
    assert lopsided["cause"]["name"] == CAUSE
    assert lopsided["cause"]["replica"] == ENDPOINTS[0]
    assert lopsided["cause"]["replica_cause"] == "head_blocked"
    both = fleet_measured([_measured(32, [0.0, 0.2, 0.9], "seq_cap"),
                           _measured(16, [0.0, 0.6, 0.95], "kv_exhausted")], ENDPOINTS, ["", ""])
    assert both is not None
    assert both["knee"]["upper"] == 16
    assert both["cause"]["name"] == CAUSE                  # at 16 only one replica refused
    together = fleet_measured([_measured(16, [0.0, 0.7, 0.9], "seq_cap"),
                               _measured(16, [0.0, 0.6, 0.95], "seq_cap")], ENDPOINTS, ["", ""])
    assert together is not None and together["cause"]["name"] == "seq_cap"
    pools = fleet_measured([_measured(16, [0.0, 0.9, 0.95], "head_blocked"),
                            _measured(None, [0.0, 0.1, 0.2], "none")], ENDPOINTS,
                           ["long", "short"])            # no peer in its pool: not routing
    assert pools is not None and pools["cause"]["name"] == "head_blocked"
    assert fleet_measured([None, _measured(16, [0.0, 0.9, 0.95], "seq_cap")], ENDPOINTS,
                          ["", ""]) is None


def test_the_console_has_a_line_per_replica(round_robin: tuple[Path, Analysis]) -> None:
    run, a = round_robin
    out = subprocess.run([sys.executable, "-m", "loadlab", "analyze", str(run)],
                         capture_output=True, text=True, check=True).stdout
    lines = [ln for ln in out.splitlines() if ln.startswith("replica ")]
    assert lines == replica_lines(a.as_json())
    assert a.replicas is not None and len(lines) == 2
    for line, r in zip(lines, a.replicas, strict=True):
        assert line.startswith(f"replica {r.endpoint}: ")
        assert f"cause {r.cause.name}" in line
        assert r.imbalance_share is not None
        assert f"{r.imbalance_share:.0%} of the fleet's stranded queue" in line
    for line, r in zip(lines, a.replicas, strict=True):   # where each replica's knee is
        knee = r.knee
        assert (f"and {knee.upper} concurrent" if knee.found
                else f"never stalled up to {knee.lower} concurrent") in line
