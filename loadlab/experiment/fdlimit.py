"""Refuse, before anything starts, a user count this process cannot hold open.

Every closed-loop user keeps one streaming connection open, and each connection is a file
descriptor of the process its user runs in (a local worker, or the point's child with
``--workers 0``). Past the ``RLIMIT_NOFILE`` soft limit (1024 on many systems) a connect
fails with EMFILE: the run records a burst of client-side errors that read as the server
failing at high load, exactly the knee loadlab exists to find. So the limit is checked
up front: raised to the hard limit first, as servers do (vLLM raises its own in
``vllm/utils/system_utils.py``), and a plan that needs more is bad input (exit 2) naming
the limit and ``ulimit -n``. Children inherit the raised limit.
"""

from __future__ import annotations

import math

from loadlab.errors import InputError
from loadlab.spec.plan import LoadPlan

CONNECTIONS_PER_USER = 1
# the rest of a process's descriptors: its run-folder files, /metrics scrapes, ZeroMQ
# sockets to the master, pipes to its children, the interpreter's own
MARGIN = 128


def peak_users(plan: LoadPlan) -> int | None:
    """The most closed-loop users one step runs; None for open loop (no users to count)."""
    if plan.search is not None:
        return plan.search.max
    if plan.concurrency:
        return int(max(plan.concurrency))
    return None


def open_files_needed(plan: LoadPlan, processes: int) -> int | None:
    """Descriptors the busiest load process needs, users spread over ``processes``."""
    users = peak_users(plan)
    if users is None:
        return None
    return math.ceil(users / max(1, processes)) * CONNECTIONS_PER_USER + MARGIN


def ensure_open_files(plan: LoadPlan, workers: int, remote_workers: int,
                      field: str = "--concurrency/--search") -> None:
    """Raise the soft ``RLIMIT_NOFILE`` to what the plan needs (up to the hard limit);
    InputError naming ``field`` (the plan's users) when even the hard limit is too low."""
    import resource

    need = open_files_needed(plan, workers + remote_workers)
    if need is None:
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or need <= soft:
        return
    if hard != resource.RLIM_INFINITY and need > hard:
        users = peak_users(plan)
        raise InputError(
            f"{users} users need about {need} open files in one load process (one connection "
            f"each, plus {MARGIN}), but this shell allows at most {hard} (RLIMIT_NOFILE)",
            field=field,
            fix=f"raise the limit (`ulimit -n {need}` in the shell that starts loadlab; "
            "LimitNOFILE= for a systemd service), spread the users over more --workers, "
            "or run fewer users")
    resource.setrlimit(resource.RLIMIT_NOFILE, (need if hard == resource.RLIM_INFINITY else hard,
                                                hard))
