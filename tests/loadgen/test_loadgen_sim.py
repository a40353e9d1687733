"""`loadlab run` against the simulator on port 0: counts, timing agreement, rates, determinism."""

from __future__ import annotations

import re

import httpx
import numpy as np
import pytest

from loadlab.loadgen.shapes import arrivals, plan_from_dict
from loadlab.sim.serve.testing import running_sim

MODEL = "test-model"


@pytest.fixture(scope="module")
def sim() -> str:
    with running_sim(served_model_name=MODEL, max_num_seqs=16) as url:
        yield url


def _metric(url: str, name: str) -> float:
    """Sum of all samples of ``name`` (any labels) on the server's /metrics."""
    text = httpx.get(f"{url}/metrics").text
    pat = re.compile(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.eE+-]+)$", re.MULTILINE)
    return sum(float(v) for v in pat.findall(text))


def _max_overlap(rows) -> int:
    """Most requests open at once, from their raw send/done times."""
    events = sorted(
        [(t, 1) for t in rows.t_sent] + [(t, -1) for t in rows.t_done], key=lambda e: (e[0], e[1])
    )
    level = best = 0
    for _, d in events:
        level += d
        best = max(best, level)
    return best


def test_closed_loop_steps_counts_ttft_and_exact_prompts(
    sim, cli, load, tiny_profile, tmp_path
) -> None:
    before = {
        n: _metric(sim, n)
        for n in (
            "vllm:request_success_total",
            "vllm:time_to_first_token_seconds_sum",
            "vllm:time_to_first_token_seconds_count",
        )
    }
    out = tmp_path / "run"
    res = cli(
        "--target",
        sim,
        "--model",
        MODEL,
        "--profile",
        str(tiny_profile),
        "--concurrency",
        "1,4",
        "--step-duration",
        "2",
        "--warmup",
        "0.5",
        "--workers",
        "1",
        "--out",
        str(out),
        "--seed",
        "3",
    )
    assert res.returncode == 0, res.stderr
    df, manifest = load(out)
    after = {n: _metric(sim, n) for n in before}

    assert manifest["status"] == "complete"
    assert (manifest["workload"]["calibrated"], manifest["workload"]["calibration_reason"]) == (
        True,
        None,
    )
    assert [(s["step"], s["concurrency"]) for s in manifest["steps"]] == [(0, 1), (1, 4)]
    assert set(df.status) == {"ok"}
    # Nothing lost or duplicated: every request the server completed has exactly one row.
    assert after["vllm:request_success_total"] - before["vllm:request_success_total"] == len(df)
    assert df.request_id.is_unique and df.seq.is_unique
    for window in manifest["steps"]:
        rows = df[df.step == window["step"]]
        c = window["concurrency"]
        # (how close c users come to c x duration / mean latency requests is the client's
        # speed: benchmarks/bench_loadgen.py)
        assert (rows.concurrency == c).all()
        assert _max_overlap(rows) <= c
        assert window["client_cpu_cores"] is not None and window["loop_lag_max_s"] is not None
    assert _max_overlap(df[df.step == 1]) == 4
    # Prompts hit their target token count exactly; outputs are pinned by max/min_tokens.
    assert (df.prompt_tokens == df.target_prompt_tokens).all()
    assert (df.output_tokens == df.target_output_tokens).all()
    assert (df.n_chunks == df.output_tokens).all()
    # The server's TTFT histogram saw every request, and the client's TTFT holds it: the
    # histogram starts at engine arrival (after HTTP parsing), as vLLM's does. How much the
    # client adds on top is its speed: benchmarks/bench_loadgen.py (client-added TTFT).
    n = (
        after["vllm:time_to_first_token_seconds_count"]
        - before["vllm:time_to_first_token_seconds_count"]
    )
    server_mean = (after["vllm:time_to_first_token_seconds_sum"]
                   - before["vllm:time_to_first_token_seconds_sum"]) / n
    assert n == len(df)
    assert df.ttft_s.mean() >= server_mean, (df.ttft_s.mean(), server_mean)


def test_open_loop_rate_is_reached_without_drift(sim, cli, load, tiny_profile, tmp_path) -> None:
    out = tmp_path / "rate"
    # Burstiness 1000 = nearly even gaps, so the schedule itself holds 300 arrivals in 3 s.
    res = cli("--target", sim, "--model", MODEL, "--profile", str(tiny_profile), "--rate", "100",
              "--burstiness", "1000", "--step-duration", "3", "--warmup", "0.5", "--workers", "0",
              "--out", str(out))
    assert res.returncode == 0, res.stderr
    df, manifest = load(out)
    assert set(df.status) == {"ok"} and df.request_id.is_unique
    # The seeded schedule runs at the target rate, and the requests sent are its arrivals in
    # order, each due at its absolute offset (so lateness never accumulates into drift). A
    # client that falls behind sends fewer before the step ends: how many, and how late, is
    # its speed (benchmarks/bench_open_loop.py).
    plan = plan_from_dict(manifest["plan"])
    offsets = np.array([a.offset_s for a in arrivals(plan, manifest["workload"]["seed"])])
    assert abs((len(offsets) - 1) / (offsets[-1] - offsets[0]) - 100) <= 2.0
    scheduled = np.sort(df.t_scheduled.to_numpy())
    assert 0 < len(scheduled) <= len(offsets)
    assert np.allclose(scheduled - scheduled[0], offsets[:len(scheduled)] - offsets[0], atol=1e-6)
    assert np.array_equal(np.sort(df.seq.to_numpy()), np.arange(len(scheduled)))
    # Lateness is recorded, not hidden.
    assert (df.send_lag_s >= 0).all()
    assert np.allclose(df.t_sent - df.t_scheduled, df.send_lag_s)
    assert (df.ttft_from_scheduled_s >= df.ttft_s).all()
    assert manifest["steps"][0]["target_rate"] == 100


def test_same_seed_same_requests_across_runs_and_worker_splits(
    sim, cli, load, tiny_profile, tmp_path
) -> None:
    before = _metric(sim, "vllm:request_success_total")
    frames = []
    for workers in ("0", "2"):
        out = tmp_path / f"w{workers}"
        res = cli("--target", sim, "--model", MODEL, "--profile", str(tiny_profile), "--rate", "40",
                  "--step-duration", "2", "--warmup", "0", "--workers", workers, "--seed", "11",
                  "--out", str(out))
        assert res.returncode == 0, res.stderr
        df, manifest = load(out)
        assert manifest["records"]["missing_by_worker"] == {}
        frames.append(df)
    one, two = frames
    assert two.worker.nunique() == 2
    assert _metric(sim, "vllm:request_success_total") - before == len(one) + len(two)
    cols = [
        "seq",
        "request_id",
        "target_prompt_tokens",
        "target_output_tokens",
        "prefix_group",
        "prompt_tokens",
    ]
    a = one[cols].sort_values("seq").reset_index(drop=True)
    b = two[cols].sort_values("seq").reset_index(drop=True)
    assert len(a) > 50 and a.equals(b)
    offs = [np.sort(f.t_scheduled.to_numpy() - f.t_scheduled.min()) for f in frames]
    assert np.allclose(offs[0], offs[1], atol=1e-6)


def test_launch_sim_chat_and_collect_into_one_run_folder(cli, load, tiny_profile, tmp_path) -> None:
    from loadlab.runstore import METRICS, read_table

    out = tmp_path / "launched"
    res = cli(
        "--launch",
        "sim",
        "--api",
        "chat",
        "--profile",
        str(tiny_profile),
        "--concurrency",
        "2",
        "--step-duration",
        "2",
        "--warmup",
        "0",
        "--collect",
        "--interval",
        "0.25",
        "--workers",
        "0",
        "--out",
        str(out),
        "--",
        "--max-num-seqs",
        "4",
        "--time-scale",
        "5",
    )
    assert res.returncode == 0, res.stderr
    df, manifest = load(out)
    assert manifest["status"] == "complete" and len(df) > 0 and set(df.status) == {"ok"}
    assert manifest["target"]["launch"]["flags"]["max_num_seqs"] == 4
    assert manifest["server"] == {"max_num_seqs": 4}
    # Chat prompts are calibrated with a chat-shaped /tokenize: template tokens included.
    assert (df.prompt_tokens == df.target_prompt_tokens).all() and (
        df.n_chunks == df.output_tokens
    ).all()
    metrics = read_table(out / "metrics.parquet", METRICS)
    done = metrics[metrics.family == "vllm:request_success"].groupby("t").value.sum()
    # The scraper and the client agree on completions up to the last scrape (2 = in flight
    # while that scrape was answered).
    t_last = done.index[-1]
    assert done.iloc[-1] > 0.8 * len(df)
    assert abs(done.iloc[-1] - (df.t_done <= t_last).sum()) <= 2
