"""Scheduler and block-pool rules of vLLM 0.32 that the conformance suite found, on both
the reference scheduler and the fast path.

Each test builds the smallest request sequence whose outcome (a chunk size, a prefix hit)
depends on the rule, so it fails if the rule is dropped:

- the long-prefill threshold is lifted for a lone request (``vllm/v1/core/sched/
  scheduler.py`` ``schedule``);
- freed blocks without a hash go to the head of the free queue, hashed ones to its tail
  (``vllm/v1/core/block_pool.py`` ``free_blocks``);
- blocks full of generated tokens are hashed, so they are freed to the tail too
  (``vllm/v1/core/kv_cache_manager.py`` ``allocate_slots`` -> ``cache_blocks``).

The expected chunks and hits are what vLLM 0.32's own scheduler gives for the same
requests (checked with tools/vllm_sched_trace.py).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from sched_fixtures import Cfg, run_until_idle, unique_tokens, unit_step

from loadlab.sim.engine.blocks import BlockPool, KVCacheManager, prompt_block_hashes
from loadlab.sim.engine.core import Engine
from loadlab.sim.engine.types import EngineRequest, StepOutput

ENGINES = pytest.mark.parametrize("reference", [True, False], ids=["reference", "fast"])


def engine(reference: bool, **kw: object) -> tuple[Engine, list[StepOutput]]:
    outs: list[StepOutput] = []
    cfg = Cfg(**kw)
    return Engine(cfg, unit_step, outs.append, reference=reference), outs


def run_one(e: Engine, rid: str, prompt: list[int], out: int, now: float) -> float:
    e.add_request(EngineRequest(rid, prompt, out, out, now))
    return run_until_idle(e, now)


@ENGINES
def test_a_lone_request_is_not_capped_by_the_threshold(reference: bool) -> None:
    e, outs = engine(reference, max_num_batched_tokens=256, long_prefill_token_threshold=64)
    e.add_request(EngineRequest("p", unique_tokens(600), 1, 1, 0.0))
    e.step(0.0)
    e.add_request(EngineRequest("q", unique_tokens(10), 3, 3, 1.0))
    e.step(1.0)  # two requests as the step starts: the cap is back
    assert [o.scheduled for o in outs] == [{"p": 256}, {"p": 64, "q": 10}]


@pytest.mark.parametrize("caching", [True, False])
def test_free_queue_takes_unhashed_blocks_at_the_head_hashed_at_the_tail(caching: bool) -> None:
    pool = BlockPool(8, enable_caching=caching)  # blocks 1-7
    kv = KVCacheManager(pool, 16, 1024)
    toks = unique_tokens(40)
    r = SimpleNamespace(
        key=0,
        num_tokens=40,
        num_computed=0,
        blocks=[],
        num_cached_blocks=0,
        num_registered=0,
        block_hashes=prompt_block_hashes(toks, 16) if caching else [],
    )
    assert kv.allocate_slots(r, 40)  # blocks 1, 2 full, 3 partial
    kv.free(r)  # tail first: 3, 2, 1
    # caching: 3 (no hash) ahead of the fresh blocks, 2 and 1 behind them;
    # caching off: nothing is hashed, so all three go ahead, the first freed first.
    assert pool.free_queue_ids() == ([3, 4, 5, 6, 7, 2, 1] if caching else [3, 2, 1, 4, 5, 6, 7])
    assert [b.block_id for b in pool.get_new_blocks(2)] == [3, 4 if caching else 2]


@ENGINES
def test_unhashed_freed_blocks_are_reused_before_cached_ones(reference: bool) -> None:
    # 5 usable blocks of 16 tokens. X caches the 2 blocks of prefix S (queue: 3 fresh,
    # X's 2). Y takes the 3 fresh ones and frees 2 hashed blocks to the tail and its
    # partial block to the head. Z needs 2 blocks: Y's partial one, then only S's second
    # block; appending the partial one to the tail would have cost S both blocks.
    e, _ = engine(reference, num_gpu_blocks=6, max_model_len=64)
    s = unique_tokens(32)
    now = run_one(e, "x", s, 1, 0.0)
    now = run_one(e, "y", unique_tokens(40), 1, now)
    now = run_one(e, "z", unique_tokens(17), 1, now)
    e.add_request(EngineRequest("c", s + unique_tokens(5), 1, 1, now))
    out = e.step(now)
    assert out is not None and out.scheduled == {"c": 37 - 16}
    assert out.prefix_hits_tokens == 16


@ENGINES
def test_generated_token_blocks_are_freed_hashed_to_the_tail(reference: bool) -> None:
    # 11 usable blocks. X caches prefix S (2 blocks). A (16 prompt + 33 computed generated
    # tokens) holds 3 full blocks, 2 of them generated, and 1 partial: freed, only the
    # partial one goes to the head, the 2 generated ones join the tail behind S. B's 7
    # blocks then take the partial one, 5 fresh and S's second block; with unhashed
    # generated blocks at the head, B would have taken those and S would hit 32 tokens.
    e, _ = engine(reference, num_gpu_blocks=12, max_model_len=128)
    s = unique_tokens(32)
    now = run_one(e, "x", s, 1, 0.0)
    now = run_one(e, "a", unique_tokens(16), 34, now)
    hashes = e.scheduler.pool.free_queue_hashes()
    assert hashes[0] is None and all(h is not None for h in hashes[-5:])  # S's 2 and A's 3
    now = run_one(e, "b", unique_tokens(100), 1, now)
    e.add_request(EngineRequest("c", s + unique_tokens(5), 1, 1, now))
    out = e.step(now)
    assert out is not None and out.prefix_hits_tokens == 16


@ENGINES
def test_an_aborted_decoding_request_frees_its_generated_blocks_hashed(reference: bool) -> None:
    e, _ = engine(reference, num_gpu_blocks=40, max_model_len=256)
    e.add_request(EngineRequest("a", unique_tokens(16), 100, 100, 0.0))
    now = 0.0
    for _ in range(40):  # prefill + 39 decodes: 55 tokens computed, 3 blocks full
        now = e.step(now).t_end  # type: ignore[union-attr]
    if not reference:
        assert e.scheduler.requests["a"].steady  # the fast path's lazy state is under test
    e.abort_request("a", now)
    hashes = e.scheduler.pool.free_queue_hashes()
    assert sum(h is not None for h in hashes) == 3
    assert hashes[0] is None and all(h is not None for h in hashes[-3:])
