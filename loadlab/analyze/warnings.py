"""What the analyzer says it could not trust in the server's side of a run folder.

- Scrapes: a run collected with ``--collect`` writes one ``scrapes.parquet`` row per
  attempt. When some failed, the line says so with their causes ("the collector ran but
  12 of 40 scrapes failed (http 500 10, timeout 2)"); when every one failed there are no
  server metrics, and the fix is the endpoint's ``/metrics``, not ``--collect``.
- NaN samples: Prometheus text may say ``NaN`` (a gauge with nothing to report, a
  histogram's sum of nothing). Summing the series of a snapshot would read it as 0 (a
  queue that vanished), and one NaN in a counter would blank every later increase:
  :func:`drop_nan` leaves such samples out and says how many, per family.
- Counter resets: a counter that goes down is a server restart; the increases are
  counted from the new value (:func:`loadlab.analyze.windows.counter_windows`), never
  negative, and the step's ``counter_resets`` makes a warning here.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pandas as pd

from loadlab.runstore.layout import METRICS_TABLE, SCRAPES_TABLE


def drop_nan(metrics: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """``metrics`` without NaN samples, and one warning naming the families that had them."""
    if metrics.empty:
        return metrics, []
    nan = metrics["value"].isna().to_numpy()
    if not nan.any():
        return metrics, []
    counts = Counter(metrics["family"].astype(object).to_numpy()[nan])
    families = ", ".join(f"{f} {n}" for f, n in counts.most_common(5))
    return metrics[~nan].reset_index(drop=True), [
        f"{int(nan.sum())} NaN samples in {METRICS_TABLE} ({families}): left out, not read as 0"]


def scrape_warnings(scrapes: pd.DataFrame, have_metrics: bool) -> list[str]:
    """What the scrape log says (module docstring); [] when every scrape came back."""
    if scrapes.empty:
        return []
    failed = scrapes[~scrapes["ok"].fillna(False).astype(bool)]
    failed = failed[failed["error"].astype(object) != "missed tick"]
    if failed.empty:
        return []
    causes = Counter(str(e) for e in failed["error"].astype(object).fillna("unknown"))
    why = ", ".join(f"{e} {n}" for e, n in causes.most_common())
    line = f"the collector ran but {len(failed)} of {len(scrapes)} scrapes failed ({why})"
    if have_metrics:
        return [line]
    return [f"{line}: no server metrics ({METRICS_TABLE}), client-only verdict, cause unknown; "
            f"check the server's /metrics endpoint ({SCRAPES_TABLE} has every attempt)"]


def reset_warnings(table: pd.DataFrame) -> list[str]:
    """One line per step in which a token counter went down."""
    if "counter_resets" not in table:
        return []
    out = []
    for step, resets in zip(table["step"], table["counter_resets"].to_numpy(dtype=float)):
        if not np.isnan(resets) and resets > 0:
            out.append(f"step {step}: the server's token counter went down {resets:.0f} time(s) "
                       "(counter reset: did the server restart?); increases are counted from "
                       "the new value")
    return out
