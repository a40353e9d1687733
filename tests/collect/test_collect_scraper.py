"""The background scraper against real HTTP servers: faults, vanishing servers, ticks, secrets."""

from __future__ import annotations

from pathlib import Path

import pytest
from collect_pages import LOAD_PAGE

from loadlab.collect.scraper import Scraper
from loadlab.collect.testing import ManualClock, PageServer, free_port
from loadlab.errors import InputError
from loadlab.runstore import METRICS, SCRAPES, read_manifest, read_table

N_VLLM_SAMPLES = 325  # vllm: samples of the 0.32 page, _created timestamps left out


def tables(out: Path):
    return read_table(out / "metrics.parquet", METRICS), read_table(
        out / "scrapes.parquet", SCRAPES
    )


def test_each_fault_is_a_recorded_gap_while_good_endpoints_keep_being_sampled(
    tmp_path, page_server
):
    good = page_server("ok")
    faulty = {mode: page_server(mode) for mode in ("slow", "500", "garbage", "close")}
    refused = f"http://127.0.0.1:{free_port()}"
    with Scraper([good.url, *(s.url for s in faulty.values()), refused], tmp_path,
                 interval_s=0.25, timeout_s=0.2) as scraper:
        assert scraper.wait_until(
            lambda st: st[good.url].ok >= 3 and all(s.attempts >= 3 for s in st.values()), 20)
    stats = scraper.stats()
    metrics, scrapes = tables(tmp_path)
    attempts = scrapes[scrapes.error != "missed tick"]
    causes = attempts.groupby("endpoint").error.agg(lambda e: set(e.dropna()))
    # on a starved CI machine any endpoint may also time out now and then
    expected = {faulty["slow"].url: "timeout", faulty["500"].url: "http 500",
                faulty["garbage"].url: "parse error", faulty["close"].url: "closed connection",
                refused: "refused"}
    for url, cause in expected.items():
        assert cause in causes[url] and causes[url] <= {cause, "timeout"}, (url, causes[url])
    assert causes[good.url] <= {"timeout"}
    assert (attempts[attempts.error == "http 500"].http_status == 500).all()
    # the slow server holds every request 30 s: the 0.2 s deadline cut each one far sooner
    assert attempts[attempts.endpoint == faulty["slow"].url].duration_s.max() < 10.0
    # the good endpoint: every scrape flushed on stop, every vllm sample of each kept raw
    ok = attempts[(attempts.endpoint == good.url) & attempts.ok]
    assert len(ok) == stats[good.url].ok
    assert (ok.n_samples == N_VLLM_SAMPLES).all()
    assert len(metrics) == N_VLLM_SAMPLES * len(ok)
    assert set(metrics.endpoint) == {good.url}
    assert metrics.groupby("t").size().eq(N_VLLM_SAMPLES).all()


def test_a_server_that_disappears_leaves_a_gap_not_a_stopped_run(tmp_path, page_server):
    stays, goes = page_server("ok"), page_server("ok")
    with Scraper([stays.url, goes.url], tmp_path, interval_s=0.2) as scraper:
        assert scraper.wait_until(lambda st: st[goes.url].ok >= 2, 10)
        goes.stop()
        assert scraper.wait_until(lambda st: st[goes.url].attempts > st[goes.url].ok, 10)
        base = scraper.stats()[stays.url].ok  # one scrape may have started before the gap
        assert scraper.wait_until(
            lambda st: (
                st[goes.url].attempts - st[goes.url].ok >= 3 and st[stays.url].ok >= base + 4
            ),
            10,
        )
    _, scrapes = tables(tmp_path)
    gone = scrapes[(scrapes.endpoint == goes.url) & ~scrapes.ok]
    assert set(gone.error) <= {"refused", "closed connection", "missed tick", "timeout"}
    assert "refused" in set(gone.error)
    late_ok = scrapes[(scrapes.endpoint == stays.url) & scrapes.ok & (scrapes.t > gone.t.min())]
    assert len(late_ok) >= 3
    assert set(read_manifest(tmp_path)["metrics"]["endpoints"]) == {stays.url, goes.url}


def test_the_same_server_given_twice_is_scraped_once(tmp_path, page_server):
    server = page_server("ok")
    scraper = Scraper([server.url, f"{server.url}/v1", f"{server.url}/metrics"], tmp_path)
    assert scraper.endpoints == [server.url]


def test_manifest_records_names_generation_and_cache_config(tmp_path, page_server):
    server = page_server("ok")
    with Scraper([server.url], tmp_path, interval_s=0.2) as scraper:
        assert scraper.wait_until(lambda st: st[server.url].ok >= 1, 10)
    metrics = read_manifest(tmp_path)["metrics"]
    info = metrics["endpoints"][server.url]
    assert info["vllm_engine"] == metrics["vllm_engine"] == "v1"
    assert info["names_found"]["kv_usage"] == "vllm:kv_cache_usage_perc"
    assert "vllm:request_num_preemptions" in info["families"]
    assert info["cache_config_info"]["num_gpu_blocks"] == 64
    assert metrics["cache_config_info"]["block_size"] == 32
    assert metrics["interval_s"] == 0.2


def test_api_key_is_sent_as_bearer_and_written_nowhere(tmp_path, page_server, monkeypatch):
    secret = "sk-loadlab-test-7f3a9c"
    monkeypatch.setenv("MY_VLLM_KEY", secret)
    server = page_server("ok")
    with Scraper([server.url], tmp_path, interval_s=0.2, api_key_env="MY_VLLM_KEY") as scraper:
        assert scraper.wait_until(lambda st: st[server.url].ok >= 2, 10)
        assert secret not in repr(scraper._loops[0].fetcher)
    assert server.last_authorization == f"Bearer {secret}"
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert files
    for path in files:
        assert secret.encode() not in path.read_bytes(), path


def test_ticks_stay_on_the_grid_and_missed_ticks_are_recorded(tmp_path, vllm_page):
    """A scrape that runs past three later ticks: those are recorded as missed, and the next
    scrape happens on the grid. The clock is the test's, the slow scrape a held request."""
    clock, interval = ManualClock(), 30.0
    with PageServer(vllm_page) as server:
        server.hold()
        with Scraper([server.url], tmp_path, interval_s=interval, clock=clock) as scraper:
            assert server.held.wait(30)       # tick 0's GET is at the server
            clock.advance(100.0)              # ... and takes until 100 s, past ticks 1-3
            server.let_go()
            assert scraper.wait_until(lambda st: st[server.url].missed == 3, 30)
            clock.advance(20.0)               # tick 4, on the grid at 120 s
            assert scraper.wait_until(lambda st: st[server.url].ok == 2, 30)
    _, scrapes = tables(tmp_path)
    scrapes = scrapes.sort_values("t")
    assert ((scrapes.t - clock.wall0) / interval).tolist() == [0, 1, 2, 3, 4]
    assert scrapes.error.fillna("ok").tolist() == [
        "ok",
        "missed tick",
        "missed tick",
        "missed tick",
        "ok",
    ]
    assert scrapes.duration_s.tolist()[0] == 100.0


@pytest.mark.parametrize("kwargs", [{"interval_s": 0.05}, {"interval_s": 1.0, "timeout_s": 1.5}])
def test_bad_settings_are_input_errors(tmp_path, kwargs):
    with pytest.raises(InputError):
        Scraper(["http://127.0.0.1:1"], tmp_path, **kwargs)


def test_a_page_without_vllm_metrics_is_a_gap(tmp_path):
    with (PageServer("# TYPE python_info gauge\npython_info 1.0\n") as server,
          Scraper([server.url], tmp_path, interval_s=0.2) as scraper):
        assert scraper.wait_until(lambda st: st[server.url].attempts >= 2, 10)
    _, scrapes = tables(tmp_path)
    attempts = scrapes[scrapes.error != "missed tick"]
    assert set(attempts.error) == {"no vllm metrics"} and not scrapes.ok.any()


def test_page_fixture_is_the_real_vllm_text():
    assert LOAD_PAGE.read_text().count("\nvllm:") > 300


def test_a_table_that_cannot_be_written_keeps_its_rows_until_it_can(tmp_path, page_server):
    server = page_server("ok")
    scraper = Scraper([server.url], tmp_path, interval_s=0.2, flush_interval_s=3600).start()
    assert scraper.wait_until(lambda st: st[server.url].ok >= 2, 20)
    metrics_dir = tmp_path / "metrics.parquet"
    metrics_dir.rmdir()  # nothing written yet: every scrape is buffered
    metrics_dir.write_text("a file where the table folder was")
    scraper.stop()  # does not raise: says why, keeps the rows
    assert len(scraper.write_errors) == 1 and "metrics.parquet" in scraper.write_errors[0]
    ok = scraper.stats()[server.url].ok
    metrics_dir.unlink()
    metrics_dir.mkdir()
    scraper.stop()  # again, once the folder is back
    assert scraper.write_errors == []
    assert len(read_table(metrics_dir, METRICS)) == N_VLLM_SAMPLES * ok
