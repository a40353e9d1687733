"""`loadlab report`: where it writes, what it does with bad folders, what it imports."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from loadlab.report.inputs import load


def _report(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "loadlab", "report", *map(str, args)],
                          check=False, capture_output=True, text=True)


def test_out_puts_the_report_where_asked(ab_sweep, tmp_path):
    target = tmp_path / "nightly" / "index.html"
    out = _report(ab_sweep / "seqs-8", "--out", target)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(target)
    html = target.read_text()
    assert html.startswith("<!doctype html>") and "max_num_seqs=8" in html
    assert html.count("* plotly.js v") == 1        # the library inlined once


@pytest.mark.parametrize("manifest", [None, "{\"kind\": ", json.dumps({"kind": "spreadsheet"}),
                                      json.dumps({"kind": "sweep", "points": "all"})])
def test_a_folder_that_is_no_run_exits_2_in_one_line(tmp_path, manifest):
    if manifest is not None:
        (tmp_path / "manifest.json").write_text(manifest)
    out = _report(tmp_path)
    assert out.returncode == 2
    assert out.stderr.startswith("loadlab: error: ") and len(out.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "report.html").exists()


def test_a_point_without_its_folder_is_reported_not_fatal(ab_sweep, tmp_path):
    root = tmp_path / "sweep"
    shutil.copytree(ab_sweep, root)
    shutil.rmtree(root / "seqs-16")
    runs = load(root)
    lost = runs.point("max_num_seqs=16")
    assert lost.analysis is None and lost.problems == ["no run folder was written for this point"]
    assert (
        runs.point("max_num_seqs=64").problems == []
    )  # failed before a folder: its error says why
    assert _report(root).returncode == 0


def test_compare_and_reading_folders_import_no_plotting_library():
    code = ("import sys, loadlab.report.compare, loadlab.cli.report; "
            "print(sorted(m for m in ('plotly', 'jinja2') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
