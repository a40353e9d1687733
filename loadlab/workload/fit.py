"""Fit sampled requests to the server's context window (``max_model_len``).

vLLM answers 400 to a prompt of ``max_model_len`` tokens or more, and clamps
``max_tokens`` to ``max_model_len - prompt_len``; the load generator sends
``min_tokens = max_tokens`` = the target output, so a clamped ``max_tokens`` below
``min_tokens`` is a 400 too. A request *fits* when ``prompt + output <= budget``:
``budget`` is ``max_model_len`` when prompts are calibrated with the server's
tokenizer (they hit their count exactly), else ``max_model_len`` less
``UNCALIBRATED_SPARE`` (10%), since an estimated prompt can come out longer.

Policies (what :class:`ContextFit` does to a request that does not fit):

- ``resample`` (profiles): take the first of ``RESAMPLE_TRIES`` (32) spare draws for
  the same ``seq`` that fits; spare ``k`` is ``spec(seq)`` of the same profile under
  seed ``key(seed, FIT_STREAM, k)``. The lengths sent are then the profile's
  distribution conditioned on fitting: what clients of such a server can send. Pure
  in (profile, seed, seq, budget), so every worker and run draws the same. A spare is
  sent as a lone request (only the profile's common prefix): its session belongs to
  another seed's layout. ``seq`` and arrival time stay the original's; later turns of
  the original's session still carry their context (their reuse is then overstated
  by what this turn would have added).
- ``clip`` (traces, whose rows are fixed, and a profile request no spare fits):
  prompt cut to ``budget - 1`` tokens (its shared prefix to at most the prompt less
  one), output to ``budget - prompt`` (at least 1).

:class:`FitCounts` tallies the requests *sent* that were changed (the load generator
adds each one it sends); the totals land in the manifest (``workload.fit``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from loadlab.workload import rng
from loadlab.workload.model import Arrivals
from loadlab.workload.sampler import Profile, RequestSampler, RequestSpec

FIT_STREAM = 0x8D
RESAMPLE_TRIES = 32
UNCALIBRATED_SPARE = 0.10


def budget(max_model_len: int, calibrated: bool) -> int:
    """Tokens a request (prompt + output) may use on this server."""
    return max_model_len if calibrated else int(max_model_len * (1 - UNCALIBRATED_SPARE))


def fits(spec: RequestSpec, limit: int) -> bool:
    return spec.prompt_tokens + spec.output_tokens <= limit


def clip(spec: RequestSpec, limit: int) -> RequestSpec:
    """The spec cut to ``limit`` tokens: prompt first to ``limit - 1``, then the output."""
    prompt = max(1, min(spec.prompt_tokens, limit - 1))
    output = max(1, min(spec.output_tokens, limit - prompt))
    return replace(spec, prompt_tokens=prompt, output_tokens=output,
                   prefix_tokens=max(0, min(spec.prefix_tokens, prompt - 1)))


@dataclass(frozen=True)
class Fitted:
    """A spec that fits, and how it was made to (None: it fitted as drawn)."""

    spec: RequestSpec
    how: str | None = None      # "resampled" | "clipped"


@dataclass
class FitCounts:
    """How many requests sent were changed to fit, and how."""

    clipped: int = 0
    resampled: int = 0

    def add(self, how: str | None) -> None:
        if how == "clipped":
            self.clipped += 1
        elif how == "resampled":
            self.resampled += 1


class ContextFit:
    """Wraps a spec source (``spec(seq)``) so every spec fits ``limit`` tokens."""

    def __init__(
        self, specs: Any, limit: int, profile: Profile | None = None, seed: int = 0
    ) -> None:
        self.specs = specs
        self.limit = limit
        self.profile = profile
        self.seed = seed
        self.policy = "resample" if profile is not None else "clip"
        self._spares: dict[int, RequestSampler] = {}

    def _spare(self, k: int) -> RequestSampler:
        sampler = self._spares.get(k)
        if sampler is None:
            assert self.profile is not None
            # No arrival model: only lengths are wanted, and a schedule would be built to seq.
            model = self.profile.model.model_copy(update={"arrivals": Arrivals(process="none")})
            sampler = self._spares[k] = RequestSampler(model, rng.key(self.seed, FIT_STREAM, k))
        return sampler

    def fitted(self, seq: int) -> Fitted:
        """Request ``seq``, made to fit (see the module docstring)."""
        spec = self.specs.spec(seq)
        if fits(spec, self.limit):
            return Fitted(spec)
        if self.profile is not None:
            for k in range(1, RESAMPLE_TRIES + 1):
                spare = self._spare(k).spec(seq)
                if fits(spare, self.limit):
                    common = max(0, min(self.profile.common_prefix_tokens, spare.prompt_tokens - 1))
                    lone = replace(
                        spare,
                        prefix_group=0 if common > 0 else None,
                        prefix_tokens=common,
                        arrival_s=spec.arrival_s,
                        turn=None,
                        reused_tokens=common if seq > 0 else 0,
                    )
                    return Fitted(lone, "resampled")
        return Fitted(clip(spec, self.limit), "clipped")
