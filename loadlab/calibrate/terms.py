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

Before both, 0. Separability. Two terms whose regressors the fit loads move together
cannot be told apart: in a load where every request has the same lengths, the context a
step reads is (almost) a fixed multiple of the requests it runs, so any split of their
cost between per-request and per-context fits equally well, and the least squares picks
one by noise. The split matters only off the fit loads, for requests of other lengths,
where a wrong per-context cost grows with every token. A term is not separable when, with
some one level left out (the same test as rule 1: one level must not carry it), under
:data:`SEPARABLE` of its column lies outside the span of the other kept columns (the sine
of the angle between them; 1 / sine^2 is its variance inflation factor, Belsley, Kuh and
Welsch 1980, "Regression Diagnostics", ch. 3). Its partner is the term whose removal frees
it most. Of the pair, the one earlier in :data:`TERMS <loadlab.sim.engine.calibration.TERMS>`
order stays: that order (per request, per prefill token, per attention pair, per context
token) is by how fast the regressor grows with a request's length, and with no evidence in
the data of a cost growing with length, the term that does not assume one extrapolates
least. Per prefill step comes last, though its regressor (1 on a step that schedules
prefill tokens, else 0) grows with nothing: the observations are prefill means and decode
means, so it is 1 on every prefill row and near 0 on the decode rows of light loads. It
is the one term that fits *any* difference between prefill and decode steps, and would
absorb what a per-token or per-context cost explains, so it stays only where the data
separate it from each of them.
The dropped term is named with the partner and the fix (a fit load of other
lengths).

Fewer than :data:`MIN_FOLDS` levels leave nothing to hold out: rules 0 and 1 use all
levels, rule 1 is skipped and rule 2 uses the in-sample error.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy.optimize import nnls

SUPPORT_RMS = 0.005     # a term worth less than half a percent of RMS error is not kept
MIN_FOLDS = 3
CARRIED = 0.25          # a term that keeps under a quarter of itself without one level
SEPARABLE = 0.1         # a column with under a tenth of its norm its own is not separable


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
    held_out = len(np.unique(groups)) >= MIN_FOLDS
    dropped.update(drop_inseparable(weighted, keep, names, groups if held_out else None))
    for j, value in zip(list(keep), _solve(weighted, keep), strict=True):
        if value == 0:
            keep.remove(j)
            dropped[names[j]] = "the fit sets it to zero (the data asks for a negative value)"
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


def own_share(weighted: np.ndarray, others: list[int], j: int) -> float:
    """The fraction of column ``j``'s norm outside the span of the ``others`` columns (the
    sine of its angle to them): 0 when they reproduce it, 1 when orthogonal to them. A
    column these rows never exercise counts as its own (1): a term some level alone
    exercises is rule 1's to judge, not a pair to split."""
    column = weighted[:, j]
    norm = float(np.linalg.norm(column))
    if norm == 0 or not others:
        return 1.0
    a = weighted[:, others]
    x, *_ = np.linalg.lstsq(a, column, rcond=None)
    return float(np.linalg.norm(column - a @ x)) / norm


def drop_inseparable(weighted: np.ndarray, keep: list[int], names: Sequence[str],
                     groups: np.ndarray | None) -> dict[str, str]:
    """Rule 0: remove from ``keep`` (in place) each term the rows cannot tell apart from
    another, keeping the earlier of the pair; the removed terms with their reasons. With
    ``groups``, a term is judged on the rows of each group left out in turn (its worst
    fold), else on all rows."""
    folds = ([groups != g for g in np.unique(groups)] if groups is not None
             else [np.ones(len(weighted), bool)])
    dropped: dict[str, str] = {}
    while True:
        worst = {j: min((own_share(weighted[rows], [k for k in keep if k != j], j), f)
                        for f, rows in enumerate(folds)) for j in keep if j != 0}
        flagged = {j: share for j, share in worst.items() if share[0] < SEPARABLE}
        if not flagged:
            return dropped
        j = max(flagged)                        # the latest term in TERMS order
        share, fold = flagged[j]
        rows = folds[fold]
        freed = {k: own_share(weighted[rows], [i for i in keep if i not in (j, k)], j)
                 for k in keep if k not in (0, j)}
        partner = max(freed, key=lambda k: freed[k]) if freed else None
        where = " with one level left out" if groups is not None else ""
        if partner is None or freed[partner] < SEPARABLE:
            with_what = "the fixed cost and the other terms"
        else:
            with_what = names[partner]
            if partner > j:                     # keep the earlier of the pair
                j, with_what = partner, names[j]
        keep.remove(j)
        dropped[names[j]] = (
            f"not separable from {with_what} with these loads: {share:.1%} of its regressor "
            f"is its own{where} (< {SEPARABLE:.0%}); add a fit load with other prompt or "
            f"output lengths")
