"""The knee's bootstrap as it was before it was vectorised: one resample at a time, a
step table rebuilt with pandas and the detectors run per resample, the TTFT median of an
index draw per step. The reference :mod:`test_bootstrap` holds the fast version to. Not
used by loadlab.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from loadlab.analyze import detectors as det
from loadlab.analyze.knee import Knee, bracket, step_states, waiting_level
from loadlab.analyze.samples import increments
from loadlab.analyze.steps import RunData
from loadlab.analyze.windows import resolve_family, snapshots

HIST_KEYS = ("q_sum", "q_count", "t_sum", "t_count", "i_sum", "i_count")
COLUMNS = ("server_queue_mean_ms", "server_ttft_mean_ms", "server_itl_mean_ms", "waiting_little",
           "waiting_occupancy", "waiting_mean", "ttft_p50_ms")


def agreement(knee: Knee, run: RunData, table: pd.DataFrame, limited: list[bool],
              growth: list[det.Slope | None] | None, n: int, seed: int) -> float:
    """Share of ``n`` resamples whose knee bracket equals the point estimate's."""
    rng = np.random.default_rng(seed)
    pieces = step_pieces(run, table)
    levels = table["level"].astype(float).tolist()
    target = (knee.found, _plain(knee.lower), _plain(knee.upper))
    hits = 0
    for _ in range(n):
        resampled = resample(table, pieces, rng)
        found, lower, upper, _ = bracket(
            levels, step_states(votes(resampled, run.closed_loop, limited, growth), limited,
                                det.occupancy_decides(resampled),
                                det.light_queue(resampled, waiting_level(resampled),
                                                run.closed_loop))
        )
        hits += (found, _plain(lower), _plain(upper)) == target
    return hits / n


def votes(table: pd.DataFrame, closed: bool, limited: list[bool],
          growth: list[det.Slope | None] | None) -> pd.DataFrame:
    waiting = waiting_level(table)
    keep = ~np.asarray(limited, dtype=bool)
    hinge = (
        det.hinge_fit(table["level"].to_numpy(dtype=float)[keep], waiting[keep]) if closed else None
    )
    return det.step_votes(table, closed, waiting, hinge, growth)


def step_pieces(run: RunData, table: pd.DataFrame) -> tuple[list, list, list]:
    """Per step: histogram increments (rows, HIST_KEYS), waiting snapshots, client TTFTs."""
    m = run.metrics
    series: dict[str, pd.Series] = {}
    if not m.empty:
        for role, key in (("queue_time", "q"), ("ttft", "t"), ("itl", "i")):
            family = resolve_family(m, role)
            if family:
                for kind in ("sum", "count"):
                    inc = increments(m, family, f"{family}_{kind}")
                    series[f"{key}_{kind}"] = inc.set_index(["endpoint", "t"])["value"]
    hist_all = pd.DataFrame(series).fillna(0.0).reset_index() if series else pd.DataFrame()
    for key in HIST_KEYS:
        if len(hist_all) and key not in hist_all:
            hist_all[key] = np.nan
    family = resolve_family(m, "waiting") if not m.empty else None
    snaps = snapshots(m, family) if family else pd.DataFrame(columns=["t", "value"])
    ok = run.requests[run.requests["status"] == "ok"] if not run.requests.empty else run.requests
    hist, waiting, ttft = [], [], []
    for w in table.itertuples(index=False):
        if len(hist_all):
            inside = hist_all[(hist_all.t > w.t_start) & (hist_all.t <= w.t_end)]
            hist.append(inside[list(HIST_KEYS)].to_numpy(dtype=float))
        else:
            hist.append(np.empty((0, len(HIST_KEYS))))
        inside = snaps[(snaps.t >= w.t_start) & (snaps.t < w.t_end)]
        waiting.append(inside["value"].to_numpy(dtype=float))
        sel = (
            ok[(ok.step == w.step) & (ok.t_sent >= w.t_start) & (ok.t_sent < w.t_end)]
            if len(ok)
            else ok
        )
        ttft.append(sel["ttft_s"].dropna().to_numpy(dtype=float) if len(sel) else np.array([]))
    return hist, waiting, ttft


def resample(
    table: pd.DataFrame, pieces: tuple[list, list, list], rng: np.random.Generator
) -> pd.DataFrame:
    """The columns the detectors read, recomputed from one resample of the pieces."""
    hist, waiting, ttft = pieces
    cols = {c: det.column(table, c).copy() for c in COLUMNS}
    length = (table["t_end"] - table["t_start"]).to_numpy(dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        for i in range(len(table)):
            h = hist[i]
            if len(h):
                tot = h[rng.integers(0, len(h), len(h))].sum(axis=0)
                for col, (s_i, c_i) in (
                    ("server_queue_mean_ms", (0, 1)),
                    ("server_ttft_mean_ms", (2, 3)),
                    ("server_itl_mean_ms", (4, 5)),
                ):
                    if not np.isnan(cols[col][i]):
                        cols[col][i] = tot[s_i] / tot[c_i] * 1e3 if tot[c_i] > 0 else np.nan
                if not np.isnan(cols["waiting_little"][i]) and length[i] > 0:
                    cols["waiting_little"][i] = tot[0] / length[i]
            w = waiting[i]
            if len(w) and not np.isnan(cols["waiting_occupancy"][i]):
                r = w[rng.integers(0, len(w), len(w))]
                cols["waiting_occupancy"][i] = float((r >= 1).mean())
                cols["waiting_mean"][i] = float(r.mean())
            t = ttft[i]
            if len(t):
                cols["ttft_p50_ms"][i] = float(np.median(t[rng.integers(0, len(t), len(t))])) * 1e3
    return table.assign(**cols)


def _plain(v: float | None) -> float | None:
    return None if v is None or np.isnan(v) else float(v)
