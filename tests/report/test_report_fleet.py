"""The report of a fleet's run folder: one lane per replica, titled with its own knee, and
the fleet's panel (its knee beside the replicas' capacities at their knees, summed), every
string from the folder escaped."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from markupsafe import escape

from loadlab.analyze.analysis import analyze_run
from loadlab.replay.driver import run_replay
from loadlab.report.page import write_report
from loadlab.runstore.analysis_model import Analysis, write_analysis_file
from loadlab.sim.fleet.config import fleet_config
from loadlab.spec.scenario import Workload
from loadlab.spec.validate import plan_from_flags

HOSTILE = '<script>window.__pwned=1</script><img src=x onerror="window.__pwned=2">'


@pytest.fixture(scope="module")
def fleet_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Analysis]:
    run = tmp_path_factory.mktemp("fleet") / "run"
    fleet = fleet_config({"replicas": 2, "router": "round-robin", "max_num_seqs": 4})
    run_replay(fleet, plan_from_flags(concurrency="2,4,8,16", step_duration_s=20.0),
               Workload(profile="sharegpt"), run)
    analysis = analyze_run(run)
    write_analysis_file(run, analysis)
    return run, analysis


def test_a_fleet_report_has_a_lane_per_replica(fleet_run: tuple[Path, Analysis]) -> None:
    html_text = write_report(fleet_run[0]).read_text()
    for i in range(2):
        assert f'<div class="chart" id="point-1-replica-{i}">' in html_text
        assert f"replica sim:\\u002f\\u002freplay\\u002freplica\\u002f{i}: " in html_text  # JSON
    assert "-replica-2" not in html_text


def test_the_fleet_panel_sets_its_knee_beside_the_replicas_capacities(
        fleet_run: tuple[Path, Analysis]) -> None:
    run, a = fleet_run
    assert a.replicas is not None and a.imbalance is not None
    each = [(r.capacity.model_extra or {})["at_knee"] for r in a.replicas]
    assert all(v is not None and v > 0 for v in each)
    assert a.imbalance.replica_capacity_sum == pytest.approx(sum(each), abs=0.01)
    for r in a.replicas:     # a replica of cap 4 that stalled ran near its cap at its knee
        if r.knee.found:
            assert 3.0 <= (r.capacity.model_extra or {})["at_knee"] <= 4.0
    page = write_report(run).read_text()
    assert '<div class="chart tiny" id="point-1-fleet">' in page
    panel = page[page.index('id="point-1-fleet-title"'):page.index('id="point-1-capacity-title"')]
    assert "<th>fleet knee</th>" in panel
    total = a.imbalance.replica_capacity_sum
    bound = "≥ " if a.imbalance.replica_capacity_bound == "at least" else ""
    assert f"<th>replicas at their knees, summed</th><td>{bound}{total:.3g}</td>" in panel
    for r in a.replicas:
        assert f"<th>replica {r.endpoint}</th>" in panel
    figures = json.loads(page[page.index('id="figures">') + 13:page.index("</script>",
                                                                        page.index('id="figures">'))])
    drawn = figures["point-1-fleet"]["data"]
    stacked = [t for t in drawn if t["y"][0] == "replicas at their knees, summed"]
    assert [t["name"] for t in stacked] == [r.endpoint for r in a.replicas]
    assert stacked[-1]["x"][1] == pytest.approx(sum(each))


def test_the_fleet_panel_escapes_what_the_folder_says(fleet_run: tuple[Path, Analysis],
                                                      tmp_path: Path) -> None:
    run = tmp_path / "hostile"
    shutil.copytree(fleet_run[0], run)
    analysis = json.loads((run / "analysis.json").read_text())
    for r in analysis["replicas"]:
        r["endpoint"], r["pool"] = f"{r['endpoint']} {HOSTILE}", HOSTILE
        r["cause"]["name"] = HOSTILE
    (run / "analysis.json").write_text(json.dumps(analysis))
    page = write_report(run).read_text()
    assert "<script>window" not in page and "<img src=x" not in page
    panel = page[page.index('id="point-1-fleet-title"'):page.index('id="point-1-capacity-title"')]
    assert panel.count(str(escape(HOSTILE))) >= 4    # endpoint, pool and cause of each replica
