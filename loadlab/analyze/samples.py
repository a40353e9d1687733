"""Raw per-scrape samples of one metric, for resampling (the knee's bootstrap).

:mod:`loadlab.analyze.windows` sums a window in one figure; a bootstrap needs the pieces.

- :func:`snapshots`: a gauge's value per (endpoint, scrape time), its series summed
  (several engines -> one figure).
- :func:`increments`: a counter-like sample's increase over each scrape interval, per
  (endpoint, scrape time at the interval's end), its series summed; a decrease is a
  reset and counts the new value, as in :func:`windows.counter_windows`.

Both return a DataFrame with columns ``endpoint``, ``t``, ``value`` sorted by time.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

COLUMNS = ["endpoint", "t", "value"]


def snapshots(metrics: pd.DataFrame, family: str, metric: str | None = None) -> pd.DataFrame:
    """Per scrape, the family's series summed."""
    data = metrics[(metrics["family"] == family) & (metrics["metric"] == (metric or family))]
    if data.empty:
        return pd.DataFrame(columns=COLUMNS)
    return (data.groupby(["endpoint", "t"], sort=True)["value"].sum().reset_index()
            .sort_values("t", kind="stable").reset_index(drop=True))


def increments(metrics: pd.DataFrame, family: str, metric: str) -> pd.DataFrame:
    """Per scrape interval, the increase of ``metric`` summed over its series."""
    data = metrics[(metrics["family"] == family) & (metrics["metric"] == metric)]
    if data.empty:
        return pd.DataFrame(columns=COLUMNS)
    data = data.sort_values(["endpoint", "labels", "t"], kind="stable")
    v = data["value"].to_numpy(dtype=float)
    same = ((data["endpoint"].to_numpy() == np.roll(data["endpoint"].to_numpy(), 1))
            & (data["labels"].to_numpy() == np.roll(data["labels"].to_numpy(), 1)))
    same[0] = False
    d = v - np.roll(v, 1)
    d = np.where(d < 0, v, d)
    frame = data[["endpoint", "t"]].assign(value=d)[same]
    return (frame.groupby(["endpoint", "t"], sort=True)["value"].sum().reset_index()
            .sort_values("t", kind="stable").reset_index(drop=True))
