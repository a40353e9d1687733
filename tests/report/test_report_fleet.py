"""The report of a fleet's run folder: one lane per replica, titled with its own knee."""

from __future__ import annotations

from pathlib import Path

from loadlab.analyze.analysis import analyze_run
from loadlab.replay.driver import run_replay
from loadlab.report.page import write_report
from loadlab.runstore.analysis_model import write_analysis_file
from loadlab.sim.fleet.config import fleet_config
from loadlab.spec.scenario import Workload
from loadlab.spec.validate import plan_from_flags


def test_a_fleet_report_has_a_lane_per_replica(tmp_path: Path) -> None:
    run = tmp_path / "run"
    fleet = fleet_config({"replicas": 2, "router": "round-robin"})
    run_replay(fleet, plan_from_flags(concurrency="2,4", step_duration_s=20.0),
               Workload(profile="sharegpt"), run)
    write_analysis_file(run, analyze_run(run))
    html = write_report(run).read_text()
    for i in range(2):
        assert f"-replica-{i}" in html
        assert f"replica sim:\\u002f\\u002freplay\\u002freplica\\u002f{i}: " in html  # JSON
    assert "-replica-2" not in html
