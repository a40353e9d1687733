"""`loadlab collect` that collected nothing says so: exit 4, one line, the folder still
written (issue #17, item 12)."""

from __future__ import annotations

import subprocess
import sys

from loadlab.runstore import SCRAPES, read_table


def test_collect_with_no_scrape_ok_exits_4_saying_so(tmp_path, page_server):
    server = page_server("500")
    res = subprocess.run([sys.executable, "-m", "loadlab", "collect", "--target", server.url,
                          "--duration", "2", "--interval", "0.5", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 4, res.stderr
    assert "Traceback" not in res.stderr
    scrapes = read_table(tmp_path / "scrapes.parquet", SCRAPES)
    tried = int((scrapes.error != "missed tick").sum())
    assert tried >= 1 and not scrapes.ok.any()            # the folder holds every failed scrape
    assert res.stderr.strip().splitlines()[-1] == (
        f"loadlab: error: no scrape succeeded: 0 of {tried} scrapes ok (last error: http 500)")
    assert f"{server.url}: 0/{tried} scrapes ok" in res.stdout

