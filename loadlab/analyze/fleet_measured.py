"""A fleet's measured verdict, from each replica's own scheduler refusals.

Adding every replica's refusal counters together (as one server's are read) dilutes a
queue: under round-robin one replica can refuse its head in nearly every step while the
other refuses in none, and the sum reads half, below the bar. A request routed to the
refusing replica waits all the same. So each replica is measured on its own series
(:func:`loadlab.analyze.measured.measure`), and the fleet's level is stalled when **any**
replica's is: the fleet's refused share at a level is the largest of its replicas'
(:func:`fleet_measured`), and its knee follows the same rule
(:func:`loadlab.analyze.measured.knee_of`).

The fleet's measured cause is that of the replica that stalled first (the lowest measured
knee), unless routing made the stall: ``routing_imbalance`` when at
:data:`~loadlab.analyze.measured.MATERIAL_REFUSED_SHARE` or more of the fleet's stalled
levels some replica was stalled while another replica of its pool was not. That is the
imbalance measure's rule (:mod:`loadlab.analyze.fleet_imbalance`) read from refusals
instead of gauges: a replica below the bar could have started the queued request.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd

from loadlab.analyze.fleet_imbalance import CAUSE
from loadlab.analyze.measured import MATERIAL_REFUSED_SHARE, knee_of, plain_level


def fleet_measured(measured: Sequence[dict[str, Any] | None], endpoints: Sequence[str],
                   pools: Sequence[str]) -> dict[str, dict[str, Any]] | None:
    """``{"knee": ..., "cause": ...}`` of the fleet from its replicas' measured verdicts
    (:func:`loadlab.analyze.measured.measure`, in ``endpoints`` order); None unless every
    replica has one."""
    if not measured or any(m is None for m in measured):
        return None
    shares = pd.DataFrame({
        ep: pd.Series({s["level"]: s["share"] for s in m["knee"]["refused_share"]}, dtype=float)
        for ep, m in zip(endpoints, measured, strict=True) if m is not None}).sort_index()
    shares = shares.fillna(0.0)
    knee = knee_of(shares.max(axis=1))
    knee["rule"] = "a level is stalled when any replica's refused share reaches the bar"
    if not knee["found"]:
        return {"knee": knee, "cause": {"name": "none", "reason_share": {}, "refused_steps": 0,
                                        "engine_steps": 0}}
    stalled = shares[shares.index >= knee["upper"]] >= MATERIAL_REFUSED_SHARE
    imbalanced = [plain_level(level) for level, row in stalled.iterrows()
                  if _one_pool_split(row.to_numpy(), pools)]
    first = min(range(len(endpoints)), key=lambda i: _upper(measured[i]))
    own = dict((measured[first] or {})["cause"])
    routed = len(imbalanced) >= MATERIAL_REFUSED_SHARE * len(stalled)
    return {"knee": knee, "cause": {
        **own, "name": CAUSE if routed else own["name"], "replica": endpoints[first],
        "replica_cause": own["name"], "imbalanced_levels": imbalanced}}


def _one_pool_split(stalled: Any, pools: Sequence[str]) -> bool:
    """Whether some replica is stalled while another of its pool is not."""
    return any(stalled[i] and not stalled[j] for i in range(len(pools))
               for j in range(len(pools)) if i != j and pools[i] == pools[j])


def _upper(measured: dict[str, Any] | None) -> float:
    knee = (measured or {}).get("knee") or {}
    return float(knee["upper"]) if knee.get("found") else float("inf")

