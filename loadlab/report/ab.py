"""A/B deltas: each arm against the baseline, level by level, with bootstrap intervals.

Levels are matched exactly (the same concurrency, or the same target rate); a level
only one arm ran is left out. Per level and arm the requests are those of the
step's measured window (after warm-up), as in the per-step table:

- TTFT p50 and p99: successful requests *sent* in the window;
- output throughput (tokens/s): successful requests that *finished* in the window,
  their output tokens summed over the window's length.

Interval: percentile bootstrap of the relative change ``new / base - 1``. Each arm's
requests are resampled with replacement independently (their count held fixed),
``RESAMPLES`` times with a fixed seed so a report is reproducible, and the 2.5th
and 97.5th percentiles of the change are the 95% interval. A change whose interval
excludes 0 is called better or worse (by the metric's direction); else "same".
The prefix-cache hit rate of each arm comes from the step table, without interval.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from loadlab.analyze.steps import measured_windows
from loadlab.analyze.tables import read_requests
from loadlab.report.inputs import Point

RESAMPLES = 1000
SEED = 0
MAX_CELLS = 4_000_000            # resampled values held at once (memory bound)


@dataclass
class Delta:
    """One metric at one level: both arms' values and the relative change with its interval."""

    metric: str                      # "ttft_p50_ms" | "ttft_p99_ms" | "out_tok_s"
    label: str
    base: float
    new: float
    change: float                    # new / base - 1
    low: float                       # 95% interval of change
    high: float
    lower_is_better: bool

    @property
    def verdict(self) -> str:
        """"better" | "worse" | "same" (interval includes 0) | "unknown" (no interval)."""
        if np.isnan(self.low) or np.isnan(self.high):
            return "unknown"
        if not (self.low > 0 or self.high < 0):
            return "same"
        return "better" if (self.high < 0) == self.lower_is_better else "worse"


@dataclass
class LevelDeltas:
    """Every delta at one load level."""

    level: float
    n_base: int                      # successful requests sent in the baseline's window
    n_new: int
    deltas: list[Delta]
    hit_base: float | None           # prefix-cache hit rate, 0..1
    hit_new: float | None


@dataclass
class ArmComparison:
    """One arm against the baseline."""

    base: str
    new: str
    unit: str
    levels: list[LevelDeltas]


@dataclass
class _Window:
    sent: pd.DataFrame               # ok requests sent in the measured window
    finished_tokens: np.ndarray      # output tokens of ok requests finished in it
    length_s: float


def compare_arms(base: Point, new: Point) -> ArmComparison:
    """Deltas of ``new`` against ``base`` at every level both ran."""
    base_w, new_w = _windows(base), _windows(new)
    hits_b, hits_n = _hit_rates(base), _hit_rates(new)
    rng = np.random.default_rng(SEED)
    levels = [LevelDeltas(level=level, n_base=len(base_w[level].sent), n_new=len(new_w[level].sent),
                          deltas=_deltas(base_w[level], new_w[level], rng),
                          hit_base=hits_b.get(level), hit_new=hits_n.get(level))
              for level in sorted(set(base_w) & set(new_w))]
    return ArmComparison(base=base.name, new=new.name, unit=base.unit, levels=levels)


def bootstrap_change(a: np.ndarray, b: np.ndarray, stat: Callable[[np.ndarray], np.ndarray],
                     rng: np.random.Generator, resamples: int = RESAMPLES) -> tuple[float, float]:
    """95% percentile interval of ``stat(b) / stat(a) - 1``; ``stat`` maps rows of samples
    to values."""
    if len(a) == 0 or len(b) == 0:
        return float("nan"), float("nan")
    ratio = _resampled(b, stat, rng, resamples) / _resampled(a, stat, rng, resamples) - 1.0
    ratio = ratio[np.isfinite(ratio)]
    if len(ratio) == 0:
        return float("nan"), float("nan")
    low, high = np.percentile(ratio, [2.5, 97.5])
    return float(low), float(high)


def _resampled(x: np.ndarray, stat: Callable[[np.ndarray], np.ndarray], rng: np.random.Generator,
               resamples: int) -> np.ndarray:
    rows = max(1, MAX_CELLS // len(x))
    out = []
    for start in range(0, resamples, rows):
        idx = rng.integers(0, len(x), size=(min(rows, resamples - start), len(x)))
        out.append(stat(x[idx]))
    return np.concatenate(out)


def _deltas(a: _Window, b: _Window, rng: np.random.Generator) -> list[Delta]:
    out = []
    ttft_a = a.sent["ttft_s"].dropna().to_numpy(dtype=float) * 1e3
    ttft_b = b.sent["ttft_s"].dropna().to_numpy(dtype=float) * 1e3
    for q in (50, 99):
        def stat(rows: np.ndarray, q: int = q) -> np.ndarray:
            return np.percentile(rows, q, axis=-1)
        out.append(_delta(f"ttft_p{q}_ms", f"TTFT p{q}", ttft_a, ttft_b, stat, rng, True))
    out.append(_delta("out_tok_s", "Output tokens/s", a.finished_tokens, b.finished_tokens,
                      lambda rows: rows.sum(axis=-1), rng, False,
                      scale=(1 / a.length_s, 1 / b.length_s)))
    return out


def _delta(metric: str, label: str, a: np.ndarray, b: np.ndarray,
           stat: Callable[[np.ndarray], np.ndarray], rng: np.random.Generator,
           lower_is_better: bool, scale: tuple[float, float] = (1.0, 1.0)) -> Delta:
    """Point values, change and its interval (``scale`` turns a sum into a rate per arm)."""
    base = float(stat(a)) * scale[0] if len(a) else float("nan")
    new = float(stat(b)) * scale[1] if len(b) else float("nan")
    low, high = bootstrap_change(a, b, stat, rng)
    factor = scale[1] / scale[0]     # windows of different lengths: the ratio carries it
    change = new / base - 1.0 if base else float("nan")
    return Delta(metric=metric, label=label, base=base, new=new, change=change,
                 low=(1 + low) * factor - 1, high=(1 + high) * factor - 1,
                 lower_is_better=lower_is_better)


def _windows(point: Point) -> dict[float, _Window]:
    """Level -> requests of that step's measured window (the last step of a repeated level)."""
    if point.run_dir is None:
        return {}
    requests = read_requests(point.run_dir)
    out: dict[float, _Window] = {}
    for w in measured_windows(point.manifest).itertuples(index=False):
        level = (
            w.concurrency
            if w.concurrency is not None and not pd.isna(w.concurrency)
            else w.target_rate
        )
        ok = requests[(requests.status == "ok") & (requests.step == w.step)]
        sent = ok[(ok.t_sent >= w.t_start) & (ok.t_sent < w.t_end)]
        done = requests[(requests.status == "ok") & (requests.t_done >= w.t_start)
                        & (requests.t_done < w.t_end)]
        out[float(level)] = _Window(sent=sent,
                                    finished_tokens=done["output_tokens"].fillna(0).to_numpy(dtype=float),
                                    length_s=max(float(w.t_end - w.t_start), 1e-9))
    return out


def _hit_rates(point: Point) -> dict[float, float]:
    steps = point.steps
    column = point.level_column
    if steps.empty or "prefix_hit_rate" not in steps or column not in steps:
        return {}
    return {float(r[column]): float(r["prefix_hit_rate"]) for _, r in steps.iterrows()
            if pd.notna(r[column]) and pd.notna(r["prefix_hit_rate"])}
