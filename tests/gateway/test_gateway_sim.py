"""``loadlab run`` through a real nginx gateway (https, self-signed certificate trusted with
``--ca-bundle``) in front of two simulator replicas, each its own ``loadlab sim serve``.

Replica B runs three times slower than A, so the balancing methods part ways: round-robin
hands both the same number of requests (B then holds most of the users and queues while A
has room: the fleet's knee comes early, cause ``routing_imbalance``), least_conn hands each
new request to the replica with fewer in flight (both hold the same number, A serves more,
the fleet queues only past its 2 + 2 running slots: ``seq_cap``). nginx's access log
(``$upstream_addr``) says where each request went; each replica's own
``vllm:request_success_total``, the run's rows and the per-replica series and tables of the
analysis (``--replica-metrics``) must agree with it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from gateway_runs import NEEDS_NGINX, counter, last_scrape, loadlab_run
from nginx_gateway import completions, mean_in_flight, netloc

from loadlab.cli import main
from loadlab.runstore import METRICS, REQUESTS, read_analysis, read_manifest, read_table
from loadlab.sim.serve.testing import running_sim

pytestmark = NEEDS_NGINX

MODEL = "m"
LEVELS = (1, 2, 4, 8)          # 8 users over 2 + 2 running slots: the fleet queues
USERS = LEVELS[-1]
SEQS = 2
SUCCESS = "vllm:request_success_total"
# The fleet's knee and cause. Round-robin: at 4 users the slow replica already holds more
# than its 2 slots while the fast one has room. least_conn: both queue only past 2 + 2.
VERDICT = {"round-robin": (2, 4, "routing_imbalance"), "least_conn": (4, 8, "seq_cap")}


@pytest.fixture(scope="module")
def replicas() -> Iterator[tuple[str, str]]:
    """(A, B) base URLs; B three times slower than A."""
    common = {"served_model_name": MODEL, "max_num_seqs": SEQS, "seed": 1}
    with running_sim(time_scale=3, **common) as fast, running_sim(time_scale=1, **common) as slow:
        yield fast, slow


def _run(gateway_url: str, cert: Path, replicas: tuple[str, str], profile: Path,
         out: Path) -> None:
    res = loadlab_run(
        "--target", gateway_url, "--ca-bundle", str(cert), "--model", MODEL,
        "--replica-metrics", ",".join(replicas), "--interval", "0.5",
        "--profile", str(profile), "--concurrency", ",".join(map(str, LEVELS)),
        "--step-duration", "3", "--warmup", "0.5", "--workers", "0", "--no-calibrate",
        "--out", str(out))
    assert res.returncode == 0, res.stderr[-3000:]


@pytest.mark.parametrize("method", ["round-robin", "least_conn"])
def test_a_run_through_the_gateway_is_counted_per_replica(
    method, replicas, gateway, cert, uniform_profile, tmp_path
) -> None:
    profile = uniform_profile("gateway", (20, 60), (8, 16))
    before = {url: counter(url, SUCCESS) for url in replicas}
    gw = gateway(list(replicas), method)
    out = tmp_path / "run"
    _run(gw.url, cert[0], replicas, profile, out)

    rows = read_table(out / "requests.parquet", REQUESTS)
    assert len(rows) > 0 and (rows["status"] == "ok").all(), rows["error"].dropna().head()
    assert set(rows["endpoint"]) == {gw.url}            # every request went through https
    assert read_manifest(out)["target"]["tls"] == {"verify": True, "ca_bundle": str(cert[0])}

    # nginx's log, each replica's own counter and the rows: the same requests
    log = gw.routed()
    served = {url: completions(log, url) for url in replicas}
    assert sum(served.values()) == len(rows)
    for url in replicas:
        assert counter(url, SUCCESS) - before[url] == served[url], url

    # the run's per-replica series and tables: each replica's own, not swapped or summed
    metrics = read_table(out / "metrics.parquet", METRICS)
    main(["analyze", str(out)])
    analysis = read_analysis(out)
    assert analysis.replicas is not None
    tables = {r.endpoint: r for r in analysis.replicas}
    assert set(tables) == set(replicas)
    for url in replicas:
        t_last, scraped = last_scrape(metrics, url, SUCCESS)
        logged = completions(log, url, until=t_last)
        # a request counted by one and not the other was in flight at that scrape
        assert abs(scraped - before[url] - logged) <= USERS, (url, scraped, logged)
        for step, replica_step in zip(analysis.steps, tables[url].steps, strict=True):
            logged = completions(log, url, step.t_start, step.t_end)
            # a request counted by one and not the other was in flight at an edge
            assert abs(replica_step.requests_done - logged) <= 2 * USERS, (url, step.step)

    knee, cause = analysis.knee, analysis.cause.name      # the fleet's verdict
    assert knee.found and (knee.lower, knee.upper, cause) == VERDICT[method], (knee, cause)

    fast, slow = replicas
    top = analysis.steps[-1]
    in_flight = mean_in_flight(log, top.t_start, top.t_end)
    outstanding = {url: in_flight[netloc(url)] for url in replicas}
    if method == "round-robin":
        # alternating over every request it proxied (the preflight's GET /v1/models too)
        split = Counter(r.upstream for r in log)
        assert abs(split[netloc(fast)] - split[netloc(slow)]) <= 1, split
        assert outstanding[slow] > 2 * outstanding[fast], outstanding
    else:
        assert served[fast] > 1.5 * served[slow], served
        assert abs(outstanding[slow] - outstanding[fast]) <= 0.5, outstanding
