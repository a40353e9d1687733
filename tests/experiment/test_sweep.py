"""`loadlab sweep`: bad scenarios refused before anything starts; what-if sweeps on the
simulator."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from loadlab.runstore.manifest import SweepManifest, load_manifest

WHATIF = """\
name: whatif-test
description: a small matrix in virtual time
target:
  launch: sim
  model: llama-3.1-8b
flags:
  gpu: h100
workload:
  profile: azure-conv
  seed: 3
load:
  concurrency: [4, 8, 16, 32]
  step_duration_s: 30
  warmup_s: 6
  slo:
    ttft_p90_s: 0.5
sweep:
  matrix:
    max-num-seqs: [8, 24]
"""


def sweep(*args: str, timeout: float = 300, env: dict[str, str] | None = None
          ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "loadlab", "sweep", *args], env=env,
                          check=False, capture_output=True, text=True, timeout=timeout)


def test_bad_scenario_exits_2_naming_file_field_and_fix(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(WHATIF.replace("max-num-seqs: [8, 24]", "max-num-seq: [8, 24]"))
    out = tmp_path / "out"
    proc = sweep(str(bad), "--out", str(out))
    assert proc.returncode == 2
    line = proc.stderr.strip()
    assert "\n" not in line and "Traceback" not in line
    assert str(bad) in line and "sweep.matrix.max_num_seq" in line and "max_num_seqs" in line
    assert not out.exists(), "nothing may start for a bad scenario"


def test_isolation_a_machine_cannot_give_exits_2_naming_the_field(tmp_path):
    scenario = tmp_path / "s.yaml"
    absent = max(os.sched_getaffinity(0)) + 1
    scenario.write_text(WHATIF + f"isolation: {{client_cpus: '{absent}'}}\n")
    out = tmp_path / "out"
    proc = sweep(str(scenario), "--out", str(out))
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert (
        "isolation.client_cpus" in proc.stderr and f"CPU {absent} is not available" in proc.stderr
    )
    assert not out.exists()
    scenario.write_text(WHATIF + "isolation: {server_cpus: '0-1', client_cpus: '1-2'}\n")
    proc = sweep(str(scenario), "--out", str(out))
    assert (
        proc.returncode == 2
        and f"{scenario}: isolation: server and client CPUs overlap on 1" in proc.stderr
    )
    assert not out.exists()


def test_a_vllm_scenario_without_vllm_exits_2_before_anything(tmp_path):
    scenario = tmp_path / "s.yaml"
    scenario.write_text(
        WHATIF.replace("launch: sim\n  model: llama-3.1-8b", "launch: vllm\n  model: m").replace(
            "  gpu: h100\n", "  enforce-eager: true\n"
        )
    )
    out = tmp_path / "out"
    env = {**os.environ, "LOADLAB_VLLM_BIN": str(tmp_path / "absent")}
    proc = sweep(str(scenario), "--out", str(out), env=env)
    assert proc.returncode == 2 and "install_vllm.sh" in proc.stderr and "--what-if" in proc.stderr
    assert not out.exists()


def test_whatif_sweep_predicts_each_points_knee(tmp_path):
    scenario = tmp_path / "s.yaml"
    scenario.write_text(WHATIF)
    out = tmp_path / "run"
    proc = sweep(str(scenario), "--what-if", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    manifest = load_manifest(out)
    assert isinstance(manifest, SweepManifest) and manifest.status == "complete"
    assert manifest.sweep.mode == "matrix" and manifest.sweep.baseline is None
    assert [(p.name, p.status, p.what_if) for p in manifest.points] == [
        ("max-num-seqs-8", "complete", True), ("max-num-seqs-24", "complete", True)]
    knees = {}
    for point in manifest.points:
        run = load_manifest(out / point.dir)
        assert (
            run.kind == "sim-replay" and run.server["max_num_seqs"] == point.flags["max_num_seqs"]
        )
        assert run.workload.seed == 3 and run.workload.profile == "azure-conv"
        analysis = json.loads((out / point.dir / "analysis.json").read_text())
        knees[point.name] = analysis["knee"]
        assert point.name in proc.stdout and analysis["verdict"] in proc.stdout
    # the cap moves the knee: (8, 16] with 8 running slots, (16, 32] with 24
    assert (knees["max-num-seqs-8"]["lower"], knees["max-num-seqs-8"]["upper"]) == (8, 16)
    assert (knees["max-num-seqs-24"]["lower"], knees["max-num-seqs-24"]["upper"]) == (16, 32)
    assert "point 2/2" in proc.stderr


def test_whatif_knee_search_point(tmp_path):
    scenario = tmp_path / "s.yaml"
    scenario.write_text(WHATIF.replace("  concurrency: [4, 8, 16, 32]\n",
                                       "  search: {start: 4, max: 32, resolution: 4}\n")
                        .replace("max-num-seqs: [8, 24]", "max-num-seqs: [12]"))
    out = tmp_path / "run"
    proc = sweep(str(scenario), "--what-if", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = load_manifest(out / "max-num-seqs-12")
    assert (run.search["lower"], run.search["upper"]) == (12, 16)
    levels = [s.concurrency for s in run.steps]
    assert levels[:4] == [4, 8, 16, 12] and len(levels) < len(range(4, 33, 4))
    analysis = json.loads((out / "max-num-seqs-12" / "analysis.json").read_text())
    assert (analysis["knee"]["lower"], analysis["knee"]["upper"]) == (12, 16)


def test_an_existing_sweep_folder_is_refused_without_resume(tmp_path):
    scenario = tmp_path / "s.yaml"
    scenario.write_text(WHATIF.replace("[4, 8, 16, 32]", "[4]"))
    out = tmp_path / "run"
    assert sweep(str(scenario), "--what-if", "--out", str(out)).returncode == 0
    proc = sweep(str(scenario), "--what-if", "--out", str(out))
    assert proc.returncode == 2 and "--resume" in proc.stderr


@pytest.mark.parametrize("name", ["demo", "prefix-caching-ab"])
def test_shipped_scenarios_resolve_by_name(name):
    from loadlab.experiment.scenarios import load_scenario, scenario_path

    assert load_scenario(scenario_path(name)).name == name
    assert scenario_path(name) == Path(__file__).resolve().parents[2] / "scenarios" / f"{name}.yaml"
