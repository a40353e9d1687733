"""A key given to a sweep's server (``flags: {api-key: K}``, ``$LOADLAB_API_KEY``) reaches the
server and nothing loadlab writes: no file of the sweep folder, no console line."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from loadlab.spec.secrets import is_secret_name, redact

SCENARIO = """\
name: secret-test
target:
  launch: sim
  model: llama-3.1-8b
flags:
  api-key: {key}
workload:
  profile: azure-conv
  seed: 3
load:
  concurrency: [2, 4]
  step_duration_s: {step}
  warmup_s: 0
loadgen:
  workers: 0
  drain_s: 2
{sweep}"""
MATRIX = "sweep:\n  matrix:\n    max-num-seqs: [8, 24]\n"


def _loadlab(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "loadlab", *args], env=env, check=False,
                          capture_output=True, timeout=300)


def _files_holding(root: Path, secret: str) -> list[str]:
    """Every file under ``root`` whose bytes hold ``secret`` (parquet, logs, locks included)."""
    return [str(p) for p in sorted(root.rglob("*"))
            if p.is_file() and secret.encode() in p.read_bytes()]


def _assert_nowhere(secret: str, out: Path, proc: subprocess.CompletedProcess[bytes]) -> None:
    assert _files_holding(out, secret) == []
    assert secret.encode() not in proc.stdout and secret.encode() not in proc.stderr


def test_a_what_if_sweep_writes_no_key(tmp_path: Path) -> None:
    key = f"sk-{secrets.token_hex(12)}"
    scenario = tmp_path / "s.yaml"
    scenario.write_text(SCENARIO.format(key=key, step=10, sweep=MATRIX))
    out = tmp_path / "out"
    proc = _loadlab("sweep", str(scenario), "--what-if", "--out", str(out))
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    _assert_nowhere(key, out, proc)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["scenario"]["flags"]["api_key"] == "***"
    assert [p["flags"] for p in manifest["points"]] == [
        {"api_key": "***", "max_num_seqs": 8}, {"api_key": "***", "max_num_seqs": 24}]
    assert "<dt>api_key</dt><dd>***</dd>" in (out / "report.html").read_text()


def test_a_live_sweep_sends_the_key_and_writes_none(tmp_path: Path) -> None:
    """The simulator answers 401 without the key: the point completing proves it was sent."""
    key = f"sk-{secrets.token_hex(12)}"
    scenario = tmp_path / "s.yaml"
    scenario.write_text(SCENARIO.format(key=key, step=2, sweep=""))
    out = tmp_path / "out"
    proc = _loadlab("sweep", str(scenario), "--out", str(out),
                    env={**os.environ, "LOADLAB_API_KEY": key})
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    manifest = json.loads((out / "manifest.json").read_text())
    assert [p["status"] for p in manifest["points"]] == ["complete"]
    point = json.loads((out / "run" / "manifest.json").read_text())
    assert "***" in point["target"]["launch"]["argv"]
    _assert_nowhere(key, out, proc)
    # the manifest cannot give the key back: resuming without the scenario file is refused
    again = _loadlab("sweep", "--resume", str(out), env={**os.environ, "LOADLAB_API_KEY": key})
    assert again.returncode == 2 and b"resume with the scenario file" in again.stderr


def test_a_report_of_an_older_folder_hides_its_key(tmp_path: Path) -> None:
    """A sweep folder written before redaction (the key in clear) reports with ``***``."""
    key = f"sk-{secrets.token_hex(12)}"
    scenario = tmp_path / "s.yaml"
    scenario.write_text(SCENARIO.format(key="x", step=10, sweep=MATRIX))
    out = tmp_path / "out"
    assert _loadlab("sweep", str(scenario), "--what-if", "--out", str(out)).returncode == 0
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["scenario"]["flags"]["api_key"] = key
    for point in manifest["points"]:
        point["flags"]["api_key"] = key
    (out / "manifest.json").write_text(json.dumps(manifest))
    report = tmp_path / "report.html"
    proc = _loadlab("report", str(out), "--out", str(report))
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    assert key not in report.read_text() and "<dt>api_key</dt><dd>***</dd>" in report.read_text()


def test_what_counts_as_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    assert all(map(is_secret_name, ["api_key", "--api-key", "hf_token", "db-password", "secret"]))
    assert not any(map(is_secret_name, ["api_key_env", "long_prefill_token_threshold",
                                        "max_num_batched_tokens", "ssl_keyfile"]))
    monkeypatch.setenv("VLLM_API_KEY", "env-key-123")
    assert redact({"error": "refused env-key-123", "hf_token": 7, "n": 8}) == {
        "error": "refused ***", "hf_token": "***", "n": 8}
    assert redact(["serve", "--api-key", "k", "--hf-token=t", "--max-num-seqs", "8"]) == [
        "serve", "--api-key", "***", "--hf-token=***", "--max-num-seqs", "8"]
    assert redact("refused: --api-key abc --block-size 16; the kv-cache key 5") == (
        "refused: --api-key *** --block-size 16; the kv-cache key 5")
