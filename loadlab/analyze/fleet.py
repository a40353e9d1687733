"""A fleet's verdict: each replica's knee and cause beside the fleet's, and whether the
router, not the replicas, made the queue (cause ``routing_imbalance``).

The load goes to one gateway, so the client's figures and the load levels belong to the
fleet; the server's series are each replica's own (metrics.parquet labels them by
endpoint). The fleet's knee is the whole run's (every replica's snapshots together). Each
replica is judged by the analyzer's own sequence (the ``judge`` passed in,
:func:`loadlab.analyze.analysis.judge`) on the run with only that replica's series and
its own flags: the fleet's load levels and requests, that replica's queue, KV and
counters. Its step table is kept compact (:data:`REPLICA_COLUMNS`), with
``requests_done`` from the replica's ``vllm:request_success_total``.

The replicas are those the manifest lists: ``replicas`` (``loadlab run`` and ``loadlab
collect`` with ``--replica-metrics``), else a simulated fleet's ``sim.fleet.replicas``,
else endpoints named ``.../replica/<i>`` (``loadlab sim serve --replicas``) when there
are two or more.

``routing_imbalance`` (:mod:`loadlab.analyze.fleet_imbalance` defines the measure) is
ranked with the other causes at the share of the fleet's stalled steps that are
imbalanced, and chosen when the fleet's knee was found and that share is at least
``MATERIAL_SHARE`` (0.5), unless the server failed requests or the client fell short
(their verdicts stand: no router fixes them).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from loadlab.analyze.capacity import as_int
from loadlab.analyze.fleet_imbalance import DEFINITION, IMBALANCED_STEP, step_imbalance
from loadlab.analyze.knee import Knee
from loadlab.analyze.steps import RunData, measured_windows
from loadlab.analyze.windows import counter_windows, resolve_family

CAUSE = "routing_imbalance"
MATERIAL_SHARE = 0.5
KNOB = ("route by waiting: a queue-aware gateway (least-waiting), or least-outstanding, so "
        "no replica queues while another has room")
KEEP = ("server_errors", "client_limited")   # causes no router fixes
REPLICA_COLUMNS = ("step", "level", "state", "running_mean", "running_max", "waiting_mean",
                   "waiting_max", "kv_mean", "kv_max", "server_ttft_mean_ms",
                   "server_queue_mean_ms", "gen_tok_rate", "requests_done")
_REPLICA_PATH = re.compile(r"/replica/\d+$")


@dataclass
class Judged:
    """The analyzer's verdict on one loaded run: what :func:`assess` reads of the fleet's
    and returns of each replica's."""

    table: pd.DataFrame
    knee: Knee
    cause: dict[str, Any]
    capacity: dict[str, Any]


@dataclass(frozen=True)
class Replica:
    endpoint: str
    pool: str = ""
    server: dict[str, Any] = field(default_factory=dict)   # its flags, where known


def replicas_of(manifest: dict[str, Any], metrics: pd.DataFrame) -> list[Replica]:
    """The fleet's replicas (see the module docstring); [] for a run of one server."""
    listed = manifest.get("replicas") or []
    if listed:
        return [Replica(str(e), server=manifest.get("server") or {}) for e in listed]
    sim = ((manifest.get("sim") or {}).get("fleet") or {}).get("replicas") or []
    if sim:
        return [Replica(r["endpoint"], r.get("pool") or "", r.get("flags") or {}) for r in sim]
    found = sorted(str(e) for e in (metrics["endpoint"].unique() if not metrics.empty else [])
                   if _REPLICA_PATH.search(str(e)))
    server = manifest.get("server") or {}
    return [Replica(e, server=server) for e in found] if len(found) > 1 else []


def assess(run: RunData, fleet: Judged, judge: Callable[[RunData], Judged]) -> dict[str, Any]:
    """``replicas`` and ``imbalance`` for analysis.json ({} for one server); names the
    fleet's cause ``routing_imbalance`` in ``fleet.cause`` where it applies."""
    replicas = replicas_of(run.manifest, run.metrics)
    if len(replicas) < 2:
        return {}
    span = measured_windows(run.manifest)
    subs = [_replica_run(run, rep) for rep in replicas]
    entries = [_replica_entry(rep, judge(sub), sub.metrics, span)
               for rep, sub in zip(replicas, subs, strict=True)]
    caps = [as_int(rep.server.get("max_num_seqs")) for rep in replicas]
    steps = step_imbalance(run.metrics, [r.endpoint for r in replicas], caps,
                           [r.pool for r in replicas], span, _interval(run))
    stalled = set(_stalled(fleet.table, fleet.knee))
    judged = [s for s in steps if s.step in stalled]
    share = (sum(s.imbalance is not None and s.imbalance >= IMBALANCED_STEP for s in judged)
             / len(judged)) if judged else 0.0
    chosen = _name(fleet, share, judged)
    fits = [e["capacity"].get("formula_max_concurrency") for e in entries]
    return {
        "replicas": entries,
        "imbalance": {
            "definition": DEFINITION, "imbalanced_step": IMBALANCED_STEP,
            "material_share": MATERIAL_SHARE, "stalled_share": round(share, 4),
            "chosen": chosen, "steps": [s.as_dict() for s in steps],
            "fleet_capacity": (sum(fits) if fits and all(f is not None for f in fits)
                               else None),
        },
    }


def _name(fleet: Judged, share: float, judged: list[Any]) -> bool:
    """Rank routing_imbalance and choose it where it applies; True when chosen."""
    cause = fleet.cause
    ranked = [r for r in cause.get("ranked") or [] if r["name"] != CAUSE]
    cause["ranked"] = sorted([*ranked, {"name": CAUSE, "score": round(share, 3)}],
                             key=lambda r: -r["score"])
    if not fleet.knee.found or share < MATERIAL_SHARE or cause.get("name") in KEEP:
        return False
    cause["name"], cause["knob"] = CAUSE, KNOB
    cause["evidence"] = [
        {"what": "waiting stranded while another replica had room (share of the queue)",
         "value": s.imbalance, "step": s.step, "queued": s.queued, "room": s.room}
        for s in judged if s.imbalance is not None]
    values = [s.imbalance for s in judged if s.imbalance is not None]
    cause.setdefault("facts", {}).update(
        imbalance=round(float(np.mean(values)), 4) if values else None,
        imbalanced_share=round(share, 4),
        queued=_most([s.queued for s in judged]), room=_most([s.room for s in judged]))
    return True


def _replica_run(run: RunData, rep: Replica) -> RunData:
    """The run as one replica saw it: its series only, its own flags and cache config."""
    metrics = run.metrics[run.metrics["endpoint"] == rep.endpoint]
    scrapes = run.scrapes
    if not scrapes.empty and "endpoint" in scrapes:
        scrapes = scrapes[scrapes["endpoint"] == rep.endpoint]
    info = run.manifest.get("metrics") or {}
    own = (info.get("endpoints") or {}).get(rep.endpoint) or {}
    manifest = {**run.manifest, "server": rep.server or run.manifest.get("server") or {},
                "metrics": {**info, "cache_config_info": own.get("cache_config_info") or {}}}
    return RunData(run.run_dir, manifest, run.requests, metrics, scrapes)


def _replica_entry(rep: Replica, judged: Judged, metrics: pd.DataFrame,
                   span: pd.DataFrame) -> dict[str, Any]:
    table = judged.table
    table["requests_done"] = _done(metrics, span)
    cause = {k: v for k, v in judged.cause.items() if k != "notes"}
    return {"endpoint": rep.endpoint, "pool": rep.pool, "knee": judged.knee.as_dict(),
            "cause": cause, "capacity": judged.capacity,
            "steps": table[[c for c in REPLICA_COLUMNS if c in table]].to_dict("records")}


def _done(metrics: pd.DataFrame, span: pd.DataFrame) -> np.ndarray:
    """Requests the replica finished per step window, from its own success counter."""
    family = resolve_family(metrics, "request_success") if not metrics.empty else None
    if family is None or span.empty:
        return np.full(len(span), np.nan)
    return counter_windows(metrics, family, span[["t_start", "t_end"]])["delta"].to_numpy(
        dtype=float)


def _stalled(table: pd.DataFrame, knee: Knee) -> list[int]:
    """The fleet's stalled steps at and above its knee (what its cause is judged on)."""
    if not knee.found or knee.upper is None or "state" not in table:
        return []
    rows = table[(table["state"] == "stalled")
                 & (table["level"].astype(float) >= float(knee.upper))]
    return [int(s) for s in rows["step"]]


def _interval(run: RunData) -> float:
    interval = (run.manifest.get("metrics") or {}).get("interval_s")
    if interval:
        return float(interval)
    times = np.sort(run.metrics["t"].unique()) if not run.metrics.empty else np.array([])
    return float(np.median(np.diff(times))) if len(times) > 2 else 1.0


def _most(values: list[str | None]) -> str | None:
    named = [v for v in values if v]
    return max(set(named), key=named.count) if named else None
