"""A live adaptive knee search through `loadlab sweep` on the simulator: each step judged
from the run folder before the next is chosen, the bracket where the sequence cap puts it."""

from __future__ import annotations

import json
import re
import subprocess
import sys

from loadlab.runstore.manifest import RunManifest, load_manifest

MAX_NUM_SEQS = 6
SCENARIO = """\
name: live-search
description: knee search over 2..16 users against max-num-seqs 6
target:
  launch: sim
  model: llama-3.1-8b
flags:
  gpu: h100
  max-num-seqs: {cap}
workload:
  profile: {profile}
  seed: 2
load:
  search: {{start: 2, max: 16, resolution: 2}}
  step_duration_s: 4
  warmup_s: 1
loadgen:
  drain_s: 2
  collect_interval_s: 0.5
"""
def test_live_search_brackets_the_sequence_cap(tmp_path, uniform_profile):
    # Short requests (E2E well under a second on the simulated H100): a step holds dozens,
    # and the queue a stalled step leaves is gone within the next step's warm-up.
    profile = uniform_profile("short", (50, 150), (40, 80))
    scenario = tmp_path / "search.yaml"
    scenario.write_text(SCENARIO.format(cap=MAX_NUM_SEQS, profile=profile))
    out = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "loadlab", "sweep", str(scenario), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]

    point = out / "run"   # a scenario without a sweep: its one point
    manifest = load_manifest(point)
    assert isinstance(manifest, RunManifest) and manifest.status == "complete"
    search = manifest.search
    assert search is not None, "the manifest records the search"
    # waiting = users - max_num_seqs: the last good level is the cap, the first stalled one
    # step above
    assert (search["lower"], search["upper"]) == (MAX_NUM_SEQS, MAX_NUM_SEQS + 2)
    levels = [level for level, _ in search["steps"]]
    assert levels == [2, 4, 8, 6], "coarse 2, 4, 8 (stalled), then bisection at 6"
    assert [stalled for _, stalled in search["steps"]] == [False, False, True, False]
    # every step the search ran is a step of the run folder, in order, at its level
    assert [s.concurrency for s in manifest.steps] == levels
    assert all(s.client_limited is False for s in manifest.steps)
    # the step after the stalled one settles: its warm-up is lengthened by settle_s (= warm-up)
    assert [s.warmup_s for s in manifest.steps] == [1.0, 1.0, 1.0, 2.0]
    assert manifest.plan is not None and manifest.plan["steps"] == []

    analysis = json.loads((point / "analysis.json").read_text())
    assert (analysis["knee"]["lower"], analysis["knee"]["upper"]) == (
        search["lower"],
        search["upper"],
    )
    assert [row["state"] for row in analysis["steps"]] == ["ok", "ok", "stalled", "ok"]
    # progress names the step and its level without a total (a search does not know it)
    lines = re.findall(r"step (\d+)(/\d+)? level=(\d+)", done.stderr)
    assert lines and all(total == "" for _, total, _ in lines)
    assert {(int(i), int(level)) for i, _, level in lines} <= {(1, 2), (2, 4), (3, 8), (4, 6)}
