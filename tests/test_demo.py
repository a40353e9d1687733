"""The README's first command: `loadlab demo` runs end to end on the simulator."""

from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd


def test_demo_quick_shows_the_sequence_cap_picture(tmp_path):
    out = tmp_path / "demo"
    proc = subprocess.run([sys.executable, "-m", "loadlab", "demo", "--quick", "--out", str(out)],
                          check=False, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Live run" in proc.stdout and "--max-num-seqs 48" in proc.stdout
    # it ends with a verdict per run: the live one and each what-if point
    verdicts = proc.stdout.split("\nVerdicts:\n")[1].splitlines()
    assert [v.split(":")[0].strip() for v in verdicts[:3]] == [
        "live", "what-if --max-num-seqs 12", "what-if --max-num-seqs 48"]
    assert "knee between 12 and 24 concurrent" in verdicts[0] and "sequence cap" in verdicts[0]
    assert "knee between 12 and 24 concurrent" in verdicts[1] and "running held at 12" in verdicts[1]
    assert "knee between 48 and 96 concurrent" in verdicts[2] and "running held at 48" in verdicts[2]
    manifest = json.loads((out / "live" / "manifest.json").read_text())
    assert manifest["status"] == "complete"
    assert [s["concurrency"] for s in manifest["steps"]] == [3, 6, 12, 24]
    # the analyzer's view of the live run, re-read from the folder as a user would
    table = json.loads(subprocess.run([sys.executable, "-m", "loadlab", "analyze", str(out / "live"), "--json"],
                                      capture_output=True, text=True, check=True).stdout)["steps"]
    last = table[-1]
    assert last["running_max"] == 12            # pinned at --max-num-seqs 12
    assert last["waiting_max"] >= 8             # 24 users, 12 slots
    assert last["kv_max"] < 0.5                 # while KV usage stays low
    requests = pd.read_parquet(out / "live" / "requests.parquet")
    assert (requests.status == "ok").sum() > 20
    # what-if: a larger cap removes the queue at 48 users
    small = json.loads(subprocess.run([sys.executable, "-m", "loadlab", "analyze",
                                       str(out / "whatif-max-num-seqs-12"), "--json"],
                                      capture_output=True, text=True, check=True).stdout)["steps"]
    large = json.loads(subprocess.run([sys.executable, "-m", "loadlab", "analyze",
                                       str(out / "whatif-max-num-seqs-48"), "--json"],
                                      capture_output=True, text=True, check=True).stdout)["steps"]
    assert small[3]["waiting_mean"] > 30 and large[3]["waiting_mean"] < 1
