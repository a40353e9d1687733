"""The scheduler's own refusals as ``loadlab:`` series, beside vLLM's.

vLLM's /metrics says how many requests wait and how full the KV cache is, but not why
the head of the queue was not admitted: at 26% KV usage a queue may be held by
``--max-num-seqs``, by a long prompt whose whole sequence must fit in free blocks
(reserve-full-ISL), or by the token budget. These series count every engine step and
every refused step by reason (:data:`~loadlab.sim.engine.types.REFUSAL_REASONS`, all
exported from the start at 0), and describe the last refused step with three gauges.
They carry the labels of vLLM's ``vllm:num_requests_running`` (passed in), so a
collector joins them to vLLM's series per engine. The same names come from loadlab's
probe on a real vLLM server.
"""

from __future__ import annotations

from collections.abc import Iterator

from loadlab.sim.engine.types import REFUSAL_REASONS, Refusal

STEPS = "loadlab:scheduler_steps"
REFUSED = "loadlab:scheduler_refused_steps"
GAUGES = (  # (family, help), in the order of Refusal's numeric fields
    ("loadlab:scheduler_head_blocks_needed",
     "Blocks the head of waiting needed at the last refused step (0 unless kv_blocks)."),
    ("loadlab:scheduler_head_free_blocks",
     "Free KV blocks (evictable cached ones included) at the last refused step."),
    ("loadlab:scheduler_head_running", "Running requests at the last refused step."),
)

Family = tuple[str, str, str, list[tuple[str, dict[str, str], float]]]


class RefusalMetrics:
    """Step and refusal counters of one engine; O(1) per step, nothing built per step."""

    __slots__ = ("last", "refused", "steps")

    def __init__(self) -> None:
        self.steps = 0
        self.refused = dict.fromkeys(REFUSAL_REASONS, 0)
        self.last = Refusal("other", 0, 0, 0)  # gauges read 0 until a step is refused

    def observe(self, refusal: Refusal | None) -> None:
        """Count one engine step and, when the head stayed waiting, its reason."""
        self.steps += 1
        if refusal is not None:
            self.refused[refusal.reason] += 1
            self.last = refusal

    def families(self, base: dict[str, str]) -> Iterator[Family]:
        """(family, type, help, samples) in exposition order, labelled with ``base``."""
        yield (STEPS, "counter", "Engine steps.", [(f"{STEPS}_total", base, self.steps)])
        yield (REFUSED, "counter", "Engine steps that left the head of waiting, by reason.",
               [(f"{REFUSED}_total", {**base, "reason": r}, n) for r, n in self.refused.items()])
        for (family, text), value in zip(GAUGES, self.last[1:]):
            yield family, "gauge", text, [(family, base, value)]

    def values(self) -> list[float]:
        """Sample values in the order of :meth:`families`."""
        last = self.last
        return [self.steps, *self.refused.values(), last.blocks_needed, last.free_blocks,
                last.running]
