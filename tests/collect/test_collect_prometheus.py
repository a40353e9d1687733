"""The same run collected directly and through a real Prometheus gives the same statistics."""

from __future__ import annotations

import threading
import time

import pandas as pd
import pytest
from collect_pages import GENERATED, RUNNING

from loadlab.analyze.windows import counter_windows, coverage_windows, gauge_windows
from loadlab.cli import main
from loadlab.collect.prometheus import (
    histogram_quantile_query,
    rate_query,
    read_prometheus,
)
from loadlab.collect.scraper import Scraper
from loadlab.collect.testing import prometheus_binary, running_prometheus
from loadlab.runstore import METRICS, SCRAPES, read_manifest, read_table

pytestmark = [
    pytest.mark.prometheus,
    pytest.mark.skipif(
        prometheus_binary() is None,
        reason="needs a Prometheus binary: apt-get install -y prometheus (Debian/Ubuntu)",
    ),
]

PHASE_SCRAPES = 5  # direct 1 Hz scrapes per phase: a few seconds of each gauge level


def test_direct_and_prometheus_agree_per_window(tmp_path, page_server):
    server = page_server("ok")
    server.grow(GENERATED, 40.0)
    direct, via_prom = tmp_path / "direct", tmp_path / "prom"
    phases = []
    with running_prometheus([f"127.0.0.1:{server.port}"]) as prom_url:
        wait_for_scrape(prom_url, time.time() - 60)
        with Scraper([server.url], direct, interval_s=1.0) as scraper:
            for level in (2, 6):
                server.set(RUNNING, level)
                t_start = time.time()
                done = scraper.stats()[server.url].ok + PHASE_SCRAPES
                assert scraper.wait_until(lambda st, done=done: st[server.url].ok >= done, 30)
                phases.append((t_start, time.time(), level))
        t_end = phases[-1][1]
        wait_for_scrape(prom_url, t_end)
        main(
            [
                "collect",
                "--prometheus-url",
                prom_url,
                "--start",
                str(t_end - 60),
                "--end",
                str(t_end + 0.5),
                "--prometheus-match",
                'job="vllm"',
                "--out",
                str(via_prom),
            ]
        )
        stepped, _ = read_prometheus(prom_url, t_end - 60, t_end, step_s=1.0)
    # interior of each phase: one scrape interval trimmed at each edge
    windows = pd.DataFrame([(a + 1.0, b - 1.0, lv) for a, b, lv in phases],
                           columns=["t_start", "t_end", "level"])
    got = {}
    for name, folder in (("direct", direct), ("prometheus", via_prom)):
        metrics = read_table(folder / "metrics.parquet", METRICS)
        scrapes = read_table(folder / "scrapes.parquet", SCRAPES)
        assert set(metrics.source) == {name}
        got[name] = (gauge_windows(metrics, "vllm:num_requests_running", windows),
                     counter_windows(metrics, "vllm:generation_tokens", windows),
                     coverage_windows(scrapes, windows, interval_s=1.0))
    for name, (gauge, counter, coverage) in got.items():
        assert gauge["mean"].tolist() == [2.0, 6.0], name
        assert gauge["max"].tolist() == [2.0, 6.0], name
        assert gauge["occupancy"].tolist() == [1.0, 1.0], name
        assert counter.rate_per_s.tolist() == pytest.approx([40.0, 40.0], rel=0.1), name
        # scrapes inside every window (how close coverage comes to 1 is the machine's timing:
        # a starved test thread ends a phase late and stretches its window)
        assert (coverage.ok > 0).all(), name
    (d_gauge, _, _), (p_gauge, _, _) = got["direct"], got["prometheus"]
    # query_range mode (values at evaluation steps) agrees on the same windows
    assert gauge_windows(stepped, "vllm:num_requests_running", windows)["mean"].tolist() == [
        2.0,
        6.0,
    ]
    assert d_gauge["p95"].tolist() == p_gauge["p95"].tolist()
    assert abs(d_gauge["n"] - p_gauge["n"]).max() <= 2
    # raw rows look the same: same series, same label spelling, same families and types
    d_metrics = read_table(direct / "metrics.parquet", METRICS)
    p_metrics = read_table(via_prom / "metrics.parquet", METRICS)
    key = ["family", "type", "metric", "labels"]
    assert set(map(tuple, d_metrics[key].drop_duplicates().to_numpy())) == \
        set(map(tuple, p_metrics[key].drop_duplicates().to_numpy()))
    assert set(p_metrics.endpoint) == {server.url}
    assert read_manifest(via_prom)["metrics"]["vllm_engine"] == "v1"


def wait_for_scrape(url: str, after: float) -> None:
    """Poll (with a deadline) until Prometheus holds a successful scrape after ``after``."""
    deadline = time.monotonic() + 20
    pause = threading.Event()
    while time.monotonic() < deadline:
        _, scrapes = read_prometheus(url, after - 1, time.time())
        if len(scrapes) and scrapes[scrapes.ok].t.max() > after + 0.5:
            return
        pause.wait(0.25)
    raise AssertionError("Prometheus did not scrape the target in time")


def test_promql_helpers_spell_the_usual_queries():
    assert rate_query("vllm:generation_tokens", 30, ["engine"]) == \
        "sum by (engine) (rate(vllm:generation_tokens_total[30s]))"
    assert histogram_quantile_query(0.95, "vllm:time_to_first_token_seconds", 60) == \
        "histogram_quantile(0.95, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket[60s])))"
