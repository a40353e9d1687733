"""Gauge lag: an honest gauge agrees with counters and the client; a stale one is caught."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from loadlab.analyze.gauge_lag import client_inflight, gauge_lag
from loadlab.analyze.steps import measured_windows
from loadlab.replay.driver import run_replay
from loadlab.runstore import METRICS, REQUESTS, read_manifest, read_table
from loadlab.sim.engine.config import SimConfig
from loadlab.spec.plan import LoadPlan
from loadlab.spec.scenario import Workload

RUNNING = "vllm:num_requests_running"


@pytest.fixture(scope="module")
def capped_run(tmp_path_factory):
    """Closed loop 4 -> 24 users against max_num_seqs 8 (simulator: gauges are exact)."""
    out = tmp_path_factory.mktemp("lag")
    run_replay(SimConfig(max_num_seqs=8, model="qwen2.5-7b", gpu="h100"),
               LoadPlan(concurrency=[4, 24], step_duration_s=30.0, warmup_s=5.0),
               Workload(profile="azure-conv", seed=5), out)
    return (
        read_table(out / "metrics.parquet", METRICS),
        read_table(out / "requests.parquet", REQUESTS),
        measured_windows(read_manifest(out)),
    )


def test_honest_gauge_agrees_with_counters_and_client(capped_run):
    metrics, requests, wins = capped_run
    lag = gauge_lag(metrics, requests, wins)
    capped = lag.iloc[1]
    assert 7.5 <= capped.running_gauge <= 8  # pinned at the cap but for refill snapshots
    assert capped.running_itl == pytest.approx(capped.running_gauge, rel=0.1)
    assert capped.stale_share == 0
    # running + waiting is what the client has in flight: 24 users, always resending
    assert capped.inflight_client == pytest.approx(24, rel=0.02)
    assert capped.inflight_gauge == pytest.approx(capped.inflight_client, rel=0.05)
    assert lag.iloc[0].running_itl == pytest.approx(4, rel=0.1)


def test_stale_zero_readings_are_measured(capped_run):
    """Emulate the starved API server: running reads 0 in every other snapshot."""
    metrics, requests, wins = capped_run
    snap_times = np.sort(metrics.loc[metrics.family == RUNNING, "t"].unique())
    stale_t = set(snap_times[::2])
    lagging = metrics.copy()
    hit = (lagging.family == RUNNING) & lagging.t.isin(stale_t)
    lagging.loc[hit, "value"] = 0.0
    honest, stale = (
        gauge_lag(metrics, requests, wins).iloc[1],
        gauge_lag(lagging, requests, wins).iloc[1],
    )
    assert stale.stale_share == pytest.approx(0.5, abs=0.1)
    assert stale.running_gauge == pytest.approx(honest.running_gauge / 2, rel=0.15)
    # the counter-derived figure does not read the gauge
    assert stale.running_itl == honest.running_itl


def test_client_inflight_is_exact_overlap():
    reqs = pd.DataFrame({"t_sent": [0.0, 1.0, 2.0, 9.0], "t_done": [4.0, 3.0, np.nan, 20.0]})
    wins = pd.DataFrame({"t_start": [0.0, 10.0], "t_end": [10.0, 12.0]})
    # [0,10): 4 + 2 + 8 (never done: until the end) + 1 = 15 request-seconds
    np.testing.assert_allclose(client_inflight(reqs, wins), [1.5, 2.0])


def test_missing_families_give_nan_not_errors(capped_run):
    metrics, requests, wins = capped_run
    lag = gauge_lag(metrics[metrics.family != RUNNING], requests, wins)
    assert lag.running_gauge.isna().all() and lag.stale_share.isna().all()
    assert lag.running_itl.notna().all() and lag.inflight_client.notna().all()
