"""Arrival schedules hit their target rate and CV, are drift-free and random-access."""

from __future__ import annotations

from itertools import islice, pairwise

import numpy as np
import pytest

from loadlab.errors import InputError
from loadlab.workload.arrivals import CHUNK, gamma_schedule, poisson_schedule, replay_schedule

N = 40_000


def _gaps(schedule) -> np.ndarray:  # type: ignore[no-untyped-def]
    return np.diff(np.fromiter(islice(iter(schedule), N), float))


def test_poisson_hits_rate_and_cv_one() -> None:
    gaps = _gaps(poisson_schedule(8.0, seed=1))
    assert 1 / gaps.mean() == pytest.approx(8.0, rel=0.02)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.03)


@pytest.mark.parametrize("shape", [0.25, 4.0])
def test_gamma_hits_rate_and_cv(shape: float) -> None:
    gaps = _gaps(gamma_schedule(3.0, shape, seed=2))
    assert 1 / gaps.mean() == pytest.approx(3.0, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1 / np.sqrt(shape), rel=0.05)


def test_offsets_are_cumulative_random_access_and_seeded() -> None:
    a = poisson_schedule(5.0, seed=9)
    b = poisson_schedule(5.0, seed=9)
    late = [b.offset(n) for n in (3 * CHUNK + 5, 7, 2 * CHUNK)]  # asked out of order
    first = list(islice(iter(a), 3 * CHUNK + 6))
    assert late == [first[3 * CHUNK + 5], first[7], first[2 * CHUNK]]
    assert first[0] == 0.0 and all(y >= x for x, y in pairwise(first))
    assert first != list(islice(iter(poisson_schedule(5.0, seed=10)), 3 * CHUNK + 6))


def test_replay_shifts_and_scales_recorded_times() -> None:
    assert list(replay_schedule([100.0, 100.5, 103.0], time_scale=0.5)) == [0.0, 0.25, 1.5]


def test_bad_rates_are_input_errors() -> None:
    with pytest.raises(InputError, match="rate"):
        poisson_schedule(0, seed=1)
    with pytest.raises(InputError, match="burstiness"):
        gamma_schedule(1.0, -1.0, seed=1)
    with pytest.raises(InputError, match="time scale"):
        list(replay_schedule([1.0], time_scale=0))
