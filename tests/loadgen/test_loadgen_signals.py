"""SIGTERM stops a run as Ctrl-C does, but says so: exit 143 (128 + 15), the manifest's
``stopped_by``, the console's line. On main it was exit 130 and nothing named the signal."""

from __future__ import annotations

import json
import signal

import pytest
from runs import start_run, wait_for_rows


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_ends_the_run_flushed_with_its_own_exit_code_and_name(
        fault, tiny_profile, tmp_path, sig, code) -> None:
    out = tmp_path / "run"
    with fault("ok", ttft_ms=20) as url:
        proc = start_run("--target", url, "--model", "m", "--profile", str(tiny_profile),
                         "--concurrency", "2", "--step-duration", "60", "--workers", "0",
                         "--no-calibrate", "--out", str(out))
        wait_for_rows(proc, out)
        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == code, stderr[-3000:]
    assert stderr.strip().splitlines()[-1] == (
        f"loadlab: error: run interrupted by {sig.name}; everything measured is in {out}")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "interrupted" and manifest["stopped_by"] == sig.name
