"""The vectorised window statistics equal the per-series loops they replaced, on random data.

Random METRICS frames (several endpoints, engines, label sets, counter resets, samples
missing per series, rows shuffled) and random windows (overlapping, empty, outside the
data), as plain strings and as the categoricals the analyzer reads; every function
against :mod:`windows_reference` (the code before vectorisation), frames compared exactly.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import windows_reference as ref

from loadlab.analyze import gauge_lag, windows

EPS = ["http://b:1", "http://a:1", "http://c:2"]
COUNTER, HIST, GAUGE = (
    "vllm:generation_tokens",
    "vllm:request_queue_time_seconds",
    "vllm:num_requests_waiting",
)
BOUNDS = ["0.1", "0.5", "2.5", "+Inf"]


def labels(**kv) -> str:
    return json.dumps(kv, sort_keys=True, separators=(",", ":"))


def random_metrics(rng: np.random.Generator) -> pd.DataFrame:
    rows = []

    def series(endpoint, family, type_, metric, lab, values, times):
        keep = rng.uniform(size=len(times)) > 0.15  # this series misses some scrapes
        rows.extend(
            {
                "t": t,
                "scrape_s": 0.002,
                "endpoint": endpoint,
                "family": family,
                "type": type_,
                "metric": metric,
                "labels": lab,
                "value": float(v),
                "source": "direct",
            }
            for t, v in zip(times[keep], values[keep])
        )

    def counter(n):
        inc = rng.poisson(3.0, n).astype(float)
        v = np.cumsum(inc)
        for at in rng.integers(1, n, rng.integers(0, 3)):   # server restarts
            v[at:] -= v[at - 1] - rng.integers(0, 3)
        return v

    for endpoint in EPS[: rng.integers(1, 4)]:
        n = int(rng.integers(5, 60))
        times = np.sort(rng.choice(np.arange(0, 200, 0.5), n, replace=False)) + rng.uniform(0, 0.01)
        for engine in map(str, range(rng.integers(1, 3))):
            series(
                endpoint,
                COUNTER,
                "counter",
                COUNTER + "_total",
                labels(engine=engine, model_name="m"),
                counter(n),
                times,
            )
            obs = np.sort(np.cumsum(rng.poisson(2.0, (n, len(BOUNDS))), axis=0), axis=1)
            for k, le in enumerate(BOUNDS):
                series(endpoint, HIST, "histogram", HIST + "_bucket", labels(engine=engine, le=le),
                       obs[:, k], times)
            series(
                endpoint,
                HIST,
                "histogram",
                HIST + "_count",
                labels(engine=engine),
                obs[:, -1],
                times,
            )
            series(endpoint, HIST, "histogram", HIST + "_sum", labels(engine=engine),
                   np.cumsum(rng.uniform(0, 3, n)), times)
            for reason in ("capacity", "deferred", None):
                lab = (
                    labels(engine=engine)
                    if reason is None
                    else labels(engine=engine, reason=reason)
                )
                series(
                    endpoint,
                    GAUGE,
                    "gauge",
                    GAUGE,
                    lab,
                    rng.integers(0, 4, n) * rng.uniform(0.5, 1.5),
                    times,
                )
    frame = pd.DataFrame(rows)
    return frame.iloc[rng.permutation(len(frame))].reset_index(drop=True)


def random_windows(rng: np.random.Generator) -> pd.DataFrame:
    n = int(rng.integers(1, 12))
    start = np.round(rng.uniform(-20, 220, n), 1)
    length = np.where(rng.uniform(size=n) < 0.15, 0.0, np.round(rng.uniform(0, 80, n), 1))
    return pd.DataFrame({"step": np.arange(n), "t_start": start, "t_end": start + length})


def categorical(frame: pd.DataFrame) -> pd.DataFrame:
    """As ``read_metrics`` returns it: string columns as categoricals, categories sorted."""
    cats = ["endpoint", "family", "type", "metric", "labels", "source"]
    return frame.astype({c: pd.CategoricalDtype(sorted(frame[c].unique())) for c in cats})


CASES = [
    ("counter_windows", COUNTER, {}),
    ("counter_windows", COUNTER, {"by": ["engine"]}),
    ("counter_windows", COUNTER, {"by": ["endpoint"], "where": {"engine": "0"}}),
    ("counter_windows", HIST, {"metric": HIST + "_sum", "by": ["endpoint", "engine"]}),
    ("histogram_windows", HIST, {}),
    ("histogram_windows", HIST, {"by": ["endpoint"]}),
    (
        "histogram_windows",
        HIST,
        {"by": ["engine"], "where": {"engine": "1"}, "quantiles": (0.1, 0.999)},
    ),
    ("histogram_buckets", HIST, {}),
    ("histogram_buckets", HIST, {"by": ["endpoint"]}),
    ("gauge_windows", GAUGE, {}),
    ("gauge_windows", GAUGE, {"by": ()}),
    ("gauge_windows", GAUGE, {"by": ("endpoint", "reason")}),
    ("gauge_windows", GAUGE, {"by": ["engine"], "where": {"reason": "capacity"}}),
    ("counter_windows", "vllm:absent", {}),
    ("gauge_windows", "vllm:absent", {}),
]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("as_categories", [False, True], ids=["str", "categorical"])
def test_window_statistics_equal_the_reference(seed, as_categories):
    rng = np.random.default_rng(seed)
    metrics, wins = random_metrics(rng), random_windows(rng)
    data = categorical(metrics) if as_categories else metrics
    span = list(zip(wins.t_start, wins.t_end))
    for name, family, kwargs in CASES:
        for w in (wins, span):
            got = getattr(windows, name)(data, family, w, **kwargs)
            expected = getattr(ref, name)(metrics, family, w, **kwargs)
            pd.testing.assert_frame_equal(got, expected, obj=f"{name}({family}, {kwargs})")


@pytest.mark.parametrize("seed", range(5))
def test_gauge_lag_parts_equal_the_reference(seed):
    rng = np.random.default_rng(100 + seed)
    metrics, wins = random_metrics(rng), random_windows(rng)
    tokens = COUNTER
    for data in (metrics, categorical(metrics)):
        got = windows.snapshots(data, GAUGE, metric=GAUGE)
        pd.testing.assert_frame_equal(
            got.astype({"endpoint": str}),
            ref._snapshots(metrics, GAUGE, GAUGE).astype({"endpoint": str}),
        )
        np.testing.assert_array_equal(gauge_lag.stale_share(data, GAUGE, tokens, wins),
                                      ref.stale_share(metrics, GAUGE, tokens, wins))
    n = int(rng.integers(0, 3000))
    sent = rng.uniform(-10, 220, n)
    done = sent + rng.exponential(rng.uniform(0.1, 30), n)
    done[rng.uniform(size=n) < 0.05] = np.nan                # still in flight at the end
    requests = pd.DataFrame({"t_sent": sent, "t_done": done})
    np.testing.assert_allclose(gauge_lag.client_inflight(requests, wins),
                               ref.client_inflight(requests, wins), rtol=1e-12, atol=1e-12)


def test_requests_never_sent_are_not_in_flight():
    wins = pd.DataFrame({"t_start": [0.0], "t_end": [10.0]})
    requests = pd.DataFrame({"t_sent": [1.0, np.nan], "t_done": [6.0, np.nan]})
    assert gauge_lag.client_inflight(requests, wins).tolist() == [0.5]
