"""CPU time of a whole process tree, sampled over time, read back over any window.

A load generator may be one process (an asyncio client), a master and its workers
(loadlab, Locust), or a launcher with a pool of worker processes (GuideLLM). Counting
one of them undercounts the side; counting each over its own window makes two sides
incomparable. :class:`TreeCpu` samples the cumulative user + system CPU of the root and
of every descendant (psutil) every ``interval_s`` in a background thread, from outside
the measured processes, so every side is counted by the same code. :meth:`TreeCpu.cpu_s`
then gives the CPU-seconds spent inside ``[t0, t1]`` (unix seconds) by interpolating the
cumulative series at both edges, so the window can be chosen after the run (from the
requests' own timestamps).

The list of descendants is refreshed every ``refresh_s`` (it scans /proc, the costly
part); a process that exits keeps its last cumulative figure, so totals never drop, and
one found late counts from its first sample (measure windows that start after the
processes are up, as after a warm-up).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import numpy as np
import psutil


@dataclass
class TreeCpu:
    """Cumulative CPU-seconds of ``root_pid`` and its descendants, per process, over time."""

    root_pid: int
    interval_s: float = 0.05
    refresh_s: float = 0.5
    times: list[float] = field(default_factory=list)
    per_pid: dict[int, list[float]] = field(
        default_factory=dict
    )  # pid -> cumulative CPU per sample
    names: dict[int, str] = field(default_factory=dict)            # pid -> command line, shortened

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._procs: dict[int, psutil.Process] = {}
        self._last: dict[int, float] = {}
        self._thread = threading.Thread(target=self._run, daemon=True, name="tree-cpu")

    def start(self) -> TreeCpu:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        next_refresh = 0.0
        while True:
            now = time.time()
            if now >= next_refresh:
                self._refresh()
                next_refresh = now + self.refresh_s
            self._sample(time.time())
            if self._stop.wait(self.interval_s):
                self._sample(time.time())
                return

    def _refresh(self) -> None:
        try:
            root = psutil.Process(self.root_pid)
            found = [root, *root.children(recursive=True)]
        except psutil.Error:
            return
        for p in found:
            if p.pid not in self._procs:
                self._procs[p.pid] = p
                try:
                    self.names[p.pid] = " ".join(p.cmdline())[:120]
                except psutil.Error:
                    self.names[p.pid] = "?"

    def _sample(self, t: float) -> None:
        for pid, p in self._procs.items():
            try:
                ct = p.cpu_times()
                self._last[pid] = ct.user + ct.system
            except psutil.Error:
                pass  # exited: keeps its last figure
        n = len(self.times)
        for pid, value in self._last.items():
            # A process found late is flat before: its earlier CPU lands in no window.
            series = self.per_pid.setdefault(pid, [value] * n)
            series.append(value)
        self.times.append(t)

    def cpu_s(self, t0: float, t1: float, pids: list[int] | None = None) -> float:
        """CPU-seconds used in ``[t0, t1]`` by ``pids`` (default: the whole tree)."""
        ts = np.asarray(self.times)
        if len(ts) < 2 or t0 < ts[0] or t1 > ts[-1]:
            raise ValueError(f"window [{t0:.3f}, {t1:.3f}] is outside the sampled span")
        total = 0.0
        for pid in pids if pids is not None else list(self.per_pid):
            series = np.asarray(self.per_pid[pid])
            total += float(np.interp(t1, ts, series) - np.interp(t0, ts, series))
        return total

    @property
    def root_only(self) -> list[int]:
        return [self.root_pid]

    @property
    def descendants(self) -> list[int]:
        return [pid for pid in self.per_pid if pid != self.root_pid]
