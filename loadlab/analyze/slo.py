"""Service-level objectives: the highest load level that meets them, and goodput.

Targets come as ``NAME=VALUE`` pairs (``--slo ttft_p99_ms=500,itl_p99_ms=50``): NAME is
``ttft``, ``itl`` or ``e2e``, a percentile ``pNN`` and a unit ``ms`` or ``s``. Per
request the figures are its TTFT, its mean inter-token latency (vLLM's TPOT view, as
DistServe judges a request) and its E2E; per step the percentile is over the requests
begun in the measured window that succeeded.

- A step *meets* the SLOs when every target's percentile is at or below its value and
  it has successful requests; ``max_level_meeting`` is the highest level that meets
  them with every lower level meeting them too (None when the first fails).
- Goodput (DistServe, Zhong et al. OSDI 2024): requests per second that finished and
  met every per-request target (percentile aside), per step.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from loadlab.errors import InputError

_NAME = re.compile(r"^(ttft|itl|e2e)_p(\d{1,2}(?:\.\d+)?)_(ms|s)$")
_COLUMN = {"ttft": "ttft_s", "itl": "itl_mean_s", "e2e": "e2e_s"}


@dataclass(frozen=True)
class Target:
    name: str          # as given, e.g. ttft_p99_ms
    metric: str        # ttft | itl | e2e
    q: float           # percentile 0..100
    limit_s: float

    @property
    def scale(self) -> float:
        """Seconds to the unit the target is named in (a ``_ms`` column holds ms)."""
        return 1e3 if self.name.endswith("_ms") else 1.0


def parse_slo(text: str | None) -> list[Target]:
    """``ttft_p99_ms=500,itl_p99_ms=50`` -> targets; InputError names the bad pair."""
    if not text:
        return []
    targets = []
    for pair in text.split(","):
        name, _, value = pair.strip().partition("=")
        match = _NAME.match(name.strip())
        try:
            limit = float(value)
        except ValueError:
            limit = float("nan")
        if not match or not limit > 0:
            raise InputError(f"bad SLO target {pair!r}", field="--slo",
                             fix="use NAME=VALUE pairs such as ttft_p99_ms=500,itl_p99_ms=50,"
                                 "e2e_p90_s=20 (ttft|itl|e2e, pNN, ms|s)")
        metric, q, unit = match.groups()
        targets.append(
            Target(name.strip(), metric, float(q), limit / 1e3 if unit == "ms" else limit)
        )
    return targets


def evaluate(targets: list[Target], requests: pd.DataFrame, table: pd.DataFrame) -> dict[str, Any]:
    """The ``slo`` block of analysis.json; per-step figures are added to ``table``."""
    if not targets:
        return {"targets": {}, "max_level_meeting": None}
    meets_all: list[bool] = []
    ok = requests[requests["status"] == "ok"] if not requests.empty else requests
    for i, w in enumerate(table.itertuples(index=False)):
        sel = (
            ok[(ok.step == w.step) & (ok.t_sent >= w.t_start) & (ok.t_sent < w.t_end)]
            if len(ok)
            else ok
        )
        meets = len(sel) > 0
        good = np.ones(len(sel), dtype=bool)
        for t in targets:
            x = sel[_COLUMN[t.metric]].to_numpy(dtype=float) if len(sel) else np.array([])
            value = (
                float(np.nanpercentile(x, t.q))
                if len(x) and not np.all(np.isnan(x))
                else float("nan")
            )
            table.loc[table.index[i], f"slo_{t.name}"] = value * t.scale
            meets = meets and value <= t.limit_s
            good &= np.nan_to_num(x, nan=np.inf) <= t.limit_s
        length = max(w.t_end - w.t_start, 1e-9)
        table.loc[table.index[i], "goodput_rps"] = float(good.sum()) / length
        table.loc[table.index[i], "meets_slo"] = meets
        meets_all.append(meets)
    levels = table["level"].astype(float).tolist()
    best = None
    for i in sorted(range(len(levels)), key=lambda k: levels[k]):
        if not meets_all[i]:
            break
        best = levels[i]
    return {
        "targets": {
            t.name: t.limit_s * t.scale for t in targets
        },
        "max_level_meeting": None if best is None else (int(best) if best.is_integer() else best),
        "goodput": "DistServe: requests/s finishing within every per-request target",
    }
