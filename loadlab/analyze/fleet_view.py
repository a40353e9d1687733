"""The fleet as one server: its replicas' gauges added up, so the fleet's step table reads
what the whole fleet held.

Each replica exports its own ``num_requests_running``, ``num_requests_waiting`` and
``kv_cache_usage_perc``. Read together as they stand, the fleet's table would show one
replica's figures (a mean over everyone's snapshots): a fleet running 16 requests on two
replicas would read 8. Here, at each scrape (snapshots matched by the scrape interval's
bin, as :mod:`loadlab.analyze.fleet_imbalance` matches them), running and waiting are
summed over the replicas and KV usage becomes the fleet's used blocks over its total
blocks (each replica's usage weighted by its ``num_gpu_blocks``; equal weights where a
pool size is unknown). Those series stand under one endpoint, :data:`FLEET_ENDPOINT`;
counters and histograms stay per replica (the analyzer's windows add them up already).
The flags the fleet's cause is judged against are the fleet's totals too: ``max_num_seqs``
and ``num_gpu_blocks`` summed over the replicas, so a fleet running 20 on two replicas of
cap 16 is not read as one at its cap.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from loadlab.analyze.capacity import as_int
from loadlab.analyze.windows import resolve_family, snapshots

if TYPE_CHECKING:
    from loadlab.analyze.fleet import Replica
    from loadlab.analyze.steps import RunData

FLEET_ENDPOINT = "fleet"
SUMMED = ("running", "waiting")
SUMMED_FLAGS = ("max_num_seqs", "num_gpu_blocks", "num_gpu_blocks_override")


def fleet_run(run: RunData, replicas: Sequence[Replica], interval_s: float) -> RunData:
    """``run`` with its replicas' running, waiting and KV gauges replaced by the fleet's
    (see the module docstring), and the fleet's summed flags and pool."""
    endpoints = [r.endpoint for r in replicas]
    blocks = [_blocks(run.manifest, r) for r in replicas]
    metrics = run.metrics
    swapped: list[pd.DataFrame] = []
    for role in (*SUMMED, "kv_usage"):
        family = resolve_family(metrics, role) if not metrics.empty else None
        if family is None:
            continue
        grid = _grid(metrics, family, endpoints, interval_s)
        if role == "kv_usage":
            weights = np.array(blocks if all(blocks) else [1] * len(blocks), dtype=float)
            values = grid.to_numpy(dtype=float) @ weights / weights.sum()
        else:
            values = grid.to_numpy(dtype=float).sum(axis=1)
        swapped.append(pd.DataFrame({"t": grid.index.to_numpy(dtype=float),
                                     "endpoint": FLEET_ENDPOINT, "family": family,
                                     "metric": family, "labels": "{}", "value": values}))
        metrics = metrics[~((metrics["family"] == family)
                            & metrics["endpoint"].isin(endpoints))]
    config = resolve_family(metrics, "cache_config") if not metrics.empty else None
    if config is not None:   # one replica's pool size: the fleet's is in its manifest
        metrics = metrics[metrics["family"] != config]
    if swapped:
        metrics = pd.concat([metrics, *swapped], ignore_index=True)
    return replace(run, metrics=metrics, manifest=_fleet_manifest(run.manifest, replicas, blocks))


def _grid(metrics: pd.DataFrame, family: str, endpoints: Sequence[str],
          interval_s: float) -> pd.DataFrame:
    """(scrape bin, replica) values of one gauge, indexed by the bin's last scrape time;
    a replica missing from a bin keeps its previous reading, and bins before every
    replica has read once are left out."""
    snaps = snapshots(metrics, family)
    snaps = snaps[snaps["endpoint"].isin(endpoints)]
    t0 = float(metrics["t"].min())
    snaps = snaps.assign(bin=np.floor((snaps["t"] - t0) / interval_s).astype(int))
    values = snaps.pivot_table(index="bin", columns="endpoint", values="value",
                               aggfunc="last").reindex(columns=list(endpoints)).ffill()
    times = snaps.groupby("bin")["t"].max()
    values.index = times.reindex(values.index).to_numpy(dtype=float)
    return values.dropna()


def _blocks(manifest: dict[str, Any], replica: Replica) -> int | None:
    """A replica's pool size: its collected cache config, else its flags."""
    own = (((manifest.get("metrics") or {}).get("endpoints") or {}).get(replica.endpoint)
           or {}).get("cache_config_info") or {}
    return as_int(own.get("num_gpu_blocks")) or as_int(replica.server.get("num_gpu_blocks")) \
        or as_int(replica.server.get("num_gpu_blocks_override"))


def _fleet_manifest(manifest: dict[str, Any], replicas: Sequence[Replica],
                    blocks: Sequence[int | None]) -> dict[str, Any]:
    """The manifest with the fleet's totals as its server flags and cache config."""
    server = dict(manifest.get("server") or replicas[0].server or {})
    for key in SUMMED_FLAGS:
        each = [as_int(r.server.get(key)) for r in replicas]
        if all(v is not None for v in each):
            server[key] = sum(v for v in each if v is not None)
        else:
            server.pop(key, None)
    info = dict(manifest.get("metrics") or {})
    config = dict(info.get("cache_config_info") or {})
    if all(b is not None for b in blocks):
        config["num_gpu_blocks"] = sum(b for b in blocks if b is not None)
    else:
        config.pop("num_gpu_blocks", None)
    config.pop("num_gpu_blocks_override", None)
    return {**manifest, "server": server, "metrics": {**info, "cache_config_info": config}}
