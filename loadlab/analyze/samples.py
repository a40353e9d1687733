"""Per-scrape-interval increments of one counter-like sample, for resampling (the knee's
bootstrap): :mod:`loadlab.analyze.windows` sums a window in one figure, a bootstrap
needs the pieces (gauges: :func:`windows.snapshots`).

:func:`increments`: the sample's increase over each scrape interval, per (endpoint,
scrape time at the interval's end), its series summed; a decrease is a reset and counts
the new value, as in :func:`windows.counter_windows`. Columns ``endpoint``, ``t``,
``value``, sorted by time.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

COLUMNS = ["endpoint", "t", "value"]


def increments(metrics: pd.DataFrame, family: str, metric: str) -> pd.DataFrame:
    """Per scrape interval, the increase of ``metric`` summed over its series."""
    data = metrics[(metrics["family"] == family) & (metrics["metric"] == metric)]
    if data.empty:
        return pd.DataFrame(columns=COLUMNS)
    data = data.sort_values(["endpoint", "labels", "t"], kind="stable")
    v = data["value"].to_numpy(dtype=float)
    endpoint = data["endpoint"].astype(str).to_numpy()
    labels = data["labels"].astype(str).to_numpy()
    same = (endpoint == np.roll(endpoint, 1)) & (labels == np.roll(labels, 1))
    same[0] = False
    d = v - np.roll(v, 1)
    d = np.where(d < 0, v, d)
    frame = pd.DataFrame({"endpoint": data["endpoint"].astype(str).to_numpy(),
                          "t": data["t"].to_numpy(dtype=float), "value": d})[same]
    return (frame.groupby(["endpoint", "t"], sort=True)["value"].sum().reset_index()
            .sort_values("t", kind="stable").reset_index(drop=True))
