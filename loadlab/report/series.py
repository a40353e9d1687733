"""Time series of one run folder for the report's over-time chart.

From ``metrics.parquet``: the running, waiting and KV-usage gauges, each snapshot's
series summed over engines (an endpoint's engines add up), then running and
waiting summed over endpoints and KV usage averaged over them (replicas each have
their own pool). From ``requests.parquet``: the client's own in-flight count at
the same instants (begun, not yet done), which does not lag as the gauges can.
From ``manifest.json``: the step windows with their warm-up cut. Times are seconds
since the first step started.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from loadlab.analyze.tables import read_metrics, read_requests
from loadlab.analyze.windows import resolve_family, snapshots
from loadlab.collect.catalog import families_for_role

GAUGE_ROLES = {"running": "running", "waiting": "waiting", "kv": "kv_usage"}
SUM_OVER_ENDPOINTS = {"running": True, "waiting": True, "kv": False}


@dataclass
class StepBand:
    """One load step on the time axis."""

    step: int
    level: float
    t_start: float                   # seconds since the run's first step began
    t_measured: float                # t_start + warm-up
    t_end: float


@dataclass
class Timeline:
    """Gauges and the client's in-flight count over time, with the step bands."""

    t: np.ndarray                    # sample instants, seconds since the first step began
    gauges: dict[str, np.ndarray]    # "running" | "waiting" | "kv" (0..1) -> values at t
    inflight: np.ndarray | None      # client's requests in flight at t
    bands: list[StepBand]

    @property
    def empty(self) -> bool:
        return len(self.t) == 0


def step_bands(manifest: dict) -> tuple[float, list[StepBand]]:
    """The run's time origin (first step start) and its step windows relative to it."""
    steps = manifest.get("steps") or []
    if not steps:
        return 0.0, []
    t0 = min(float(s["t_start"]) for s in steps)
    bands = []
    for s in steps:
        start = float(s["t_start"]) - t0
        level = s.get("concurrency") if s.get("concurrency") is not None else s.get("target_rate")
        bands.append(StepBand(step=int(s["step"]), level=float(level or 0), t_start=start,
                              t_measured=start + float(s.get("warmup_s") or 0.0),
                              t_end=float(s["t_end"]) - t0))
    return t0, bands


def timeline(run_dir: Path, manifest: dict, endpoint: str | None = None) -> Timeline:
    """The over-time view of ``run_dir`` (empty arrays when nothing was scraped); with
    ``endpoint``, that replica's gauges only (a fleet's lane), the client's in-flight
    count still the fleet's."""
    t0, bands = step_bands(manifest)
    metrics = read_metrics(
        run_dir, [f for role in GAUGE_ROLES.values() for f in families_for_role(role)]
    )
    if endpoint is not None and not metrics.empty:
        metrics = metrics[metrics["endpoint"] == endpoint]
    per_role = {name: _gauge(metrics, role, SUM_OVER_ENDPOINTS[name])
                for name, role in GAUGE_ROLES.items()}
    instants = sorted(set().union(*(s.index for s in per_role.values() if s is not None)))
    t = np.asarray(instants, dtype=float)
    gauges = {name: s.reindex(t).to_numpy(dtype=float)
              for name, s in per_role.items() if s is not None}
    requests = read_requests(run_dir)
    inflight = _inflight(requests, t) if len(t) and not requests.empty else None
    return Timeline(t=t - t0, gauges=gauges, inflight=inflight, bands=bands)


def _gauge(metrics: pd.DataFrame, role: str, summed: bool) -> pd.Series | None:
    """Value per scrape instant of the family carrying ``role`` (None if not scraped)."""
    if metrics.empty:
        return None
    family = resolve_family(metrics, role)
    if family is None:
        return None
    snaps = snapshots(metrics, family, metric=family)
    if snaps["endpoint"].nunique() == 1:
        return snaps.set_index("t")["value"]
    # endpoints are scraped at slightly different instants: align them on the second
    snaps["t"] = snaps["t"].round(0)
    by_t = snaps.groupby(["t", "endpoint"])["value"].mean().groupby(level="t")
    return by_t.sum() if summed else by_t.mean()


def _inflight(requests: pd.DataFrame, t: np.ndarray) -> np.ndarray:
    """Requests begun at or before each instant and not yet done (open ones count)."""
    begun = requests["t_sent"].to_numpy(dtype=float)
    if "t_issued" in requests:
        begun = np.where(np.isnan(begun), requests["t_issued"].to_numpy(dtype=float), begun)
    done = requests["t_done"].to_numpy(dtype=float)
    keep = ~np.isnan(begun)
    begun = np.sort(begun[keep])
    done = np.sort(np.where(np.isnan(done[keep]), np.inf, done[keep]))
    return (
        np.searchsorted(begun, t, side="right") - np.searchsorted(done, t, side="right")
    ).astype(float)
