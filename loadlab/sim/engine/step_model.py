"""Which step-time function an engine runs with: a server's calibration, or the roofline.

Every engine (virtual-time replay, the live simulator, what-if points) asks
:func:`step_time_for`, so ``--calibration FILE`` changes them all the same way.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

from loadlab.sim.engine.calibration import Calibration
from loadlab.sim.engine.hardware import ResolvedConfig
from loadlab.sim.engine.timing import StepTimeModel, attention_pairs
from loadlab.sim.engine.types import BatchShape

StepTime = Callable[[BatchShape], float]


def step_features(batch: BatchShape) -> tuple[float, ...]:
    """The quantities the calibrated terms multiply, in ``calibration.TERMS`` order (one
    per term: ``calibration.TERMS`` and this tuple change together)."""
    return (1.0, float(batch.num_requests), float(batch.num_prefill_tokens),
            attention_pairs(batch), float(batch.context_tokens),
            float(batch.num_prefill_tokens > 0))


def calibrated_step_time(calibration: Calibration, seed: int = 0) -> StepTime:
    """Seconds per step from the fitted terms, times the server's own jitter.

    The jitter: each step is the fitted sum times a seeded lognormal draw of median 1 and
    mean ``calibration.mean_over_median`` (:func:`host_sigma`). The fit
    made its terms the steps' median, so medians of token gaps stay the terms' while a
    sum of steps (a whole decode, a wait behind a queue) runs at the mean, as the real
    server's do. Without it a closed-loop replay's users, all alike, stay in lockstep:
    each level's TTFT takes a few values and its p50 jumps between them on any change
    (one CPU host's steps with one request running vary with a coefficient of variation
    of 0.35-0.5, its gaps independent from one token to the next).
    """
    fixed, per_req, per_prefill, per_pair, per_ctx, per_step = calibration.step.values()
    sigma = host_sigma(calibration)
    draw = random.Random(seed).lognormvariate

    def step_time(batch: BatchShape) -> float:
        prefill = batch.num_prefill_tokens
        seconds = (fixed + per_req * batch.num_requests + per_prefill * prefill
                   + per_pair * attention_pairs(batch) + per_ctx * batch.context_tokens
                   + (per_step if prefill else 0.0))
        return seconds * draw(0.0, sigma) if sigma else seconds

    return step_time


def host_sigma(calibration: Calibration) -> float:
    """The lognormal sigma of the host's jitter, whose mean over median is the fit's
    ``mean_over_median``: sqrt(2 ln mean_over_median)."""
    return math.sqrt(2.0 * math.log(max(calibration.mean_over_median, 1.0)))


@dataclass
class Delays:
    """A calibration's delays outside the engine, per request: the front end drawn about its
    fitted mean with the host's jitter (:func:`host_sigma`), the turnaround at its mean.

    The front end is the API server's work (tokenizing, streaming) on the host CPU the
    engine core steps on, so it varies as a step does; it is fitted as a mean (a
    difference of measured means), so each draw keeps the mean and spreads about it. Drawn,
    it also keeps a closed loop's users apart: with a fixed front end, users whose
    requests once shared a prefill step (alike requests finish in the same step) come back
    in the same step for ever, and a replay gathers them into ever larger groups, with
    fewer and larger prefills than the real server's ``vllm:iteration_tokens_total``
    shows. The turnaround is the load generator's, on CPUs of its own (as loadlab runs
    it), so it does not share the host's jitter.
    """

    calibration: Calibration
    seed: int = 0

    def __post_init__(self) -> None:
        sigma = host_sigma(self.calibration)
        self._mu, self._sigma = -sigma * sigma / 2, sigma     # a factor of mean 1
        self._draw = random.Random(f"{self.seed}:front").lognormvariate

    def front(self, in_flight: float) -> float:
        """One request's front end (:meth:`Calibration.front` is its mean)."""
        return self.calibration.front(in_flight) * self._draw(self._mu, self._sigma)

    def turnaround(self, in_flight: float) -> float:
        """A closed-loop user's turnaround: :meth:`Calibration.turnaround`."""
        return self.calibration.turnaround(in_flight)


def step_time_for(resolved: ResolvedConfig, calibration: Calibration | None = None) -> StepTime:
    """The calibration's step time when there is one (given, or in ``resolved``), else the
    roofline of the model and GPU profiles."""
    calibration = calibration or resolved.calibration
    if calibration is not None:
        return calibrated_step_time(calibration, resolved.seed)
    return StepTimeModel(resolved).step_time
