"""The scheduler's decode fast path: O(events) per step instead of O(running).

At concurrency in the hundreds almost every running request is *decoding*: each step it
computes one token and emits one. Nothing about it needs attention except (a) the step
in which its next token needs a new KV block and (b) the step of its last token. The
fast path keeps such requests "steady": their counters are stored as of a decode clock
``base`` and advance implicitly by one per fast step; the clocks of (a) and (b) are fixed
when it becomes steady (``full_at``, ``last_at``; (a) moves on by a block's worth of
steps at each new block), and a calendar (clock -> requests) holds the earlier of the two.
Prefilling requests stay explicit.

A step is fast when the batch cannot be order-dependent:

1. ``demand = #steady + sum(chunk of each explicit running request) <= max_num_batched_tokens``
   (every running request gets its whole share, as the reference loop would give it), and
2. ``blocks needed (steady requests at a block boundary + explicit chunks) <= free blocks``
   (no allocation can fail, so no preemption).

Then: allocate for explicit requests (running order) and for calendar events, admit
waiting requests exactly as the reference does with the budget left, and in
:meth:`update` emit one token for every steady request at once (dict copy), finish the
calendar's finishers, and advance explicit requests one by one. Otherwise the step
is slow: every steady request is materialised and the reference
:class:`~loadlab.sim.engine.scheduler.Scheduler` plans the step, after which the steady set and
calendar are rebuilt (O(running), like the reference itself).

The reference registers a block in the prefix cache in the step that fills it, generated
tokens included (as vLLM does). The fast path defers that for steady requests until their
blocks are freed: at the step of the last token (before :meth:`update` releases them), at
an abort, or at a preemption (``Scheduler._preempt``); a slow step catches every request
it schedules up. The hash of a held block is never observed before then: generated-block
ids are unique per request, so only that request, resumed after a preemption, could
hit them. When freed, hashed and unhashed blocks go to opposite ends of the free queue,
so the catch-up must happen before the free.
Finished requests are released in batch (= running) order, as the reference and vLLM's
``update_from_output`` free them, since that order decides which freed blocks are
evicted first. Every StepOutput, and the free queue's order of hashes, equals the
reference's (tests/sim/test_fastpath.py).
"""

from __future__ import annotations

from loadlab.sim.engine.scheduler import (
    SchedulePlan,
    Scheduler,
    SchedulerConfig,
    SimRequest,
    StepResult,
)


class FastScheduler(Scheduler):
    """Same decisions as :class:`Scheduler`; decoding requests cost O(1) per event."""

    def __init__(self, cfg: SchedulerConfig) -> None:
        super().__init__(cfg)
        self._clock = 0                                 # fast steps taken
        self._steady: dict[str, int] = {}               # id -> 1 for each steady request
        self._calendar: dict[int, list[SimRequest]] = {}
        self._explicit: list[SimRequest] = []           # running, not steady, running order
        self._steady_ctx = 0                            # sum of steady num_computed, now

    # -- lazy state -----------------------------------------------------------------------
    def _materialize(self, r: SimRequest) -> None:
        d = self._clock - r.base
        if d:
            r.num_computed += d
            r.num_tokens += d
            r.num_output += d
        r.base = self._clock

    def _make_steady(self, r: SimRequest) -> None:
        """``r`` (decoding, counters current) joins the steady set."""
        clock = self._clock
        r.steady = True
        r.base = clock
        r.full_at = clock + len(r.blocks) * self.block_size - r.num_computed
        r.last_at = clock + min(r.output_len - r.num_output, self.max_model_len - r.num_tokens) - 1
        self._steady[r.request_id] = 1
        self._steady_ctx += r.num_computed
        ev = min(r.full_at, r.last_at)
        r.event_at = ev
        slot = self._calendar.get(ev)
        if slot is None:
            self._calendar[ev] = [r]
        else:
            slot.append(r)

    def _drop_steady(self, r: SimRequest) -> None:
        self._materialize(r)
        r.steady = False
        del self._steady[r.request_id]
        self._steady_ctx -= r.num_computed

    # -- step ----------------------------------------------------------------------------
    def schedule(self) -> SchedulePlan:
        clock = self._clock
        bs = self.block_size
        thr = self.step_threshold()
        mml = self.max_model_len
        events = [r for r in self._calendar.pop(clock, ()) if r.steady and r.event_at == clock]
        demand = len(self._steady)
        need_blocks = 0
        chunks = []
        for r in self._explicit:
            c = r.num_computed
            n = r.num_tokens - c
            if 0 < thr < n:
                n = thr
            n = min(n, mml - 1 - c)
            chunks.append(n)
            if n > 0:
                demand += n
                need = -(-min(c + n, mml) // bs) - len(r.blocks)
                if need > 0:
                    need_blocks += need
        free = self.pool.num_free
        if need_blocks + len(events) > free:  # count exactly only when the bound is tight
            for r in events:
                if r.full_at == clock:
                    need_blocks += 1
        if demand > self.max_num_batched_tokens or need_blocks > free:
            return self._slow_schedule()

        kv = self.kv
        caching = self.enable_caching
        # The steady dict itself becomes this step's ``scheduled`` and a copy stays ours: a
        # copy has no holes from deleted ids, and copying a hole-free dict (update's
        # new_tokens, the next step's copy when nobody finished) is ~8x cheaper.
        scheduled = self._steady
        self._steady = dict(scheduled)
        plan = SchedulePlan(scheduled, [], [], [], fast=True)
        context = n_prefill = n_prefill_reqs = 0
        for r, n in zip(self._explicit, chunks):
            if n <= 0:
                continue
            c = r.num_computed
            if c + n > len(r.blocks) * bs:
                kv.allocate_slots(r, n)
            elif caching and (c + n) // bs > r.num_cached_blocks:
                kv.cache_full_blocks(r, min(c + n, r.num_tokens))
            scheduled[r.request_id] = n
            plan.requests.append(r)
            context += c + n
            n_prefill += n
            n_prefill_reqs += 1
        calendar = self._calendar
        at_boundary = []  # block lists that get a new block, in event order (one pool call)
        for r in events:  # counters stay lazy, except for a request about to finish
            full_at = r.full_at
            if full_at == clock:
                at_boundary.append(r.blocks)
                full_at = r.full_at = clock + bs
            last_at = r.last_at
            if last_at == clock:
                self._materialize(r)
                if caching:  # deferred hashing (module docstring): before update frees them
                    kv.cache_full_blocks(r, r.num_tokens)
                plan.finishing.append(r)
                continue
            ev = r.event_at = min(last_at, full_at)
            slot = calendar.get(ev)
            if slot is None:
                calendar[ev] = [r]
            else:
                slot.append(r)
        if at_boundary:
            for blocks, blk in zip(at_boundary, self.pool.get_new_blocks(len(at_boundary))):
                blocks.append(blk)
        n_steady = len(self._steady)
        plan.num_decode_tokens = n_steady
        plan.num_prefill_tokens = n_prefill
        plan.num_prefill_requests = n_prefill_reqs
        plan.context_tokens = context + self._steady_ctx + n_steady
        self._admit(plan, self.max_num_batched_tokens - demand, thr)
        return plan

    def update(self, plan: SchedulePlan) -> StepResult:
        if not plan.fast:
            res = super().update(plan)
            self._rebuild()
            return res
        # With nothing but steady requests, new_tokens equals scheduled (every one computes
        # and emits one token): share the dict rather than copy hundreds of ids again.
        res = StepResult(plan.scheduled if not plan.requests else dict(self._steady))
        res.iteration_tokens = len(self._steady)
        mml = self.max_model_len
        for r in plan.finishing:  # counters are current (materialised at schedule)
            r.num_computed += 1
            r.num_tokens += 1
            r.num_output += 1
            r.steady = False
            del self._steady[r.request_id]
            self._steady_ctx -= r.num_computed - 1
            if r.num_tokens >= mml or r.num_output >= r.max_tokens:
                res.finished.append((r, "length"))
            else:
                res.finished.append((r, "stop"))
        self._steady_ctx += len(self._steady)
        self._clock += 1
        n_done = len(res.finished)
        scheduled = plan.scheduled
        for r in plan.requests:
            self._advance(r, scheduled[r.request_id], res)
        done = {r.request_id for r, _ in res.finished[n_done:]}
        explicit = []
        for r in self._explicit + plan.admitted:
            if r.request_id in done:
                continue
            if r.is_decoding:
                self._make_steady(r)
            else:
                explicit.append(r)
        self._explicit = explicit
        if len(res.finished) > 1:  # free in the reference's (and vLLM's) batch order
            res.finished.sort(key=lambda f: f[0].admitted_seq)
        for r, _ in res.finished:
            self._release(r)
        return res

    def _slow_schedule(self) -> SchedulePlan:
        """Materialise every steady request and let the reference plan the step."""
        for r in self.running:
            if r.steady:  # (a victim's generated blocks are cached by _preempt)
                self._materialize(r)
                r.steady = False
        self._steady.clear()
        self._calendar.clear()
        self._explicit = []
        self._steady_ctx = 0
        return super().schedule()

    def _rebuild(self) -> None:
        for r in self.running:
            if r.is_decoding:
                self._make_steady(r)
            else:
                self._explicit.append(r)

    def abort_request(self, request_id: str) -> SimRequest | None:
        r = self.requests.get(request_id)
        if r is not None:
            if r.steady:
                self._drop_steady(r)
                if self.enable_caching:  # deferred hashing, before the free
                    self.kv.cache_full_blocks(r, r.num_computed)
            elif r in self._explicit:
                self._explicit.remove(r)
        return super().abort_request(request_id)
