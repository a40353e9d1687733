"""A simulated level measures the requests the real run's client figures count: those sent
after the warm-up and before the level's end, however late they finish
(``loadlab.calibrate.runs`` reads a step's requests by send time).

On main the simulated level counted only requests finished by its end: a request lasting
more than a third of the level was never measured (a real tiny-long level at 8 users,
E2E 7 s in 15 s steps, came out NaN in the fit table), and in a mix the short ones were
measured more often than they were sent.
"""

from __future__ import annotations

import pytest

from loadlab.calibrate.runs import Level
from loadlab.calibrate.simulate import simulate_level
from loadlab.sim.engine.calibration import Calibration, StepTerms
from loadlab.sim.engine.step_model import Delays
from loadlab.sim.engine.types import BatchShape, SchedulerSettings

STEP_S = 0.01
SETTINGS = SchedulerSettings(max_num_seqs=8, max_num_batched_tokens=2048, block_size=16,
                             num_gpu_blocks=4096, max_model_len=4096,
                             enable_prefix_caching=False, enable_chunked_prefill=True,
                             long_prefill_token_threshold=0, scheduler_reserve_full_isl=False)


def level(lengths: list[tuple[int, int]], users: int, duration_s: float) -> Level:
    return Level(run="r", profile="p", concurrency=users, t_start=0.0, duration_s=duration_s,
                 hist={},
                 engine_steps=0.0, client={}, lengths=lengths)


def constant(_: BatchShape) -> float:
    return STEP_S


# a calibration without front end or turnaround: requests reach the engine as sent
NO_DELAY = Delays(Calibration(step=StepTerms(fixed_s=STEP_S)))


def test_requests_longer_than_half_the_level_are_measured() -> None:
    """Two users, 600 output tokens (6 s) in a 10 s level: each user's first request starts
    in the warm-up, its second after it; those two finish after the level's end."""
    trace = simulate_level(SETTINGS, level([(16, 600)], 2, 10.0), constant, NO_DELAY)
    assert len(trace.e2e_s) == 2
    assert trace.e2e_s == pytest.approx(600 * STEP_S, rel=0.01)   # one step a token


def test_a_mix_is_measured_in_the_proportion_it_was_sent() -> None:
    """Alternating 20- and 400-token requests: the measured ones are those sent in the
    window, long and short alike, not the short ones that happened to finish in it."""
    users, duration = 4, 20.0
    trace = simulate_level(SETTINGS, level([(16, 20), (16, 400)], users, duration), constant,
                           NO_DELAY)
    long = trace.e2e_s > 100 * STEP_S
    # the lengths are taken in turn over all sends: as many of each are sent, give or take
    # one, in any span of sends (with only the finished ones, the long ones sent in the
    # level's last 4 s would be missing: about 4 of some 40)
    assert long.sum() > 10 and abs(long.sum() - (~long).sum()) <= 1, (long.sum(), len(long))
