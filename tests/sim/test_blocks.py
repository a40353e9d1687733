"""Block pool and KV manager: null block, free counting, LRU order, prefix hits."""

from __future__ import annotations

from sched_fixtures import unique_tokens

from loadlab.sim.engine.blocks import (
    PRIVATE_HASH_BASE,
    BlockPool,
    KVCacheManager,
    prompt_block_hashes,
)


class FakeReq:
    """Minimal KVRequest."""

    def __init__(self, tokens: list[int], bs: int, key: int = 0) -> None:
        self.key = key
        self.num_tokens = len(tokens)
        self.num_computed = 0
        self.blocks: list = []
        self.block_hashes = prompt_block_hashes(tokens, bs)
        self.num_cached_blocks = 0
        self.num_registered = 0


def test_null_block_is_never_handed_out_and_usage_uses_n_minus_1() -> None:
    pool = BlockPool(6)
    assert pool.num_free == 5 and pool.usage() == 0.0
    got = pool.get_new_blocks(5)
    assert sorted(b.block_id for b in got) == [1, 2, 3, 4, 5]
    assert pool.num_free == 0 and pool.usage() == 1.0


def test_only_full_blocks_are_hashed_and_hashes_chain() -> None:
    toks = unique_tokens(40)
    hashes = prompt_block_hashes(toks, 16)
    assert len(hashes) == 2  # 8-token tail is not hashed
    other = prompt_block_hashes(unique_tokens(16) + toks[16:32], 16)
    assert other[1] != hashes[1]  # same tokens, different parent


def test_cached_free_blocks_count_as_free_and_still_hit() -> None:
    pool = BlockPool(20)
    kv = KVCacheManager(pool, 16, 1024)
    toks = unique_tokens(64)
    r = FakeReq(toks, 16)
    assert kv.allocate_slots(r, 64)
    assert pool.num_free == 15
    kv.free(r)
    assert pool.usage() == 0.0 and pool.num_free == 19
    assert pool.num_cached_blocks == 4
    again = FakeReq(toks + unique_tokens(10), 16)
    assert len(kv.lookup(again)) == 4


def test_prefix_hit_leaves_the_last_token_to_compute() -> None:
    pool = BlockPool(20)
    kv = KVCacheManager(pool, 16, 1024)
    toks = unique_tokens(32)
    r = FakeReq(toks, 16)
    assert kv.allocate_slots(r, 32)
    same = FakeReq(toks, 16, key=1)
    assert len(kv.lookup(same)) == 1  # (32 - 1) // 16 whole blocks


def test_lru_evicts_a_freed_requests_tail_before_its_prefix() -> None:
    pool = BlockPool(6)  # 5 usable
    kv = KVCacheManager(pool, 16, 1024)
    toks = unique_tokens(64)
    r = FakeReq(toks, 16)
    assert kv.allocate_slots(r, 64)  # blocks 1-4, all full and cached
    kv.free(r)
    assert pool.free_queue_ids() == [5, 4, 3, 2, 1]
    pool.get_new_blocks(2)  # pops block 5 (never used) and block 4 (the tail)
    probe = FakeReq(toks + unique_tokens(1), 16)
    hit = kv.lookup(probe)
    assert [b.block_id for b in hit] == [1, 2, 3]


def test_touching_a_free_hit_block_takes_it_out_of_the_queue() -> None:
    pool = BlockPool(10)
    kv = KVCacheManager(pool, 16, 1024)
    toks = unique_tokens(48)
    r = FakeReq(toks, 16)
    assert kv.allocate_slots(r, 48)
    kv.free(r)
    free_before = pool.num_free
    b = FakeReq(toks + unique_tokens(5), 16, key=1)
    hit = kv.lookup(b)
    assert len(hit) == 3
    assert kv.allocate_slots(b, 5, hit)
    assert pool.num_free == free_before - 4  # 3 touched + 1 new
    assert all(blk.block_id not in pool.free_queue_ids() for blk in hit)


def test_allocation_failure_changes_nothing() -> None:
    pool = BlockPool(4)  # 3 usable
    kv = KVCacheManager(pool, 16, 1024)
    r = FakeReq(unique_tokens(64), 16)
    assert not kv.allocate_slots(r, 64)
    assert pool.num_free == 3 and r.blocks == []


def test_full_sequence_must_fit_checks_whole_prompt_but_allocates_the_chunk() -> None:
    pool = BlockPool(5)  # 4 usable
    kv = KVCacheManager(pool, 16, 1024)
    r = FakeReq(unique_tokens(80), 16)  # 5 blocks in all
    assert not kv.allocate_slots(r, 32, full_sequence_must_fit=True)
    assert kv.allocate_slots(r, 32, full_sequence_must_fit=False)
    assert len(r.blocks) == 2 and pool.num_free == 2


def test_hit_blocks_in_the_free_queue_count_as_blocks_needed() -> None:
    pool = BlockPool(5)  # 4 usable
    kv = KVCacheManager(pool, 16, 1024)
    toks = unique_tokens(48)
    r = FakeReq(toks, 16)
    assert kv.allocate_slots(r, 48)
    kv.free(r)
    other = FakeReq(unique_tokens(10), 16, key=2)
    assert kv.allocate_slots(other, 10)  # takes the never-used block: 3 cached blocks left free
    b = FakeReq(toks + unique_tokens(5), 16, key=1)
    hit = kv.lookup(b)
    assert len(hit) == 3 and pool.num_free == 3
    # 1 new block + 3 hit blocks that touching takes out of the queue > 3 free.
    assert not kv.allocate_slots(b, 5, hit)
    assert pool.num_free == 3


def test_private_blocks_enter_the_map_only_when_their_request_is_preempted() -> None:
    pool = BlockPool(20)
    kv = KVCacheManager(pool, 16, 1024)
    done = FakeReq(unique_tokens(70), 16)
    done.block_hashes = [PRIVATE_HASH_BASE + i for i in range(4)]
    assert kv.allocate_slots(done, 70)
    partial = done.blocks[-1]
    kv.free(done)  # finished: hashed, so freed to the tail, but nobody can look them up
    assert pool.num_cached_blocks == 0
    assert pool.free_queue_hashes()[-4:] == [PRIVATE_HASH_BASE + i for i in (3, 2, 1, 0)]
    assert pool.free_queue_ids()[0] == partial.block_id  # unhashed: at the head
    preempted = FakeReq(unique_tokens(70), 16, key=1)
    preempted.block_hashes = [PRIVATE_HASH_BASE + 100 + i for i in range(4)]
    assert kv.allocate_slots(preempted, 70)
    preempted.num_computed = 70
    kv.free_preempted(preempted)
    assert pool.num_cached_blocks == 4
    preempted.num_computed = 0
    assert len(kv.lookup(preempted)) == 4  # resumed, it hits its own blocks
    pool.get_new_blocks(pool.num_free)  # evicts registered and unregistered ones alike
    assert pool.num_cached_blocks == 0
