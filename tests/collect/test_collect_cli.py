"""`loadlab collect` end to end: standalone sampling of the simulator and of a served page."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from loadlab.cli import main
from loadlab.runstore import METRICS, SCRAPES, read_manifest, read_table


def test_collect_samples_endpoints_for_a_duration(tmp_path, page_server, capsys):
    a, b = page_server("ok"), page_server("500")
    main(["collect", "--target", a.url, "--target", b.url, "--interval", "0.2", "--duration", "1.2",
          "--out", str(tmp_path)])
    captured = capsys.readouterr()
    out = captured.out
    assert "deprecated" not in captured.err
    assert f"{a.url}: " in out and "engine v1" in out
    assert "last error: http 500" in out
    scrapes = read_table(tmp_path / "scrapes.parquet", SCRAPES)
    assert (
        scrapes[scrapes.endpoint == a.url].ok.sum() >= 1
    )  # how many in 1.2 s is the machine's speed
    assert read_table(tmp_path / "metrics.parquet", METRICS).endpoint.unique().tolist() == [a.url]
    assert read_manifest(tmp_path)["metrics"]["endpoints"][a.url]["vllm_engine"] == "v1"


def test_collect_compacts_what_it_wrote_without_losing_a_sample(tmp_path, page_server, capsys):
    """Endpoints given the old way (arguments) still work, with one deprecation line."""
    a, b = page_server("ok"), page_server("ok")  # one metrics writer each: two parts at least
    main(
        ["collect", a.url, b.url, "--interval", "0.2", "--duration", "1.2", "--out", str(tmp_path)]
    )
    err = capsys.readouterr().err
    assert err.count("deprecated") == 1
    assert ("loadlab: an endpoint given as an argument is deprecated, use --target URL "
            "(the old spelling goes in the next release)\n") in err
    parts = {table: [p.name for p in (tmp_path / table).glob("part-*.parquet")]
             for table in ("metrics.parquet", "scrapes.parquet")}
    assert all(len(names) == 1 for names in parts.values()), parts
    assert "~" in parts["metrics.parquet"][0]               # the compacted part
    scrapes = read_table(tmp_path / "scrapes.parquet", SCRAPES)
    metrics = read_table(tmp_path / "metrics.parquet", METRICS)
    assert set(metrics.endpoint) == {a.url, b.url}
    assert (
        len(metrics) == scrapes.loc[scrapes.ok, "n_samples"].sum() > 0
    )  # every sample of every scrape
    assert not (tmp_path / "requests.parquet").exists()


@pytest.mark.parametrize("argv", [
    ["collect", "--target", "http://127.0.0.1:1", "--interval", "0.01"],
    ["collect", "--target", "http://127.0.0.1:1", "--interval", "1", "--timeout", "2"],
    ["collect"],
    ["collect", "--target", "ftp://x", "--duration", "1"],
    ["collect", "--target", "http://127.0.0.1:1", "--prometheus-url", "http://127.0.0.1:1",
     "--start", "0", "--end", "1"],
    ["collect", "--prometheus-url", "http://127.0.0.1:1", "--start", "yesterday", "--end", "1"],
    ["collect", "--prometheus-url", "http://127.0.0.1:1"],
])
def test_bad_input_exits_2_with_a_fix(tmp_path, argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--out", str(tmp_path)])
    assert exc.value.code == 2
    assert "fix:" in capsys.readouterr().err


def test_scraper_follows_the_simulator_under_load(tmp_path):
    """V1 simulator in its own process: tokens generated show up as counter increases."""
    sim_testing = pytest.importorskip("loadlab.sim.serve.testing")
    from loadlab.analyze.windows import counter_windows
    from loadlab.collect.scraper import Scraper

    with (sim_testing.running_sim(max_num_seqs=4) as url,
          Scraper([url], tmp_path, interval_s=0.2) as scraper):
        assert scraper.wait_until(lambda st: st[url].ok >= 1, 10)
        t0 = time.time()
        with httpx.Client(timeout=30) as client:
            model = client.get(f"{url}/v1/models").json()["data"][0]["id"]
            for _ in range(3):
                r = client.post(f"{url}/v1/completions",
                                json={"model": model, "prompt": "hello there", "max_tokens": 8,
                                      "ignore_eos": True})
                assert r.status_code == 200
        done = scraper.stats()[url].ok + 2
        assert scraper.wait_until(lambda st: st[url].ok >= done, 10)
        t1 = time.time()
    metrics = read_table(tmp_path / "metrics.parquet", METRICS)
    gen = counter_windows(metrics, "vllm:generation_tokens", [(t0 - 1, t1)])
    assert gen.delta.iloc[0] == 24
    ok = counter_windows(metrics, "vllm:request_success", [(t0 - 1, t1)], by=["finished_reason"])
    assert dict(zip(ok.finished_reason, ok.delta))["length"] == 3
    info = read_manifest(tmp_path)["metrics"]["endpoints"][url]
    assert info["vllm_engine"] == "v1"
    assert json.dumps(info["cache_config_info"])  # typed, JSON-clean
    assert info["cache_config_info"]["block_size"] > 0


def test_collector_process_flushes_on_sigterm(tmp_path, page_server):
    """Run as a process (no --duration), stopped by SIGTERM: nothing buffered is lost."""
    import signal
    import subprocess
    import sys

    server = page_server("ok")
    proc = subprocess.Popen([sys.executable, "-m", "loadlab", "collect", "--target", server.url,
                             "--interval", "0.2", "--out", str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        pause = threading.Event()
        while not read_manifest(tmp_path).get("metrics", {}).get("endpoints"):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
            pause.wait(0.05)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0
    assert "scrapes ok" in out
    assert len(read_table(tmp_path / "metrics.parquet", METRICS)) >= 325
    assert read_table(tmp_path / "scrapes.parquet", SCRAPES).ok.sum() >= 1
