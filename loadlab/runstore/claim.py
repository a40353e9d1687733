"""Claim a folder for a new run; say who is writing it, and whether that writer is gone.

:func:`claim_run_dir`: a run folder's tables are directories of part files named by
writer and counter, so a second run into a used folder would replace some parts and
sit beside others (old metrics next to new requests). So:

1. The folder must be one we can create and write: a folder made (and removed at once)
   in its nearest existing ancestor proves it, so a refused run leaves no trace.
2. A folder that holds a run (``manifest.json``, ``analysis.json`` or a ``*.parquet``
   table directory) is refused, naming that file, unless ``overwrite``: then exactly
   those, and a launched server's ``*-server.log``, are removed first; anything else in
   the folder is left alone.

:func:`owner_entry` is the manifest's ``owner`` (pid and hostname of the process
writing the folder). :func:`unfinished_note` reads it back: a manifest still
``running`` whose owner process is gone (same host) was cut off (SIGKILL, a crash, a
power cut) and says so in one line.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from pathlib import Path

from loadlab.errors import InputError
from loadlab.runstore.layout import ANALYSIS, MANIFEST, SERVER_LOG_SUFFIX
from loadlab.runstore.manifest import Manifest, Owner

RUN_FILES = (MANIFEST, ANALYSIS)
RUN_GLOBS = ("*.parquet", f"*{SERVER_LOG_SUFFIX}")


def _run_contents(run_dir: Path) -> list[Path]:
    found = [run_dir / name for name in RUN_FILES if (run_dir / name).exists()]
    for pattern in RUN_GLOBS:
        found += sorted(run_dir.glob(pattern))
    return found


def _writable(folder: Path) -> bool:
    """Whether a folder can be made in ``folder``: tried (and removed), since permission bits
    say nothing for root or for special file systems such as /proc."""
    if not folder.is_dir():
        return False
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".loadlab-probe-", dir=folder))
    except OSError:
        return False
    return True


def claim_run_dir(run_dir: str | Path, overwrite: bool = False, flag: str = "--out") -> Path:
    """Check (and with ``overwrite``, clear) a folder a new run will write; see the module
    docstring."""
    run_dir = Path(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise InputError("exists and is not a folder", source=run_dir, field=flag,
                         fix="give a folder path for the run")
    ancestor = run_dir.absolute()
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not _writable(ancestor):
        raise InputError(f"cannot write here ({ancestor} is not a writable folder)", source=run_dir,
                         field=flag, fix="choose a folder you can write, e.g. under reports/")
    held = _run_contents(run_dir) if run_dir.is_dir() else []
    if held and not overwrite:
        raise InputError(f"already holds a run ({held[0]})", source=run_dir, field=flag,
                         fix="choose a new folder, or pass --overwrite to clear that run first")
    for path in held:
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()
    return run_dir


def owner_entry() -> Owner:
    """The manifest's ``owner``: this process, on this host."""
    return Owner(pid=os.getpid(), hostname=socket.gethostname())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def unfinished_note(manifest: Manifest) -> str | None:
    """One line when the manifest says ``running`` but its writer is gone (None otherwise)."""
    if manifest.status != "running":
        return None
    owner = getattr(manifest, "owner", None)
    pid, host = (owner.pid, owner.hostname) if owner is not None else (None, None)
    if pid is None or host != socket.gethostname():
        where = f" on {host}" if host else ""
        return (f"the manifest says the run is still going (written by pid {pid}{where}); "
                "if it is not, it was cut off: figures cover what was recorded")
    if _alive(pid):
        return f"the run is still going (pid {pid}); figures cover what was recorded so far"
    return (f"unfinished run: the process that wrote it (pid {pid}) is gone without finishing "
            "(killed or crashed); figures cover what was recorded")
