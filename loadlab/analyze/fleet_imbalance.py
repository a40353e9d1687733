"""Routing imbalance: how much of a fleet's queue sat at one replica while another had room.

A router that does not read the replicas' queues (round-robin, a Kubernetes Service)
keeps handing a replica its share of new requests while that replica is busy with a
long prefill, and those requests wait there though the replica beside it could start
them at once. The fleet's own table (every replica's snapshots together) shows a queue
and cannot say whether more servers or a better router would remove it; this measure can.

Definition (the one place it is defined). At each scrape, replica *j* **has room** when
its waiting gauge reads 0, its KV usage is below ``KV_FULL`` (0.9) and its running count
is below its ``max_num_seqs`` where known: a request sent there would be scheduled at its
next engine step (``vllm/v1/core/sched/scheduler.py`` admits from the waiting queue while
the running list and the KV pool have room). A replica's waiting requests are
**stranded** at that scrape when some *other* replica of its pool has room (pools split by
length serve different requests: a short pool's room is no place for a long prompt). Per load step::

    imbalance = sum over scrapes of stranded waiting / sum over scrapes of all waiting

(0 with no queue anywhere; None without snapshots). 0: every queued request waited
because every replica was busy (more capacity helps, routing does not); 1: every queued
request could have started elsewhere. A step is **imbalanced** at ``IMBALANCED_STEP``
(0.5) or more. Scrapes of different replicas are matched by the scrape interval's bin.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from loadlab.analyze.cause import KV_FULL
from loadlab.analyze.windows import resolve_family, snapshots

CAUSE = "routing_imbalance"
IMBALANCED_STEP = 0.5
DEFINITION = ("per step: waiting requests summed over the scrapes at which another replica "
              "of their pool had room (waiting 0, KV < 0.9, running below its cap), over all "
              "waiting requests summed over the scrapes")


@dataclass(frozen=True)
class StepImbalance:
    """One load step's imbalance and the replicas behind it (None where nothing queued)."""

    step: int
    imbalance: float | None
    queued: str | None = None      # the replica that held most of the stranded waiting
    room: str | None = None        # the other replica that had room most often meanwhile
    stranded_mean: float = 0.0     # stranded waiting requests per scrape
    stranded_by: tuple[float, ...] = ()   # each replica's stranded waiting, summed over scrapes

    def as_dict(self) -> dict[str, object]:
        return {"step": self.step, "imbalance": _round(self.imbalance), "queued": self.queued,
                "room": self.room, "stranded_mean": round(self.stranded_mean, 4)}


def step_imbalance(metrics: pd.DataFrame, endpoints: Sequence[str],
                   caps: Sequence[int | None], pools: Sequence[str], span: pd.DataFrame,
                   interval_s: float) -> list[StepImbalance]:
    """The imbalance of every step window in ``span`` (``step``, ``t_start``, ``t_end``)."""
    grids = _grids(metrics, endpoints, interval_s)
    if grids is None:
        return [StepImbalance(int(s), None) for s in span["step"]]
    t, waiting, running, kv = grids
    cap = np.array([np.inf if c is None else float(c) for c in caps])
    room = (waiting == 0) & (np.nan_to_num(kv, nan=0.0) < KV_FULL) & \
        (np.nan_to_num(running, nan=0.0) < cap)
    pool = np.asarray(pools)
    peers = (pool[:, None] == pool[None, :]) & ~np.eye(len(pool), dtype=bool)
    other_room = (room.astype(int) @ peers.astype(int)) > 0
    stranded = np.where(other_room, waiting, 0.0)
    out = []
    for w in span.itertuples(index=False):
        inside = (t >= w.t_start) & (t < w.t_end)
        if not inside.any():
            out.append(StepImbalance(int(w.step), None))
            continue
        total, held = float(waiting[inside].sum()), stranded[inside].sum(axis=0)
        if total <= 0:
            out.append(StepImbalance(int(w.step), 0.0))
            continue
        if held.sum() <= 0:
            out.append(StepImbalance(int(w.step), 0.0, stranded_by=tuple(map(float, held))))
            continue
        queued = int(np.argmax(held))
        rooms = room[inside & (stranded[:, queued] > 0)].sum(axis=0)
        rooms = np.where(peers[queued], rooms, -1)
        out.append(StepImbalance(
            int(w.step), float(held.sum()) / total, queued=endpoints[queued],
            room=endpoints[int(np.argmax(rooms))],
            stranded_mean=float(held.sum()) / int(inside.sum()),
            stranded_by=tuple(map(float, held))))
    return out


def _grids(metrics: pd.DataFrame, endpoints: Sequence[str], interval_s: float,
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """Bin times and (bins, replicas) arrays of waiting, running and KV usage; bins where
    some replica's waiting gauge is missing are left out (None without the gauge)."""
    frames = {}
    t0 = float(metrics["t"].min()) if not metrics.empty else 0.0
    for role in ("waiting", "running", "kv_usage"):
        family = resolve_family(metrics, role) if not metrics.empty else None
        if family is None:
            if role == "waiting":
                return None
            continue
        snaps = snapshots(metrics, family)
        snaps = snaps[snaps["endpoint"].isin(endpoints)]
        snaps = snaps.assign(bin=np.floor((snaps["t"] - t0) / interval_s).astype(int))
        frames[role] = snaps.pivot_table(index="bin", columns="endpoint", values="value",
                                         aggfunc="last").reindex(columns=list(endpoints))
    waiting = frames["waiting"].dropna()
    if waiting.empty:
        return None
    bins = waiting.index
    t = t0 + (bins.to_numpy(dtype=float) + 0.5) * interval_s

    def aligned(role: str) -> np.ndarray:
        if role not in frames:
            return np.full(waiting.shape, np.nan)
        return frames[role].reindex(bins).to_numpy(dtype=float)

    return t, waiting.to_numpy(dtype=float), aligned("running"), aligned("kv_usage")


def _round(v: float | None) -> float | None:
    return None if v is None or np.isnan(v) else round(float(v), 4)
