"""Claim a folder for a new run; say who is writing it, and whether that writer is gone.

:func:`claim_run_dir`: a run folder's tables are directories of part files, so two runs
writing one folder would put both runs' rows under one manifest, and a second run into a
used folder would sit beside the first one's parts (old metrics next to new requests). So:

1. The folder must be one we can create and write: a folder made (and removed at once)
   in its nearest existing ancestor proves it, so a refused run leaves no trace.
2. One writer at a time (:func:`lock_run_dir`): the claimer takes an exclusive
   ``flock`` on the folder's ``.claim`` file and writes its pid, host and start time
   there. Checking and then writing the folder would let two runs started together
   both pass the check; the lock is taken atomically by the kernel, and a second
   claimer is refused (InputError, exit 2) naming the folder and the holder, before it
   starts a server or any load. The kernel drops the lock when the last process holding
   it ends however it ends (SIGKILL, a crash), so a writer that died never blocks the
   folder: its ``.claim`` file stays behind, unlocked, and the next claim takes it.
   A point's child process (:mod:`loadlab.experiment.child`) inherits the open file
   (:func:`held_claim_fds`), so the folder stays held while it flushes, even when the
   process that claimed it was killed first. ``flock`` works across hosts on NFS (Linux
   maps it to a POSIX lock there).
3. Under the lock, a folder that holds a run (``manifest.json``, ``analysis.json`` or a
   ``*.parquet`` table directory) is refused, naming that file, unless ``overwrite``:
   then exactly those, and a launched server's ``*-server.log``, are removed first;
   anything else in the folder is left alone. ``overwrite`` never takes a folder from a
   run that still holds it. A server log alone is no run: it is what a launch that
   failed leaves (its error quoted the log), and the next run, the one retried with the
   fix, takes the folder and starts a fresh log.

:func:`owner_entry` is the manifest's ``owner`` (pid and hostname of the process
writing the folder). :func:`unfinished_note` reads it back: a manifest still
``running`` whose owner process is gone (same host) was cut off (SIGKILL, a crash, a
power cut) and says so in one line.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
import tempfile
import time
from pathlib import Path

from loadlab.errors import InputError
from loadlab.runstore.layout import ANALYSIS, CLAIM, MANIFEST, SERVER_LOG_SUFFIX
from loadlab.runstore.manifest import Manifest, Owner

RUN_FILES = (MANIFEST, ANALYSIS)


def _run_contents(run_dir: Path) -> list[Path]:
    """What makes the folder a run's."""
    found = [run_dir / name for name in RUN_FILES if (run_dir / name).exists()]
    return found + sorted(run_dir.glob("*.parquet"))


def _server_logs(run_dir: Path) -> list[Path]:
    return sorted(run_dir.glob(f"*{SERVER_LOG_SUFFIX}"))


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


class RunClaim:
    """A run folder this process holds: its ``.claim`` file, open and locked, until
    :meth:`release` (or the end of a ``with`` block, or of the process)."""

    def __init__(self, run_dir: Path, fd: int, made: bool) -> None:
        self.run_dir = run_dir
        self.fd: int | None = fd
        self.made = made   # the claim made the folder
        _HELD.add(fd)

    def release(self) -> None:
        """Close the lock file; the folder is free once no child holds it either. A run
        refused before it wrote anything (bad key, closed port) leaves no trace: the lock
        file goes, and the folder too when the claim made it."""
        if self.fd is None:
            return
        if [p.name for p in self.run_dir.iterdir()] == [CLAIM]:
            (self.run_dir / CLAIM).unlink()   # unlinked while still locked: no run holds it
            if self.made:
                self.run_dir.rmdir()
        _HELD.discard(self.fd)
        os.close(self.fd)
        self.fd = None

    def __enter__(self) -> RunClaim:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


_HELD: set[int] = set()   # the lock files of the claims this process holds


def held_claim_fds() -> tuple[int, ...]:
    """The open lock files of this process's claims, for a child doing its run to inherit."""
    return tuple(sorted(_HELD))


def lock_run_dir(run_dir: str | Path, flag: str = "--out") -> RunClaim:
    """Hold ``run_dir`` (made if missing) for this process; InputError naming the holder
    when another run holds it. Checks nothing else (see :func:`claim_run_dir`)."""
    run_dir = Path(run_dir)
    made = not run_dir.exists()
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / CLAIM
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(fd)
        os.close(fd)
        raise InputError(f"is being written by another run ({holder}; lock file {path})",
                         source=run_dir, field=flag,
                         fix="wait for that run to end, or choose another folder") from None
    except OSError as exc:
        os.close(fd)
        raise InputError(f"cannot lock {path} ({exc})", source=run_dir, field=flag,
                         fix="choose a folder on a file system that supports locks") from None
    me = {"pid": os.getpid(), "hostname": socket.gethostname(), "since": time.time()}
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(me).encode(), 0)
    return RunClaim(run_dir, fd, made)


def _holder(fd: int) -> str:
    """Who holds a lock file, as its holder wrote it there."""
    try:
        info = json.loads(os.pread(fd, 4096, 0))
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info["since"]))
        return f"pid {info['pid']} on {info['hostname']}, since {since}"
    except (OSError, ValueError, TypeError, KeyError):   # locked, not yet written
        return "a process that has just claimed it"


def claim_run_dir(run_dir: str | Path, overwrite: bool = False, flag: str = "--out") -> RunClaim:
    """Hold (and with ``overwrite``, clear) a folder a new run will write, for as long as
    the returned claim is held; see the module docstring."""
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
    if not overwrite and not (run_dir / CLAIM).exists():
        _refuse_held(run_dir, flag)        # an old run: refused before anything is written
    claim = lock_run_dir(run_dir, flag)
    held = _run_contents(run_dir)          # again, under the lock: what no run now writes
    if held and not overwrite:
        claim.release()
        _refuse_held(run_dir, flag)
    for path in held + _server_logs(run_dir):
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()
    return claim


def _refuse_held(run_dir: Path, flag: str) -> None:
    held = _run_contents(run_dir) if run_dir.is_dir() else []
    if held:
        raise InputError(f"already holds a run ({held[0]})", source=run_dir, field=flag,
                         fix="choose a new folder, or pass --overwrite to clear that run first")


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
