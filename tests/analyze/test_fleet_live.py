"""``loadlab run --replica-metrics`` against a live ``loadlab sim serve --replicas 2``: the
load goes to the gateway, each replica's series are recorded under its own endpoint and
the analysis judges each; and the flag's and the scenario field's input errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from pydantic import ValidationError

from loadlab.errors import InputError
from loadlab.runstore.analysis_model import read_analysis
from loadlab.sim.serve.testing import running_sim
from loadlab.spec.scenario import Target
from loadlab.spec.validate import validate

PROFILE = Path(__file__).parents[1] / "vllm" / "profiles" / "tiny-short.yaml"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def loadlab(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "loadlab", *args], check=False,
                          capture_output=True, text=True, timeout=300)


def test_a_live_run_records_and_judges_both_replicas(tmp_path: Path) -> None:
    out = tmp_path / "run"
    with running_sim(replicas=2, router="round-robin", time_scale=20, seed=0) as base:
        replicas = [f"{base}/replica/0", f"{base}/replica/1/metrics"]   # either spelling
        proc = loadlab("run", "--target", base, "--model", MODEL, "--profile", str(PROFILE),
                       "--concurrency", "2,4", "--step-duration", "4", "--warmup", "0",
                       "--workers", "0", "--drain", "5", "--interval", "0.25",
                       "--replica-metrics", ",".join(replicas), "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    labels = [f"{base}/replica/0", f"{base}/replica/1"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["replicas"] == labels
    metrics = pd.read_parquet(out / "metrics.parquet")
    assert sorted(metrics["endpoint"].unique()) == labels          # not the gateway's page
    done = metrics[metrics["metric"] == "vllm:request_success_total"]
    last = done[done["t"] == done.groupby("endpoint")["t"].transform("max")]
    per = last.groupby("endpoint")["value"].sum()
    requests = pd.read_parquet(out / "requests.parquet")
    ok = int((requests["status"] == "ok").sum())
    # Every request once (bar those finishing after the last scrape), half on each replica.
    assert ok > 0 and 0 <= ok - per.sum() <= 0.05 * ok
    assert abs(per.iloc[0] - per.iloc[1]) <= 0.05 * ok
    proc = loadlab("analyze", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    a = read_analysis(out)
    assert a.replicas is not None and [r.endpoint for r in a.replicas] == labels
    assert a.imbalance is not None and len(a.imbalance.steps) == 2


def test_replica_metrics_needs_a_gateway_url_and_two_replicas() -> None:
    with pytest.raises(InputError) as err:
        validate(Target, {"launch": "sim", "replica_metrics": ["http://a:1", "http://b:1"]})
    assert "replica_metrics" in str(err.value) and "url" in str(err.value)
    with pytest.raises(InputError) as err:
        validate(Target, {"url": "http://gw:80", "replica_metrics": ["http://a:1"]})
    assert "replica_metrics" in str(err.value)
    with pytest.raises((InputError, ValidationError)):
        validate(Target, {"url": "http://gw:80", "replica_metrics": ["a:1", "ftp://b"]})
    ok = validate(Target, {"url": "http://gw:80", "replica_metrics": ["http://a:1", "http://b:1"]})
    assert ok.replica_metrics == ["http://a:1", "http://b:1"]


def test_the_flag_names_itself_and_exits_2(tmp_path: Path) -> None:
    proc = loadlab("run", "--target", "http://127.0.0.1:9", "--model", "m", "--concurrency", "1",
                   "--replica-metrics", "http://127.0.0.1:9/replica/0", "--out",
                   str(tmp_path / "run"))
    assert proc.returncode == 2, proc.stderr
    assert "--replica-metrics" in proc.stderr.splitlines()[-1]
    proc = loadlab("collect", "--replica-metrics", "http://127.0.0.1:9", "--out",
                   str(tmp_path / "c"), "--duration", "1")
    assert proc.returncode == 2, proc.stderr
    assert "--replica-metrics" in proc.stderr.splitlines()[-1]
