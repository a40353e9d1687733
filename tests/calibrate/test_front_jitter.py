"""A replayed front end is drawn per request, and that keeps a closed loop's users apart.

With a fixed front end, users whose requests once shared a prefill step (alike requests
finish in the same step) return in the same step for ever, so a long level gathers them
into ever larger groups: on the real CPU server's ``tiny-short`` levels (64 prompt tokens,
32 output tokens) the replay ran 17% of its steps with a prefill at 16 users where
``vllm:iteration_tokens_total`` showed 26%. Drawn about the same mean with the host's
jitter, the groups break up again.
"""

from __future__ import annotations

from loadlab.calibrate.runs import Level
from loadlab.calibrate.simulate import simulate_level
from loadlab.sim.engine.calibration import Calibration, StepTerms
from loadlab.sim.engine.step_model import Delays, calibrated_step_time
from loadlab.sim.engine.types import BatchShape, SchedulerSettings

SETTINGS = SchedulerSettings(max_num_seqs=16, max_num_batched_tokens=256, block_size=32,
                             num_gpu_blocks=512, max_model_len=1024,
                             enable_prefix_caching=False, enable_chunked_prefill=True,
                             long_prefill_token_threshold=0, scheduler_reserve_full_isl=True)
CAL = Calibration(step=StepTerms(fixed_s=4e-3, per_request_s=0.6e-3, per_prefill_token_s=0.1e-3),
                  front_s=0.01, front_busy_s=0.01, front_per_in_flight_s=0.002,
                  turnaround_s=0.005, mean_over_median=1.12)
LEVEL = Level(run="r", profile="tiny-short", concurrency=16, t_start=0.0, duration_s=15.0,
              hist={}, engine_steps=0.0, client={}, lengths=[(64, 32)])


class FixedFront(Delays):
    """The front end at its mean for every request (as replays had it before)."""

    def front(self, in_flight: float) -> float:
        return self.calibration.front(in_flight)


def prefill_groups(delays: Delays, seed: int) -> tuple[int, float]:
    """(prefill steps, requests per prefill step) of one replay of LEVEL."""
    step_time = calibrated_step_time(CAL, seed)
    prefills: list[int] = []

    def timed(batch: BatchShape) -> float:
        if batch.num_prefill_tokens:
            prefills.append(batch.num_prefill_requests)
        return step_time(batch)

    simulate_level(SETTINGS, LEVEL, timed, delays)
    return len(prefills), sum(prefills) / len(prefills)


def test_a_drawn_front_end_keeps_alike_users_from_prefilling_in_groups() -> None:
    for seed in range(3):
        fixed_steps, fixed_group = prefill_groups(FixedFront(CAL, seed), seed)
        drawn_steps, drawn_group = prefill_groups(Delays(CAL, seed), seed)
        assert drawn_steps > 1.2 * fixed_steps, (seed, fixed_steps, drawn_steps)
        assert drawn_group < fixed_group, (seed, fixed_group, drawn_group)
