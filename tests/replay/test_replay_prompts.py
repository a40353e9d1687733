"""Replay prompts: runs of ids, and block hashes from runs that hit exactly as token hashing."""

from __future__ import annotations

import random

import pytest

from loadlab.errors import InputError
from loadlab.replay.prompts import prompt_ids, prompt_runs, replay_request, run_block_hashes
from loadlab.sim.engine.blocks import PRIVATE_HASH_BASE, prompt_block_hashes
from loadlab.sim.engine.config import SimConfig
from loadlab.sim.engine.core import Engine
from loadlab.sim.engine.hardware import resolve
from loadlab.sim.engine.types import EngineRequest


def test_runs_are_maximal_and_spell_the_prompt() -> None:
    # group 0's ids continue the common ids, so the two parts merge into one run
    assert prompt_runs(5, 100, 0, 60, 20) == [
        (0, 60),
        (prompt_runs(5, 1, None, 0, 0)[0][0] + 60, 40),
    ]
    runs = prompt_runs(2, 100, 3, 60, 20)
    assert len(runs) == 3 and sum(n for _, n in runs) == 100
    assert [i for first, n in runs for i in range(first, first + n)] == prompt_ids(
        2, 100, 3, 60, 20
    )


def test_run_hashes_equal_exactly_where_token_hashes_do() -> None:
    # at any positions, across prompts: a bijection between run keys and token hashes
    rng = random.Random(7)
    for _ in range(300):
        bs = rng.choice([1, 3, 16])
        common = rng.choice([0, 5, 40])
        pairs = set()
        for seq in range(5):
            length = rng.randint(1, 200)
            group = rng.choice([None, 0, 1, 2])
            prefix = min(rng.choice([0, 7, 33, 150]), length - 1)
            by_runs = run_block_hashes(prompt_runs(seq, length, group, prefix, common), bs)
            by_ids = prompt_block_hashes(prompt_ids(seq, length, group, prefix, common), bs)
            assert len(by_runs) == len(by_ids) == length // bs
            pairs.update(zip(by_runs, by_ids))
        assert len(pairs) == len({k for k, _ in pairs}) == len({h for _, h in pairs})


def test_engine_takes_precomputed_hashes_and_refuses_a_wrong_count() -> None:
    resolved = resolve(SimConfig(num_gpu_blocks_override=200, max_model_len=1024, block_size=16))
    engine = Engine(resolved, lambda batch: 0.01)
    first = replay_request("a", 0, 100, 1, 64, 0, 4, 0.0, 16)
    again = replay_request("b", 1, 100, 1, 64, 0, 4, 0.0, 16)
    assert isinstance(first.prompt_token_ids, list) and len(first.block_hashes or []) == 6
    engine.add_request(first)
    while engine.has_unfinished_requests():
        engine.step(0.0)
    engine.add_request(again)
    out = engine.step(0.0)
    assert out is not None and out.prefix_hits_tokens == 64  # the group's 4 full blocks
    alone = replay_request("c", 2, 100, None, 0, 0, 4, 0.0, 16)
    assert isinstance(alone.prompt_token_ids, range)
    with pytest.raises(InputError):
        engine.add_request(EngineRequest("d", range(100), 4, 4, 0.0, block_hashes=[1, 2]))


def test_groups_past_a_million_still_share() -> None:
    # sessions take a group each, so a long replay numbers groups past 2**20
    group = (1 << 20) + 5
    first = run_block_hashes(prompt_runs(10, 100, group, 99, 16), 16)
    later = run_block_hashes(prompt_runs(26, 200, group, 199, 16), 16)
    other = run_block_hashes(prompt_runs(11, 100, 5, 99, 16), 16)
    assert later[:6] == first[:6] and all(k < PRIVATE_HASH_BASE for k in first)
    assert set(first) & set(other) == {first[0]}  # the 16 common tokens only
