"""Data passed between the simulator's parts (engine, timing, metrics, replay, HTTP front).

Plain dataclasses, no logic: the one set of shapes the engine, the timing, metrics
and replay side and the HTTP front all agree on. All times are on the
engine clock (seconds); the engine never reads a wall clock itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from functools import cached_property
from itertools import compress
from typing import NamedTuple

# Why the head of the waiting queue stayed there, in the order vLLM's
# ``Scheduler.schedule`` (vllm/v1/core/sched/scheduler.py) checks the limits: a preemption
# skips the waiting loop; ``while token_budget > 0`` (or a whole prompt that does not fit
# the budget left, chunked prefill off); ``len(running) >= max_num_seqs``;
# ``allocate_slots`` returning None. "other" (LoRA, remote KV, pause) the simulator never
# produces; it is exported so every reason's counter exists on every server.
REFUSAL_REASONS = ("preempted", "token_budget", "seq_cap", "kv_blocks", "other")


@dataclass
class EngineRequest:
    """What the front end or the replay hands the engine.

    ``output_len`` is decided by the caller (the simulator does not sample text), so
    the engine knows from the start how many decode steps the request needs.
    """

    request_id: str
    prompt_token_ids: Sequence[int]  # a list, or any sequence (replay: a range)
    output_len: int  # tokens it will generate before finishing (>= 1)
    max_tokens: int  # finish_reason "length" when output_len == max_tokens, else "stop"
    arrival_time: float              # engine clock, seconds
    # Chained hashes of the prompt's full blocks, when the caller can compute them more
    # cheaply than the engine (replay: from runs of ids, loadlab.replay.prompts).
    # Equal hashes must mean equal blocks, and every request of one engine must use the
    # same scheme; None: the engine hashes the token ids (blocks.prompt_block_hashes).
    # Hashes from blocks.PRIVATE_HASH_BASE (2**64) up mark blocks no other request has:
    # they enter the prefix-cache map only if this request is preempted, so a shared
    # block given such a hash would never be hit by another request.
    block_hashes: list[int] | None = None


@dataclass
class FinishedRequest:
    """Facts about one finished (or aborted) request, for metrics and records."""

    request_id: str
    finish_reason: str               # "length" | "stop" | "abort"
    arrival_time: float
    first_scheduled_time: float | None
    first_token_time: float | None
    finished_time: float
    prompt_len: int
    output_len: int                  # tokens actually generated
    max_tokens: int
    num_preemptions: int
    num_cached_tokens: int           # prefix-cache hit tokens at first admission (vLLM semantics)


@dataclass
class BatchShape:
    """Input of the timing model for one step."""

    num_prefill_tokens: int          # tokens of requests still in prefill computed this step
    num_decode_tokens: int           # one per decoding request
    num_requests: int                # requests in the batch
    num_prefill_requests: int
    context_tokens: int              # sum over scheduled requests of (computed + scheduled) tokens


class Refusal(NamedTuple):
    """The limit that kept the head of waiting out in one step, and the state behind it.

    ``blocks_needed`` is what the failed block check compared with ``free_blocks``
    (vLLM's ``num_blocks_to_allocate``: the whole sequence under reserve-full-ISL, else
    the chunk, less the head's prefix-hit blocks, plus those of them sitting in the free
    queue); 0 for the other reasons, for which vLLM never computes it. ``free_blocks``
    counts evictable cached blocks as free; ``free_blocks`` and ``running`` are as
    ``schedule`` leaves them. ``_asdict()`` is the step trace's ``refusal`` record.
    """

    reason: str
    blocks_needed: int
    free_blocks: int
    running: int


@dataclass
class StepOutput:
    """Everything observable about one engine step.

    Kept rich on purpose: metrics, replay records and the step-by-step comparison
    against vLLM's real Scheduler all read it.
    """

    t_start: float
    t_end: float                     # t_start + modelled duration
    batch: BatchShape
    scheduled: dict[str, int]        # request_id -> tokens computed this step
    new_tokens: dict[str, int]       # request_id -> output tokens emitted at t_end (0 or 1)
    first_token: list[str]           # ids whose first output token came out this step
    finished: list[FinishedRequest]
    preempted: list[str]             # victims this step (recompute; back at head of waiting)
    prefix_queries_tokens: int       # tokens looked up in the prefix cache this step
    prefix_hits_tokens: int
    prompt_tokens_computed: (
        int  # prompt_len - cached of requests whose first token came out (local_compute)
    )
    iteration_tokens: int            # vllm:iteration_tokens_total observation for this step
    num_running: int                 # after the step
    num_waiting: int
    kv_usage: float  # 1 - free/(num_gpu_blocks - 1); cached-free blocks count as free
    admitted: list[str] = field(default_factory=list)  # ids moved waiting -> running this step
    prompt_tokens_cached: int = 0  # prompt tokens served by the prefix cache (local_cache_hit),
    #                                  counted with prompt_tokens_computed when the first token
    #                                  comes out
    refusal: Refusal | None = None  # None: waiting was empty when schedule() ended

    @cached_property
    def emitted(self) -> AbstractSet[str]:
        """The ids that emitted a token at ``t_end``: ``new_tokens``' own keys when every
        scheduled request did (always without a prefill request in the batch), else a set.

        Computed once for the engine's metrics and the replay's token times, which both
        read it (a sum over hundreds of values, and on a partial prefill a set of
        hundreds of ids, per step).
        """
        new = self.new_tokens
        if not self.batch.num_prefill_requests or sum(new.values()) == len(new):
            return new.keys()
        return set(compress(new, new.values()))


@dataclass(frozen=True)
class SchedulerSettings:
    """The scheduler and cache settings the engine reads, and nothing else.

    ``hardware.ResolvedConfig`` extends it with the model, GPU and pool arithmetic;
    tests, the vLLM conformance suite and calibration build it directly to drive the
    scheduler without a hardware profile.
    """

    max_num_seqs: int
    max_num_batched_tokens: int
    block_size: int
    num_gpu_blocks: int
    max_model_len: int
    enable_prefix_caching: bool
    enable_chunked_prefill: bool
    long_prefill_token_threshold: int
    scheduler_reserve_full_isl: bool
