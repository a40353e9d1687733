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

The fleet's own table adds its replicas' gauges up (:mod:`loadlab.analyze.fleet_view`).
Where no rule matches those sums, or they cannot tell two causes apart, the fleet's cause
is that of the replica that stalled first (the lowest knee) and named one, with
``replica`` naming it. Each replica's entry carries its
measured verdict where the scheduler's refusals were exported, and the fleet's measured
verdict is built from them (:mod:`loadlab.analyze.fleet_measured`). ``imbalance`` also
carries the replicas' capacities at their knees, summed, to stand beside the fleet's knee.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from loadlab.analyze.capacity import as_int
from loadlab.analyze.fleet_imbalance import CAUSE, DEFINITION, IMBALANCED_STEP, step_imbalance
from loadlab.analyze.fleet_measured import fleet_measured
from loadlab.analyze.knee import Knee
from loadlab.analyze.steps import RunData, measured_windows
from loadlab.analyze.windows import counter_windows, resolve_family
from loadlab.spec.scenario import POOLS, parse_router

MATERIAL_SHARE = 0.5
KNOB = ("route by waiting: a queue-aware gateway (least-waiting), or least-outstanding, so "
        "no replica queues while another has room")
KEEP = ("server_errors", "client_limited")   # causes no router fixes
UNDECIDED = ("unknown", "undetermined")        # a fleet's cause its replicas may name
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
    measured: dict[str, dict[str, Any]] | None = None   # the scheduler's own verdict


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


def assess(run: RunData, replicas: list[Replica], fleet: Judged,
           judge: Callable[[RunData], Judged]) -> dict[str, Any]:
    """``replicas`` and ``imbalance`` for analysis.json ({} for one server); names the
    fleet's cause ``routing_imbalance`` in ``fleet.cause`` where it applies, and sets
    ``fleet.measured`` to the fleet's measured verdict from its replicas'
    (:mod:`loadlab.analyze.fleet_measured`)."""
    if len(replicas) < 2:
        return {}
    span = measured_windows(run.manifest)
    subs = [_replica_run(run, rep) for rep in replicas]
    verdicts = [judge(sub) for sub in subs]
    entries = [_replica_entry(rep, v, sub.metrics, span)
               for rep, v, sub in zip(replicas, verdicts, subs, strict=True)]
    endpoints, pools = [r.endpoint for r in replicas], [r.pool for r in replicas]
    fleet.measured = fleet_measured([v.measured for v in verdicts], endpoints, pools)
    caps = [as_int(rep.server.get("max_num_seqs")) for rep in replicas]
    steps = step_imbalance(run.metrics, endpoints, caps, pools, span, interval(run))
    for entry, held in zip(entries, _stranded_shares(steps, len(entries)), strict=True):
        entry["imbalance_share"] = held
    stalled = set(_stalled(fleet.table, fleet.knee))
    judged = [s for s in steps if s.step in stalled]
    share = (sum(s.imbalance is not None and s.imbalance >= IMBALANCED_STEP for s in judged)
             / len(judged)) if judged else 0.0
    chosen = _name(fleet, share, judged)
    if not chosen and fleet.cause.get("name") in UNDECIDED:
        _from_first_stalled(fleet.cause, entries)
    fits = [e["capacity"].get("formula_max_concurrency") for e in entries]
    return {
        "replicas": entries,
        "imbalance": {
            "definition": DEFINITION, "imbalanced_step": IMBALANCED_STEP,
            "material_share": MATERIAL_SHARE, "stalled_share": round(share, 4),
            "chosen": chosen, "steps": [s.as_dict() for s in steps],
            "fleet_capacity": (sum(fits) if fits and all(f is not None for f in fits)
                               else None),
            **_capacity_sum(entries),
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


def _from_first_stalled(cause: dict[str, Any], entries: list[dict[str, Any]]) -> None:
    """Name the fleet's cause after the replica that stalled first, where the fleet's own
    (summed) series matched no rule or could not tell two apart: a scheduler's limits are
    each replica's (a head blocked by its own free blocks reads as room in the fleet's
    total; a cap reached by each replica at its own moment is no plateau in their sum),
    and the fleet stalls where its first replica does."""
    named = [e for e in entries if e["knee"].get("found") and e["knee"].get("upper") is not None
             and e["cause"].get("name") not in (*UNDECIDED, "none", None)]
    if not named:
        return
    first = min(named, key=lambda e: float(e["knee"]["upper"]))
    kept = {k: cause[k] for k in ("ranked", "notes") if k in cause}   # the fleet's own
    cause.clear()
    cause.update({k: v for k, v in first["cause"].items() if k != "measured"}, **kept,
                 replica=first["endpoint"])


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
    return RunData(run.run_dir, manifest, _pool_requests(run, rep), metrics, scrapes)


def _pool_requests(run: RunData, rep: Replica) -> pd.DataFrame:
    """The requests a replica could have served. A simulated fleet split by length sends
    prompts over the threshold to its long pool and the rest to its short pool
    (``ByLength`` in :mod:`loadlab.sim.fleet.router`), so each pool is judged on its own
    lengths (a long pool judged on mostly short requests reads its full KV pool as a
    dashboard artefact). Otherwise all of them: which replica served a request is not
    recorded."""
    router = ((run.manifest.get("sim") or {}).get("fleet") or {}).get("router")
    try:
        name, threshold = parse_router(router) if router else ("", None)
    except ValueError:
        return run.requests
    requests = run.requests
    if name != "by-length" or threshold is None or rep.pool not in POOLS or requests.empty:
        return requests
    prompt = requests["prompt_tokens"].fillna(requests["target_prompt_tokens"]).astype(float)
    long = (prompt > threshold).to_numpy()
    return requests[long if rep.pool == POOLS[0] else ~long]


def _replica_entry(rep: Replica, judged: Judged, metrics: pd.DataFrame,
                   span: pd.DataFrame) -> dict[str, Any]:
    table = judged.table
    table["requests_done"] = _done(metrics, span)
    cause = {k: v for k, v in judged.cause.items() if k != "notes"}
    knee = judged.knee.as_dict()
    if judged.measured is not None:
        knee["measured"], cause["measured"] = judged.measured["knee"], judged.measured["cause"]
    return {"endpoint": rep.endpoint, "pool": rep.pool, "knee": knee, "cause": cause,
            "capacity": {**judged.capacity, **_at_knee(table, judged.knee)},
            "steps": table[[c for c in REPLICA_COLUMNS if c in table]].to_dict("records")}


def _at_knee(table: pd.DataFrame, knee: Knee) -> dict[str, Any]:
    """A replica's capacity at its knee: the requests it ran (mean running) at its first
    stalled level, where its queue began while it held all it could. A replica that never
    stalled ran at least its figure at the top level (``at_knee_bound`` "at least")."""
    if "running_mean" not in table or table.empty:
        return {"at_knee": None, "at_knee_bound": None}
    if knee.found and knee.upper is not None:
        rows, bound = table[table["level"].astype(float) == float(knee.upper)], "at"
    else:
        rows, bound = table[table["level"].astype(float) == table["level"].astype(float).max()], \
            "at least"
    running = rows["running_mean"].dropna()
    return {"at_knee": float(running.mean()) if len(running) else None,
            "at_knee_bound": bound if len(running) else None}


def _capacity_sum(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """The replicas' capacities at their knees, summed (None unless each has one); "at
    least" when some replica never stalled."""
    each = [e["capacity"].get("at_knee") for e in entries]
    if not each or any(v is None for v in each):
        return {"replica_capacity_sum": None, "replica_capacity_bound": None}
    bounds = {e["capacity"].get("at_knee_bound") for e in entries}
    return {"replica_capacity_sum": round(sum(each), 2),
            "replica_capacity_bound": "at least" if "at least" in bounds else "at"}


def _done(metrics: pd.DataFrame, span: pd.DataFrame) -> np.ndarray:
    """Requests the replica finished per step window, from its own success counter."""
    family = resolve_family(metrics, "request_success") if not metrics.empty else None
    if family is None or span.empty:
        return np.full(len(span), np.nan)
    return counter_windows(metrics, family, span[["t_start", "t_end"]])["delta"].to_numpy(
        dtype=float)


def _stranded_shares(steps: list[Any], n: int) -> list[float | None]:
    """Each replica's share of the fleet's stranded waiting over the whole run (None for
    all when nothing was stranded): where the router's misplaced queue sat."""
    held = np.zeros(n)
    for s in steps:
        if s.stranded_by:
            held += np.asarray(s.stranded_by)
    total = float(held.sum())
    return [round(float(h) / total, 4) if total > 0 else None for h in held]


def _stalled(table: pd.DataFrame, knee: Knee) -> list[int]:
    """The fleet's stalled steps at and above its knee (what its cause is judged on)."""
    if not knee.found or knee.upper is None or "state" not in table:
        return []
    rows = table[(table["state"] == "stalled")
                 & (table["level"].astype(float) >= float(knee.upper))]
    return [int(s) for s in rows["step"]]


def interval(run: RunData) -> float:
    """The scrape interval: the manifest's, else the median gap between samples."""
    interval = (run.manifest.get("metrics") or {}).get("interval_s")
    if interval:
        return float(interval)
    times = np.sort(run.metrics["t"].unique()) if not run.metrics.empty else np.array([])
    return float(np.median(np.diff(times))) if len(times) > 2 else 1.0


def _most(values: list[str | None]) -> str | None:
    named = [v for v in values if v]
    return max(set(named), key=named.count) if named else None
