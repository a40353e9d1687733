"""One server's fitted step-time model, as ``loadlab sim calibrate`` writes it (YAML).

A :class:`Calibration` replaces the roofline of :mod:`loadlab.sim.engine.timing` with
constants fitted to a real server's own histograms (``loadlab.calibrate``), so a what-if
of *that* server needs no model or GPU profile. One engine step takes

    step_s = fixed + per_request x n + per_prefill_token x P
             + per_attention_pair x pairs + per_context_token x context
             + per_prefill_step x [P > 0]

(n scheduled requests, P prefill tokens, ``pairs`` the new x context token pairs of
:func:`loadlab.sim.engine.timing.attention_pairs`, ``context`` the tokens the batch
reads). ``per_prefill_step`` is paid once by a step that schedules any prefill tokens,
whatever their number. Its likely source is host work that only such a step does: vLLM's
model runner prepares inputs and attention metadata for query lengths above one
(``_prepare_inputs`` in vllm/v1/worker/gpu_model_runner.py, inherited by the CPU runner,
vllm/v1/worker/cpu_model_runner.py); on a small model that host work, not the tokens,
sets the step time, so the fixed cost alone cannot be both a decode and a prefill step.

Each step is that sum times a seeded draw of the server's own jitter, of median 1 and mean
``mean_over_median`` (:func:`loadlab.sim.engine.step_model.calibrated_step_time`).

Beside the engine: ``front_s``, the API server's share of a request's latency
(to the engine's queue and the first token back), and ``turnaround_s``, the time a
closed-loop user's next request takes to reach the engine after its previous one
finished, each with an optional slope on the requests in flight; the front end also
steps up by ``front_busy_s`` once another request is in flight; a replay draws each
request's front end about that line (:class:`loadlab.sim.engine.step_model.Delays`). The
KV pool and scheduler flags of the calibrated run travel in ``server``, so a replay of that
server runs on its own pool.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field

from loadlab.errors import InputError
from loadlab.spec.validate import validate

TERMS = ("fixed_s", "per_request_s", "per_prefill_token_s", "per_attention_pair_s",
         "per_context_token_s", "per_prefill_step_s")


class StepTerms(BaseModel):
    """The coefficients of one engine step's duration, seconds per unit (>= 0)."""

    model_config = ConfigDict(extra="forbid")

    fixed_s: float = Field(ge=0)
    per_request_s: float = Field(0.0, ge=0)
    per_prefill_token_s: float = Field(0.0, ge=0)
    per_attention_pair_s: float = Field(0.0, ge=0)
    per_context_token_s: float = Field(0.0, ge=0)
    per_prefill_step_s: float = Field(0.0, ge=0)

    def values(self) -> list[float]:
        """The coefficients in :data:`TERMS` order."""
        return [getattr(self, name) for name in TERMS]


class Calibration(BaseModel):
    """A fitted step-time model and the server it came from."""

    model_config = ConfigDict(extra="forbid")

    format_version: int = 1
    step: StepTerms
    front_s: float = Field(0.0, ge=0, description="API server <-> engine, per request")
    front_per_in_flight_s: float = Field(
        0.0, description="front-end slope, seconds per request in flight at the server")
    front_busy_s: float = Field(
        0.0, ge=0, description="front-end step, added while another request is in flight")
    turnaround_s: float = Field(0.0, ge=0, description="closed loop: request end -> next arrival")
    turnaround_per_in_flight_s: float = Field(
        0.0, description="turnaround slope, seconds per request in flight at the server")
    dropped: dict[str, str] = Field(default_factory=dict,
                                    description="terms the data did not support, and why")
    fit_errors: dict[str, float] = Field(default_factory=dict,
                                         description="median relative errors on the fit runs")
    mean_over_median: float = Field(
        1.0, gt=0, description="the server's jitter: mean over median token gap with one "
                               "request running; the fit divided vLLM's means by it, and "
                               "each replayed step is drawn with it as its mean over median")
    runs: list[str] = Field(default_factory=list)
    server: dict[str, Any] = Field(default_factory=dict,
                                   description="the calibrated run's scheduler and KV-pool flags")

    def front(self, in_flight: float) -> float:
        """Seconds a request spends outside the engine before its first token reaches the
        client, with ``in_flight`` requests at the server (a closed loop: its users). The
        API server tokenizes and streams for all of them, on the host CPU the engine core
        also uses, so this grows with the load, and steps up as soon as the engine runs
        beside it (a request alone has the API server's CPU to itself)."""
        busy = self.front_busy_s if in_flight > 1 else 0.0
        return max(0.0, self.front_s + busy + self.front_per_in_flight_s * in_flight)

    def turnaround(self, in_flight: float) -> float:
        """Seconds from a closed-loop request's end to its user's next engine arrival."""
        return max(0.0, self.turnaround_s + self.turnaround_per_in_flight_s * in_flight)

    def save(self, path: Path) -> None:
        path.write_text(yaml.safe_dump(self.model_dump(), sort_keys=False))


def load(path: str | Path) -> Calibration:
    """The calibration in ``path``; InputError naming the file, field and fix if it is off."""
    path = Path(path)
    fix = "write it with `loadlab sim calibrate RUN --out FILE.yaml`"
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputError(f"cannot read the calibration: {exc.strerror or exc}", source=path,
                         field="--calibration", fix=fix) from None
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise InputError(f"not a YAML calibration: {exc}", source=path, fix=fix) from None
    if not isinstance(data, dict) or "step" not in data:
        raise InputError("a calibration is a mapping with a 'step' block", source=path,
                         field="step", fix=fix)
    return validate(Calibration, data, source=path)
