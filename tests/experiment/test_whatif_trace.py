"""``what_if: {trace: RUN}``: a what-if sweep replays a recorded run's requests at every point."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from loadlab.replay.driver import ReplayOptions, run_replay
from loadlab.runstore import REQUESTS, read_manifest, read_table
from loadlab.runstore.manifest import SweepManifest, load_manifest
from loadlab.sim.engine.config import SimConfig
from loadlab.spec.plan import LoadPlan
from loadlab.spec.scenario import Workload

SCENARIO = """\
name: trace-whatif
target:
  launch: sim
  model: llama-3.1-8b
flags:
  gpu: h100
workload:
  profile: sharegpt
load:
  concurrency: [64]
  step_duration_s: 30
what_if:
  trace: {trace}
sweep:
  matrix:
    max-num-seqs: [2, 16]
"""


def sweep(scenario: Path, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "loadlab", "sweep", str(scenario), "--what-if",
                           "--out", str(out)], check=False, capture_output=True, text=True,
                          timeout=300)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run of 4 then 8 users on a 16-slot server, azure-conv lengths."""
    out = tmp_path_factory.mktemp("rec") / "recorded"
    run_replay(SimConfig(model="llama-3.1-8b", gpu="h100", max_num_seqs=16),
               LoadPlan(concurrency=[4, 8], step_duration_s=10.0, warmup_s=2.0),
               Workload(profile="azure-conv", seed=5), out, ReplayOptions())
    return out


def test_whatif_sweep_replays_the_recorded_workload(recorded: Path, tmp_path: Path) -> None:
    scenario = recorded.parent / "s.yaml"   # the trace path is relative to the file
    scenario.write_text(SCENARIO.format(trace=recorded.name))
    out = tmp_path / "sweep"
    proc = sweep(scenario, out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    manifest = load_manifest(out)
    assert isinstance(manifest, SweepManifest) and manifest.status == "complete"
    sent = read_table(recorded / "requests.parquet", REQUESTS)
    lengths = set(zip(sent.prompt_tokens, sent.target_output_tokens, strict=True))
    ttft = {}
    for point in manifest.points:
        run = out / point.dir
        info = read_manifest(run)
        # the recorded steps (4 and 8 users, 10 s), not the scenario's load plan
        assert [(w["concurrency"], w["t_end"] - w["t_start"]) for w in info["steps"]] == [
            (4, pytest.approx(10.0)), (8, pytest.approx(10.0))]
        assert info["sim"]["trace"]["source"] == str(recorded / "requests.parquet")
        assert info["server"]["max_num_seqs"] == point.flags["max_num_seqs"]
        rows = read_table(run / "requests.parquet", REQUESTS)
        assert set(zip(rows.prompt_tokens, rows.target_output_tokens, strict=True)) <= lengths
        ttft[point.name] = rows.ttft_s.median()
    # the recorded server had 16 slots: the same requests through 2 wait for a slot
    assert ttft["max-num-seqs-2"] > 2 * ttft["max-num-seqs-16"]


def test_a_bad_whatif_trace_exits_2_naming_the_field(tmp_path: Path) -> None:
    scenario = tmp_path / "s.yaml"
    scenario.write_text(SCENARIO.format(trace="absent"))
    proc = sweep(scenario, tmp_path / "a")
    assert proc.returncode == 2 and f"{scenario}: what_if.trace: " in proc.stderr
    (tmp_path / "empty").mkdir()
    scenario.write_text(SCENARIO.format(trace="empty"))
    proc = sweep(scenario, tmp_path / "b")
    assert proc.returncode == 2 and "what_if.trace: no requests.parquet" in proc.stderr
    assert "--trace" not in proc.stderr
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
