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
