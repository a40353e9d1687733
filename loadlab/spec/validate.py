"""Plain data into config models; what does not fit becomes a one-line InputError.

:func:`validate` runs a model of :mod:`loadlab.spec.plan` or :mod:`~loadlab.spec.scenario`
over a dict (parsed YAML, or a CLI's flags) and turns the first validation error into
an :class:`~loadlab.errors.InputError` (exit 2) naming

- the source: the file, or nothing for flags;
- the field: pydantic's error location, dotted (``load.concurrency``, ``sweep.arms.on``),
  or the flag it came from when ``names`` maps field names to flags (``names[""]``
  names the whole model, for errors about several fields);
- the fix: the one the validator attached, else built from the model: the allowed keys
  for an unknown one, the field's description for a missing or mistyped one.

:mod:`loadlab.spec.scenario_file` reads a scenario YAML file through it;
:func:`plan_from_flags` is the one place a load plan is built from command-line flags
(``loadlab run``, ``loadlab sim replay``, the Locust file's plan helpers).
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from loadlab.errors import InputError
from loadlab.spec.plan import KneeSearch, LoadPlan

M = TypeVar("M", bound=BaseModel)
# LoadPlan fields -> the flags `loadlab run` and `loadlab sim replay` take for them
PLAN_FLAGS = {"": "plan", "concurrency": "--concurrency", "rate": "--rate",
              "burstiness": "--burstiness", "step_duration_s": "--step-duration",
              "warmup_s": "--warmup", "time_scale": "--time-scale",
              "max_in_flight": "--max-in-flight", "trace": "--trace-replay", "search": "--search"}
# the plan kinds, each the flag that chooses it (--geometric is closed-loop levels too)
_PLAN_KINDS = {"concurrency": "--concurrency", "geometric": "--geometric", "search": "--search",
               "rate": "--rate", "trace": "--trace-replay"}


def validate(model: type[M], data: Any, *, source: str | Path | None = None,
             names: dict[str, str] | None = None) -> M:
    """``model.model_validate(data)``, errors as InputError (see the module docstring)."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise input_error(exc, model, source, names or {}) from None


def plan_from_flags(*, geometric: str | None = None, search: str | KneeSearch | None = None,
                    trace_span: Callable[[str, float], float] | None = None,
                    **fields: Any) -> LoadPlan:
    """The LoadPlan of command-line flag values (None = not given); errors name the flag.

    ``fields`` are LoadPlan fields (``concurrency``, ``rate``, ``step_duration_s``, ...).
    ``geometric`` is ``--geometric start:factor:max`` (closed-loop levels, as
    ``concurrency``), ``search`` is ``--search START:MAX:RESOLUTION``. A trace's span is
    read by ``trace_span(trace, time_scale)`` once the trace is known to be the only plan
    (the trace reader lives in the load generator, a layer above this one); a trace plan
    ignores ``step_duration_s``, the trace sets its one step's length.
    """
    given = {"geometric": geometric, "search": search, **fields}
    chosen = [flag for key, flag in _PLAN_KINDS.items() if given.get(key) is not None]
    if len(chosen) != 1:
        raise InputError(f"give exactly one load plan, got {', '.join(chosen) or 'none'}",
                         field="plan", fix=f"use one of {', '.join(_PLAN_KINDS.values())}")
    names = dict(PLAN_FLAGS)
    if geometric is not None:
        fields["concurrency"], names["concurrency"] = geometric, "--geometric"
    if isinstance(search, str):
        fields["search"] = _search(search)
    elif search is not None:
        fields["search"] = search
    if fields.get("trace") is not None:
        fields.pop("step_duration_s", None)
        if trace_span is not None:
            span = trace_span(fields["trace"], fields.get("time_scale") or 1.0)
            fields["trace_duration_s"] = max(span, 1e-3)
    return validate(LoadPlan, {k: v for k, v in fields.items() if v is not None}, names=names)


def _search(text: str) -> dict[str, int]:
    """``2:64:2`` -> the KneeSearch fields (start, max, resolution)."""
    parts = text.split(":")
    if len(parts) != 3 or not all(p.strip().isdigit() for p in parts):
        raise InputError(f"'{text}' is not START:MAX:RESOLUTION", field="--search",
                         fix="give three whole numbers of users, e.g. --search 2:64:2")
    return dict(zip(("start", "max", "resolution"), map(int, parts), strict=True))


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
