"""``loadlab sim``: flag handling, exit codes, help, replay wiring, the test helper's argv."""

from __future__ import annotations

import json
import subprocess
import sys

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from loadlab.cli.sim import sim
from loadlab.sim.engine.flags import sim_config
from loadlab.sim.serve.testing import sim_argv


def loadlab(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "loadlab", "sim", *args],
                          check=False, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("args, needle", [
    (["serve", "--max-num-seqz", "4"], "No such option"),
    (["serve", "--port", "-3"], "--port"),
    (["serve", "--gpu", "tpu-v9"], "--gpu"),
    (["serve", "--no-enable-chunked-prefill", "--max-num-batched-tokens", "512",
      "--max-model-len", "4096"], "--max-num-batched-tokens"),
    (["serve", "--time-scale", "0"], "--time-scale"),
    (["replay", "--concurrency", "1,two", "--out", "x"], "--concurrency"),
    (["replay", "--out", "x"], "concurrency"),
])
def test_bad_flags_and_impossible_configs_exit_2(args, needle):
    done = loadlab(*args)
    assert done.returncode == 2, done.stderr
    assert needle in done.stderr
    assert "Traceback" not in done.stderr


def test_help_groups_options_by_section():
    text = CliRunner().invoke(sim, ["serve", "--help"]).output
    sections = ["Model and hardware:", "Scheduler (vLLM defaults when omitted):", "KV cache:",
                "Server:", "Simulation:"]
    positions = [text.index(s) for s in sections]
    assert positions == sorted(positions)
    assert "--no-enable-prefix-caching" in text and "--api-key" in text


def test_hugging_face_model_names_map_to_profiles():
    cfg = sim_config({"model": "meta-llama/Llama-3.1-8B-Instruct", "max_num_seqs": 4,
                      "enforce_eager": True})
    assert cfg.model == "llama-3.1-8b" and cfg.max_num_seqs == 4


def test_replay_writes_a_run_folder(tmp_path):
    out = tmp_path / "run"
    result = CliRunner().invoke(sim, ["replay", "--concurrency", "1,2", "--step-duration", "5",
                                      "--warmup", "1", "--max-num-seqs", "4", "--out", str(out)])
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "complete" and len(manifest["steps"]) == 2
    assert manifest["server"]["max_num_seqs"] == 4
    rows = pq.read_table(out / "requests.parquet").num_rows
    assert rows > 0 and f"{rows} requests" in result.output


def test_sim_argv_spells_vllm_flags():
    argv = sim_argv(max_num_seqs=4, enable_prefix_caching=False, enforce_eager=True,
                    api_key=None, time_scale=2.5)
    assert argv == ["--max-num-seqs", "4", "--no-enable-prefix-caching", "--enforce-eager",
                    "--time-scale", "2.5"]


def test_running_sim_reports_a_server_that_cannot_start():
    from loadlab.errors import TargetError
    from loadlab.sim.serve.testing import running_sim

    with pytest.raises(TargetError) as info, running_sim(gpu="tpu-v9", startup_timeout_s=30):
        pass
    assert "unknown gpu" in str(info.value)
