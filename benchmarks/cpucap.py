"""Confine a client to a share of one CPU, so that the server out-produces it.

On two cores the simulator in fast mode, alone on its core, streams about as many events
as loadlab can read on the other: loadlab is then server-bound and its CPU per event
says how it spends spare time (reading each event alone), not what a core of it can do.
Giving every client the same share of its core (say 0.3) makes each the bottleneck
again, while the server keeps a whole core.

How: an RT group (cgroup v1 ``cpu`` controller with RT group scheduling): real-time tasks
in it may run ``share x period`` per ``period`` (10 ms). It needs root, the clients
running under SCHED_RR (``bench_loadgen.py --realtime``), and
``/sys/fs/cgroup/cpu/cpu.rt_runtime_us``. A process joins by writing its pid to the
group's ``cgroup.procs`` before it execs (benchmarks/clients.py starts each client through
``sh -c 'echo $$ > .../cgroup.procs && exec ...'``); its children follow it. The RT time of
all groups together is bounded (95% of a CPU by default), so a group left behind by a
killed benchmark (``loadlab-bench-PID``, PID gone, no tasks) is removed first.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

CPU_ROOT = Path("/sys/fs/cgroup/cpu")
PERIOD_US = 10_000


@contextmanager
def rt_share(share: float, period_us: int = PERIOD_US) -> Iterator[Path]:
    """A fresh RT group allowed ``share`` of a CPU; removed on exit."""
    if not (CPU_ROOT / "cpu.rt_runtime_us").exists():
        raise SystemExit(
            f"--client-cap needs RT group scheduling: {CPU_ROOT}/cpu.rt_runtime_us is missing"
        )
    if not 0 < share < 1:
        raise SystemExit(f"--client-cap must be a share of a CPU in (0, 1), got {share}")
    for stale in CPU_ROOT.glob("loadlab-bench-*"):
        pid = stale.name.rpartition("-")[2]
        if (
            pid.isdigit()
            and not Path(f"/proc/{pid}").exists()
            and not (stale / "cgroup.procs").read_text()
        ):
            stale.rmdir()
    group = CPU_ROOT / f"loadlab-bench-{os.getpid()}"
    group.mkdir()
    try:
        (group / "cpu.rt_period_us").write_text(str(period_us))
        (group / "cpu.rt_runtime_us").write_text(str(int(share * period_us)))
        yield group
    finally:
        for pid in (group / "cgroup.procs").read_text().split():   # leftovers back to the root
            try:
                (CPU_ROOT / "cgroup.procs").write_text(pid)
            except OSError:
                pass
        group.rmdir()
