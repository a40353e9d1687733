"""The per-step table reads a run folder and shows each stall signature where it is."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from loadlab.analyze.display import format_step_table
from loadlab.analyze.steps import burst_share, step_table
from loadlab.errors import InputError
from loadlab.replay.driver import run_replay
from loadlab.runstore import read_manifest, update_manifest
from loadlab.sim.engine.config import SimConfig
from loadlab.spec.plan import LoadPlan
from loadlab.spec.scenario import Workload


@pytest.fixture(scope="module")
def seq_capped(tmp_path_factory):
    """Closed loop 4 -> 32 users against max_num_seqs 8 with a roomy pool."""
    out = tmp_path_factory.mktemp("capped")
    cfg = SimConfig(max_num_seqs=8, model="qwen2.5-7b", gpu="h100")
    plan = LoadPlan(concurrency=[4, 32], step_duration_s=40.0, warmup_s=10.0)
    run_replay(cfg, plan, Workload(profile="azure-conv", seed=3), out)
    return step_table(out)


def test_sequence_cap_shows_as_running_pinned_and_waiting(seq_capped):
    below, above = seq_capped.iloc[0], seq_capped.iloc[1]
    assert below.running_max <= 4 and below.waiting_max == 0
    assert above.running_max == 8
    # waiting sits near c - max_num_seqs = 24 (a snapshot can catch a slot mid-refill)
    assert 20 <= above.waiting_mean <= 24
    assert above.kv_max < 0.5
    assert above.ttft_p50_ms > 3 * below.ttft_p50_ms


def test_engine_steps_and_the_batch_a_step_come_from_the_iteration_histogram(seq_capped):
    """vLLM observes vllm:iteration_tokens_total once per engine step: its count over the
    measured 30 s is the steps taken, and tokens generated over it the decode batch a
    step, at most the running requests (4 users below the cap, 8 seats above it)."""
    below, above = seq_capped.iloc[0], seq_capped.iloc[1]
    for row, seats in ((below, 4), (above, 8)):
        assert row.engine_steps > 100
        assert seats - 1 <= row.decode_per_step <= seats
    # a step carries more requests above the cap, so each one takes longer: fewer steps
    assert above.engine_steps < below.engine_steps


def test_cached_prompt_tokens_come_from_the_split_by_source_where_that_is_all(tmp_path):
    """The simulator, like a vLLM without ``vllm:prompt_tokens_cached``, splits prompt
    tokens by source only: the tokens served from the prefix cache come from
    ``source="local_cache_hit"``, about the prefix cache's hit rate of the prompt tokens,
    so the tokens an engine step computed leave the shared system prompt out."""
    cfg = SimConfig(max_num_seqs=8, model="qwen2.5-7b", gpu="h100")
    plan = LoadPlan(concurrency=[4, 16], step_duration_s=30.0, warmup_s=10.0)
    run_replay(cfg, plan, Workload(profile="shared-system-prompt", seed=3), tmp_path)
    table = step_table(tmp_path)
    share = table.cached_tok_rate / table.prompt_tok_rate
    assert (share > 0.2).all()
    assert np.allclose(share, table.prefix_hit_rate, atol=0.05)


def test_itl_stays_flat_across_the_cap(seq_capped):
    below, above = seq_capped.iloc[0], seq_capped.iloc[1]
    assert above.itl_p50_ms < 3 * below.itl_p50_ms


def test_tiny_pool_shows_preemptions_and_full_kv(tmp_path):
    cfg = SimConfig(max_num_seqs=64, num_gpu_blocks_override=400, max_model_len=4096)
    plan = LoadPlan(concurrency=[48], step_duration_s=30.0, warmup_s=5.0)
    run_replay(cfg, plan, Workload(profile="bwb", seed=1), tmp_path)
    row = step_table(tmp_path).iloc[0]
    assert row.preemptions > 0
    assert row.kv_max > 0.9
    assert row.running_max < 64


def test_table_text_has_a_row_per_step_and_skips_empty_columns(seq_capped):
    text = format_step_table(seq_capped)
    lines = text.splitlines()
    assert len(lines) == 1 + len(seq_capped)
    assert "TTFT p50 ms" in lines[0] and "waiting" in lines[0]
    assert "rate" not in lines[0].split()  # closed loop: no target rate column


def test_missing_manifest_is_an_input_error(tmp_path):
    with pytest.raises(InputError) as exc:
        step_table(tmp_path)
    assert str(tmp_path) in str(exc.value)
    assert exc.value.exit_code == 2


def test_measured_window_excludes_warmup(seq_capped):
    # every step kept its warm-up cut: the measured window is 30 of the 40 s
    assert all(
        math.isclose(r.t_end - r.t_start, 30.0, abs_tol=1e-6) for r in seq_capped.itertuples()
    )


def test_burst_share_counts_streams_delivered_whole():
    offsets = [[0.100, 0.1005, 0.101], [0.1, 0.2], [0.3]]
    ok = pd.DataFrame(
        {
            "n_chunks": [3, 2, 1],  # the mean gap as the client stores it
            "itl_mean_s": [(o[-1] - o[0]) / (len(o) - 1) if len(o) > 1 else None for o in offsets],
        }
    )
    assert burst_share(ok) == 0.5  # the one-chunk stream says nothing either way
    assert math.isnan(burst_share(ok.iloc[2:]))


def test_simulated_streams_are_paced_not_burst(seq_capped):
    assert (seq_capped.burst_share == 0).all()


def test_table_shows_the_load_each_step_achieved(tmp_path):
    run_replay(
        SimConfig(max_num_seqs=8),
        LoadPlan(concurrency=[2, 4], step_duration_s=5.0, warmup_s=1.0),
        Workload(profile="azure-conv", seed=1),
        tmp_path,
    )
    manifest = read_manifest(tmp_path)
    steps = [{**manifest["steps"][0], "achieved_ratio": 0.995, "client_limited": False},
             {**manifest["steps"][1], "achieved_ratio": 0.26, "client_limited": True}]
    update_manifest(tmp_path, steps=steps)
    lines = format_step_table(step_table(tmp_path)).splitlines()
    end = lines[0].index("achieved") + len("achieved")  # cells are right-aligned under headers
    assert [line[:end].split()[-1] for line in lines[1:]] == ["100%", "26%"]
