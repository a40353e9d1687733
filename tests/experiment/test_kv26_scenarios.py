"""The two shipped "KV at 26% and a queue" scenarios, in virtual time: the same dashboard
(KV usage about a quarter, requests waiting), each with its own cause in the loadlab:
refusal series."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from loadlab.experiment.runner import run_sweep
from loadlab.experiment.scenarios import load_scenario, scenario_path
from loadlab.runstore import METRICS, read_table


def what_if(name: str, out: Path) -> dict[str, pd.DataFrame]:
    """Each arm's metrics, by arm name."""
    run_sweep(load_scenario(scenario_path(name)), out, what_if=True)
    return {path.parent.name: read_table(path, METRICS) for path in out.glob("*/metrics.parquet")}


def series(metrics: pd.DataFrame, name: str) -> pd.Series:
    return metrics[metrics.metric == name].set_index("t").value


def refused_by_reason(metrics: pd.DataFrame) -> dict[str, float]:
    rows = metrics[metrics.metric == "loadlab:scheduler_refused_steps_total"]
    last = rows[rows.t == rows.t.max()]
    return {json.loads(labels)["reason"]: v for labels, v in zip(last.labels, last.value)}


@pytest.mark.parametrize("name, reason", [("kv-26-percent-long-head", "kv_blocks"),
                                          ("kv-26-percent-seq-cap", "seq_cap")])
def test_same_dashboard_different_cause(tmp_path: Path, name: str, reason: str) -> None:
    arms = what_if(name, tmp_path)
    metrics = arms.pop("as-deployed")
    kv = series(metrics, "vllm:kv_cache_usage_perc")
    waiting = series(metrics, "vllm:num_requests_waiting")
    warm = kv.index > kv.index.min() + 10
    assert 0.2 < kv[warm].mean() < 0.33, kv[warm].mean()
    assert waiting[warm].mean() > 0.5
    refused = refused_by_reason(metrics)
    assert refused[reason] > 0.8 * sum(refused.values()), refused
    if reason == "kv_blocks":  # the head needed more blocks than were free, KV mostly free
        needed = series(metrics, "loadlab:scheduler_head_blocks_needed")
        free = series(metrics, "loadlab:scheduler_head_free_blocks")
        assert ((needed > free) & (kv < 0.5))[warm].mean() > 0.5
        assert refused["seq_cap"] == 0
    else:  # held at the cap: the last refused step saw the cap's worth running
        assert series(metrics, "loadlab:scheduler_head_running").iloc[-1] == 10
        assert refused["kv_blocks"] == 0
    (fixed,) = arms.values()  # the other arm lifts the limit: its reason all but vanishes
    assert refused_by_reason(fixed)[reason] < 0.02 * refused[reason]
