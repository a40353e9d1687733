"""manifest.json and analysis.json through their models: round trips, folders written
before the models, and a damaged file named down to its field."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from loadlab.analyze.analysis import analyze_run
from loadlab.errors import InputError
from loadlab.report.inputs import load
from loadlab.runstore.analysis_model import Analysis, read_analysis, write_analysis_file
from loadlab.runstore.claim import owner_entry
from loadlab.runstore.jsonfile import field_path
from loadlab.runstore.manifest import (
    RUN_KINDS,
    RunManifest,
    StepWindow,
    TargetInfo,
    load_manifest,
    read_manifest,
    write_manifest,
)
from loadlab.spec.scenario import Isolation

OLD_MANIFEST = {   # a point folder as an older loadlab wrote it: kind, no owner, extra keys
    "kind": "sweep-point", "point": "seqs-8", "status": "complete", "created": 1.7e9,
    "target": {"base_url": "http://127.0.0.1:8000", "model": "m", "api": "completions"},
    "server": {"max_num_seqs": 8}, "isolation": {"server_cpus": [0], "client_cpus": [1]},
    "loadgen": {"workers": 0}, "steps": [{"step": 0, "concurrency": 4, "t_start": 100,
                                          "t_end": 110, "warmup_s": 2}],
}
OLD_ANALYSIS = {   # no run block, no verdict, measured_knee as a bracket: older writers
    "schema": 1, "steps": [{"step": 0, "concurrency": 4, "ttft_p50_ms": None, "state": "ok"}],
    "knee": {"found": False, "unit": "concurrency", "lower": None, "upper": None,
             "confidence": "low", "reasons": [], "detectors": {}},
    "slo": {"targets": {}, "max_level_meeting": None},
    "cause": {"name": "unknown", "knob": None, "ranked": [], "facts": {}, "evidence": []},
    "capacity": {"measured_knee": {"lower": None, "upper": None}},
    "warnings": ["one load step only"],
}


def test_run_manifest_round_trips(tmp_path):
    isolation = Isolation(server_cpus="0-1", client_cpus="2")
    written = RunManifest(kind="run", point="p", status="running", owner=owner_entry(),
                          target=TargetInfo(base_url="http://h:1"), custom={"kept": [1, 2]},
                          isolation=isolation.manifest_entry(),
                          steps=[StepWindow(step=0, t_start=1.0, t_end=2.0, concurrency=4)])
    write_manifest(tmp_path, written)
    loaded = load_manifest(tmp_path)
    assert loaded == written and loaded.custom == {"kept": [1, 2]}
    raw = read_manifest(tmp_path)
    assert raw["isolation"] == {"server_cpus": [0, 1], "client_cpus": [2]}
    assert "seed" not in json.dumps(raw)        # defaults are not filled in on disk
    assert set(RUN_KINDS) == {"run", "sim-replay", "sweep-point"}


def test_analysis_round_trips_and_reads_as_attributes(replayed):
    analysis = analyze_run(replayed)
    assert isinstance(analysis, Analysis)
    assert analysis.knee.found and analysis.knee.upper == 8 and analysis.cause.name == "seq_cap"
    assert [row.level for row in analysis.steps] == [2, 8]
    path = write_analysis_file(replayed, analysis)
    text = json.loads(path.read_text())
    assert text["schema"] == 1 and "schema_version" not in text
    assert isinstance(text["knee"]["upper"], int)        # 8, not 8.0: the verdict's words
    again = read_analysis(replayed)
    assert again == analysis and again.as_json() == text


def test_old_style_folder_still_loads(tmp_path):
    (tmp_path / "manifest.json").write_text(json.dumps(OLD_MANIFEST))
    (tmp_path / "analysis.json").write_text(json.dumps(OLD_ANALYSIS))
    manifest = load_manifest(tmp_path)
    assert manifest.kind == "sweep-point" and manifest.loadgen == {"workers": 0}
    assert manifest.steps[0].warmup_s == 2 and manifest.isolation["client_cpus"] == [1]
    analysis = read_analysis(tmp_path)
    assert analysis.run is None and analysis.verdict is None
    assert analysis.as_json() == OLD_ANALYSIS            # read and written back unchanged
    point = load(tmp_path).points[0]                     # and the report reads it
    assert point.name == "seqs-8" and point.section("capacity") == OLD_ANALYSIS["capacity"]
    assert list(point.steps["state"]) == ["ok"] and not point.problems


@pytest.mark.parametrize("patch,field", [
    ({"status": "done"}, "status"),
    ({"steps": [{"step": 0, "t_start": 1.0}]}, "steps[0].t_end"),
    ({"owner": {"pid": "me", "hostname": "h"}}, "owner.pid"),
])
def test_bad_manifest_names_file_and_field(tmp_path, patch, field):
    (tmp_path / "manifest.json").write_text(json.dumps({**OLD_MANIFEST, **patch}))
    with pytest.raises(InputError) as info:
        load_manifest(tmp_path)
    assert info.value.field == field and info.value.exit_code == 2
    assert info.value.source == str(tmp_path / "manifest.json")
    proc = subprocess.run([sys.executable, "-m", "loadlab", "analyze", str(tmp_path)],
                          capture_output=True, text=True, check=False, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"manifest.json: {field}:" in proc.stderr


def test_bad_analysis_names_file_and_field(tmp_path):
    (tmp_path / "analysis.json").write_text(json.dumps({**OLD_ANALYSIS, "knee": {"found": "?"}}))
    with pytest.raises(InputError) as info:
        read_analysis(tmp_path)
    assert info.value.field == "knee.found" and info.value.source.endswith("analysis.json")
    (tmp_path / "analysis.json").write_text("{not json")
    with pytest.raises(InputError, match="not valid JSON"):
        read_analysis(tmp_path)


def test_field_path_reads_like_the_file():
    assert field_path(("steps", 0, "t_start")) == "steps[0].t_start"
    assert field_path(("kind",)) == "kind" and field_path(()) == ""
