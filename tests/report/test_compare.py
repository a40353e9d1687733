"""`loadlab compare`: exit 0 / 1 / 2 and a JSON summary a CI system can read."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from loadlab.errors import InputError
from loadlab.report.compare import compare, parse_margin


def _compare(*args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "loadlab", "compare", *map(str, args)],
                          check=False, capture_output=True, text=True)


def _edit(run: Path, **changes) -> None:
    """Change the knee / slo of a point's analysis.json."""
    path = run / "analysis.json"
    analysis = json.loads(path.read_text())
    for section, values in changes.items():
        analysis[section].update(values)
    path.write_text(json.dumps(analysis))


@pytest.fixture
def nightly(ab_sweep, tmp_path) -> Path:
    """A second copy of the sweep: tonight's run, to be edited by each test."""
    new = tmp_path / "tonight"
    shutil.copytree(ab_sweep, new)
    return new


def test_same_verdicts_pass_with_exit_0_and_json_on_stdout(ab_sweep, nightly):
    out = _compare(ab_sweep, nightly, "--json", "-")
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    assert summary["regression"] is False and summary["exit_code"] == 0
    assert [p["name"] for p in summary["points"]] == [
        "max_num_seqs=8",
        "max_num_seqs=16",
        "max_num_seqs=32",
    ]
    assert summary["skipped_in_base"] == ["max_num_seqs=64"]   # failed in BASE: nothing to compare
    first = summary["points"][0]
    assert first["knee"]["base"] == first["knee"]["new"] == 16
    assert first["slo_level"]["base"] == 8


def test_knee_drop_beyond_margin_exits_1_and_names_the_point(ab_sweep, nightly, tmp_path):
    _edit(nightly / "seqs-16", knee={"lower": 8, "upper": 16})    # was (16, 32]
    report = tmp_path / "gate.json"
    out = _compare(ab_sweep, nightly, "--json", report)
    assert out.returncode == 1
    assert (
        "max_num_seqs=16: regression" in out.stdout
        and "knee fell from (16, 32] to (8, 16]" in out.stdout
    )
    summary = json.loads(report.read_text())
    bad = [p for p in summary["points"] if p["status"] != "ok"]
    assert [p["name"] for p in bad] == ["max_num_seqs=16"]
    assert bad[0]["knee"]["change"] == pytest.approx(-0.5)


def test_a_drop_within_the_margin_passes(ab_sweep, nightly):
    # knee upper 32 -> 28 is -12.5%: a regression at 10%, not at 15%
    _edit(nightly / "seqs-16", knee={"upper": 28})
    assert _compare(ab_sweep, nightly, "--margin", "10%").returncode == 1
    assert _compare(ab_sweep, nightly, "--margin", "0.15").returncode == 0


def test_slo_level_drop_alone_is_a_regression(ab_sweep, nightly):
    _edit(nightly / "seqs-8", slo={"max_level_meeting": 4})
    result = compare(ab_sweep, nightly)
    assert result.exit_code == 1
    point = result.points[0]
    assert point.knee.regressed is False and point.slo_level.regressed is True


def test_a_knee_where_there_was_none_is_a_regression(ab_sweep, nightly):
    _edit(nightly / "seqs-32", knee={"found": True, "lower": 16, "upper": 32})  # was: none up to 32
    assert compare(ab_sweep, nightly).points[2].status == "regression"


def test_point_failed_or_missing_tonight_fails_the_gate(ab_sweep, nightly):
    manifest = json.loads((nightly / "manifest.json").read_text())
    manifest["points"][0].update(status="failed", error="server died", dir=None)
    del manifest["points"][1]
    (nightly / "manifest.json").write_text(json.dumps(manifest))
    result = compare(ab_sweep, nightly)
    assert [p.status for p in result.points] == ["failed", "missing", "ok"]
    assert result.exit_code == 1


def test_single_runs_compare_whatever_their_names(ab_sweep):
    out = _compare(ab_sweep / "seqs-16", ab_sweep / "seqs-8", "--json", "-")
    assert out.returncode == 1
    point = json.loads(out.stdout)["points"][0]
    assert point["knee"]["base_text"] == "(16, 32]" and point["knee"]["new_text"] == "(8, 16]"


@pytest.mark.parametrize("bad", ["nothing-here", "analysis-not-json", "manifest-not-json"])
def test_bad_input_exits_2_with_a_one_line_message(ab_sweep, tmp_path, bad):
    target = tmp_path / bad
    if bad != "nothing-here":
        shutil.copytree(ab_sweep / "seqs-8", target)
        broken = "analysis.json" if bad == "analysis-not-json" else "manifest.json"
        (target / broken).write_text("{\"kind\": ")
    out = _compare(ab_sweep / "seqs-8", target)
    assert out.returncode == 2
    assert out.stderr.startswith("loadlab: error: ") and "Traceback" not in out.stderr
    assert str(target) in out.stderr


@pytest.mark.parametrize(
    "text,value", [("10%", 0.10), ("0.05", 0.05), ("0", 0.0), ("12.5%", 0.125), ("", None)]
)
def test_margin_accepts_percent_or_fraction(text, value):
    if value is None:
        with pytest.raises(InputError, match="--margin"):
            parse_margin(text)
    else:
        assert parse_margin(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["150%", "1.5", "-5%", "ten"])
def test_margin_out_of_range_is_exit_2(ab_sweep, text):
    out = _compare(ab_sweep, ab_sweep, "--margin", text)
    assert out.returncode == 2 and "--margin" in out.stderr
