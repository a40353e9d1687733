"""A process that must not outlive the one that started it: the kernel's parent-death signal.

Load belongs to its owner. ``loadlab run`` starts a point process
(:mod:`loadlab.experiment.child`), which starts Locust worker processes; a worker left
behind by a killed or crashed owner goes on sending its full load, unrecorded, until its
master's heartbeat times out (Locust: 60 s). Each such process asks Linux's ``prctl``
for ``PR_SET_PDEATHSIG`` (prctl(2)): the kernel sends the signal as soon as the parent
exits, however it exits (SIGKILL, a crash), which no heartbeat or cleanup handler can
match. Elsewhere the call is skipped and the owner's own signals and heartbeats remain.

Locally spawned workers learn their parent from :data:`PARENT_ENV`; a worker a user
starts by hand (``loadlab run --join`` on another machine) has none, and keeps Locust's
own rules.
"""

from __future__ import annotations

import os
import signal
import sys

PR_SET_PDEATHSIG = 1    # linux/prctl.h
PARENT_ENV = "LOADLAB_WORKER_PARENT"


def end_with_parent(parent: int, sig: int = signal.SIGTERM) -> None:
    """``sig`` to this process when ``parent`` (its parent) dies; exit now if it already has."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, sig)
    except (OSError, AttributeError):   # not Linux
        return
    if os.getppid() != parent:   # it died before the request took effect
        sys.exit(1)


def end_with_spawner() -> None:
    """SIGKILL when the process named by :data:`PARENT_ENV` dies; nothing when it is unset.

    SIGKILL, not SIGTERM: such a worker's records go only to its parent, so once that is
    gone there is nothing left to flush, and not even a busy event loop may delay the end.
    """
    parent = os.environ.pop(PARENT_ENV, None)
    if parent is not None:
        end_with_parent(int(parent), signal.SIGKILL)
