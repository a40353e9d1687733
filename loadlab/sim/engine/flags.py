"""vLLM flag values into a :class:`SimConfig`: the one place a flag list becomes an engine.

Used by ``loadlab sim serve``/``replay`` and by what-if sweep points alike, so a flag
list configures the same engine whichever way it arrives. A Hugging Face model name
maps to its profile; numbers a simulation cannot run with fail as InputError (exit 2).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from loadlab.errors import InputError
from loadlab.sim.engine.calibration import load as load_calibration
from loadlab.sim.engine.config import SimConfig
from loadlab.sim.engine.hardware import MODELS

_SIM_FIELDS = {f.name for f in dataclasses.fields(SimConfig)}
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(SimConfig)}


def sim_config(params: dict[str, Any]) -> SimConfig:
    """A SimConfig from parsed flags; a Hugging Face model name maps to its profile."""
    values = {k: v for k, v in params.items() if k in _SIM_FIELDS}
    by_hf = {m.hf_name.lower(): name for name, m in MODELS.items()}
    model = str(values.get("model", "")).lower()
    values["model"] = by_hf.get(model, model)
    if values.get("calibration"):
        # the calibrated server's pool and flags, for every flag left at its default
        for knob, value in load_calibration(values["calibration"]).server.items():
            if knob in _SIM_FIELDS and values.get(knob, _DEFAULTS[knob]) == _DEFAULTS[knob]:
                values[knob] = value
    for flag, low, strict in _LOWER_BOUNDS:
        value = values.get(flag.lstrip("-").replace("-", "_"))
        if value is not None and (value <= low if strict else value < low):
            raise InputError(
                f"must be {'>' if strict else '>='} {low:g}, got {value:g}",
                field=flag,
                fix=f"pass a value {'above' if strict else 'of at least'} {low:g}",
            )
    return SimConfig(**values)


# (flag, bound, strict): numbers a simulation cannot run with below the bound.
_LOWER_BOUNDS = (("--time-scale", 0.0, True), ("--output-len-mean", 0.0, True),
                 ("--output-len-sigma", 0.0, False), ("--step-jitter", 0.0, False))
