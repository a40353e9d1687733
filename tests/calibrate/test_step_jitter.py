"""A calibration's replayed steps carry the server's measured jitter: each step is the
fitted terms' sum times a seeded draw whose median is 1 and whose mean is the fit's
``mean_over_median``, so token-gap medians stay the terms' and sums of steps run at the
server's mean."""

from __future__ import annotations

import numpy as np
import pytest

from loadlab.sim.engine.calibration import Calibration, StepTerms
from loadlab.sim.engine.step_model import calibrated_step_time
from loadlab.sim.engine.types import BatchShape

TERMS = StepTerms(fixed_s=4e-3, per_request_s=0.5e-3, per_prefill_token_s=0.1e-3)
DECODE = BatchShape(num_prefill_tokens=0, num_decode_tokens=4, num_requests=4,
                    num_prefill_requests=0, context_tokens=400)
BASE = 4e-3 + 4 * 0.5e-3


def draws(mean_over_median: float, seed: int, n: int = 20_000) -> np.ndarray:
    step = calibrated_step_time(Calibration(step=TERMS, mean_over_median=mean_over_median),
                                seed)
    return np.array([step(DECODE) for _ in range(n)])


def test_steps_keep_the_fitted_median_and_the_servers_mean():
    times = draws(1.15, seed=0)
    assert np.median(times) == pytest.approx(BASE, rel=0.02)
    assert times.mean() == pytest.approx(1.15 * BASE, rel=0.02)


def test_without_jitter_every_step_is_the_terms_sum():
    assert draws(1.0, seed=3, n=50) == pytest.approx(np.full(50, BASE))


def test_the_draws_are_seeded():
    assert np.array_equal(draws(1.1, seed=7, n=100), draws(1.1, seed=7, n=100))
    assert not np.array_equal(draws(1.1, seed=7, n=100), draws(1.1, seed=8, n=100))
