"""The scraper keeps the simulator's loadlab: refusal series in metrics.parquet, as it keeps
vLLM's: a live simulator (subprocess) capped at two sequences, two long streams holding
both slots while four more requests arrive."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack

import httpx
from prometheus_client.parser import text_string_to_metric_families

from loadlab.collect.scraper import Scraper
from loadlab.runstore import METRICS, read_manifest, read_table
from loadlab.sim.engine.types import REFUSAL_REASONS
from loadlab.sim.serve.testing import running_sim

REFUSED = "loadlab:scheduler_refused_steps"


def body(max_tokens: int, stream: bool = False) -> dict:
    return {"model": "sim", "prompt": "one two three", "max_tokens": max_tokens,
            "ignore_eos": True, "stream": stream}


def complete(url: str) -> int:
    return httpx.post(f"{url}/v1/completions", json=body(40), timeout=60).status_code


def load_behind_the_cap(url: str) -> None:
    """Both slots are taken (each long stream has sent a token) before the four others are
    sent, so each of them waits at the head: 480 tokens in modelled time (over 3 s) last
    far longer than sending four requests."""
    with ExitStack() as stack:
        client = stack.enter_context(httpx.Client(timeout=60))
        streams = [stack.enter_context(client.stream("POST", f"{url}/v1/completions",
                                                     json=body(480, stream=True)))
                   for _ in range(2)]
        lines = [s.iter_lines() for s in streams]
        for it in lines:
            assert next(line for line in it if line.startswith("data: {"))
        with ThreadPoolExecutor(4) as pool:
            assert list(pool.map(complete, [url] * 4)) == [200] * 4
        for it in lines:
            assert any(line == "data: [DONE]" for line in it)


def test_refusal_counters_land_in_metrics_parquet(tmp_path) -> None:
    with running_sim(served_model_name="sim", max_num_seqs=2, max_model_len=512,
                     num_gpu_blocks_override=400) as url:
        with Scraper([url], tmp_path, interval_s=0.1) as scraper:
            load_behind_the_cap(url)
            done = scraper.stats()[url].ok
            # two more scrapes, both taken after the load ended: the counters are final
            assert scraper.wait_until(lambda st: st[url].ok >= done + 2, 20)
        page = httpx.get(f"{url}/metrics", timeout=10).text
    served = {f.name: f for f in text_string_to_metric_families(page)}

    metrics = read_table(tmp_path / "metrics.parquet", METRICS)
    ours = metrics[metrics.family.str.startswith("loadlab:")]
    assert set(ours.family) == {
        "loadlab:scheduler_steps", REFUSED, "loadlab:scheduler_head_blocks_needed",
        "loadlab:scheduler_head_free_blocks", "loadlab:scheduler_head_running"}
    last = ours[ours.t == ours.t.max()]
    refused = {json.loads(row.labels)["reason"]: row.value
               for row in last[last.family == REFUSED].itertuples()}
    assert set(refused) == set(REFUSAL_REASONS)
    # four requests behind a cap of two held by long streams: heads wait for a slot
    assert refused["seq_cap"] > 0 and refused["kv_blocks"] == refused["preempted"] == 0
    for family in ("loadlab:scheduler_steps", REFUSED):  # the final values, as served
        want = {json.dumps(s.labels, sort_keys=True, separators=(",", ":")): s.value
                for s in served[family].samples}
        got = dict(zip(last[last.family == family].labels, last[last.family == family].value))
        assert got == want, family
    running = last[last.family == "loadlab:scheduler_head_running"].value.item()
    assert running == 2
    assert (ours.source == "direct").all()
    described = read_manifest(tmp_path)["metrics"]["endpoints"][url]
    assert REFUSED in described["families"]
    assert described["names_found"]["refused_steps"] == REFUSED
