"""The scheduler's refusals: one case per reason, and the loadlab: series that count them.

Every case runs through the reference scheduler and its fast path (they must agree).
Each step lasts 1 s (unit_step). Pools are ``num_gpu_blocks`` blocks of 16 tokens, one of
them the null block, so ``usable = num_gpu_blocks - 1``.
"""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families
from sched_fixtures import Cfg, req, unit_step

from loadlab.sim.engine.config import SimConfig
from loadlab.sim.engine.core import Engine
from loadlab.sim.engine.hardware import resolve
from loadlab.sim.engine.metrics import EngineMetrics
from loadlab.sim.engine.types import REFUSAL_REASONS, EngineRequest, Refusal, StepOutput

ENGINES = pytest.mark.parametrize("reference", [True, False], ids=["reference", "fast"])


def engine(reference: bool, **cfg: object) -> tuple[Engine, list[StepOutput]]:
    outs: list[StepOutput] = []
    return Engine(Cfg(**cfg), unit_step, outs.append, reference=reference), outs


def run(e: Engine, max_steps: int = 10_000) -> None:
    now = 0.0
    for _ in range(max_steps):
        out = e.step(now)
        if out is None:
            return
        now = out.t_end
    raise AssertionError("engine did not go idle")


def check_invariants(outs: list[StepOutput], usable: int) -> None:
    """A step is refused exactly when requests still wait after it; the state it records
    is the scheduler's at the end of schedule() (finishes free blocks only afterwards)."""
    for out in outs:
        assert (out.refusal is None) == (out.num_waiting == 0), out
        if out.refusal is not None:
            assert out.refusal.running == out.num_running + len(out.finished)
            if not out.finished:
                assert out.refusal.free_blocks == round((1 - out.kv_usage) * usable)


@ENGINES
def test_seq_cap(reference: bool) -> None:
    e, outs = engine(reference, max_num_seqs=2)
    for rid in "ABC":
        e.add_request(req(rid, 20, out=5))
    run(e)
    # two 20-token prompts hold 2 blocks each of 999
    assert outs[0].refusal == Refusal("seq_cap", 0, 999 - 4, 2)
    assert [o.refusal.reason for o in outs if o.refusal] == ["seq_cap"] * 5
    check_invariants(outs, 999)


@ENGINES
def test_token_budget_whole_prompt_without_chunked_prefill(reference: bool) -> None:
    e, outs = engine(reference, enable_chunked_prefill=False, max_num_batched_tokens=2048)
    e.add_request(req("A", 1500, out=3))
    e.add_request(req("B", 1000, out=3))
    run(e)
    # 548 tokens of budget left, B's 1000 do not fit whole: B waits though 905 blocks are free
    assert outs[0].refusal == Refusal("token_budget", 0, 999 - 94, 1)
    assert outs[0].admitted == ["A"] and outs[1].admitted == ["B"]
    assert outs[1].refusal is None
    check_invariants(outs, 999)


@ENGINES
def test_token_budget_spent_by_a_prefill_chunk(reference: bool) -> None:
    e, outs = engine(reference, max_num_batched_tokens=256)
    e.add_request(req("A", 300, out=3))
    e.add_request(req("B", 10, out=3))
    run(e)
    assert outs[0].scheduled == {"A": 256}
    assert outs[0].refusal == Refusal("token_budget", 0, 999 - 16, 1)
    check_invariants(outs, 999)


@ENGINES
def test_token_budget_spent_by_running_decodes_wins_over_the_seq_cap(reference: bool) -> None:
    # budget 4: four decoding requests spend it; the cap (4) binds too, but vLLM's loop
    # condition `while token_budget > 0` is checked first
    e, outs = engine(reference, max_num_batched_tokens=4, max_num_seqs=4, max_model_len=64,
                     num_gpu_blocks=100)
    for i in range(5):
        e.add_request(req(f"r{i}", 1, out=6))
    run(e)
    assert outs[0].admitted == ["r0", "r1", "r2", "r3"]
    assert [o.refusal.reason for o in outs if o.refusal] == ["token_budget"] * 6
    assert outs[3].scheduled == dict.fromkeys(["r0", "r1", "r2", "r3"], 1)
    check_invariants(outs, 99)

    e, outs = engine(reference, max_num_batched_tokens=8, max_num_seqs=4, max_model_len=64,
                     num_gpu_blocks=100)
    for i in range(5):
        e.add_request(req(f"r{i}", 1, out=6))
    run(e)
    assert outs[0].refusal == Refusal("seq_cap", 0, 99 - 4, 4)  # budget left: the cap binds


@ENGINES
def test_kv_blocks_long_head_under_reserve_full_isl_while_kv_is_mostly_free(
        reference: bool) -> None:
    cfg = dict(num_gpu_blocks=200, max_model_len=3000, max_num_batched_tokens=1024)
    e, outs = engine(reference, **cfg)
    for i in range(5):
        e.add_request(req(f"s{i}", 120, out=40))   # 8 blocks each
    e.add_request(req("long", 2900, out=4))        # 182 blocks for its whole prompt
    run(e)
    first = outs[0].refusal
    assert first == Refusal("kv_blocks", 182, 199 - 40, 5)
    assert first.blocks_needed > first.free_blocks
    assert outs[0].kv_usage < 0.5
    admitted_at = next(i for i, o in enumerate(outs) if "long" in o.admitted)
    assert admitted_at >= 40  # once the short ones are done
    assert all(o.refusal and o.refusal.reason == "kv_blocks" for o in outs[:admitted_at])
    check_invariants(outs, 199)

    # without reserve-full-ISL the first chunk fits: the same head is admitted at once
    e, outs = engine(reference, scheduler_reserve_full_isl=False, **cfg)
    for i in range(5):
        e.add_request(req(f"s{i}", 120, out=40))
    e.add_request(req("long", 2900, out=4))
    e.step(0.0)
    assert outs[0].refusal is None and "long" in outs[0].admitted


@ENGINES
def test_kv_blocks_counts_the_chunk_and_evictable_hit_blocks_without_reserve(
        reference: bool) -> None:
    # without reserve-full-ISL the need is the chunk's: prefix-hit blocks are not needed,
    # except those in the free queue (touching them takes them out of it), as vLLM's
    # get_num_blocks_to_allocate counts them
    e, outs = engine(reference, num_gpu_blocks=30, max_model_len=400,
                     scheduler_reserve_full_isl=False, max_num_batched_tokens=600)
    shared = list(range(5000, 5000 + 64))   # 4 full blocks
    e.add_request(req("warm", shared + [1], out=1))
    run(e)                                   # its 4 hashed blocks are now free and cached
    e.add_request(req("big", 380, out=30))  # 24 blocks: 5 free blocks are left
    e.add_request(req("hit", shared + list(range(9000, 9000 + 80)), out=2))
    run(e)
    refused = [o.refusal for o in outs if o.refusal]
    assert refused and refused[0].reason == "kv_blocks"
    # 144 tokens = 9 blocks, 4 of them a hit: 5 new + 4 evictable
    assert refused[0].blocks_needed == 9 and refused[0].free_blocks == 29 - 24


@ENGINES
def test_preempted(reference: bool) -> None:
    e, outs = engine(reference, num_gpu_blocks=12, max_model_len=160,
                     enable_prefix_caching=False, scheduler_reserve_full_isl=False,
                     long_prefill_token_threshold=32, max_num_seqs=3)
    e.add_request(req("A", 150, out=5))
    e.add_request(req("B", 8, out=6))
    e.add_request(req("C", 40, out=20))
    run(e)
    preempting = [o for o in outs if o.preempted]
    assert preempting
    for o in preempting:
        assert o.refusal is not None and o.refusal.reason == "preempted"
        assert o.refusal.blocks_needed == 0 and not o.admitted
    check_invariants(outs, 11)


def test_no_refusal_while_nothing_waits() -> None:
    e, outs = engine(False)
    e.add_request(req("A", 40, out=30))
    run(e)
    assert len(outs) == 30 and all(o.refusal is None for o in outs)


def test_metrics_count_the_step_trace() -> None:
    resolved = resolve(SimConfig(num_gpu_blocks_override=40, block_size=16, max_model_len=512,
                                 max_num_seqs=4, max_num_batched_tokens=512))
    metrics = EngineMetrics(resolved)
    outs: list[StepOutput] = []

    def observe(out: StepOutput) -> None:
        outs.append(out)
        metrics.observe_step(out)

    e = Engine(resolved, unit_step, observe)
    for i in range(12):  # seq cap, then long heads that need more than the free blocks
        prompt, output = (400, 10) if i % 5 == 0 else (30, 60)
        r = EngineRequest(f"r{i}", [i * 1000 + k for k in range(prompt)], output, 60, 0.0)
        e.add_request(r)
        metrics.observe_arrival(r, 0.0)
    run(e)
    reasons = [o.refusal.reason for o in outs if o.refusal]
    assert {"seq_cap", "kv_blocks"} <= set(reasons)

    families = {f.name: f for f in text_string_to_metric_families(metrics.render())}
    steps = families["loadlab:scheduler_steps"].samples
    assert [(s.name, s.value) for s in steps] == [("loadlab:scheduler_steps_total", len(outs))]
    refused = {s.labels["reason"]: s.value
               for s in families["loadlab:scheduler_refused_steps"].samples}
    assert refused == {r: reasons.count(r) for r in REFUSAL_REASONS}
    last = [o.refusal for o in outs if o.refusal][-1]
    for name, want in (("blocks_needed", last.blocks_needed),
                       ("free_blocks", last.free_blocks), ("running", last.running)):
        (sample,) = families[f"loadlab:scheduler_head_{name}"].samples
        assert sample.value == want, name
        assert sample.labels == {"engine": "0", "model_name": resolved.served_model_name}
    assert metrics.values().tolist() == [s.value for s in metrics.samples()]


def test_every_reason_is_exported_at_zero_before_any_step() -> None:
    metrics = EngineMetrics(resolve(SimConfig(num_gpu_blocks_override=64, max_model_len=512)),
                            names="v0")
    families = {f.name: f for f in text_string_to_metric_families(metrics.render())}
    samples = families["loadlab:scheduler_refused_steps"].samples
    assert sorted(s.labels["reason"] for s in samples) == sorted(REFUSAL_REASONS)
    assert all(s.value == 0 for s in samples)
    assert [s.labels for s in families["loadlab:scheduler_steps"].samples] == [
        {"model_name": metrics.resolved.served_model_name}]  # V0 naming: no engine label
