"""run_replay: a step load through the simulator in virtual time, written as a run folder."""

from __future__ import annotations

import gc
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from loadlab.errors import InputError
from loadlab.replay import driver, replicas
from loadlab.replay.driver import ReplayOptions, TokenTimes, gc_relaxed, prompt_ids, run_replay
from loadlab.replay.records import RequestRows, gap_quantiles, segment_quantile
from loadlab.runstore import METRICS, REQUESTS, read_manifest, read_table
from loadlab.sim.engine.config import SimConfig
from loadlab.sim.engine.core import Engine
from loadlab.sim.engine.hardware import resolve
from loadlab.sim.engine.metrics import EngineMetrics
from loadlab.sim.engine.types import EngineRequest
from loadlab.spec.plan import KneeSearch, LoadPlan
from loadlab.spec.scenario import Workload
from loadlab.spec.validate import plan_from_flags

EPOCH = 1_800_000_000.0


def small_cfg(**kw: object) -> SimConfig:
    base = {"model": "qwen2.5-7b", "gpu": "h100", "max_model_len": 4096, "max_num_seqs": 8,
                "num_gpu_blocks_override": 3000}
    return SimConfig(**{**base, **kw})


def replay(tmp: Path, cfg: SimConfig | None = None, profile: str = "sharegpt", seed: int = 0,
           metrics_interval_s: float = 1.0, **plan: object) -> tuple[pd.DataFrame, pd.DataFrame]:
    kw = {k: v for k, v in {"concurrency": [4, 12], "step_duration_s": 15.0, "warmup_s": 3.0,
                            **plan}.items() if v is not None}
    summary = run_replay(
        cfg or small_cfg(),
        LoadPlan(**kw),
        Workload(profile=profile, seed=seed),
        tmp,
        ReplayOptions(start_epoch=EPOCH, metrics_interval_s=metrics_interval_s),
    )
    requests = read_table(tmp / "requests.parquet", REQUESTS)
    metrics = read_table(tmp / "metrics.parquet", METRICS)
    assert summary.requests == len(requests) and summary.metrics_rows == len(metrics)
    return requests, metrics


def gauge(metrics: pd.DataFrame, name: str) -> pd.Series:
    return metrics[metrics.metric == name].set_index("t").value


def test_closed_loop_records(tmp_path: Path) -> None:
    requests, _ = replay(tmp_path)
    assert sorted(requests.seq) == list(range(len(requests)))
    assert set(requests.step) == {0, 1} and (requests.worker == "sim-replay").all()
    # every user always has one request open: at the end exactly c_last are cut off
    assert (requests.status == "aborted").sum() == 12
    ok = requests[requests.status == "ok"]
    assert (ok.n_chunks == ok.output_tokens).all()
    assert (ok.output_tokens == ok.target_output_tokens.clip(upper=4095)).all()
    assert ok.e2e_s.to_numpy() == pytest.approx([c[-1] for c in ok.chunk_offsets_s])
    assert ok.ttft_s.to_numpy() == pytest.approx([c[0] for c in ok.chunk_offsets_s])
    assert (ok.t_done <= EPOCH + 30).all() and (requests.t_sent >= EPOCH).all()
    assert (requests.prompt_tokens + requests.output_tokens <= 4096).all()
    # a user sends its next request the moment the previous one is done
    for _, rows in requests.sort_values("t_sent").groupby("user"):
        done = rows.t_done.to_numpy()[:-1]
        assert rows.t_sent.to_numpy()[1:] == pytest.approx(done)
    # rows per step = requests sent in the step's window
    for step, rows in requests.groupby("step"):
        assert ((rows.t_sent >= EPOCH + 15 * step) & (rows.t_sent < EPOCH + 15 * (step + 1))).all()
        assert (rows.concurrency == (4, 12)[step]).all()
    multi = ok[ok.n_chunks > 1]
    assert len(multi) > 0 and multi.itl_max_s.ge(multi.itl_p50_s).all()
    assert multi.itl_mean_s.to_numpy() == pytest.approx(
        ((multi.e2e_s - multi.ttft_s) / (multi.n_chunks - 1)).to_numpy())


def test_seq_cap_shows_in_waiting_gauge(tmp_path: Path) -> None:
    _, metrics = replay(tmp_path)
    running, waiting = (
        gauge(metrics, "vllm:num_requests_running"),
        gauge(metrics, "vllm:num_requests_waiting"),
    )
    window = (waiting.index > EPOCH + 18) & (waiting.index < EPOCH + 30)
    assert running[window].max() == 8
    # c=12 against max_num_seqs=8: 4 wait (one more in the instant between a finish and admission)
    assert waiting[window].median() == 12 - 8
    assert set(waiting[window]) <= {4.0, 5.0}
    assert waiting[(waiting.index > EPOCH + 3) & (waiting.index < EPOCH + 15)].max() == 0
    # one sample per virtual second, 0..30 inclusive
    assert len(running) == 31 and running.index[1] - running.index[0] == pytest.approx(1.0)
    assert (metrics.source == "sim").all()


def test_refusals_are_sampled_in_virtual_time(tmp_path: Path) -> None:
    _, metrics = replay(tmp_path)
    steps = gauge(metrics, "loadlab:scheduler_steps_total")
    refused = metrics[metrics.metric == "loadlab:scheduler_refused_steps_total"]
    by_reason = {reason: rows.set_index("t").value
                 for reason, rows in refused.groupby(refused.labels.str.extract(
                     r'"reason":"(\w+)"')[0])}
    assert set(by_reason) == {"preempted", "token_budget", "seq_cap", "kv_blocks", "other"}
    assert len(steps) == 31 and steps.is_monotonic_increasing and steps.iloc[-1] > 100
    seq_cap = by_reason["seq_cap"]
    # c=4 under max_num_seqs=8 leaves nobody waiting; c=12 does, behind the cap
    assert seq_cap[seq_cap.index < EPOCH + 15].max() == 0
    assert seq_cap.iloc[-1] > 0.5 * (steps.iloc[-1] - steps[EPOCH + 16])
    assert by_reason["kv_blocks"].iloc[-1] == by_reason["preempted"].iloc[-1] == 0
    assert gauge(metrics, "loadlab:scheduler_head_running").iloc[-1] == 8


def test_same_seed_same_records(tmp_path: Path) -> None:
    a, ma = replay(tmp_path / "a", seed=3)
    b, mb = replay(tmp_path / "b", seed=3)
    c, _ = replay(tmp_path / "c", seed=4)
    pd.testing.assert_frame_equal(a.sort_values("seq").reset_index(drop=True),
                                  b.sort_values("seq").reset_index(drop=True))
    pd.testing.assert_frame_equal(ma.reset_index(drop=True), mb.reset_index(drop=True))
    assert list(a.sort_values("seq").target_prompt_tokens[:20]) != \
        list(c.sort_values("seq").target_prompt_tokens[:20])


def test_many_flushes_write_what_one_flush_writes(tmp_path: Path, monkeypatch) -> None:
    """A flush reads each replica's step ends only from the first step its requests
    span; flushing every 8 requests must give the rows (ITL figures and rebuilt token
    offsets included) that one flush at the end gives."""
    one, _ = replay(tmp_path / "one", seed=5)
    monkeypatch.setattr(driver, "RequestRows", partial(RequestRows, flush_rows=8))
    many, _ = replay(tmp_path / "many", seed=5)
    assert len(list((tmp_path / "many" / "step_ends.parquet").glob("*.parquet"))) == 1  # compacted
    assert many.token_timeline.notna().sum() > 8 * 4   # several flushes of pointed rows
    pd.testing.assert_frame_equal(one.sort_values("seq").reset_index(drop=True),
                                  many.sort_values("seq").reset_index(drop=True))


def test_steps_applied_without_the_heap_write_what_the_heap_writes(tmp_path: Path,
                                                                   monkeypatch) -> None:
    """A lone replica's steps that end before the heap's next event are applied inline;
    pushing every step's end on the heap instead (``inline_steps`` handing each step
    back) must write the same requests and metrics, with preemptions (a small pool) and
    samples falling mid-step (0.25 s scrapes), and run the same engine steps."""
    cfg = small_cfg(num_gpu_blocks_override=400)
    calls: list[int] = []
    real = driver._Replay.inline_steps

    def counted(self, replica, out, steps):  # type: ignore[no-untyped-def]
        calls.append(steps)
        return real(self, replica, out, steps)

    monkeypatch.setattr(driver._Replay, "inline_steps", counted)
    inline, m_inline = replay(tmp_path / "inline", cfg, seed=6, metrics_interval_s=0.25)
    assert calls   # the inline path ran
    monkeypatch.setattr(driver._Replay, "inline_steps", lambda self, replica, out, steps:
                        (steps, out))
    heap, m_heap = replay(tmp_path / "heap", cfg, seed=6, metrics_interval_s=0.25)
    assert gauge(m_heap, "vllm:num_preemptions_total").max() > 0
    pd.testing.assert_frame_equal(inline.sort_values("seq").reset_index(drop=True),
                                  heap.sort_values("seq").reset_index(drop=True))
    pd.testing.assert_frame_equal(m_inline.reset_index(drop=True), m_heap.reset_index(drop=True))
    steps = [read_manifest(tmp_path / d)["sim"]["engine_steps"] for d in ("inline", "heap")]
    assert steps[0] == steps[1] > 0


def test_open_loop_rate_steps(tmp_path: Path) -> None:
    requests, _ = replay(
        tmp_path, concurrency=None, rate=[2.0, 6.0], step_duration_s=20.0, burstiness=0.5
    )
    counts = requests.groupby("step").size()
    for step, rate in enumerate((2.0, 6.0)):
        expected = rate * 20
        assert abs(counts[step] - expected) < 4 * (expected / 0.5) ** 0.5
        assert (requests[requests.step == step].target_rate == rate).all()
    assert requests.concurrency.isna().all() and requests.user.isna().all()


def test_prefix_groups_hit_the_cache(tmp_path: Path) -> None:
    cfg = small_cfg(max_model_len=8192, num_gpu_blocks_override=4000)
    plan = {"profile": "shared-system-prompt", "concurrency": [4], "step_duration_s": 20.0}
    _, on = replay(tmp_path / "on", cfg, **plan)
    _, off = replay(tmp_path / "off", small_cfg(max_model_len=8192, num_gpu_blocks_override=4000,
                                                enable_prefix_caching=False), **plan)
    hits_on = gauge(on, "vllm:prefix_cache_hits_total").iloc[-1]
    queries_on = gauge(on, "vllm:prefix_cache_queries_total").iloc[-1]
    assert hits_on > 0.2 * queries_on
    assert gauge(off, "vllm:prefix_cache_hits_total").iloc[-1] == 0


def test_manifest(tmp_path: Path) -> None:
    replay(tmp_path, cfg=small_cfg(api_key="sk-secret"))
    manifest = read_manifest(tmp_path)
    assert manifest["kind"] == "sim-replay" and manifest["status"] == "complete"
    assert [s["concurrency"] for s in manifest["steps"]] == [4, 12]
    assert manifest["steps"][1]["t_start"] == EPOCH + 15 and manifest["steps"][1]["warmup_s"] == 3
    assert manifest["server"]["max_num_seqs"] == 8 and manifest["server"]["num_gpu_blocks"] == 3000
    assert manifest["sim"]["startup_lines"][-1].startswith("Maximum concurrency for 4,096 tokens")
    assert manifest["sim"]["speed"] > 0
    assert "sk-secret" not in (tmp_path / "manifest.json").read_text()


def test_the_finished_folder_is_compacted_without_losing_a_row(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # 0.1 s samples over 200 virtual s: ~580k metric rows, three parts of 200k before compaction
    monkeypatch.setattr(replicas, "SAMPLES_PER_PART", 200_000)
    requests, metrics = replay(tmp_path, concurrency=[2], step_duration_s=200.0, warmup_s=5.0,
                                metrics_interval_s=0.1)
    parts = sorted(p.name for p in (tmp_path / "metrics.parquet").glob("part-*.parquet"))
    assert len(parts) == 1 and "~" in parts[0], parts       # one part, the compacted one
    assert len(metrics) > 400_000 and len(requests) > 0
    assert metrics["t"].is_monotonic_increasing              # rows kept in order


def test_a_replay_shorter_than_a_part_writes_one_part_left_uncompacted(tmp_path: Path) -> None:
    # ~580k metric rows: one part of the replay's buffer, nothing for compaction to rewrite
    requests, metrics = replay(tmp_path, concurrency=[2], step_duration_s=200.0, warmup_s=5.0,
                                metrics_interval_s=0.1)
    parts = sorted(p.name for p in (tmp_path / "metrics.parquet").glob("part-*.parquet"))
    assert len(parts) == 1 and "~" not in parts[0], parts
    assert len(metrics) > 400_000 and metrics["t"].is_monotonic_increasing


def test_prompt_ids_share_exactly_the_prefix() -> None:
    a = prompt_ids(1, 100, 3, 60, 20)
    b = prompt_ids(2, 80, 3, 60, 20)
    other_group = prompt_ids(3, 100, 4, 60, 20)
    alone = prompt_ids(4, 100, None, 0, 20)
    assert len(a) == 100 and a[:60] == b[:60] and a[60] != b[60]
    assert a[:20] == other_group[:20] and a[20] != other_group[20]
    assert not set(alone) & set(a)


@pytest.mark.parametrize("plan", [
    {}, {"concurrency": "2", "rate": "1"}, {"concurrency": "0"},
    {"concurrency": "2", "warmup_s": 60.0}, {"rate": "-1"}, {"concurrency": "2,x"},
])
def test_bad_plans(plan: dict) -> None:
    with pytest.raises(InputError):
        plan_from_flags(**plan)


@pytest.mark.parametrize("plan", [
    LoadPlan(trace="t.csv", trace_duration_s=10.0),
    LoadPlan(search=KneeSearch(start=2, max=8, resolution=2)),
])
def test_plans_a_replay_cannot_run(tmp_path: Path, plan: LoadPlan) -> None:
    with pytest.raises(InputError):
        run_replay(small_cfg(), plan, Workload(), tmp_path)
    assert not (tmp_path / "manifest.json").exists()


def test_token_times_match_per_token_tracking_under_preemption() -> None:
    # 6 long requests in a 40-block pool: preemptions make requests skip steps
    resolved = resolve(SimConfig(num_gpu_blocks_override=40, block_size=16, max_model_len=512,
                                 max_num_seqs=6, max_num_batched_tokens=256))
    tracker, naive, done, preempted = TokenTimes(), {}, {}, 0
    engine, metrics = Engine(resolved, lambda batch: 0.01), EngineMetrics(resolved)
    for i in range(6):
        req = EngineRequest(f"r{i}", list(range(i * 1000, i * 1000 + 90)), 60, 60, 0.0)
        engine.add_request(req)
        metrics.observe_arrival(req, 0.0)
    now = 0.0
    while engine.has_unfinished_requests():
        out = engine.step(now)
        assert out is not None
        now = out.t_end
        preempted += len(out.preempted)
        metrics.observe_step(out)
        tracker.observe(out, metrics.stopped)
        for rid, n in out.new_tokens.items():
            if n:
                naive.setdefault(rid, []).append(out.t_end)
        for fin in out.finished:
            done[fin.request_id] = tracker.pop(fin.request_id)[0].tolist()
    assert preempted > 0 and len(done) == 6
    assert done == naive


def test_segment_quantile_matches_numpy() -> None:
    rng = np.random.default_rng(0)
    segments = [np.sort(rng.exponential(size=n)) for n in (37, 1, 2, 100)]
    flat = np.concatenate(segments)
    count = np.array([len(s) for s in segments])
    start = np.concatenate(([0], np.cumsum(count)[:-1]))
    for q in (0.0, 0.5, 0.99, 1.0):
        got = segment_quantile(flat, start, count, q)
        assert got == pytest.approx([np.percentile(s, q * 100) for s in segments])


def test_gap_quantiles_per_request_across_chunks() -> None:
    # more requests than one chunk holds, with 0- and 1-token requests among them
    rng = np.random.default_rng(1)
    times = [np.cumsum(rng.exponential(size=n)) for n in rng.integers(0, 40, size=200)]
    p50, p99, top = gap_quantiles(times)
    for i, t in enumerate(times):
        gaps = np.diff(t)
        want = ((np.percentile(gaps, 50), np.percentile(gaps, 99), gaps.max()) if len(gaps)
                else (0.0, 0.0, 0.0))
        assert (p50[i], p99[i], top[i]) == pytest.approx(want)


def test_lowered_concurrency_retires_users(tmp_path: Path) -> None:
    requests, metrics = replay(tmp_path, concurrency=[8, 2], step_duration_s=10.0, warmup_s=2.0)
    later = requests[requests.step == 1]
    assert set(later.user) <= {0, 1} and len(later) > 0
    assert (requests.status == "aborted").sum() == 2
    running = gauge(metrics, "vllm:num_requests_running")
    assert running[running.index > EPOCH + 16].max() <= 2


def test_gc_relaxed_restores_the_collector_and_leaves_a_callers_freeze_alone() -> None:
    assert gc.isenabled()
    with gc_relaxed():
        assert not gc.isenabled()
    assert gc.isenabled() and gc.get_freeze_count() == 0
    gc.freeze()  # a caller's frozen objects (e.g. before a fork) stay frozen
    try:
        frozen = gc.get_freeze_count()
        with gc_relaxed():
            pass
        # gc.unfreeze() would leave none frozen; another test's thread still running may
        # free a few frozen objects meanwhile (a flush timer's buffer), which leaves them
        assert gc.get_freeze_count() > frozen * 0.9
    finally:
        gc.unfreeze()
