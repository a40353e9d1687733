"""Plain data into config models; what does not fit becomes a one-line InputError.

:func:`validate` runs a pydantic model of :mod:`loadlab.spec.models` over a dict (parsed
YAML, or a CLI's flags) and turns the first validation error into an
:class:`~loadlab.errors.InputError` (exit 2) naming

- the source: the file, or nothing for flags;
- the field: pydantic's error location, dotted (``load.concurrency``, ``sweep.arms.on``),
  or the flag it came from when ``names`` maps field names to flags (``names[""]``
  names the whole model, for errors about several fields);
- the fix: the one the validator attached, else built from the model: the allowed keys
  for an unknown one, the field's description for a missing or mistyped one.

:mod:`loadlab.spec.scenario_file` reads a scenario YAML file through it.
"""

from __future__ import annotations

import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from loadlab.spec.models import LoadPlan
from loadlab.errors import InputError

M = TypeVar("M", bound=BaseModel)
# LoadPlan fields -> the flags `loadlab run` and `loadlab sim replay` take for them
PLAN_FLAGS = {"": "plan", "concurrency": "--concurrency", "rate": "--rate", "burstiness": "--burstiness",
              "step_duration_s": "--step-duration", "warmup_s": "--warmup",
              "time_scale": "--time-scale", "max_in_flight": "--max-in-flight",
              "trace": "--trace-replay", "search": "--search"}


def validate(model: type[M], data: Any, *, source: str | Path | None = None,
             names: dict[str, str] | None = None) -> M:
    """``model.model_validate(data)``, errors as InputError (see the module docstring)."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise input_error(exc, model, source, names or {}) from None


def plan_from_flags(**fields: Any) -> LoadPlan:
    """A LoadPlan from flag values (None = not given); errors name the flag."""
    return validate(LoadPlan, {k: v for k, v in fields.items() if v is not None}, names=PLAN_FLAGS)


def input_error(exc: ValidationError, model: type[BaseModel], source: str | Path | None,
                names: dict[str, str]) -> InputError:
    errors = exc.errors(include_url=False)
    err = errors[0]
    loc = tuple(str(p) for p in err["loc"])
    field = ".".join(loc) or names.get("", model.__name__.lower())
    if loc and loc[0] in names:
        field = ".".join((names[loc[0]], *loc[1:]))
    ctx = err.get("ctx") or {}
    fix = ctx.get("fix") or _default_fix(model, loc, err["type"])
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return InputError(f"{err['msg']}{more}", source=source, field=field, fix=fix)


def _default_fix(model: type[BaseModel], loc: tuple[str, ...], kind: str) -> str | None:
    parent, info = _walk(model, loc)
    if kind == "extra_forbidden":
        allowed = ", ".join(parent.model_fields) if parent else "none"
        return f"remove it; allowed here: {allowed}"
    if info is not None and info.description:
        return f"{loc[-1]}: {info.description}"
    return None


def _walk(model: type[BaseModel], loc: tuple[str, ...]) -> tuple[type[BaseModel] | None, Any]:
    """The model holding the last named field of ``loc``, and that field's FieldInfo."""
    current: type[BaseModel] | None = model
    parent, info = None, None
    for part in loc:
        if current is None or part not in current.model_fields:
            if current is not None:  # a key the model does not know: current holds it
                parent, info = current, None
            continue  # a dict key or list index: stay with the same field
        parent, info = current, current.model_fields[part]
        current = _model_in(info.annotation)
    return parent, info


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model inside ``X``, ``X | None`` or ``Annotated[X, ...]``, if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType, typing.Annotated):
        for arg in typing.get_args(annotation):
            found = _model_in(arg)
            if found is not None:
                return found
    return None
