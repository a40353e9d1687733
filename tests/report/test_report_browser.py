"""The HTML report in a real headless Chromium: it renders offline, every section is there."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from report_folders import replay, write_verdict

from loadlab.analyze.analysis import analyze_run
from loadlab.analyze.display import cause_text
from loadlab.replay.driver import run_replay
from loadlab.report.page import write_report
from loadlab.sim.fleet.config import fleet_config
from loadlab.spec.scenario import Workload
from loadlab.spec.validate import plan_from_flags


def _check_renders(opened, screenshot: Path) -> None:
    page = opened.page
    assert opened.console_errors == []
    assert [u for u in opened.requests if not u.startswith("file://")] == []
    drawn = page.eval_on_selector_all(
        ".chart", "els => els.filter(e => e.querySelector('.main-svg')).length"
    )
    assert drawn == int(page.get_attribute("body", "data-charts")) > 0
    page.screenshot(path=str(screenshot), full_page=True)
    assert screenshot.stat().st_size > 50_000


def test_sweep_report_renders_every_section(ab_sweep, open_page, tmp_path):
    out = subprocess.run([sys.executable, "-m", "loadlab", "report", str(ab_sweep)],
                         capture_output=True, text=True, check=True)
    path = Path(out.stdout.strip())
    assert path == ab_sweep / "report.html"
    opened = open_page(path)
    _check_renders(opened, tmp_path / "sweep-report.png")
    page = opened.page
    sections = ["verdict", "comparison", "ab", "scenario"]
    for k in (1, 2, 3):
        sections += [f"point-{k}", f"point-{k}-load", f"point-{k}-timeline", f"point-{k}-capacity",
                     f"point-{k}-manifest", f"point-{k}-steps"]
    sections += ["point-4", "point-4-manifest"]
    missing = [s for s in sections if not page.is_visible(f"#{s}")]
    assert missing == []
    rows = page.inner_text("table.verdict")
    assert "(8, 16]" in rows and "(16, 32]" in rows and "none up to 32" in rows
    assert "CUDA out of memory" in page.inner_text("#point-4")
    assert "failed" in page.inner_text("#point-4 .badge").lower()
    # the A/B section compares both arms with the baseline, level by level
    assert page.locator("#ab .arm").count() == 2
    assert "max_num_seqs=8" in page.inner_text("#ab h3")
    # stalled steps are flagged in the per-step table, from the knee's upper bound on
    assert page.locator("#point-1-steps + .scroll tr.stalled").count() == 2


def test_single_run_report_leads_with_its_verdict(tmp_path, open_page):
    run = replay(tmp_path / "run", levels=(2, 4, 8, 16), max_num_seqs=4)
    write_verdict(
        run, lower=4, upper=8, slo_level=4, knob="raise --max-num-seqs (the pool fits ~700)"
    )
    path = write_report(run)
    opened = open_page(path)
    _check_renders(opened, tmp_path / "run-report.png")
    page = opened.page
    for section in ("verdict", "point-1", "point-1-load", "point-1-timeline", "point-1-manifest"):
        assert page.is_visible(f"#{section}")
    assert not page.is_visible("#ab") and not page.is_visible("#comparison")
    headline = page.inner_text("#verdict .verdict-box")
    assert "Knee between 4 and 8 concurrent users" in headline and "Sequence cap" in headline
    kpis = page.inner_text("#verdict .kpis")
    assert "(4, 8]" in kpis and "tok/s" in kpis


def test_partial_sweep_with_a_broken_point_still_reports(ab_sweep, tmp_path, open_page):
    root = tmp_path / "partial"
    shutil.copytree(ab_sweep, root)
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["status"] = "interrupted"
    manifest["points"][1]["status"] = "running"
    (root / "seqs-16" / "analysis.json").write_text("{not json")
    (root / "manifest.json").write_text(json.dumps(manifest))
    opened = open_page(write_report(root))
    _check_renders(opened, tmp_path / "partial-report.png")
    page = opened.page
    assert "interrupted" in page.inner_text(".banner.warn")
    assert "not valid JSON" in page.inner_text("#point-2")
    assert page.is_visible("#point-1-load") and page.is_visible("#point-3-load")
    assert page.is_visible("#point-2-timeline")     # the raw data still shows over time


def test_a_run_without_analysis_is_analysed_first(tmp_path, open_page):
    """The real analyzer's verdict reaches the page, in the console's words; the run
    folder is read, never written (the analysis is made in memory)."""
    run = replay(tmp_path / "run", levels=(2, 4, 8, 16, 32), max_num_seqs=8)
    out = subprocess.run([sys.executable, "-m", "loadlab", "report", str(run)],
                         capture_output=True, text=True, check=True)
    assert not (run / "analysis.json").exists()
    analysis = analyze_run(run).as_json()
    assert analysis["schema"] == 1 and analysis["cause"]["name"] == "seq_cap"
    opened = open_page(Path(out.stdout.strip()))
    _check_renders(opened, tmp_path / "analysed-report.png")
    box = opened.page.inner_text("#verdict .verdict-box")
    assert "Knee between 8 and 16 concurrent users" in box
    assert cause_text(analysis["cause"]).split(" — ", 1)[1] in box
    assert analysis["cause"]["knob"] in box
    # the per-step table uses the console's headers
    assert "TTFT p99 ms" in opened.page.inner_text("#point-1-steps + .scroll thead")


def test_a_fleet_report_draws_its_lanes_and_panel(tmp_path, open_page):
    """Every chart of a fleet's page has its element and is drawn: a lane per replica and
    the panel of the fleet's knee beside the replicas' capacities."""
    run = tmp_path / "fleet"
    run_replay(fleet_config({"replicas": 2, "router": "round-robin", "max_num_seqs": 4}),
               plan_from_flags(concurrency="2,4,8,16", step_duration_s=20.0),
               Workload(profile="sharegpt"), run)
    opened = open_page(write_report(run))
    _check_renders(opened, tmp_path / "fleet-report.png")
    page = opened.page
    for section in ("point-1-replica-0", "point-1-replica-1", "point-1-fleet"):
        assert page.is_visible(f"#{section}")
        assert page.locator(f"#{section} .main-svg").count() > 0
    panel = page.inner_text("#point-1-fleet-title + p + .capacity")
    assert "replicas at their knees, summed" in panel and "fleet knee" in panel
    assert page.locator("#point-1-fleet .main-svg text", has_text="replicas at their knees").count()
