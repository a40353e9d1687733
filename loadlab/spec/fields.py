"""Building blocks of the spec models: the strict base, errors that carry their fix, flag values.

Every model refuses unknown keys and is frozen (a resolved scenario is not edited in
place). :func:`bad` raises a validation error whose ``fix`` travels with it, which
:mod:`loadlab.spec.validate` shows beside the file and field (exit 2).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict
from pydantic_core import PydanticCustomError


class Strict(BaseModel):
    """Unknown keys refused, instances frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def bad(message: str, fix: str, **ctx: Any) -> PydanticCustomError:
    """A validation error whose fix travels with it (shown by loadlab.spec.validate)."""
    return PydanticCustomError("loadlab", message, {"fix": fix, **ctx})


def _scalar(value: Any) -> Any:
    if not isinstance(value, (bool, int, float, str)):
        raise bad(
            "a flag value is a number, a word or true/false, got {value}",
            "write one value (a matrix lists them: {max-num-seqs: [8, 16]})",
            value=repr(value),
        )
    return value


Scalar = Annotated[bool | int | float | str, BeforeValidator(_scalar)]


def number_or_word(text: str) -> int | float | str:
    """A flag's value as a command line gives it: an int or a float when it reads as one,
    else the text (vLLM's argparse does the same per flag type)."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            continue
    return text
