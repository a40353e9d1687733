"""The knee: the lowest load level from which a persistent waiting queue dominates TTFT
and keeps doing so at every higher level, with how sure we are.

Steps:

1. Waiting level per step: the larger of the time-mean waiting count from the
   queue-time histogram (``waiting_little``, Little's law) and the waiting gauge's mean.
2. Client-limited steps are set aside: the manifest's ``client_limited`` (load
   generator), or, closed loop, a client in-flight count below CLIENT_INFLIGHT (0.8) of
   the users, or, open loop, a send lag p99 above SEND_LAG_S (1 s) or requests sent
   below 0.9 of the offered rate and 3 Poisson sigmas under it. They are never blamed
   on the server.
3. Detector votes per step (:mod:`loadlab.analyze.detectors`). Where the waiting gauge
   was read DENSE_SNAPSHOTS (20) times or more in the step, ``occupancy`` (the share of
   scrapes with a non-empty queue) decides alone: a persistent queue, the knee's own
   definition, is one present in most of the step, and occupancy is the one detector
   that measures that. The others read the queue's depth: a long prompt that blocks the
   head now and then, or a burst, piles a deep queue up for a moment, which lifts the
   mean queue (Little's law), the queue-time share and the hinge while the queue is empty
   most of the time. On the held-out tuning seeds (``benchmarks/heldout``, against the
   scheduler's refusals) the majority called 25 of the 445 unstalled steps of 1 s scrapes
   stalled, occupancy alone 1. With fewer scrapes a step its share is a handful of
   coin tosses (a gateway run of 3 s steps read 2 of 5 scrapes queued where the
   scheduler refused the head in most steps), and a step is stalled when more detectors
   say so than not; a tie goes to occupancy where it voted, else to the counter-based
   ``queue``/``little``. Occupancy's "not" (the queue seen in fewer than half the
   scrapes) still stands against the rest there: the depth detectors' reasons to
   overrule it are the moments above. On the spent validation9 seeds (15 s scrapes, four
   to six a step) the majority called 39 unstalled steps stalled against 2 missed; the
   veto took 17 of the 39 and 2 stalled steps (knee within one level 192 -> 197 of 200,
   the same level 166 -> 178, and no cause turned wrong).
4. Knee: over the judged steps in level order, the first from which every later one is
   stalled: ``upper``; the judged step before it: ``lower``. Nothing stalled: "never
   stalled up to" the highest level (``found`` False, ``lower`` = that level). The first
   step stalled: ``lower`` None. A client-limited step at or below where the knee would
   be leaves ``found`` False: the client, not the server, stopped the load. One
   exception (:func:`recovered_top`): when only the highest judged step reads ok and the
   one below it is stalled, that top step is set aside as noise and the knee is judged
   below it, with a note; confidence is then at most medium (low when one stalled step
   is all the evidence). A step in which no request succeeded is never ``ok`` (the fine
   side of a knee): it is ``failed`` (requests sent, none ok) or ``no_data`` (none sent)
   unless the detectors found it stalled, and it is not judged.
5. Confidence: BOOTSTRAP_N (200) resamples of each step's scrape intervals (histogram
   increments and gauge snapshots) and of its requests' TTFTs (client-only runs vote on
   them), seeded, drawn for all resamples at once (:mod:`loadlab.analyze.bootstrap`);
   steps 1-4 recomputed on each (votes and states as (resamples, steps) arrays, the
   hinge refitted per resample); *agreement* = share giving the same bracket. Also the
   share of detectors whose own knee equals the verdict, the worst scrape coverage and
   the Little's-law residual |L - lambda W| / L per step (client in-flight vs send rate x
   mean E2E; large when steps are short against latency). High: agreement >= 0.9,
   detector agreement >= 0.6, coverage >= 0.9, residual <= 0.25, server metrics
   present and at least two stalled steps from the knee up (agreement only says the
   rule is stable under resampling; one stalled step is one piece of evidence however
   stable); medium: agreement >= 0.7 and coverage >= 0.5; else low. What the levels
   are worth is measured, not assumed: ``benchmarks/heldout/score.py`` prints the share
   of right verdicts per level on its tuning seeds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from loadlab.analyze import detectors as det
from loadlab.analyze.bootstrap import resample
from loadlab.analyze.steps import RunData, binned

CLIENT_INFLIGHT = 0.8
CLIENT_SEND = 0.9
SEND_LAG_S = 1.0
BOOTSTRAP_N = 200
HIGH_AGREEMENT, MEDIUM_AGREEMENT = 0.9, 0.7
HIGH_DETECTORS = 0.6
HIGH_COVERAGE, MEDIUM_COVERAGE = 0.9, 0.5
HIGH_RESIDUAL = 0.25


@dataclass
class Knee:
    found: bool
    unit: str
    lower: float | None
    upper: float | None
    confidence: str = "low"
    reasons: list[str] = field(default_factory=list)
    detectors: dict[str, Any] = field(default_factory=dict)
    states: list[str] = field(
        default_factory=list
    )  # per step: ok | stalled | client_limited | unjudged | failed | no_data
    client_limited_before: bool = False
    psi: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"found": self.found, "unit": self.unit, "lower": _plain(self.lower),
                "upper": _plain(self.upper), "confidence": self.confidence,
                "reasons": list(self.reasons), "detectors": self.detectors,
                "psi": self.psi, "client_limited_before_knee": self.client_limited_before}


def client_limited(table: pd.DataFrame, closed: bool) -> list[bool]:
    """Per step: did the load generator fail to apply the load (never the server's fault)?"""
    out = []
    for row in table.itertuples(index=False):
        flagged = getattr(row, "client_limited_manifest", None)
        if flagged is not None and not _isnan(flagged):
            out.append(bool(flagged))
            continue
        if closed:
            ratio = _div(getattr(row, "inflight", np.nan), row.level)
            out.append(bool(ratio < CLIENT_INFLIGHT))
        else:
            out.append(_behind_schedule(row))
    return out


def _behind_schedule(row: Any) -> bool:
    """Open loop: sends late by more than SEND_LAG_S (p99), or a send count short of the
    offered rate beyond Poisson noise (below 0.9 x expected and 3 sigma under it)."""
    lag = getattr(row, "send_lag_p99_s", np.nan)
    if lag is not None and not _isnan(lag) and lag > SEND_LAG_S:
        return True
    expected = float(row.level) * float(row.t_end - row.t_start)
    sent = float(getattr(row, "n_sent", np.nan))
    return bool(sent < CLIENT_SEND * expected and sent < expected - 3 * np.sqrt(expected))


def waiting_level(table: pd.DataFrame | dict[str, np.ndarray]) -> np.ndarray:
    """Time-mean waiting count per step: the larger of Little's law on the queue histogram
    and the gauge's mean (a lagging gauge reads low, never high; vLLM's queue time starts
    only when its engine core has the request). ``table``: the step table, or its columns
    as arrays (the bootstrap's resamples)."""
    little = det.column(table, "waiting_little")
    gauge = det.column(table, "waiting_mean")
    return np.fmax(little, gauge)


STATES = ("ok", "stalled", "client_limited", "unjudged")   # state codes 0..3


def step_states(votes: pd.DataFrame, limited: list[bool],
                decisive: np.ndarray | None = None, light: np.ndarray | None = None) -> list[str]:
    """Per step: ok | stalled | client_limited | unjudged, from the detectors' votes (step 3)."""
    arrays = {
        k: np.array([np.nan if v is None else float(v) for v in votes[k]]) for k in votes.columns
    }
    return [STATES[c] for c in state_codes(arrays, np.asarray(limited, dtype=bool), decisive,
                                           light)]


def state_codes(votes: dict[str, np.ndarray], limited: np.ndarray,
                decisive: np.ndarray | None = None, light: np.ndarray | None = None) -> np.ndarray:
    """:data:`STATES` codes from votes as :func:`detectors.votes` gives them (any leading axes).
    ``decisive``: per step, occupancy's vote decides alone
    (:func:`detectors.occupancy_decides`); ``light``: per step, a light queue vetoes a stall
    (:func:`detectors.light_queue`)."""
    stack = np.stack(list(votes.values())) if votes else np.full((1, *limited.shape), np.nan)
    yes, no = (stack == 1).sum(axis=0), (stack == 0).sum(axis=0)
    tie_break = np.zeros(yes.shape, dtype=bool)
    for name in ("queue", "little"):
        if name in votes:
            tie_break |= votes[name] == 1
    occupancy = votes.get("occupancy")
    if occupancy is not None:   # a tie goes to the share of time the queue is non-empty
        tie_break = np.where(np.isnan(occupancy), tie_break, occupancy == 1)
    stalled = (yes > no) | ((yes == no) & tie_break)
    if occupancy is not None:   # a queue seen in under half the scrapes is no stall
        stalled &= occupancy != 0
    if occupancy is not None and decisive is not None:
        stalled = np.where(decisive & ~np.isnan(occupancy), occupancy == 1, stalled)
    if light is not None:
        stalled &= ~light
    codes = np.where(yes + no == 0, 3, np.where(stalled, 1, 0))
    return np.where(limited, 2, codes)


def no_success(table: pd.DataFrame) -> np.ndarray:
    """Per step: not one request succeeded in it."""
    return np.nan_to_num(det.column(table, "n_ok")) == 0


def without_success(table: pd.DataFrame, states: list[str]) -> list[str]:
    """``ok`` / ``unjudged`` states of steps without a success become ``failed`` /
    ``no_data``: a step that served nothing held nothing."""
    sent = np.nan_to_num(det.column(table, "n_sent"))
    return [("failed" if n else "no_data") if empty and st in ("ok", "unjudged") else st
            for st, empty, n in zip(states, no_success(table), sent)]


def bracket(
    levels: list[float], states: list[str]
) -> tuple[bool, float | None, float | None, bool]:
    """(found, lower, upper, client_limited_before) from the per-step states (see step 4)."""
    order = sorted(range(len(levels)), key=lambda i: levels[i])
    judged = [i for i in order if states[i] in ("ok", "stalled")]
    if recovered_top(levels, states) is not None:
        judged = judged[:-1]
    upper_pos = next((p for p in range(len(judged))
                      if all(states[j] == "stalled" for j in judged[p:])), None)
    if upper_pos is None:
        limited = any(states[i] == "client_limited" for i in order)
        top = levels[judged[-1]] if judged else None
        return False, top, None, limited
    upper_i = judged[upper_pos]
    limited = any(states[i] == "client_limited" and levels[i] <= levels[upper_i] for i in order)
    lower = levels[judged[upper_pos - 1]] if upper_pos > 0 else None
    if limited:
        return False, lower, None, True
    return True, lower, levels[upper_i], False


def recovered_top(levels: list[float], states: list[str]) -> float | None:
    """The highest judged level when it alone reads ok right above a stalled one (step 4's
    exception), else None.

    A saturated server does not recover with more load: one ok step above a stall is
    far likelier a noisy window (a lull in long prompts, a scrape gap) than a real
    recovery, so it must not erase the stall below it. Two ok steps above a stall are
    believed: that is a curve the knee cannot describe, and "never stalled" stands.
    """
    judged = sorted((levels[i], states[i]) for i in range(len(levels))
                    if states[i] in ("ok", "stalled"))
    if len(judged) >= 2 and judged[-1][1] == "ok" and judged[-2][1] == "stalled":
        return judged[-1][0]
    return None


def find_knee(run: RunData, table: pd.DataFrame, seed: int = 0) -> Knee:
    closed = run.closed_loop
    levels = table["level"].astype(float).tolist()
    limited = client_limited(table, closed)
    waiting = waiting_level(table)
    growth = None if closed else det.inflight_slopes(binned(run.requests), table)
    votes = _votes(table, closed, waiting, limited, growth)
    states = without_success(table, step_states(votes, limited, det.occupancy_decides(table),
                                                det.light_queue(table, waiting, closed)))
    found, lower, upper, limited_before = bracket(levels, states)
    knee = Knee(found, "concurrency" if closed else "rate", lower, upper, states=states,
                client_limited_before=limited_before)
    hinge = _hinge(table, waiting, limited) if closed else None
    knee.psi = None if hinge is None else round(hinge.psi, 2)
    knee.detectors = _detector_report(votes, levels, states, hinge, table, run)
    _confidence(knee, run, table, votes, limited, growth, seed)
    return knee


def _votes(table: pd.DataFrame, closed: bool, waiting: np.ndarray, limited: list[bool],
           growth: list[det.Slope | None] | None) -> pd.DataFrame:
    return det.step_votes(
        table, closed, waiting, _hinge(table, waiting, limited) if closed else None, growth
    )


def _hinge(table: pd.DataFrame, waiting: np.ndarray, limited: list[bool]) -> det.HingeFit | None:
    keep = ~np.asarray(limited, dtype=bool)
    return det.hinge_fit(table["level"].to_numpy(dtype=float)[keep], waiting[keep])


def _detector_report(
    votes: pd.DataFrame,
    levels: list[float],
    states: list[str],
    hinge: det.HingeFit | None,
    table: pd.DataFrame,
    run: RunData,
) -> dict[str, Any]:
    report: dict[str, Any] = {}
    for name in votes.columns:
        col = votes[name].tolist()
        if all(v is None for v in col):
            continue
        own = [("client_limited" if s == "client_limited" else "unjudged" if v is None
                else "stalled" if v else "ok") for v, s in zip(col, states)]
        found, lower, upper, _ = bracket(levels, own)
        report[name] = {"per_step": list(col), "found": found, "lower": _plain(lower),
                        "upper": _plain(upper)}
    if hinge is not None and "hinge" in report:
        report["hinge"].update(psi=round(hinge.psi, 2), r2=round(hinge.r2, 3))
    plateau = det.two_segment(table["level"].to_numpy(dtype=float), det.column(table, "out_tok_s"))
    report["throughput_plateau"] = {"cross_check": True, "level": _plain(plateau.level),
                                    "gain": round(plateau.gain, 3)}
    trend = det.ttft_trend(run.requests, table) if not run.requests.empty else [None] * len(table)
    report["ttft_trend"] = {"cross_check": True, "per_step": trend}
    return report


def _confidence(knee: Knee, run: RunData, table: pd.DataFrame, votes: pd.DataFrame,
                limited: list[bool], growth: list[det.Slope | None] | None, seed: int) -> None:
    reasons: list[str] = []
    agreement = _bootstrap(knee, run, table, limited, growth, seed)
    reasons.append(f"bootstrap: {agreement:.0%} of {BOOTSTRAP_N} resamples give the same bracket")
    voting = [n for n, d in knee.detectors.items() if not d.get("cross_check")]
    same = [n for n in voting if knee.detectors[n]["found"] == knee.found
            and knee.detectors[n]["upper"] == _plain(knee.upper)]
    share = len(same) / len(voting) if voting else 0.0
    reasons.append(
        f"detectors agreeing: {', '.join(same) or 'none'} of {', '.join(voting) or 'none'}"
    )
    coverage = det.column(table, "coverage")
    worst = float(np.nanmin(coverage)) if not np.all(np.isnan(coverage)) else float("nan")
    server = not np.isnan(worst)
    if server:
        reasons.append(f"scrape coverage >= {worst:.0%} in every step")
    else:
        reasons.append("no server metrics: client-side verdict only")
    resid = littles_residual(table)
    worst_resid = float(np.nanmax(resid)) if not np.all(np.isnan(resid)) else float("nan")
    if not np.isnan(worst_resid):
        reasons.append(f"Little's-law residual <= {worst_resid:.0%} per step")
    top = recovered_top(table["level"].astype(float).tolist(), knee.states) \
        if knee.found else None
    if top is not None:
        reasons.append(f"the top step ({_fmt(top)}) read ok above stalled steps: set aside as "
                       "noise; rerun it (or one level more) to confirm the knee")
    plateau = knee.detectors["throughput_plateau"]["level"]
    if plateau is not None and knee.found and plateau < knee.upper:
        reasons.append(f"throughput plateaus from {_fmt(plateau)}, before the queue: not the knee")
    evidence = sum(st == "stalled" for st, lv in zip(knee.states, table["level"])
                   if knee.found and float(lv) >= float(knee.upper or 0))
    if (
        server
        and evidence >= 2
        and agreement >= HIGH_AGREEMENT
        and share >= HIGH_DETECTORS
        and worst >= HIGH_COVERAGE
        and not worst_resid > HIGH_RESIDUAL
    ):
        knee.confidence = "high"
    elif agreement >= MEDIUM_AGREEMENT and (not server or worst >= MEDIUM_COVERAGE):
        knee.confidence = "medium"
    else:
        knee.confidence = "low"
    if top is not None:
        stalled = sum(st == "stalled" for st in knee.states)
        knee.confidence = "low" if stalled < 2 or knee.confidence == "low" else "medium"
    knee.reasons = reasons
    table["littles_residual"] = resid


def littles_residual(table: pd.DataFrame) -> np.ndarray:
    """|L - lambda W| / L per step: client in-flight vs send rate x mean E2E."""
    L = det.column(table, "inflight")
    lam = det.column(table, "send_rps")
    W = det.column(table, "e2e_mean_s")
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(L > 0, np.abs(L - lam * W) / L, np.nan)


def _bootstrap(knee: Knee, run: RunData, table: pd.DataFrame, limited: list[bool],
               growth: list[det.Slope | None] | None, seed: int) -> float:
    """Share of resamples whose knee bracket equals the point estimate's (all at once)."""
    closed = run.closed_loop
    levels = table["level"].astype(float).tolist()
    cols = {c: det.column(table, c) for c in det.VOTE_COLUMNS} | resample(
        run, table, BOOTSTRAP_N, seed
    )
    waiting = waiting_level(cols)
    psi = _hinge_psi(table, waiting, limited) if closed else None
    lim = np.asarray(limited, dtype=bool)
    codes = state_codes(det.votes(cols, closed, waiting, psi, growth), lim,
                        det.occupancy_decides(cols), det.light_queue(cols, waiting, closed))
    codes = np.where(no_success(table) & (codes == 0), 3, codes)   # not judged, as the estimate
    target = (knee.found, _plain(knee.lower), _plain(knee.upper))
    if not levels:
        return float(bracket([], [])[:3] == target)
    rows, counts = np.unique(codes, axis=0, return_counts=True)
    hits = 0
    for row, count in zip(rows, counts):
        found, lower, upper, _ = bracket(levels, [STATES[c] for c in row])
        hits += int(count) * ((found, _plain(lower), _plain(upper)) == target)
    return hits / BOOTSTRAP_N


def _hinge_psi(table: pd.DataFrame, waiting: np.ndarray, limited: list[bool]) -> np.ndarray:
    """Per resample (rows of ``waiting``): the hinge's psi over the steps not client-limited;
    NaN with fewer than 2 points."""
    keep = ~np.asarray(limited, dtype=bool)
    c, w = table["level"].to_numpy(dtype=float)[keep], waiting[:, keep]
    psi = np.full(len(w), np.nan)
    if w.shape[1] < 2:
        return psi
    present = ~(np.isnan(w) | np.isnan(c))
    patterns, which = np.unique(present, axis=0, return_inverse=True)
    for k, ok in enumerate(patterns):               # almost always one: NaN where the table has it
        if ok.sum() >= 2:
            rows = np.flatnonzero(which.ravel() == k)
            psi[rows] = det.hinge_psi(c[ok], w[np.ix_(rows, np.flatnonzero(ok))])[0]
    return psi


def _div(a: float, b: float) -> float:
    try:
        return float(a) / float(b) if float(b) > 0 else float("nan")
    except (TypeError, ValueError):
        return float("nan")


def _isnan(v: Any) -> bool:
    return isinstance(v, float) and np.isnan(v)


def _plain(v: Any) -> Any:
    """A level as JSON wants it: int when whole, None for missing."""
    if v is None or _isnan(v):
        return None
    f = float(v)
    return int(f) if f.is_integer() else f


def _fmt(v: Any) -> str:
    return str(_plain(v))
