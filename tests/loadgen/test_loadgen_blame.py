"""Server failures are blamed on the server (issue #17, item 5): a server answering
``200 text/html`` or closing its streams without ``[DONE]`` gives no exit 3 ("more client
CPUs"), and ``loadlab analyze`` names the failures, not the client."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from runs import fault_server_process


# Nine failures in ten, answered at once: users are out of flight between requests for a
# visible share of their time, which the in-flight rule used to read as a starved client.
@pytest.mark.parametrize("pattern,kind", [("ok" + ",html200" * 9, "not_event_stream"),
                                          ("ok" + ",nodone" * 9, "truncated")])
def test_a_failing_server_is_not_a_client_limited_run(cli, load, tiny_profile, tmp_path,
                                                      pattern, kind) -> None:
    out = tmp_path / kind
    with fault_server_process(pattern, 0.0, 0.0) as (_, url):
        res = cli("--target", url, "--model", "m", "--profile", str(tiny_profile),
                  "--concurrency", "4", "--step-duration", "3", "--warmup", "0",
                  "--timeout", "2", "--workers", "0", "--drain", "1", "--out", str(out))
    assert "Traceback" not in res.stderr, res.stderr
    assert res.returncode == 0, res.stderr
    assert "more CPU" not in res.stderr and "--client-cpus" not in res.stderr
    df, manifest = load(out)
    assert (df.failure == kind).sum() > len(df) / 2, df.failure.value_counts()
    assert not any(s.get("client_limited") for s in manifest["steps"]), manifest["steps"]
    analyzed = subprocess.run([sys.executable, "-m", "loadlab", "analyze", str(out), "--json", "-"],
                              capture_output=True, text=True, check=False, timeout=120)
    assert analyzed.returncode == 0, analyzed.stderr
    data = json.loads(analyzed.stdout)
    assert data["cause"]["name"] == "server_errors", data["cause"]
    assert "the server failed" in data["cause"]["knob"] and kind in data["cause"]["knob"]
    assert "not the bottleneck" not in data["verdict"] and "client limited" not in data["verdict"]
    assert any(f"{kind} " in w and "failed server-side" in w for w in data["warnings"])


def _run_and_analyze(cli, tiny_profile, out, pattern: str, metrics: str) -> dict:
    with fault_server_process(pattern, 5.0, 2.0, "--metrics-pattern", metrics) as (_, url):
        res = cli("--target", url, "--model", "m", "--profile", str(tiny_profile),
                  "--concurrency", "2", "--step-duration", "3", "--warmup", "0",
                  "--timeout", "2", "--workers", "0", "--drain", "1", "--collect",
                  "--interval", "0.25", "--out", str(out))
    assert "Traceback" not in res.stderr, res.stderr
    analyzed = subprocess.run([sys.executable, "-m", "loadlab", "analyze", str(out), "--json", "-"],
                              capture_output=True, text=True, check=False, timeout=120)
    assert analyzed.returncode == 0, analyzed.stderr
    return json.loads(analyzed.stdout)


def test_a_collector_whose_scrapes_failed_says_so(cli, tiny_profile, tmp_path) -> None:
    """/metrics answering 500 or hanging under --collect: not "rerun with --collect"."""
    data = _run_and_analyze(cli, tiny_profile, tmp_path / "scrapes", "ok", "500,hang")
    said = [w for w in data["warnings"] if w.startswith("the collector ran but ")]
    assert len(said) == 1, data["warnings"]
    assert "scrapes failed (" in said[0] and "http 500" in said[0] and "timeout" in said[0]
    assert "/metrics" in said[0]
    assert not any("rerun with --collect" in w for w in data["warnings"]), data["warnings"]


def test_resets_nan_gauges_and_a_restarted_counter_are_warned_about(cli, tiny_profile,
                                                                     tmp_path) -> None:
    """One stream in ten reset mid-way; the waiting gauge sometimes NaN; the token counter
    starting again from a small value: each is a warning, none a silent number."""
    data = _run_and_analyze(cli, tiny_profile, tmp_path / "resets", "ok," * 9 + "reset",
                            "ok,ok,nan,ok,restart,ok")
    warnings = data["warnings"]
    resets = [w for w in warnings if "failed server-side" in w]
    assert resets and all("reset " in w for w in resets), warnings
    assert not any("cancelled" in w and "reset" not in w for w in resets)
    assert any("NaN samples" in w and "vllm:num_requests_waiting" in w
               and "not read as 0" in w for w in warnings), warnings
    assert any("counter went down" in w for w in warnings), warnings
    step = data["steps"][0]
    assert step["gen_tok_rate"] > 0 and step["counter_resets"] >= 1
    assert step["server_errors"]["reset"] >= 1 and step["n_server_err"] < step["n_sent"]
