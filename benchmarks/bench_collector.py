"""What the collector costs: CPU share of one core while sampling 4 endpoints at 10 Hz.

Goal: < 5% of one core, so sampling never slows the load beside it.

Measured in one run:

1. The collector: ``Scraper`` on 4 endpoints every 0.1 s for ``--duration`` seconds;
   the endpoints serve the real vLLM 0.32 page (~50 KB, 325 vllm: samples) from
   ANOTHER process, so only the collector's CPU is counted. CPU share =
   process CPU time (all threads) / wall time, from the first good scrape of every
   endpoint to stop (final flush included); the first scrapes, where each page's
   lines are learnt once, are reported apart.
2. Side by side, per page: full ``prometheus_client`` parse vs the memoised parser.
3. Side by side, per 10,000 rows: ``PartWriter`` dict rows vs the columnar sink.

Usage: ``python benchmarks/bench_collector.py [--duration 20] [--endpoints 4] [--interval 0.1]``
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "tests" / "fixtures" / "vllm-0.32-cpu" / "metrics_under_load_tinypool_seqbound.txt"


def bench_scraper(n: int, interval: float, duration: float) -> dict[str, float]:
    from loadlab.collect.scraper import Scraper
    from loadlab.runstore import METRICS, read_table

    server = subprocess.Popen([sys.executable, "-m", "loadlab.collect.testing", str(n), str(PAGE)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        urls = [server.stdout.readline().strip() for _ in range(n)]
        with tempfile.TemporaryDirectory() as out:
            scraper = Scraper(urls, out, interval_s=interval)
            cpu0 = time.process_time()
            with scraper:
                # first page of each endpoint: memoising its lines is a one-time cost
                scraper.wait_until(lambda st: all(s.ok >= 1 for s in st.values()), 30)
                cpu1, wall1 = time.process_time(), time.perf_counter()
                scraper._stop.wait(duration)  # the bench's own clock: sample for `duration` seconds
            cpu, wall = time.process_time() - cpu1, time.perf_counter() - wall1
            first_cpu = cpu1 - cpu0
            stats = scraper.stats().values()
            rows = len(read_table(Path(out) / "metrics.parquet", METRICS))
    finally:
        server.stdin.close()
        server.wait(10)
    ok = sum(s.ok for s in stats)
    return {
        "cpu_share_of_one_core": cpu / wall,
        "first_scrape_cpu_ms_all": 1e3 * first_cpu,
        "cpu_ms_per_scrape": 1e3 * cpu / max(ok, 1),
        "scrapes_ok": ok,
        "scrapes_expected": n * duration / interval,
        "missed_ticks": sum(s.missed for s in stats),
        "failed": sum(s.attempts - s.ok for s in stats),
        "rows_written": rows,
    }


def bench_parse(repeat: int = 100) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    from loadlab.collect.parse import ExpositionParser

    text = PAGE.read_text()
    t0 = time.process_time()
    for _ in range(repeat // 5):
        for fam in text_string_to_metric_families(text):
            list(fam.samples)
    full = (time.process_time() - t0) / (repeat // 5)
    parser = ExpositionParser()
    parser.parse(text)
    t0 = time.process_time()
    for _ in range(repeat):
        parser.parse(text)
    memo = (time.process_time() - t0) / repeat
    return {"prometheus_client_ms_per_page": 1e3 * full, "memoised_ms_per_page": 1e3 * memo,
            "speedup": full / memo}


def bench_sink(rows: int = 10_000) -> dict[str, float]:
    from loadlab.collect.parse import ExpositionParser, scrape_rows
    from loadlab.collect.sink import MetricsSink
    from loadlab.runstore import METRICS, PartWriter

    parser = ExpositionParser()
    scrape = parser.parse(PAGE.read_text())
    n_scrapes = max(1, rows // len(scrape.ids))
    with tempfile.TemporaryDirectory() as out:
        dict_rows = [r for i in range(n_scrapes)
                     for r in scrape_rows(parser, scrape, t=float(i), endpoint="http://e:1")]
        t0 = time.process_time()
        with PartWriter(Path(out) / "a", METRICS, flush_rows=10**9, flush_interval_s=1e9) as w:
            w.extend(dict_rows)
        by_dict = time.process_time() - t0
        t0 = time.process_time()
        with MetricsSink(Path(out) / "b", parser, endpoint="http://e:1", flush_interval_s=1e9) as s:
            for i in range(n_scrapes):
                s.add_scrape(float(i), 0.001, scrape)
        columnar = time.process_time() - t0
    per = 1e4 / len(dict_rows)
    return {"partwriter_dict_rows_ms_per_10k": 1e3 * by_dict * per,
            "columnar_sink_ms_per_10k": 1e3 * columnar * per, "speedup": by_dict / columnar}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=20.0)
    ap.add_argument("--endpoints", type=int, default=4)
    ap.add_argument("--interval", type=float, default=0.1)
    args = ap.parse_args()
    print(f"collector: {args.endpoints} endpoints every {args.interval} s for {args.duration} s")
    for key, value in bench_scraper(args.endpoints, args.interval, args.duration).items():
        print(f"  {key:28s} {value:,.4g}")
    print("parse, one vLLM 0.32 page:")
    for key, value in bench_parse().items():
        print(f"  {key:28s} {value:,.4g}")
    print("write METRICS rows:")
    for key, value in bench_sink().items():
        print(f"  {key:28s} {value:,.4g}")


if __name__ == "__main__":
    main()
