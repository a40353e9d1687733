"""Request rows a full run folder refused, saved where a file can still be written.

The point's process keeps rows its part writer could not put on disk
(:class:`~loadlab.runstore.writer.PartWriter` never drops them) and hands them over in a
:class:`~loadlab.errors.StorageError`. The caller's process saves them as JSON lines, one
row a line as the requests table holds it: first beside the run's tables (the folder may
have room again, or refused only large files), else in the temporary directory
(``$TMPDIR``), which is often another file system. The error's message then names the
file, so the person at the terminal knows what to keep.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from loadlab.errors import StorageError

RECOVERY_NAME = "requests.recovery.jsonl"


def save_unwritten(exc: StorageError, out: Path) -> StorageError:
    """``exc`` with its rows saved and its message naming where (or saying they are lost)."""
    if not exc.rows:
        return exc
    tried: list[str] = []
    for path in (out / RECOVERY_NAME,
                 Path(tempfile.gettempdir()) / f"loadlab-{out.name}-{os.getpid()}.{RECOVERY_NAME}"):
        try:
            _write_lines(path, exc.rows)
        except OSError as err:
            tried.append(f"{path}: {err.strerror or err}")
            continue
        return StorageError(f"{exc}; the {len(exc.rows)} rows measured but not written are "
                            f"saved in {path} (JSON lines)")
    return StorageError(f"{exc}; {len(exc.rows)} rows measured but not written are lost: "
                        f"{'; '.join(tried)}")


def _write_lines(path: Path, rows: list[dict[str, Any]]) -> None:
    with path.open("x") as f:   # never over an earlier run's rows
        try:
            for row in rows:
                f.write(json.dumps(row, default=repr) + "\n")
            f.flush()
        except OSError:
            with contextlib.suppress(OSError):   # half a file: the next place gets them whole
                path.unlink()
            raise
