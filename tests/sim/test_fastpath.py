"""The decode fast path must make exactly the reference scheduler's decisions.

Both engines get the same seeded request stream (arrivals between steps, shared
prefixes, aborts) and must produce equal StepOutputs (``finished`` in the same order) and
free queues holding the same hashes in the same order, step by step, under settings that
exercise preemption, chunking, the prefill threshold, chunked prefill off and the
full-prompt admission check.
"""

from __future__ import annotations

import random
from dataclasses import asdict

import pytest
from sched_fixtures import Cfg, unit_step

from loadlab.sim.engine.core import Engine
from loadlab.sim.engine.types import EngineRequest

CASES = {
    "roomy": Cfg(max_num_seqs=16, max_num_batched_tokens=512, num_gpu_blocks=800),
    "tiny_pool": Cfg(max_num_seqs=16, max_num_batched_tokens=256, num_gpu_blocks=40,
                     max_model_len=512),
    "threshold": Cfg(max_num_seqs=12, max_num_batched_tokens=300, num_gpu_blocks=120,
                     max_model_len=1024, long_prefill_token_threshold=48),
    "no_chunking": Cfg(max_num_seqs=10, max_num_batched_tokens=600, num_gpu_blocks=90,
                       max_model_len=600, enable_chunked_prefill=False,
                       scheduler_reserve_full_isl=False),
    "no_caching": Cfg(max_num_seqs=20, max_num_batched_tokens=200, num_gpu_blocks=60,
                      max_model_len=512, enable_prefix_caching=False),
    "short_context": Cfg(max_num_seqs=16, max_num_batched_tokens=256, num_gpu_blocks=70,
                         max_model_len=128),
    "budget_tight": Cfg(max_num_seqs=64, max_num_batched_tokens=40, num_gpu_blocks=400,
                        max_model_len=512),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_fast_path_matches_reference_step_by_step(case: str) -> None:
    cfg = CASES[case]
    rng = random.Random(case)
    ref = Engine(cfg, unit_step, reference=True)
    fast = Engine(cfg, unit_step)
    prefixes = [[rng.randrange(50_000) for _ in range(rng.choice((16, 40, 64)))]
                for _ in range(3)]
    now, sent, steps, preemptions = 0.0, 0, 0, 0
    live: list[str] = []
    while steps < 400:
        for _ in range(rng.choice((0, 0, 0, 1, 1, 2, 4))):
            n = rng.randrange(1, min(cfg.max_model_len - 1, 300))
            toks = [rng.randrange(50_000) for _ in range(n)]
            if rng.random() < 0.5:
                pre = rng.choice(prefixes)
                toks = (pre + toks)[: cfg.max_model_len - 1]
            out_len = rng.randrange(1, 120)
            req = EngineRequest(f"q{sent}", toks, out_len, out_len + rng.choice((0, 5)), now)
            ref.add_request(req)
            fast.add_request(EngineRequest(req.request_id, list(toks), req.output_len,
                                           req.max_tokens, now))
            live.append(req.request_id)
            sent += 1
        if live and rng.random() < 0.03:
            victim = live.pop(rng.randrange(len(live)))
            a, b = ref.abort_request(victim, now), fast.abort_request(victim, now)
            assert (a is None) == (b is None)
            if a is not None:
                assert asdict(a) == asdict(b)  # type: ignore[arg-type]
        ro, fo = ref.step(now), fast.step(now)
        assert (ro is None) == (fo is None), f"step {steps}"
        if ro is None:
            now += 1.0
            continue
        assert asdict(ro) == asdict(fo), f"step {steps}"  # type: ignore[arg-type]
        # Free queues hold the same hashes in the same order: the same blocks get evicted.
        assert ref.scheduler.pool.free_queue_hashes() == fast.scheduler.pool.free_queue_hashes()
        preemptions += len(ro.preempted)
        for f in ro.finished:
            if f.request_id in live:
                live.remove(f.request_id)
        now = ro.t_end
        steps += 1
    assert sent > 100
    assert fast.scheduler._clock > 50  # type: ignore[attr-defined]  # fast steps did happen
    if case in ("tiny_pool", "no_caching"):
        assert preemptions >= 3
