"""The collector over https: the simulator's /metrics scraped with the CA bundle, a
self-signed server's scrapes failing with the reason, and ``loadlab collect``'s TLS flags."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from loadlab.collect.fetch import MetricsFetcher
from loadlab.sim.serve.testing import running_sim
from loadlab.spec.tls import TlsSettings


@pytest.fixture(scope="module")
def https_sim(tls_cert: tuple[Path, Path]):
    with running_sim(ssl_certfile=str(tls_cert[0]), ssl_keyfile=str(tls_cert[1])) as url:
        yield url


def test_metrics_verified_with_the_bundle_refused_without(https_sim, tls_cert) -> None:
    url = f"{https_sim}/metrics"
    ok = MetricsFetcher(url, timeout_s=5, tls=TlsSettings(ca_bundle=str(tls_cert[0])).context())
    results = [ok.fetch() for _ in range(2)]
    assert all(r.error is None and b"vllm:" in (r.body or b"") for r in results)
    refused = MetricsFetcher(url, timeout_s=5).fetch()   # the system store
    assert refused.error == "tls error: self-signed certificate"


def _collect(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "loadlab", "collect", *args],
                          capture_output=True, text=True, timeout=60)


def test_collect_scrapes_https_with_ca_bundle_or_insecure(https_sim, tls_cert, tmp_path) -> None:
    res = _collect("--target", https_sim, "--out", str(tmp_path / "a"), "--duration", "1",
                   "--interval", "0.5", "--ca-bundle", str(tls_cert[0]))
    assert res.returncode == 0, res.stderr
    assert " 0/" not in res.stdout and "scrapes ok" in res.stdout
    res = _collect("--target", https_sim, "--out", str(tmp_path / "b"), "--duration", "1",
                   "--interval", "0.5", "--insecure")
    assert res.returncode == 0, res.stderr
    assert "TLS certificate verification is OFF" in res.stderr


def test_collect_refuses_a_missing_bundle(tmp_path) -> None:
    res = _collect("--target", "https://127.0.0.1:1", "--out", str(tmp_path / "c"),
                   "--ca-bundle", str(tmp_path / "nope.pem"))
    assert res.returncode == 2
    assert "--ca-bundle: CA bundle: no file" in res.stderr
