"""The shipped split-by-length scenario, predicted: ``loadlab sweep
scenarios/fleet-split-by-length.yaml --what-if`` prints each point's replicas a line each,
each pool is judged on the requests routed to it, and the measured verdict is each
replica's: the long pool refuses its head in most engine steps at 16 users while the short
pool, stepping far more often, refuses in none. Added up as one server's counters, those
refusals read as a small share, and no stall."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd

from loadlab.analyze.measured import MATERIAL_REFUSED_SHARE, REFUSED, STEPS
from loadlab.analyze.steps import measured_windows
from loadlab.analyze.windows import counter_windows
from loadlab.runstore.analysis_model import read_analysis

SCENARIO = Path(__file__).parents[2] / "scenarios" / "fleet-split-by-length.yaml"
LONG, SHORT = "sim://replay/replica/0", "sim://replay/replica/1"


def test_the_split_what_if_measures_each_pool_on_its_own(tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    done = subprocess.run([sys.executable, "-m", "loadlab", "sweep", str(SCENARIO), "--what-if",
                           "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = (done.stdout + done.stderr).splitlines()
    split = [ln for ln in lines if ln.startswith("[point 1/2 by-length] replica ")]
    assert [ln.split(":", 2)[1] for ln in split] == ["//replay/replica/0 (pool long)",
                                                     "//replay/replica/1 (pool short)"]
    assert len([ln for ln in lines if ln.startswith("[point 2/2 one-pool] replica ")]) == 2
    a = read_analysis(out / "by-length")
    assert a.replicas is not None and a.knee.measured is not None and a.cause.measured is not None
    long, short = (r.knee.measured for r in a.replicas)
    assert long is not None and short is not None
    top = long.refused_share[-1]
    assert top.share >= MATERIAL_REFUSED_SHARE and short.refused_share[-1].share == 0
    assert a.knee.measured.found and a.knee.measured.upper == top.level
    assert (a.cause.measured.model_extra or {})["replica"] == LONG
    assert a.cause.measured.name == a.replicas[0].cause.measured.name    # pools: not routing
    # each pool is judged on the requests routed to it: prompts over 8192 tokens go long
    per_request = [r.capacity.blocks_per_request for r in a.replicas]
    assert per_request[0] is not None and per_request[0] > 8192 / 16
    assert per_request[1] is not None and per_request[1] < 8192 / 16
    # the same counters added up over the fleet, as one server's, stay under the bar
    metrics = pd.read_parquet(out / "by-length" / "metrics.parquet")
    manifest = (out / "by-length" / "manifest.json").read_text()
    wins = measured_windows(json.loads(manifest)).iloc[[-1]]
    steps = counter_windows(metrics, STEPS, wins)["delta"].sum()
    refused = counter_windows(metrics, REFUSED, wins)["delta"].sum()
    assert refused / steps < MATERIAL_REFUSED_SHARE
    # one pool: round-robin strands a queue behind the documents now and then, but the
    # scheduler refuses the head in under 2% of either replica's steps at 16 users, and
    # the inferred knee says what the measured one says
    one = read_analysis(out / "one-pool")
    assert one.knee.measured is not None
    assert (one.knee.found, one.knee.upper) == (one.knee.measured.found, one.knee.measured.upper)
