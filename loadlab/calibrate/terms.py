"""Which step-time terms the fit runs support, and their values.

The values: a non-negative least squares on relative errors (each observation, a level's
mean prefill time or mean inter-token latency, divided by its measured value, so a 5 ms
ITL weighs as much as a 200 ms prefill).

The choice: leave one level out. A term is judged by how well the fit predicts each level
it did not see (cross-validation, Stone 1974, "Cross-validatory choice and assessment of
statistical predictions", J. R. Stat. Soc. B 36:111-147), not by how well it fits the
levels it saw. In-sample, every added term lowers the error, so an in-sample rule keeps a
term whose regressor the fit loads barely vary: the context read per step, say, when the
only long contexts are one level's few inter-token gaps. Such a term is fitted to that
level's residual, and extrapolated to a load with more requests running it dominates the
step. Two rules, each on the fit levels alone, with each level left out in turn:

1. Support. A term one level carries changes with that level in or out: with the level
   gone it is unexercised (zero) or fitted to the others' noise. While some term other
   than the fixed cost, fitted without some one level, keeps less than :data:`CARRIED` of
   its value, the one that keeps least goes. (Held-out error alone does not catch
   it: with the term, an outlying level no longer bends the other terms, so the *other*
   levels are predicted better, though the term itself is that level's residual.)
2. Use. While some term other than the fixed cost can go without raising the held-out
   RMS relative error by :data:`SUPPORT_RMS` or more, the one whose removal costs least
   goes.

Fewer than :data:`MIN_FOLDS` levels leave nothing to hold out: rule 1 is skipped and rule
2 uses the in-sample error.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy.optimize import nnls

SUPPORT_RMS = 0.005     # a term worth less than half a percent of RMS error is not kept
MIN_FOLDS = 3
CARRIED = 0.25          # a term that keeps under a quarter of itself without one level


def least_squares(features: np.ndarray, measured: np.ndarray, names: Sequence[str],
                  groups: np.ndarray | None = None) -> tuple[list[float], dict[str, str]]:
    """Non-negative coefficients of the ``names`` columns of ``features`` minimising the
    RMS relative error to ``measured``, and the terms dropped with their reasons.
    ``groups`` labels each row with its level, the unit left out (default: one a row).
    Column 0 is the fixed cost: only a zero drops it."""
    weighted = features / measured[:, None]
    groups = np.arange(len(measured)) if groups is None else np.asarray(groups)
    exercised = np.linalg.norm(weighted, axis=0) > 0
    dropped = {names[j]: "no step of the fit runs exercises it"
               for j in range(len(names)) if not exercised[j]}
    keep = [j for j in range(len(names)) if exercised[j]]
    for j, value in zip(list(keep), _solve(weighted, keep), strict=True):
        if value == 0:
            keep.remove(j)
            dropped[names[j]] = "the fit sets it to zero (the data asks for a negative value)"
    held_out = len(np.unique(groups)) >= MIN_FOLDS
    while held_out and len(keep) > 1:
        kept = least_kept(weighted, keep, groups)
        j = min((k for k in range(len(keep)) if keep[k] != 0), key=lambda k: kept[k])
        if kept[j] >= CARRIED:
            break
        dropped[names[keep[j]]] = (
            f"one level carries it: fitted without that level it keeps {kept[j]:.0%} of its "
            f"value (< {CARRIED:.0%})")
        keep.pop(j)
    score = held_out_rms if held_out else in_sample_rms
    how = "left out one level at a time, the levels are" if held_out else "the levels are"
    error = score(weighted, keep, groups)
    while len(keep) > 1:
        trials = {j: score(weighted, [k for k in keep if k != j], groups)
                  for j in keep if j != 0}
        if not trials:
            break
        j, without = min(trials.items(), key=lambda item: item[1])
        if without - error >= SUPPORT_RMS:
            break
        keep.remove(j)
        dropped[names[j]] = (f"{how} predicted {without - error:+.2%} RMS without it "
                             f"(< {SUPPORT_RMS:.1%} worse): these runs do not support it")
        error = without
    coef = [0.0] * len(names)
    for j, value in zip(keep, _solve(weighted, keep), strict=True):
        coef[j] = float(value)
    return coef, dropped


def _solve(weighted: np.ndarray, cols: list[int]) -> np.ndarray:
    """NNLS of ``weighted[:, cols] @ x = 1``, columns scaled to unit norm for conditioning;
    a column these rows never exercise gets zero."""
    if not cols:
        return np.zeros(0)
    a = weighted[:, cols]
    scale = np.linalg.norm(a, axis=0)
    live = scale > 0
    x = np.zeros(len(cols))
    if live.any():
        solved, _ = nnls(a[:, live] / scale[live], np.ones(len(a)))
        x[live] = solved / scale[live]
    return x


def in_sample_rms(weighted: np.ndarray, cols: list[int], groups: np.ndarray) -> float:
    """RMS relative error of the fit on the rows it was fitted to."""
    del groups
    return float(np.sqrt(np.mean((weighted[:, cols] @ _solve(weighted, cols) - 1.0) ** 2)))


def _folds(weighted: np.ndarray, cols: list[int],
           groups: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per group: its rows (a mask) and the coefficients fitted without them."""
    return [(groups == g, _solve(weighted[groups != g], cols)) for g in np.unique(groups)]


def held_out_rms(weighted: np.ndarray, cols: list[int], groups: np.ndarray) -> float:
    """RMS relative error of each group's rows, predicted by a fit on the other groups."""
    residuals = [weighted[out][:, cols] @ x - 1.0 for out, x in _folds(weighted, cols, groups)]
    return float(np.sqrt(np.mean(np.concatenate(residuals) ** 2)))


def least_kept(weighted: np.ndarray, cols: list[int], groups: np.ndarray) -> np.ndarray:
    """Per coefficient, the smallest fraction of its full-fit value that a fit without
    one group keeps (1 where the full fit is zero: nothing to lose)."""
    full = _solve(weighted, cols)
    fits = np.array([x for _, x in _folds(weighted, cols, groups)])
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(full > 0, fits.min(axis=0) / np.where(full > 0, full, 1.0), 1.0)
