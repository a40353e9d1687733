"""End to end on a REAL vLLM (tiny model, CPU): loadgen + collector against vllm serve.

Two servers, each started once (module order groups the tests by server):
- A: ``--max-num-seqs 4`` with a roomy 512-block pool, prefix caching on.
- B: ``--max-num-seqs 32`` with a 64-block pool, prefix caching off.
What each test asserts is the scheduler picture of vLLM's V1 scheduler
(vllm/v1/core/sched/scheduler.py): the sequence cap
(running capped at 4, the rest waiting, KV low, TTFT jumping while ITL stays flat), KV
exhaustion (usage near 1, preemptions), prefix-cache counters that move only with caching
on and a first token that needs fewer engine steps with it. Gauges are 0.5 s snapshots, so
assertions on them leave room for a snapshot taken between a finish and the next admission.
Client-vs-server TTFT differences and the gauge-lag figures per step are printed (run with
-s) and written to ``ttft_overhead.json`` and ``gauge_lag.json`` in the run folder. Server
and client run on CPUs of their own (realvllm.ISOLATION), and every load asserts it was
applied: ``loadlab run`` exits 3 when the client fell short (loadrun.run_steps).
"""

from __future__ import annotations

import json

import pytest
from loadrun import run_steps
from realvllm import SEQ_CAP, SMALL_POOL

from loadlab.analyze.gauge_lag import gauge_lag
from loadlab.analyze.steps import step_table

pytestmark = pytest.mark.vllm

LEVELS = [1, 2, 4, 8, 16]


@pytest.fixture(scope="module")
def step_load_a(vllm_server, tmp_path_factory):
    target = vllm_server(**SEQ_CAP)
    # A 3 s warm-up: a step's new users arrive at once, and at 16 users their first tokens
    # come up to ~2 s later, each having waited in the API server beside the streams it
    # serves (outside vLLM's TTFT histogram): the measured window starts past that burst.
    return run_steps(target, tmp_path_factory.mktemp("seqcap"), "tiny-short", LEVELS,
                     step_s=7.5, warmup_s=3.0)


def test_seq_cap_step_load(step_load_a):
    res = step_load_a
    assert (res.requests.status == "ok").all(), res.requests[
        res.requests.status != "ok"
    ].error.head()
    running = res.gauge("vllm:num_requests_running")
    waiting = res.gauge("vllm:num_requests_waiting")
    kv = res.gauge("vllm:kv_cache_usage_perc")
    assert running["max"].max() <= 4, running
    for c in (8, 16):
        # The cap is reached and never passed. Not a share of snapshots at the cap: V1 makes
        # its stats after a step's finished requests leave `running` and before the next
        # schedule() admits from the queue (vllm/v1/core/sched/scheduler.py,
        # update_from_output -> make_stats), so every step that finishes a request reads
        # below the cap until the next one; at 16 users 8 of 9 snapshots once did. That
        # the rest wait is the queue's bound below.
        assert running.loc[c, "max"] == 4, running
        # Maxima, not means: a lagging gauge reads 0 in up to ~half the samples here, while
        # a snapshot between a finish and the next admission can show one more waiting.
        assert c - 4 - 2 <= waiting.loc[c, "max"] <= c - 4 + 1, waiting
    assert kv["max"].max() < 0.1, kv
    ttft = res.histogram("vllm:time_to_first_token_seconds")["mean"]
    itl = res.histogram("vllm:inter_token_latency_seconds")["mean"]
    assert ttft[16] > 4 * ttft[4], ttft
    assert ttft[8] > 2 * ttft[4], ttft
    # ... while ITL stays flat across the cap: 4 decode at 4, 8 and 16 users. Against the
    # cap level, the step before: the one-core server's step time drifts with whatever else
    # the shared box runs on that core (ITL at 1 user and at 16, 30 s apart, differed 3x).
    assert itl[16] < 2.5 * itl[4] and itl[8] < 2.5 * itl[4], itl


# Client TTFT mean within this of vLLM's histogram mean, per step: TTFT_TOL_MS plus
# TTFT_TOL_REL of the server's figure (both over the same requests: LoadResult.client_ttft).
TTFT_TOL_MS, TTFT_TOL_REL = 15.0, 0.05


def test_client_ttft_matches_server_histogram(step_load_a):
    """vLLM stamps its TTFT from the request's arrival at the engine to the API server's
    output handler taking the first token; the client adds the front end around that (HTTP
    parsing and tokenising before, the SSE write and loopback after). With the server and
    the client on CPUs of their own that is a few ms at every level (measured here: +2 to
    +12 ms, 1 to 16 users), so each step's client mean must lie within TTFT_TOL_MS +
    TTFT_TOL_REL x the server's mean. Sharing the cores it did not: +33 to +103 ms at 8 and
    16 users, with 13-32% of the streams delivered whole (benchmarks/bench_isolation.py).
    ``burst_share`` is reported beside it."""
    res = step_load_a
    server = res.histogram("vllm:time_to_first_token_seconds")["mean"]
    client = res.client_ttft()
    diff_ms = ((client - server) * 1000).round(1)
    bursts = step_table(res.run / "load").set_index("concurrency")["burst_share"]
    report = {int(c): {"client_ms": round(float(client[c]) * 1000, 1),
                       "server_ms": round(float(server[c]) * 1000, 1),
                       "diff_ms": float(diff_ms[c]), "burst_share": round(float(bursts[c]), 3)}
              for c in LEVELS}
    (res.run / "ttft_overhead.json").write_text(json.dumps(report, indent=2))
    print("\nclient - server TTFT mean per step (ms):", report)
    for c in LEVELS:
        assert abs(diff_ms[c]) <= TTFT_TOL_MS + TTFT_TOL_REL * server[c] * 1000, (c, report)


def test_gauge_lag_is_measured(step_load_a):
    """The running gauge beside the running count read from vLLM's ITL counter and the
    client's in-flight count; written to ``gauge_lag.json`` (run with -s to see it)."""
    res = step_load_a
    lag = gauge_lag(res.metrics, res.requests, res.steps).set_index(res.steps.concurrency)
    report = {int(c): {k: round(float(v), 3) for k, v in row.items()} for c, row in lag.iterrows()}
    (res.run / "gauge_lag.json").write_text(json.dumps(report, indent=2))
    print("\ngauge vs counter-derived running per step:", report)
    # The counters see the cap whatever the gauge shows: 4 decoding, less each
    # request's prefill step (1 of 32) and the refill gap after each finish.
    for c in (8, 16):
        assert 3.0 <= lag.loc[c, "running_itl"] <= 4.2, report
        assert lag.loc[c, "inflight_client"] == pytest.approx(c, rel=0.1), report
    assert 0.6 <= lag.loc[1, "running_itl"] <= 1.05, report
    assert lag["stale_share"].between(0, 1).all(), report


@pytest.fixture(scope="module")
def prefix_on(vllm_server, tmp_path_factory):
    target = vllm_server(**SEQ_CAP)
    return run_steps(target, tmp_path_factory.mktemp("prefix-on"), "tiny-shared", [2],
                     step_s=6.0, warmup_s=0.5)


def test_prefix_caching_on_counts_hits(prefix_on):
    res = prefix_on
    queries = res.total("vllm:prefix_cache_queries")
    hits = res.total("vllm:prefix_cache_hits")
    assert hits > 0 and queries > 0
    assert hits / queries > 0.5, (hits, queries)  # 256 of 320 prompt tokens are shared
    info = res.server_manifest["metrics"]["cache_config_info"]
    assert info["enable_prefix_caching"] is True and info["num_gpu_blocks"] == 512, info


def test_kv_exhaustion_preempts(vllm_server, tmp_path_factory):
    target = vllm_server(**SMALL_POOL)
    res = run_steps(target, tmp_path_factory.mktemp("kv"), "tiny-long", [16], step_s=20.0,
                    warmup_s=2.0)
    kv = res.gauge("vllm:kv_cache_usage_perc")
    running = res.gauge("vllm:num_requests_running")
    assert kv.loc[16, "max"] > 0.9, kv
    assert running.loc[16, "max"] < 16, running  # the pool, not the cap of 32, limits
    assert res.total("vllm:num_preemptions") > 0
    info = res.server_manifest["metrics"]["cache_config_info"]
    assert info["num_gpu_blocks"] == 64 and info["enable_prefix_caching"] is False, info


def test_prefix_caching_off_counts_no_hits(vllm_server, tmp_path_factory, prefix_on):
    target = vllm_server(**SMALL_POOL)
    res = run_steps(target, tmp_path_factory.mktemp("prefix-off"), "tiny-shared", [2],
                    step_s=6.0, warmup_s=0.5)
    assert (res.requests.status == "ok").sum() > 0
    assert res.total("vllm:prefix_cache_hits") == 0
    # With caching on only the 64 unshared tokens of each prompt are prefilled (one engine
    # step), with it off all 320 (a 256-token chunk, then 64): the first token needs fewer
    # steps. Counted in decode steps of the same run (prefill = scheduled -> first token,
    # over the ITL mean, both engine-stamped): the two runs are on different servers
    # minutes apart, and on this shared 2-core box the step time of the one-core server
    # moved 3-6x between such runs (ITL 6.8 to 42 ms), far more than one step. Measured
    # here: on 2.1 steps (three runs), off 3.2-5.2.
    runs = (("on", prefix_on), ("off", res))
    steps = {
        name: float(
            r.histogram("vllm:request_prefill_time_seconds")["mean"].iloc[0]
            / r.histogram("vllm:inter_token_latency_seconds")["mean"].iloc[0]
        )
        for name, r in runs
    }
    ttft = {
        name: float(r.histogram("vllm:time_to_first_token_seconds")["mean"].iloc[0])
        for name, r in runs
    }
    client = {name: float(r.client_ttft().iloc[0]) for name, r in runs}
    print(
        "\nprefix caching on/off: prefill in decode steps",
        steps,
        "TTFT mean: server",
        ttft,
        "client",
        client,
    )
    assert steps["on"] < steps["off"], steps
    # ... and the client sees each run's first token where vLLM does (see the seq-cap test).
    for name, server_s in ttft.items():
        assert (
            abs(client[name] - server_s) * 1000 <= TTFT_TOL_MS + TTFT_TOL_REL * server_s * 1000
        ), (client, ttft)
