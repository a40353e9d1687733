"""Server and client on disjoint CPU sets: parse, check, pin (Linux ``sched_setaffinity``).

Why: on one host the server and the load generator compete for the same cores. vLLM's
CPU backend pins its worker to one core and its engine core busy-polls beside the API
server; a load generator sharing those cores is runnable but not running, applies a
fraction of the load it claims and stamps late times (real-vllm.md, "Sharing 2 cores":
in-flight 1.9-2.7 of 8 users unpinned, 8.0 pinned). Giving each side its own CPUs
removes that contention; it cannot help against a third party using the same CPUs.

- :func:`parse_cpu_list`: taskset's list syntax, ``0``, ``0,2``, ``0-3``, ``0-3,6``.
- :func:`check_isolation`: every CPU named must be one this process may run on
  (``os.sched_getaffinity(0)``) and the two sets must not overlap.
- :func:`inherited_affinity`: the calling thread runs on a set while a child is started,
  so the child (and everything it starts) inherits the set from its first instruction.
- :func:`pin_tree`: every thread of a process and of all its descendants is narrowed to
  the set after the fact. A thread already bound inside the set keeps its binding (vLLM's
  OpenMP threads bind one per core); a thread outside it is moved onto the whole set.
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
from dataclasses import dataclass

import psutil

from loadlab.errors import InputError

CpuSet = frozenset[int]


@dataclass(frozen=True)
class Isolation:
    """Where each side runs; None on a side = not pinned."""

    server_cpus: CpuSet | None = None
    client_cpus: CpuSet | None = None

    def manifest_entry(self) -> dict[str, list[int] | None] | None:
        """The manifest's ``isolation`` block, or None when nothing is pinned."""
        if self.server_cpus is None and self.client_cpus is None:
            return None
        return {"server_cpus": _sorted(self.server_cpus), "client_cpus": _sorted(self.client_cpus)}


def _sorted(cpus: CpuSet | None) -> list[int] | None:
    return None if cpus is None else sorted(cpus)


def format_cpu_list(cpus: CpuSet) -> str:
    """{0, 1, 2, 5} -> ``0-2,5`` (the form taskset and parse_cpu_list read)."""
    out: list[str] = []
    ordered = sorted(cpus)
    start = prev = ordered[0]
    for cpu in [*ordered[1:], None]:
        if cpu is not None and cpu == prev + 1:
            prev = cpu
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if cpu is not None:
            start = prev = cpu
    return ",".join(out)


def parse_cpu_list(text: str, flag: str) -> CpuSet:
    """``0-3,6`` -> {0, 1, 2, 3, 6}; errors name ``flag``."""
    cpus: set[int] = set()
    for part in text.split(","):
        lo, dash, hi = part.strip().partition("-")
        try:
            first, last = int(lo), int(hi) if dash else int(lo)
        except ValueError:
            raise InputError(f"not a CPU list: {text!r}", field=flag,
                             fix="write CPU numbers like taskset: 0, 0,2 or 0-3") from None
        if first < 0 or last < first:
            raise InputError(f"bad CPU range {part.strip()!r} in {text!r}", field=flag,
                             fix="ranges go low-high, e.g. 0-3")
        cpus.update(range(first, last + 1))
    return frozenset(cpus)


def check_isolation(server: CpuSet | None, client: CpuSet | None) -> Isolation:
    """Both sets usable here and disjoint; returns them as an :class:`Isolation`."""
    allowed = os.sched_getaffinity(0)
    for flag, cpus in (("--server-cpus", server), ("--client-cpus", client)):
        if cpus is not None and not cpus <= allowed:
            raise InputError(f"CPU {format_cpu_list(cpus - allowed)} is not available here "
                             f"(this process may use {format_cpu_list(frozenset(allowed))})",
                             field=flag, fix="name CPUs from that list")
    if server is not None and client is not None and server & client:
        raise InputError(f"server and client CPUs overlap on {format_cpu_list(server & client)}",
                         field="--server-cpus/--client-cpus",
                         fix="give each side its own CPUs, e.g. --server-cpus 0 --client-cpus 1")
    return Isolation(server, client)


def check_omp_bind(value: str | None, cpus: CpuSet) -> None:
    """Refuse an explicit ``VLLM_CPU_OMP_THREADS_BIND`` naming CPUs outside the server's set."""
    if value is None or value in ("auto", "nobind"):
        return
    named = frozenset().union(*(parse_cpu_list(p, "VLLM_CPU_OMP_THREADS_BIND") for p in value.split("|")))
    if not named <= cpus:
        raise InputError(f"VLLM_CPU_OMP_THREADS_BIND={value!r} binds vLLM's threads to CPU "
                         f"{format_cpu_list(named - cpus)}, outside --server-cpus {format_cpu_list(cpus)}",
                         field="VLLM_CPU_OMP_THREADS_BIND",
                         fix="unset it (auto binds inside the server's CPUs) or name only server CPUs")


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


def default_split() -> Isolation:
    """The last usable CPU for the client, the others for the server; no pinning on 1 CPU."""
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        return Isolation()
    return Isolation(frozenset(allowed[:-1]), frozenset(allowed[-1:]))
