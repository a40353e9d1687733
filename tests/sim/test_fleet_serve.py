"""A simulated fleet end to end: real HTTP requests to ``sim serve --replicas``, each
replica's own /metrics, and ``sim replay --replicas`` writing per-replica series."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pyarrow.compute as pc
import pyarrow.parquet as pq
from prometheus_client.parser import text_string_to_metric_families

from loadlab.replay.driver import run_replay
from loadlab.sim.fleet.config import fleet_config
from loadlab.sim.serve.testing import running_sim, running_sim_in_thread
from loadlab.spec.scenario import Workload
from loadlab.spec.validate import plan_from_flags

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def sample_sum(text: str, name: str) -> float:
    return sum(s.value for fam in text_string_to_metric_families(text) for s in fam.samples
               if s.name == name)


def replica_sum(base: str, i: int, name: str) -> float:
    return sample_sum(httpx.get(f"{base}/replica/{i}/metrics").text, name)


def complete(base: str, prompt: list[int], max_tokens: int = 2) -> None:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True}
    resp = httpx.post(f"{base}/v1/completions", json=body, timeout=30)
    assert resp.status_code == 200, resp.text


def test_round_robin_fleet_splits_requests_evenly_over_its_replicas() -> None:
    with running_sim(replicas=2, router="round-robin", time_scale=50) as base:
        for k in range(6):
            complete(base, [k + 1] * 20)
        done = [replica_sum(base, i, "vllm:request_success_total") for i in range(2)]
        assert done == [3, 3]
        assert sample_sum(httpx.get(f"{base}/metrics").text,
                          "vllm:request_success_total") == done[0]   # /metrics: replica 0
        assert httpx.get(f"{base}/replica/2/metrics").status_code == 404


def test_least_waiting_sends_to_the_emptier_queue() -> None:
    fleet = fleet_config({"replicas": 2, "router": "least-waiting", "router_refresh_ms": 0,
                          "max_num_seqs": 1})
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 100_000, "ignore_eos": True,
                            "stream": True}
    stop = threading.Event()

    def hold(prompt: list[int], started: threading.Event) -> None:
        with httpx.stream("POST", f"{base}/v1/completions", json={**body, "prompt": prompt},
                          timeout=30) as resp:
            for _ in resp.iter_bytes():
                started.set()
                if stop.is_set():
                    return

    with running_sim_in_thread(fleet) as base:
        threads = []
        try:
            # one long request each replica runs (max_num_seqs 1), then two that must queue
            for k in range(4):
                started = threading.Event()
                t = threading.Thread(target=hold, args=([k + 1] * 2000, started), daemon=True)
                t.start()
                threads.append(t)
                if k < 2:
                    assert started.wait(10)
                else:      # wait until the engine has queued it before sending the next
                    deadline = time.monotonic() + 10
                    while sum(replica_sum(base, i, "vllm:num_requests_waiting")
                              for i in range(2)) < k - 1:
                        assert time.monotonic() < deadline
                        time.sleep(0.01)     # polling a condition, bounded by the deadline
            waiting = [replica_sum(base, i, "vllm:num_requests_waiting") for i in range(2)]
            assert waiting == [1, 1]
        finally:
            stop.set()
            for t in threads:
                t.join(10)


def test_by_length_sends_a_long_prompt_to_the_long_pool() -> None:
    fleet = fleet_config({"replicas": 2, "router": "by-length:50", "time_scale": 50})
    with running_sim_in_thread(fleet) as base:
        complete(base, [5] * 200)
        complete(base, [6] * 10)
        complete(base, [7] * 10)
        long_pool = replica_sum(base, 0, "vllm:prompt_tokens_total")
        short_pool = replica_sum(base, 1, "vllm:prompt_tokens_total")
        assert (long_pool, short_pool) == (200, 20)


def test_replay_writes_each_replicas_series_under_its_endpoint(tmp_path: Path) -> None:
    fleet = fleet_config({"replicas": 2, "router": "round-robin"})
    plan = plan_from_flags(concurrency="4", step_duration_s=20.0)
    summary = run_replay(fleet, plan, Workload(profile="sharegpt"), tmp_path / "run")
    table = pq.read_table(tmp_path / "run" / "metrics.parquet")
    success = table.filter(pc.equal(table["metric"], "vllm:request_success_total"))
    last = success.filter(pc.equal(success["t"], pc.max(success["t"])))
    per = {ep: sum(v for e, v in zip(last["endpoint"].to_pylist(), last["value"].to_pylist(),
                                     strict=True) if e == ep)
           for ep in set(last["endpoint"].to_pylist())}
    assert sorted(per) == ["sim://replay/replica/0", "sim://replay/replica/1"]
    assert sum(per.values()) == summary.completed > 0
    assert abs(per["sim://replay/replica/0"] - per["sim://replay/replica/1"]) <= 4
