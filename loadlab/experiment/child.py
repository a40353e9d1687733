"""A live point in a child process, so Locust's gevent patching never reaches the caller.

Importing Locust runs gevent's ``monkey.patch_all()``: every later thread of that process
becomes a greenlet, and asyncio, ssl and in-thread servers break. A notebook or script
that calls :func:`loadlab.run_point` or :func:`loadlab.run_sweep` keeps working after
the point because the point's whole sequence (:func:`loadlab.experiment.point.run_here`:
launch, preflight, load, scrape) runs in ``python -m loadlab.experiment.child``.

The boundary, parent side (:func:`run_in_child`):

- The spec goes to the child pickled on its stdin, its ``progress`` left behind (a
  callable of the caller's); the child answers on a pipe of its own (``pass_fds``), one
  pickle per message: ``("progress", line)`` for each progress line, which the parent
  hands to ``spec.progress``, then ``("result", manifest)`` or ``("error", exception)``.
  The child's stdout and stderr are the parent's, so Locust's own lines still show.
- The child gets a process group of its own: a Ctrl-C at the terminal reaches the
  parent only, which passes SIGINT or SIGTERM on exactly once (a second SIGINT could cut
  short the child's clean-up), then waits for the child to flush, stop its server and
  answer.
  Handlers can only be installed from the main thread; elsewhere a KeyboardInterrupt
  in the wait is passed on the same way.
- The child's exception is re-raised in the parent as the same type (an InputError
  keeps its file, field and fix; RunInterrupted is still exit 130, ClientLimited 3).
  A child that ends without answering (killed) is a LoadlabError naming its exit status.
- The parent's Python path comes first on the child's, so both run the same loadlab.
- The child inherits the run folder claims the parent holds
  (:func:`loadlab.runstore.claim.held_claim_fds`): the folder stays locked until the
  child has flushed and ended, even when the parent was killed first.
- The parent waits on the client's CPUs (``isolation.client_cpus``): it relays the
  child's lines, client work that stays off the server's CPUs. It pins itself after the
  child has started, which pins itself in turn once its server is up.

Child side (:func:`main`): it asks the kernel for SIGTERM should the parent die
(``PR_SET_PDEATHSIG``, Linux, :mod:`loadlab.lifeline`), and its Locust workers ask for
SIGKILL should it die, so a killed notebook leaves no load running; SIGTERM
before the load starts ends it like Ctrl-C (the launcher still stops its server); once
the load runs, the driver turns both signals into a flushed, interrupted run.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import subprocess
import sys
import threading
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from loadlab.errors import LoadlabError, RunInterrupted, StorageError
from loadlab.experiment.cpus import pinned_process
from loadlab.experiment.recovery import save_unwritten
from loadlab.lifeline import end_with_parent
from loadlab.pystart import module_argv
from loadlab.runstore.claim import held_claim_fds

if TYPE_CHECKING:
    from loadlab.experiment.point import PointSpec

# Tests only: a file-size limit in bytes for the point's process (:func:`_limit_file_size`).
FSIZE_ENV = "LOADLAB_TEST_FILE_SIZE_LIMIT"
# The child's own process group, in the caller's session: a new session would also be a
# new scheduler autogroup, whose CPU share ``nice`` cannot lower.
OWN_GROUP: dict[str, Any] = ({"process_group": 0} if sys.version_info >= (3, 11)
                             else {"preexec_fn": os.setpgrp})


def run_in_child(spec: PointSpec) -> dict[str, Any]:
    """Run ``spec`` in a child process; its manifest, or the child's exception re-raised."""
    payload = pickle.dumps(replace(spec, progress=print))   # the caller's callable stays here
    read_fd, write_fd = os.pipe()
    try:
        proc = subprocess.Popen(
            module_argv("loadlab.experiment.child", str(write_fd), str(os.getpid())),
            stdin=subprocess.PIPE, pass_fds=(write_fd, *held_claim_fds()), env=_child_env(),
            **OWN_GROUP)
    except BaseException:
        os.close(read_fd)
        raise
    finally:
        os.close(write_fd)
    forwarded: list[int] = []   # the signals passed on to the child
    with os.fdopen(read_fd, "rb") as answers, _forwarding_signals(proc, forwarded), \
            pinned_process(spec.isolation.client_cpus):
        assert proc.stdin is not None
        try:
            proc.stdin.write(payload)
            proc.stdin.close()
        except BrokenPipeError:   # it died at start; its exit status says more below
            pass
        outcome = _relay(answers, spec, proc)
        proc.wait()
    if outcome is None:
        raise LoadlabError(f"the point's process ended with exit status {proc.returncode} before "
                           f"answering; what it measured is in {spec.out}")
    kind, value = outcome
    if kind == "error":
        raise _as_raised(value, spec, forwarded)
    return value


def _as_raised(exc: BaseException, spec: PointSpec, forwarded: list[int]) -> BaseException:
    """The child's exception as the caller gets it: unwritten rows saved, and a SIGTERM
    that stopped the point before its load (the child saw a KeyboardInterrupt) named."""
    if isinstance(exc, StorageError):
        return save_unwritten(exc, spec.out)
    if isinstance(exc, KeyboardInterrupt) and signal.SIGTERM in forwarded:
        return RunInterrupted(f"run interrupted by SIGTERM; what was measured is in {spec.out}",
                              "SIGTERM")
    return exc


def _child_env() -> dict[str, str]:
    """This process's environment, the folder holding this loadlab first on PYTHONPATH."""
    root = str(Path(__file__).resolve().parents[2])
    path = os.environ.get("PYTHONPATH", "")
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, path) if p)}


def _relay(answers: IO[bytes], spec: PointSpec,
           proc: subprocess.Popen[bytes]) -> tuple[str, Any] | None:
    """Progress lines to ``spec.progress`` until the child's final answer (None if it has none)."""
    while True:
        try:
            kind, value = pickle.load(answers)
        except EOFError:
            return None
        except KeyboardInterrupt:   # not the main thread: no handler forwards it
            _forward(proc, signal.SIGINT)
            continue
        if kind != "progress":
            return kind, value
        spec.progress(value)


def _forward(proc: subprocess.Popen[bytes], sig: int) -> None:
    if proc.poll() is None:
        try:
            os.kill(proc.pid, sig)
        except ProcessLookupError:
            pass


@contextmanager
def _forwarding_signals(proc: subprocess.Popen[bytes], forwarded: list[int]) -> Iterator[None]:
    """SIGINT and SIGTERM passed on to the child while it runs (main thread only), each
    appended to ``forwarded``."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def forward(sig: int, _frame: object) -> None:
        forwarded.append(sig)
        _forward(proc, sig)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def main() -> None:
    """``python -m loadlab.experiment.child FD PARENT_PID``: the spec on stdin, answers on FD."""
    answer_fd, parent = int(sys.argv[1]), int(sys.argv[2])
    end_with_parent(parent)
    _limit_file_size(os.environ.get(FSIZE_ENV))
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    answers = os.fdopen(answer_fd, "wb")
    caller_gone = False

    def send(kind: str, value: Any) -> None:
        # A caller that died (SIGKILL) closed the pipe: nobody is left to tell, and a
        # progress line failing must not cut short the run's own flush and clean-up.
        nonlocal caller_gone
        if caller_gone:
            return
        try:
            pickle.dump((kind, value), answers)
            answers.flush()
        except BrokenPipeError:
            caller_gone = True

    try:
        spec = pickle.load(sys.stdin.buffer)
        from loadlab.experiment.point import run_here

        spec.progress = lambda line: send("progress", line)
        send("result", run_here(spec))
    except BaseException as exc:
        if not isinstance(exc, (LoadlabError, KeyboardInterrupt)):
            traceback.print_exc()
        send("error", _picklable(exc))
    finally:
        with contextlib.suppress(BrokenPipeError):   # what the dead caller never read
            answers.close()


def _limit_file_size(limit: str | None) -> None:
    """Tests only (``FSIZE_ENV``): a file-size limit on this process, so that the run folder
    refuses writes as a full disk does (EFBIG instead of ENOSPC, SIGXFSZ ignored), while
    the caller, unlimited, can still save what this process hands back."""
    if not limit:
        return
    import resource

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE,
                       (int(limit), resource.getrlimit(resource.RLIMIT_FSIZE)[1]))


def _picklable(exc: BaseException) -> BaseException:
    """``exc`` itself when it survives pickling, else a LoadlabError saying what it was."""
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:
        return LoadlabError(f"{type(exc).__name__}: {exc}")
    return exc


if __name__ == "__main__":
    main()
