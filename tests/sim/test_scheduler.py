"""V1 scheduling behaviours the stall diagnosis relies on, driven through the Engine.

Every step lasts 1 s of engine clock (unit_step), so times read as step numbers.
"""

from __future__ import annotations

import math

import pytest
from sched_fixtures import make_engine, req, run_until_idle, unique_tokens

from loadlab.errors import InputError
from loadlab.sim.engine.core import Engine


def test_sequence_cap_keeps_requests_waiting_with_kv_mostly_free() -> None:
    c, cap = 12, 4
    e, _outs = make_engine(max_num_seqs=cap, num_gpu_blocks=400, max_num_batched_tokens=1024)
    sent = 0
    for _ in range(c):
        e.add_request(req(f"r{sent}", 100, out=10 + sent % 17))
        sent += 1
    now = 0.0
    quiet_steps = 0
    for _ in range(200):  # closed loop: every finished request is replaced at once
        out = e.step(now)
        assert out is not None
        now = out.t_end
        for _ in out.finished:
            e.add_request(req(f"r{sent}", 100, out=10 + sent % 17, t=now))
            sent += 1
        assert out.num_running + out.num_waiting + len(out.finished) == c
        assert out.kv_usage < 0.1
        assert out.preempted == []
        if not out.finished:  # a finish frees a slot that the next step refills
            quiet_steps += 1
            assert (out.num_running, out.num_waiting) == (cap, c - cap)
    assert quiet_steps > 100
    assert sent > 2 * c  # requests did cycle through


def test_tiny_pool_preempts_the_newest_and_admits_nothing_that_step() -> None:
    e, outs = make_engine(num_gpu_blocks=12, max_model_len=160, enable_prefix_caching=False,
                          scheduler_reserve_full_isl=False, long_prefill_token_threshold=32,
                          max_num_seqs=3)
    e.add_request(req("A", 150, out=5))
    e.add_request(req("B", 8, out=6))
    e.add_request(req("C", 40, out=20))
    now = 0.0
    while True:
        out = e.step(now)
        assert out is not None, "expected a preemption before going idle"
        now = out.t_end
        if out.preempted:
            break
    assert out.preempted == ["C"]  # newest running, though A (oldest) needed the blocks
    assert "A" in out.scheduled and "B" in out.scheduled
    # C's blocks would fit its next 32-token chunk, yet nothing is admitted this step.
    assert out.admitted == [] and "C" not in out.scheduled
    assert e.kv_usage < 1.0
    assert e.scheduler.waiting[0].request_id == "C"
    assert (out.num_running, out.num_waiting) == (2, 1)
    run_until_idle(e, now)
    fin = {f.request_id: f for o in outs for f in o.finished}
    assert fin["C"].num_preemptions == 1 and fin["C"].output_len == 20
    assert fin["A"].num_preemptions == 0


def test_preempted_request_goes_before_older_waiting_requests() -> None:
    e, _outs = make_engine(num_gpu_blocks=12, max_model_len=160, enable_prefix_caching=False,
                          scheduler_reserve_full_isl=False, long_prefill_token_threshold=32,
                          max_num_seqs=3)
    for rid, n, o in (("A", 150, 5), ("B", 8, 6), ("C", 40, 20), ("D", 8, 2)):
        e.add_request(req(rid, n, out=o))
    now = 0.0
    while not (out := e.step(now)).preempted:
        now = out.t_end
    assert [r.request_id for r in e.scheduler.waiting] == ["C", "D"]


def test_long_prompt_is_chunked_over_ceil_prompt_over_budget_steps() -> None:
    budget, prompt = 256, 1000
    e, outs = make_engine(max_num_batched_tokens=budget)
    e.add_request(req("long", prompt, out=2))
    run_until_idle(e)
    first = next(i for i, o in enumerate(outs) if o.first_token == ["long"])
    assert first + 1 == math.ceil(prompt / budget)
    assert [o.scheduled["long"] for o in outs[:first]] == [budget] * first
    assert outs[first].scheduled["long"] == prompt - budget * first


def _head_of_line_case(chunked: bool) -> tuple[float, float]:
    """8 decoders leave 1016 of 1024 tokens; a 1020-token prompt waits; shorts queue behind.

    Returns (first schedule time of the long prompt, earliest first schedule of a short).
    """
    e, outs = make_engine(max_num_batched_tokens=1024, max_model_len=1024, max_num_seqs=32,
                          enable_chunked_prefill=chunked, num_gpu_blocks=2000)
    for i in range(8):
        e.add_request(req(f"d{i}", 20, out=30))
    now = e.step(0.0).t_end  # decoders admitted and emitting
    e.add_request(req("long", 1020, out=2, t=now))
    for i in range(4):
        e.add_request(req(f"s{i}", 10, out=2, t=now))
    run_until_idle(e, now)
    first_sched: dict[str, float] = {}
    for o in outs:
        for rid in o.admitted:
            first_sched.setdefault(rid, o.t_start)
    return first_sched["long"], min(first_sched[f"s{i}"] for i in range(4))


def test_chunked_prefill_off_lets_a_long_head_block_the_short_requests() -> None:
    long_off, short_off = _head_of_line_case(chunked=False)
    long_on, short_on = _head_of_line_case(chunked=True)
    assert long_off >= 30  # waited for all decoders to finish (budget never had 1020 left)
    assert short_off >= long_off  # shorts could have run, but FCFS head blocked them
    assert long_on == 1.0 and short_on <= 2.0


def test_chunked_prefill_off_requires_budget_of_max_model_len() -> None:
    with pytest.raises(InputError) as err:
        make_engine(enable_chunked_prefill=False, max_num_batched_tokens=512, max_model_len=1024)
    assert err.value.field == "max_num_batched_tokens"
    make_engine(enable_chunked_prefill=False, max_num_batched_tokens=1024, max_model_len=1024)


@pytest.mark.parametrize("threshold", [0, 64])
def test_long_prefill_token_threshold_caps_prefill_chunks(threshold: int) -> None:
    e, outs = make_engine(max_num_batched_tokens=256, long_prefill_token_threshold=threshold)
    e.add_request(req("p", 300, out=1))
    e.add_request(req("d", 10, out=12))  # a competitor, so the cap applies (see test_vllm_rules)
    run_until_idle(e)
    chunks = [o.scheduled["p"] for o in outs if "p" in o.scheduled]
    assert sum(chunks) == 300
    assert chunks == ([64, 64, 64, 64, 44] if threshold else [256, 44])


@pytest.mark.parametrize("caching", [True, False])
def test_shared_prefix_hits_cut_prefill_work(caching: bool) -> None:
    e, outs = make_engine(enable_prefix_caching=caching)
    prefix = unique_tokens(64)
    e.add_request(req("first", prefix + unique_tokens(30), out=2))
    now = run_until_idle(e)
    e.add_request(req("second", prefix + unique_tokens(30), out=2, t=now))
    run_until_idle(e, now)
    second = next(o for o in outs if "second" in o.admitted)
    if caching:
        assert second.prefix_queries_tokens == 94 and second.prefix_hits_tokens == 64
        assert second.scheduled["second"] == 30
        assert second.prompt_tokens_computed == 30
    else:
        assert second.prefix_queries_tokens == 0 and second.prefix_hits_tokens == 0
        assert second.scheduled["second"] == 94
        assert second.prompt_tokens_computed == 94
    fin = {f.request_id: f for o in outs for f in o.finished}
    assert fin["second"].num_cached_tokens == (64 if caching else 0)
    total_q = sum(o.prefix_queries_tokens for o in outs)
    assert total_q == (188 if caching else 0)


def test_identical_requests_in_one_step_share_blocks_cached_at_allocation() -> None:
    e, _outs = make_engine()
    toks = unique_tokens(48)
    e.add_request(req("a", toks, out=2))
    e.add_request(req("b", list(toks), out=2))
    out = e.step(0.0)
    # vLLM caches full blocks when they are allocated, so b hits a's blocks in the same step.
    assert out.prefix_hits_tokens == 32 and out.scheduled == {"a": 48, "b": 16}


def test_kv_usage_counts_cached_free_blocks_as_free() -> None:
    e, _outs = make_engine(num_gpu_blocks=101, max_model_len=1024, max_num_batched_tokens=512)
    e.add_request(req("x", 320, out=3))
    out = e.step(0.0)
    assert out.kv_usage == pytest.approx(20 / 100)
    run_until_idle(e, out.t_end)
    assert e.kv_usage == 0.0
    assert e.scheduler.pool.num_cached_blocks == 20  # still cached, yet counted free


def _reserve_case(reserve: bool) -> list[str]:
    """A holds 6 of 10 blocks; B (100 tokens = 7 blocks) arrives; 64-token budget."""
    e, _outs = make_engine(num_gpu_blocks=11, max_model_len=160, max_num_batched_tokens=64,
                          scheduler_reserve_full_isl=reserve, enable_prefix_caching=False)
    e.add_request(req("A", 90, out=3))
    now = run_steps(e, 2)
    e.add_request(req("B", 100, out=2, t=now))
    out = e.step(now)
    return out.admitted


def run_steps(e: Engine, n: int, now: float = 0.0) -> float:
    for _ in range(n):
        now = e.step(now).t_end
    return now


def test_full_prompt_must_fit_admission_check_changes_admission() -> None:
    assert _reserve_case(reserve=True) == []      # 7 blocks needed, 4 free: not admitted
    assert _reserve_case(reserve=False) == ["B"]  # first 63-token chunk (4 blocks) fits


def test_first_token_counts_and_iteration_tokens() -> None:
    e, outs = make_engine(max_num_batched_tokens=64)
    e.add_request(req("a", 100, out=3))
    e.add_request(req("b", 10, out=3))
    run_until_idle(e)
    emitted = [sum(o.new_tokens.values()) for o in outs]
    assert sum(emitted) == 6
    for o in outs:
        prompts = sum({"a": 100, "b": 10}[r] for r in o.first_token)
        assert o.iteration_tokens == prompts + sum(o.new_tokens.values())
    fin = {f.request_id: f for o in outs for f in o.finished}
    assert fin["a"].finish_reason == "length" and fin["a"].output_len == 3


def test_budget_never_exceeded_and_running_never_above_cap() -> None:
    e, outs = make_engine(max_num_seqs=5, max_num_batched_tokens=100, num_gpu_blocks=60,
                          max_model_len=256)
    for i in range(40):
        e.add_request(req(f"r{i}", 30 + 7 * i % 150, out=1 + i % 40))
    run_until_idle(e)
    assert all(sum(o.scheduled.values()) <= 100 for o in outs)
    assert all(o.num_running <= 5 for o in outs)
    done = [f for o in outs for f in o.finished]
    assert len(done) == 40 and e.scheduler.pool.num_free == 59
