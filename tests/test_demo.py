"""The README's first command: `loadlab demo` runs end to end on the simulator (quick variant)."""

from __future__ import annotations

import json
import subprocess
import sys

from loadlab.runstore.manifest import SweepManifest, load_manifest


def test_demo_quick_sweeps_ab_and_caps_reports_and_prints_verdicts(tmp_path):
    out = tmp_path / "demo"
    proc = subprocess.run([sys.executable, "-m", "loadlab", "demo", "--quick", "--out", str(out)],
                          check=False, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    live, whatif = load_manifest(out / "live"), load_manifest(out / "whatif")
    assert isinstance(live, SweepManifest) and isinstance(whatif, SweepManifest)
    assert live.status == whatif.status == "complete" and live.sweep.mode == "matrix"
    names = [p.name for p in live.points]
    assert names == [p.name for p in whatif.points] and len(names) == 4
    assert all(p.status == "complete" for p in live.points) and all(
        p.what_if for p in whatif.points
    )
    # the report is written and its path printed
    assert (out / "live" / "report.html").exists() and str(
        out / "live" / "report.html"
    ) in proc.stdout
    analyses = {
        p.name: json.loads((out / "live" / p.dir / "analysis.json").read_text())
        for p in live.points
    }
    for name, analysis in analyses.items():
        assert analysis["verdict"] in proc.stdout
        # 16 users against 8 slots (and 24): the sequence cap, KV far from full
        if name.startswith("max-num-seqs-8_"):
            assert analysis["knee"]["upper"] == 16 and analysis["cause"]["name"] == "seq_cap", (
                analysis["verdict"]
            )
    # prefix caching: hits with it on, none off; the same seeded requests went to every point
    on = analyses["max-num-seqs-8_enable-prefix-caching-on"]["steps"]
    off = analyses["max-num-seqs-8_enable-prefix-caching-off"]["steps"]
    assert all(s["prefix_hit_rate"] > 0.2 for s in on) and not any(
        s["prefix_hit_rate"] for s in off
    )
    assert on[0]["ttft_p50_ms"] < off[0]["ttft_p50_ms"]
    assert "predicted:" in proc.stdout and "hit rate" in proc.stdout
