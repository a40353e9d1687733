"""CPU lists in taskset's syntax, read and written (pure; no system calls).

``0``, ``0,2``, ``0-3``, ``0-3,6``: numbers and low-high ranges, comma-separated. The
scenario schema (:class:`loadlab.spec.scenario.Isolation`) and the ``--server-cpus`` /
``--client-cpus`` flags read them here; :mod:`loadlab.experiment.cpus` checks them against
the machine and pins processes.
"""

from __future__ import annotations

from typing import Any

CpuSet = frozenset[int]
FIX = "write CPU numbers like taskset: 0, 0,2 or 0-3 (ranges low-high)"


def parse_cpu_list(value: Any) -> CpuSet:
    """``"0-3,6"`` -> {0, 1, 2, 3, 6}; also one number or a list of numbers (YAML reads
    ``server_cpus: 0`` as a number); ValueError (TypeError for a value of another kind)
    saying what is wrong."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = [value]
    if isinstance(value, (list, tuple, set, frozenset)):
        if not value or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value
        ):
            raise ValueError(f"not a list of CPU numbers: {list(value)!r}")
        return frozenset(value)
    if not isinstance(value, str):
        raise TypeError(f"not a CPU list: {value!r}")
    cpus: set[int] = set()
    for part in value.split(","):
        lo, dash, hi = part.strip().partition("-")
        try:
            first, last = int(lo), int(hi) if dash else int(lo)
        except ValueError:
            raise ValueError(f"not a CPU list: {value!r}") from None
        if first < 0 or last < first:
            raise ValueError(f"bad CPU range {part.strip()!r} in {value!r}")
        cpus.update(range(first, last + 1))
    return frozenset(cpus)


def format_cpu_list(cpus: CpuSet) -> str:
    """{0, 1, 2, 5} -> ``0-2,5`` (the form taskset and :func:`parse_cpu_list` read)."""
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
