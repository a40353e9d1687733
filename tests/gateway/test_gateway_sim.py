"""``loadlab run`` through a real nginx gateway (https, self-signed certificate trusted with
``--ca-bundle``) in front of two simulator replicas, each its own ``loadlab sim serve``.

Replica B runs three times slower than A, so the balancing methods part ways: round-robin
hands both the same number of requests (B then holds most of the users), least_conn hands
each new request to the replica with fewer in flight (both hold the same number, A serves
more). nginx's access log (``$upstream_addr``) says where each request went, and each
replica's own ``vllm:request_success_total`` must agree with it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from gateway_runs import NEEDS_NGINX, counter, loadlab_run, mean_outstanding

from loadlab.cli import main
from loadlab.runstore import REQUESTS, read_analysis, read_table
from loadlab.sim.serve.testing import running_sim

pytestmark = NEEDS_NGINX

MODEL = "m"
LEVELS = (1, 2, 4, 8)          # 8 users over 2 + 2 running slots: the fleet queues
SEQS = 2


@pytest.fixture(scope="module")
def replicas() -> Iterator[tuple[str, str]]:
    """(A, B) base URLs; B three times slower than A."""
    common = {"served_model_name": MODEL, "max_num_seqs": SEQS, "seed": 1}
    with running_sim(time_scale=3, **common) as fast, running_sim(time_scale=1, **common) as slow:
        yield fast, slow


def _run(gateway_url: str, cert: Path, profile: Path, out: Path) -> None:
    res = loadlab_run(
        "--target", gateway_url, "--ca-bundle", str(cert), "--model", MODEL,
        "--profile", str(profile), "--concurrency", ",".join(map(str, LEVELS)),
        "--step-duration", "3", "--warmup", "0.5", "--workers", "0", "--no-calibrate",
        "--out", str(out))
    assert res.returncode == 0, res.stderr[-3000:]


@pytest.mark.parametrize("method", ["round-robin", "least_conn"])
def test_a_run_through_the_gateway_is_counted_per_replica(
    method, replicas, gateway, cert, uniform_profile, tmp_path
) -> None:
    profile = uniform_profile("gateway", (20, 60), (8, 16))
    before = {url: counter(url, "vllm:request_success_total") for url in replicas}
    gw = gateway(list(replicas), method)
    out = tmp_path / "run"
    _run(gw.url, cert[0], profile, out)

    rows = read_table(out / "requests.parquet", REQUESTS)
    assert len(rows) > 0 and (rows["status"] == "ok").all(), rows["error"].dropna().head()
    assert set(rows["endpoint"]) == {gw.url}             # every request went through https

    routed = gw.completions_by_replica()
    port_of = {url: url.rsplit(":", 1)[1] for url in replicas}
    served = {url: routed[f"127.0.0.1:{port_of[url]}"] for url in replicas}
    assert sum(served.values()) == len(rows)
    for url in replicas:            # each replica's own counter: what nginx routed there
        assert counter(url, "vllm:request_success_total") - before[url] == served[url], url

    fast, slow = replicas
    top = rows[rows["concurrency"] == LEVELS[-1]]
    t0, t1 = top["t_sent"].min(), top["t_done"].max()
    busy = mean_outstanding(gw.routed(), t0, t1)
    busy_fast, busy_slow = (busy[f"127.0.0.1:{port_of[u]}"] for u in (fast, slow))
    if method == "round-robin":
        assert abs(served[fast] - served[slow]) <= 1, served
        assert busy_slow > 1.5 * busy_fast, busy
    else:
        assert busy_slow == pytest.approx(busy_fast, rel=0.25), busy
        assert served[fast] > 1.5 * served[slow], served

    main(["analyze", str(out)])
    knee = read_analysis(out).knee       # the fleet's: 8 users over 2 + 2 slots queue
    assert knee.found and (knee.lower, knee.upper) == (LEVELS[-2], LEVELS[-1]), knee
