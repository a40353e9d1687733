"""The simulated engine core: scheduler + a step-time model + an observer, clock-free.

Callers own the clock and pass ``now``: the live server passes (scaled) wall time, the
replay passes virtual time, so the same engine serves both. One :meth:`Engine.step`:

1. ``plan = scheduler.schedule()`` (:class:`~loadlab.sim.engine.fastpath.FastScheduler`, or the
   reference :class:`~loadlab.sim.engine.scheduler.Scheduler` with ``reference=True``);
   nothing scheduled or preempted -> return None (idle).
2. ``duration = step_time(BatchShape)``; ``t_end = now + duration``.
3. ``scheduler.update(plan)`` applies the forward pass as of ``t_end``.
4. Per-request timestamps: first scheduled = ``now`` of its first admission (not reset by
   preemption, as vLLM's queue time); first token and finish = ``t_end``.
5. Build a :class:`StepOutput` (state after the step, with the scheduler's refusal: why
   the head of waiting stayed there, if it did), hand it to the observer, return it.

Checked against vllm-project/vllm ``vllm/v1/engine/core.py`` (schedule -> execute ->
update_from_output) and ``vllm/v1/metrics/stats.py`` (timestamps behind the queue,
prefill, decode and e2e histograms).
"""

from __future__ import annotations

from collections.abc import Callable

from loadlab.sim.engine.fastpath import FastScheduler
from loadlab.sim.engine.scheduler import Scheduler, SchedulerConfig, SimRequest
from loadlab.sim.engine.types import BatchShape, EngineRequest, FinishedRequest, StepOutput


def _finished(r: SimRequest, reason: str, now: float) -> FinishedRequest:
    return FinishedRequest(
        request_id=r.request_id, finish_reason=reason, arrival_time=r.req.arrival_time,
        first_scheduled_time=r.first_scheduled_time, first_token_time=r.first_token_time,
        finished_time=now, prompt_len=r.prompt_len, output_len=r.num_output,
        max_tokens=r.max_tokens, num_preemptions=r.num_preemptions,
        num_cached_tokens=max(r.num_cached_tokens, 0))


class Engine:
    """Runs scheduler steps on the caller's clock and reports each as a StepOutput."""

    def __init__(self, cfg: SchedulerConfig, step_time: Callable[[BatchShape], float],
                 observer: Callable[[StepOutput], None] | None = None, *,
                 reference: bool = False) -> None:
        """``reference=True`` runs the plain Scheduler instead of its decode fast path."""
        self.scheduler = Scheduler(cfg) if reference else FastScheduler(cfg)
        self.step_time = step_time
        self.observer = observer

    def add_request(self, req: EngineRequest) -> None:
        """Queue a request (InputError if its prompt cannot fit max_model_len)."""
        self.scheduler.add_request(req)

    def abort_request(self, request_id: str, now: float) -> FinishedRequest | None:
        """Abort a queued or running request; None when it is unknown or already done."""
        r = self.scheduler.abort_request(request_id)
        return None if r is None else _finished(r, "abort", now)

    def step(self, now: float) -> StepOutput | None:
        """Run one engine step starting at ``now``; None when nothing can be scheduled."""
        sched = self.scheduler
        plan = sched.schedule()
        if not plan.scheduled and not plan.preempted:
            return None
        batch = BatchShape(plan.num_prefill_tokens, plan.num_decode_tokens,
                           len(plan.scheduled), plan.num_prefill_requests, plan.context_tokens)
        t_end = now + self.step_time(batch) if plan.scheduled else now
        for r in plan.admitted:
            if r.first_scheduled_time is None:
                r.first_scheduled_time = now
        res = sched.update(plan)
        for r in res.first_token:
            r.first_token_time = t_end
        out = StepOutput(
            t_start=now, t_end=t_end, batch=batch, scheduled=plan.scheduled,
            new_tokens=res.new_tokens, first_token=[r.request_id for r in res.first_token],
            finished=[_finished(r, reason, t_end) for r, reason in res.finished],
            preempted=plan.preempted, prefix_queries_tokens=plan.prefix_queries_tokens,
            prefix_hits_tokens=plan.prefix_hits_tokens,
            prompt_tokens_computed=res.prompt_tokens_computed,
            iteration_tokens=res.iteration_tokens, num_running=sched.num_running,
            num_waiting=sched.num_waiting, kv_usage=sched.kv_usage(),
            admitted=[r.request_id for r in plan.admitted],
            prompt_tokens_cached=res.prompt_tokens_cached, refusal=plan.refusal)
        if self.observer is not None:
            self.observer(out)
        return out

    def has_unfinished_requests(self) -> bool:
        return bool(self.scheduler.requests)

    @property
    def num_running(self) -> int:
        return self.scheduler.num_running

    @property
    def num_waiting(self) -> int:
        return self.scheduler.num_waiting

    @property
    def kv_usage(self) -> float:
        return self.scheduler.kv_usage()
