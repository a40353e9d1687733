"""What the gateway tests share: the nginx requirement, ``loadlab run`` in a subprocess, a
server's own counters and the run's last scrape of them."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pandas as pd
import pytest
from nginx_gateway import nginx_binary
from prometheus_client.parser import text_string_to_metric_families

NEEDS_NGINX = [
    pytest.mark.nginx,
    pytest.mark.skipif(nginx_binary() is None,
                       reason="needs nginx: apt-get install -y nginx (Debian/Ubuntu)"),
]


def loadlab_run(*args: str, timeout_s: float = 240.0) -> subprocess.CompletedProcess:
    """``loadlab run ARGS`` in a subprocess: Locust must not gevent-patch this process."""
    return subprocess.run([sys.executable, "-m", "loadlab", "run", *args], capture_output=True,
                          text=True, timeout=timeout_s, check=False)


def last_scrape(metrics: pd.DataFrame, endpoint: str, metric: str) -> tuple[float, float]:
    """(time, value) of a counter in a run's last scrape of ``endpoint`` (label sets summed)."""
    mine = metrics[(metrics["endpoint"] == endpoint) & (metrics["metric"] == metric)]
    by_scrape = mine.groupby("t")["value"].sum().sort_index()
    return float(by_scrape.index[-1]), float(by_scrape.iloc[-1])


def counter(base_url: str, name: str) -> float:
    """A counter on a server's own /metrics, summed over its label sets."""
    text = httpx.get(f"{base_url}/metrics", timeout=10).text
    return sum(s.value for fam in text_string_to_metric_families(text) for s in fam.samples
               if s.name == name)

