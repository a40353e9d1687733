"""A calibration's replayed steps carry the server's measured jitter: each step is the
fitted terms' sum times a seeded draw whose median is 1 and whose mean is the fit's
``mean_over_median``, so token-gap medians stay the terms' and sums of steps run at the
server's mean."""

from __future__ import annotations

import numpy as np
import pytest

from loadlab.sim.engine.calibration import Calibration, StepTerms
from loadlab.sim.engine.step_model import Delays, calibrated_step_time
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


FRONTED = Calibration(step=TERMS, front_s=0.02, front_per_in_flight_s=0.002, turnaround_s=0.005,
                      mean_over_median=1.12)


def test_a_front_end_is_drawn_about_its_fitted_mean_and_the_turnaround_is_not():
    """The front end is the API server's, on the host's CPU: it spreads as a step does but
    keeps its fitted mean (a difference of measured means). The turnaround is the load
    generator's, on CPUs of its own: it stays at its mean."""
    delays = Delays(FRONTED, seed=0)
    fronts = np.array([delays.front(4) for _ in range(20_000)])
    assert fronts.mean() == pytest.approx(FRONTED.front(4), rel=0.02)
    assert np.median(fronts) < 0.97 * FRONTED.front(4)          # lognormal: median below mean
    assert fronts.std() / fronts.mean() == pytest.approx(np.sqrt(1.12 ** 2 - 1), rel=0.05)
    assert {delays.turnaround(4) for _ in range(100)} == {FRONTED.turnaround(4)}


def test_front_draws_are_seeded_and_exact_without_jitter():
    def fronts(cal: Calibration, seed: int) -> list[float]:
        delays = Delays(cal, seed)
        return [delays.front(8) for _ in range(50)]

    assert fronts(FRONTED, 3) == fronts(FRONTED, 3) != fronts(FRONTED, 4)
    calm = FRONTED.model_copy(update={"mean_over_median": 1.0})
    assert fronts(calm, 3) == pytest.approx([calm.front(8)] * 50)
