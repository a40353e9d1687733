"""The JSON files of a run folder (manifest.json, analysis.json): read as one object,
checked against a model, replaced atomically.

Every reader of these files goes through here so that a damaged file gets the same
answer whoever reads it: an :class:`~loadlab.errors.InputError` (exit 2) naming the file
and, for a value that does not fit the model, the field (``steps[0].t_start``).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from loadlab.errors import InputError, StorageError

M = TypeVar("M", bound=BaseModel)


def read_object(path: Path, fix: str) -> dict[str, Any]:
    """The JSON object in ``path``; InputError naming the file when it is not one."""
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read it: {exc}", source=path, fix=fix) from None
    except json.JSONDecodeError as exc:
        raise InputError(f"not valid JSON (line {exc.lineno}, column {exc.colno}): {exc.msg}",
                         source=path, fix=fix) from None
    if not isinstance(data, dict):
        raise InputError(f"holds a {type(data).__name__}, not a JSON object", source=path, fix=fix)
    return data


def field_path(loc: tuple[int | str, ...]) -> str:
    """pydantic's error location as the file's readers write it: ``steps[0].t_start``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def validated(model: type[M], data: dict[str, Any], path: Path | str, fix: str) -> M:
    """``data`` as ``model``; InputError naming the file and the first field that does not fit
    (the others are counted, so a fix-and-retry loop knows more are coming)."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        first = errors[0]
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        msg = str(first["msg"])
        raise InputError(f"{msg[:1].lower()}{msg[1:]}{more}", source=path,
                         field=field_path(first["loc"]) or None, fix=fix) from None


def replace_text(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` through a temporary name and a rename, so a reader (or a
    crash) never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):   # a half-written temporary file helps nobody
            tmp.unlink()
        raise StorageError(f"cannot write {path}: {exc.strerror or exc} (free space on its "
                           "file system, or fix its permissions)") from exc
    return path
