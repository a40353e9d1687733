"""Window statistics on constructed series: counters with resets, histogram quantiles, gauges."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from loadlab.analyze.windows import (
    counter_windows,
    coverage_windows,
    gauge_windows,
    histogram_buckets,
    histogram_quantile,
    histogram_windows,
    resolve_family,
)

EP = "http://a:1"


def rows(family, type_, metric, labels, ts, values, endpoint=EP):
    lab = json.dumps(labels, sort_keys=True, separators=(",", ":"))
    return [
        {
            "t": float(t),
            "scrape_s": 0.001,
            "endpoint": endpoint,
            "family": family,
            "type": type_,
            "metric": metric,
            "labels": lab,
            "value": float(v),
            "source": "direct",
        }
        for t, v in zip(ts, values)
    ]


def frame(*parts):
    return pd.DataFrame([r for p in parts for r in p])


def test_counter_increase_and_rate_survive_a_reset():
    ts = np.arange(0, 21)                     # one sample a second
    values = list(np.arange(0, 11) * 5.0)     # 0..50 in 10 s, +5/s
    values += [3.0, 8, 13, 18, 23, 28, 33, 38, 43, 48]  # restart at t=11: 3 accrued, then +5/s
    m = frame(rows("vllm:generation_tokens", "counter", "vllm:generation_tokens_total",
                   {"engine": "0"}, ts, values))
    out = counter_windows(m, "vllm:generation_tokens", [(0, 10), (10, 20), (5, 15)])
    assert list(out.delta) == [50.0, 3 + 45.0, 25 + 3 + 20.0]
    assert list(out.resets) == [0, 1, 1]
    assert out.rate_per_s.iloc[0] == pytest.approx(5.0)
    assert out.rate_per_s.iloc[1] == pytest.approx(4.8)


def test_counter_sums_engines_or_keeps_them_apart():
    ts = np.arange(0, 11)
    m = frame(rows("vllm:num_preemptions", "counter", "vllm:num_preemptions_total",
                   {"engine": "0"}, ts, ts * 1.0),
              rows("vllm:num_preemptions", "counter", "vllm:num_preemptions_total",
                   {"engine": "1"}, ts, ts * 3.0))
    total = counter_windows(m, "vllm:num_preemptions", [(0, 10)])
    assert total.delta.tolist() == [40.0]
    split = counter_windows(m, "vllm:num_preemptions", [(0, 10)], by=["engine"])
    assert dict(zip(split.engine, split.delta)) == {"0": 10.0, "1": 30.0}
    only1 = counter_windows(m, "vllm:num_preemptions", [(0, 10)], where={"engine": "1"})
    assert only1.delta.tolist() == [30.0]


def test_histogram_quantile_matches_numpy_on_uniform_data():
    rng = np.random.default_rng(7)
    data = rng.uniform(0, 10, 200_000)
    bounds = np.append(np.arange(0.5, 10.01, 0.5), np.inf)
    cumulative = [(data <= b).sum() for b in bounds]
    for q in (0.1, 0.5, 0.9, 0.99):
        assert histogram_quantile(q, bounds, cumulative) == pytest.approx(
            np.quantile(data, q), abs=0.02
        )


def test_histogram_quantile_edge_cases_follow_prometheus():
    bounds = [1.0, 2.0, np.inf]
    assert histogram_quantile(0.99, bounds, [0, 1, 10]) == 2.0  # rank in +Inf: highest finite bound
    assert histogram_quantile(0.5, bounds, [4, 4, 4]) == pytest.approx(0.5)  # first bucket from 0
    assert np.isnan(histogram_quantile(0.5, bounds, [0, 0, 0]))


def test_histogram_windows_use_bucket_deltas_per_window():
    """Window 1 observes 0.05 s ten times, window 2 observes 3 s ten times."""
    fam = "vllm:time_to_first_token_seconds"
    bounds = ["0.1", "1.0", "5.0", "+Inf"]
    ts = [0, 10, 20]
    cum = {"0.1": [0, 10, 10], "1.0": [0, 10, 10], "5.0": [0, 10, 20], "+Inf": [0, 10, 20]}
    parts = [rows(fam, "histogram", fam + "_bucket", {"engine": "0", "le": le}, ts, cum[le])
             for le in bounds]
    parts.append(rows(fam, "histogram", fam + "_count", {"engine": "0"}, ts, [0, 10, 20]))
    parts.append(rows(fam, "histogram", fam + "_sum", {"engine": "0"}, ts, [0, 0.5, 30.5]))
    m = frame(*parts)
    out = histogram_windows(
        m, fam, pd.DataFrame({"step": [1, 2], "t_start": [0, 10], "t_end": [10, 20]})
    )
    assert out.step.tolist() == [1, 2]
    assert out["count"].tolist() == [10, 10]
    assert out["mean"].tolist() == pytest.approx([0.05, 3.0])
    assert out.p50.iloc[0] == pytest.approx(0.05)             # half-way through (0, 0.1]
    assert out.p50.iloc[1] == pytest.approx(1.0 + 4.0 * 0.5)  # half-way through (1, 5]
    buckets = histogram_buckets(m, fam, [(0, 10), (10, 20)])
    assert buckets[buckets.t_start == 10].set_index("le")["count"].to_dict() == \
        {0.1: 0, 1.0: 0, 5.0: 10, float("inf"): 10}


def test_gauge_statistics_sum_engines_per_snapshot():
    ts = np.arange(0, 10) + 0.5
    m = frame(rows("vllm:num_requests_running", "gauge", "vllm:num_requests_running",
                   {"engine": "0"}, ts, [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]),
              rows("vllm:num_requests_running", "gauge", "vllm:num_requests_running",
                   {"engine": "1"}, ts, [0] * 10))
    out = gauge_windows(m, "vllm:num_requests_running", [(0, 10), (0, 4)])
    first = out.iloc[0]
    assert first.n == 10 and first["mean"] == pytest.approx(2.0) and first["max"] == 4
    assert first.occupancy == pytest.approx(0.8)
    assert first.p95 == pytest.approx(np.percentile([0, 0, 1, 1, 2, 2, 3, 3, 4, 4], 95))
    assert out.iloc[1].n == 4 and out.iloc[1]["last"] == 1


def test_coverage_counts_gaps_and_names_the_main_cause():
    scrapes = pd.DataFrame({
        "t": np.arange(0, 10) + 0.1, "endpoint": EP,
        "duration_s": 0.01, "ok": [True] * 6 + [False] * 4, "http_status": 200, "n_samples": 300,
        "error": [None] * 6 + ["timeout", "timeout", "missed tick", "refused"],
    })
    out = coverage_windows(scrapes, [(0, 10), (0, 5)], interval_s=1.0)
    assert out.coverage.tolist() == pytest.approx([0.6, 1.0])
    assert out.missed.tolist() == [1, 0]
    assert out.main_error.iloc[0] == "timeout"


def test_resolve_family_prefers_the_current_name():
    m = frame(
        rows("vllm:gpu_cache_usage_perc", "gauge", "vllm:gpu_cache_usage_perc", {}, [0], [0.1])
    )
    assert resolve_family(m, "kv_usage") == "vllm:gpu_cache_usage_perc"
    m2 = pd.concat([m, frame(rows("vllm:kv_cache_usage_perc", "gauge", "vllm:kv_cache_usage_perc",
                                  {}, [0], [0.1]))])
    assert resolve_family(m2, "kv_usage") == "vllm:kv_cache_usage_perc"
