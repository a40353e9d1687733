"""The learned arbiter: which server limit held the queue, weighed from every signature at once.

The signatures of :mod:`loadlab.analyze.cause` each test one limit with a threshold, and
:func:`loadlab.analyze.cause.choose` takes the best score. On the held-out tuning seeds
(``benchmarks/heldout``, the spent ``validation8`` to ``validation17``: 2,000 scenarios
the simulator replayed, their truth the scheduler's own refusals) that choice named the
limit the scheduler measured in 92% of runs. The misses are runs where two limits leave
similar marks: a long prompt at the head of the queue and a sequence cap both hold
running flat below a pool that is not full; a token budget and a cap both flatten a
stripped run's running plateau. What separates them is a combination of figures no single
threshold reads (how far the batch decoded per engine step sits below running's max, how
many median requests the free blocks would hold, how often running was preempted).

So the name is weighed here by a small gradient-boosted tree ensemble over the signatures'
scores and the figures behind them (:data:`FEATURES`), fitted by
``benchmarks/heldout/train_arbiter.py`` on tuning seeds only and scored on held-out seeds
it never saw. Its parameters are committed as ``arbiter.json`` beside this module; the
evaluator below is plain numpy, so analysis needs no machine-learning library. The rule
scores stay the evidence and the knobs: the arbiter only chooses among the server causes
the signatures already describe, and its probabilities are reported beside the rules'.
It also reads the engine steps from the client's token streams
(:mod:`loadlab.analyze.stream_steps`), which resolve what a window of scrapes cannot: with
them, fitted on ``validation8`` to ``validation21`` (2,800 scenarios), the leave-one-set-out
estimate rose from 94.6% to 96.1%.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from loadlab.analyze import stream_steps

if TYPE_CHECKING:
    from loadlab.analyze.cause import Signals

MODEL = Path(__file__).with_name("arbiter.json")
CLASSES = ("head_blocked", "kv_exhausted", "seq_cap", "token_budget")
"""The limits the arbiter chooses among: those the scheduler's refusals measure
(``dashboard_caliber`` is a reading of ``kv_exhausted``, kept where the rules name it)."""
FEATURES = (
    "score_seq_cap", "score_kv_exhausted", "score_dashboard_caliber", "score_token_budget",
    "score_head_blocked", "stalled_steps", "cap_known", "cap_inferred", "budget_known",
    "chunked", "closed_loop", "running_top_per_level", "running_mean_rel", "running_p50_rel",
    "running_max_spread_rel", "decoding_rel", "step_decoding_rel", "step_decoding_rel_min",
    "kv_max", "kv_max_min", "kv_mean", "kv_queued", "token_fill", "preemptions",
    "preempted_any", "waiting_per_level", "tokens_per_step_flat", "tokens_per_step_budget",
    "head_need_per_free", "head_need_per_free_max", "typical_per_free", "pool_per_typical",
    "prompt_per_budget", "unheld_share", *stream_steps.FEATURES,
)
"""The arbiter's inputs, in the model's column order: per stalled step figures averaged
over the stalled steps (``_min``/``_max``: the extreme), as ratios where a count would
tie them to one server's size (running to the cap's plateau or the users, blocks to the
free blocks, tokens to the budget), so that a pool of 900 blocks and one of 90,000 read
alike; preemptions stay a count per load step. NaN where a figure is not known (the
trees send a missing value down the branch fitted for it). The ``stream_`` inputs are
the engine steps as the client's token streams show them (:mod:`loadlab.analyze.stream_steps`),
NaN where the run did not stream."""


def features(sig: Signals, scores: dict[str, float], free: np.ndarray, need: np.ndarray,
             unheld: np.ndarray, stream: Mapping[str, float] | None = None) -> dict[str, float]:
    """The arbiter's inputs for one run's stalled steps (:data:`FEATURES`): ``scores``, the
    signatures'; per stalled step, the ``free`` blocks while requests waited, the blocks
    the longest prompt would ``need`` and whether seats stood ``unheld``
    (:mod:`loadlab.analyze.cause`); ``stream``, the figures of
    :func:`loadlab.analyze.stream_steps.step_figures`."""
    levels = np.asarray(sig.levels, dtype=float)
    top = _reduce(np.nanmax, sig.running_max)

    def rel(x: np.ndarray) -> np.ndarray:
        return x / top if top else x * np.nan

    need = need / free
    tps = sig.tokens_per_step
    return {
        "score_seq_cap": scores.get("seq_cap", 0.0),
        "score_kv_exhausted": scores.get("kv_exhausted", 0.0),
        "score_dashboard_caliber": scores.get("dashboard_caliber", 0.0),
        "score_token_budget": scores.get("token_budget", 0.0),
        "score_head_blocked": scores.get("head_blocked", 0.0),
        "stalled_steps": float(len(sig.steps)),
        "cap_known": float(bool(sig.cap) and not sig.cap_inferred),
        "cap_inferred": float(sig.cap_inferred),
        "budget_known": float(bool(sig.budget)),
        "chunked": np.nan if sig.chunked is None else float(sig.chunked),
        "closed_loop": float(sig.closed_loop),
        "running_top_per_level": top / levels.max() if len(levels) and levels.max() else np.nan,
        "running_mean_rel": _reduce(np.nanmean, rel(sig.running_mean)),
        "running_p50_rel": _reduce(np.nanmean, rel(sig.running_p50)),
        "running_max_spread_rel": _reduce(np.ptp, sig.running_max) / top if top else np.nan,
        "decoding_rel": _reduce(np.nanmean, None if sig.decoding is None else rel(sig.decoding)),
        "step_decoding_rel": _reduce(np.nanmean, None if sig.step_decoding is None
                                     else rel(sig.step_decoding)),
        "step_decoding_rel_min": _reduce(np.nanmin, None if sig.step_decoding is None
                                         else rel(sig.step_decoding)),
        "kv_max": _reduce(np.nanmean, sig.kv_max),
        "kv_max_min": _reduce(np.nanmin, sig.kv_max),
        "kv_mean": _reduce(np.nanmean, sig.kv_mean),
        "kv_queued": _reduce(np.nanmean, sig.kv_queued),
        "token_fill": _reduce(np.nanmean, sig.fill),
        "preemptions": _reduce(np.nanmean, sig.preemptions),
        "preempted_any": float(np.nansum(sig.preemptions) > 0),
        "waiting_per_level": _reduce(np.nanmean, sig.waiting / np.maximum(levels, 1.0)),
        "tokens_per_step_flat": _reduce(_flatness, tps),
        "tokens_per_step_budget": _reduce(np.nanmean, tps / sig.budget) if sig.budget else np.nan,
        "head_need_per_free": _reduce(np.nanmean, need),
        "head_need_per_free_max": _reduce(np.nanmax, need),
        "typical_per_free": (_reduce(np.nanmean, sig.typical_blocks / free)
                             if sig.typical_blocks else np.nan),
        "pool_per_typical": (sig.pool_blocks / sig.typical_blocks
                             if sig.pool_blocks and sig.typical_blocks else np.nan),
        "prompt_per_budget": (_reduce(np.nanmean, sig.prompt_max / sig.budget)
                              if sig.budget and sig.prompt_max is not None else np.nan),
        "unheld_share": float(unheld.mean()) if len(unheld) else np.nan,
        **{k: float((stream or {}).get(k, np.nan)) for k in stream_steps.FEATURES},
    }


def _reduce(how: Any, values: np.ndarray | None) -> float:
    """``how`` over the known values; NaN where none is known."""
    if values is None:
        return np.nan
    x = np.asarray(values, dtype=float)
    return float(how(x[np.isfinite(x)])) if np.isfinite(x).any() else np.nan


def _flatness(x: np.ndarray) -> float:
    """Lowest over highest: 1 where the figure held one value over the stalled steps."""
    return float(x.min() / x.max()) if x.max() > 0 else np.nan


@dataclass(frozen=True)
class Model:
    """A fitted ensemble: per boosting round, one tree per class; each tree as flat node
    arrays (a leaf's ``left`` is -1). Raw score = baseline + the sum of the class's
    trees' leaves; probabilities = softmax over the classes."""

    classes: tuple[str, ...]
    features: tuple[str, ...]
    baseline: np.ndarray          # (classes,)
    trees: list[list[dict[str, np.ndarray]]]   # [round][class] -> node arrays
    ranges: dict[str, tuple[float, float]] = field(default_factory=dict)   # see outside()

    def probabilities(self, x: dict[str, float]) -> dict[str, float]:
        row = np.array([x.get(f, np.nan) for f in self.features], dtype=float)
        raw = self.baseline.astype(float).copy()
        for per_class in self.trees:
            for k, tree in enumerate(per_class):
                raw[k] += _leaf(tree, row)
        p = np.exp(raw - raw.max())
        p /= p.sum()
        return {c: float(v) for c, v in zip(self.classes, p)}


def outside(ranges: Mapping[str, Sequence[float]], x: dict[str, float]) -> list[str]:
    """The inputs beyond what a model was fitted on (``ranges``: its training runs' lowest
    and highest value of each): trees extrapolate flat from their last split, however far
    out a figure lies, so there the arbiter stands aside and the rules decide. On the
    tuning seeds' leave-one-set-out fits this stood aside in 52 of 2,800 runs (the rules
    right in 31). A fleet of two replicas of a tiny model, its gauges added up,
    decoded twice the running max a step and held a pool of 14,000 median requests: the
    arbiter, fitted on nothing like it, leaned 60/40 to a budget where the scheduler
    refused at the cap."""
    return [f for f, (lo, hi) in ranges.items()
            if not np.isnan(v := x.get(f, np.nan)) and not lo <= v <= hi]


def _leaf(tree: dict[str, np.ndarray], row: np.ndarray) -> float:
    node = 0
    left, right = tree["left"], tree["right"]
    while left[node] >= 0:
        v = row[tree["feature"][node]]
        if np.isnan(v):
            go_left = bool(tree["missing_left"][node])
        else:
            go_left = v <= tree["threshold"][node]
        node = int(left[node] if go_left else right[node])
    return float(tree["value"][node])


def model_from_json(data: dict[str, Any]) -> Model:
    """A :class:`Model` from ``arbiter.json``'s structure (``train_arbiter.py`` writes it)."""
    trees = [[{k: np.asarray(v) for k, v in tree.items()} for tree in per_class]
             for per_class in data["trees"]]
    return Model(tuple(data["classes"]), tuple(data["features"]),
                 np.asarray(data["baseline"], dtype=float), trees,
                 {f: (float(lo), float(hi)) for f, (lo, hi) in data.get("ranges", {}).items()})


@cache
def model() -> Model | None:
    """The committed model, or None where the package ships without one (the rules decide)."""
    if not MODEL.is_file():
        return None
    return model_from_json(json.loads(MODEL.read_text()))


ABSTAIN_BELOW = 0.5
"""Below this probability for its best cause the arbiter names none (``undetermined``, with
the two likeliest as candidates): no limit is more likely than not. On the tuning seeds'
leave-one-set-out fits of the eighteenth round, picks below it were right in 3 of 8."""
HIGH = 0.99
"""A pick at this probability or more, on a knee whose bracket is not low-confidence, is
"high": right in 1,699 of 1,711 such picks (99.3%) on the tuning seeds' leave-one-set-out
fits (benchmarks/heldout/README.md, twenty-first round)."""
MEDIUM = 0.8
"""At this probability or more (and below HIGH, or on a low-confidence knee), "medium":
right in 440 of 475 (92.6%) on the same fits; below it right in 35 of 68: "low"."""


@dataclass(frozen=True)
class Decision:
    name: str
    confidence: str | None        # None: the rules' own (the arbiter stood aside)
    candidates: list[str] | None = None


def decide(rule: str, p: dict[str, float], knee_confidence: str | None,
           outside: list[str]) -> Decision:
    """The cause and its confidence from the arbiter's probabilities ``p`` and the rules'
    choice ``rule``; shared with ``train_arbiter.py``, whose estimate is of this policy.
    ``outside``: inputs beyond the range the model was fitted on, where it stands aside."""
    if outside:
        return Decision(rule, None)
    ranked = sorted(p, key=lambda c: -p[c])
    best = ranked[0]
    if p[best] < ABSTAIN_BELOW:
        return Decision("undetermined", "low", ranked[:2])
    # a full pool the rules read as a dashboard caliber keeps that reading
    shown = rule if rule == "dashboard_caliber" and best == "kv_exhausted" else best
    sure_knee = knee_confidence in (None, "high", "medium")
    level = ("high" if p[best] >= HIGH and sure_knee else
             "medium" if p[best] >= MEDIUM else "low")
    return Decision(shown, level)


def weighing(name: str, p: dict[str, float]) -> str:
    """What the arbiter found, in words, with its two likeliest causes."""
    likeliest = ", ".join(f"{c} {p[c]:.0%}" for c in sorted(p, key=lambda c: -p[c])[:2])
    if name == "undetermined":
        return f"weighed together, the figures make no limit more likely than not ({likeliest})"
    return f"weighed together, the figures favour {name} ({likeliest})"


def arbitrate(rule: str, sig: Signals, scores: dict[str, float], free: np.ndarray,
              need: np.ndarray, unheld: np.ndarray, knee_confidence: str | None,
              chosen_by_rule: bool, stream: Mapping[str, float] | None = None
              ) -> dict[str, Any] | None:
    """The arbiter's verdict where it weighs in: ``{"name", "confidence", "arbiter"[,
    "candidates"]}`` (:func:`decide`); None where it does not (``chosen_by_rule`` False: no
    knee, a client, failures or a front end decided; no stalled step). Without a model the
    rules' name stands and only the inputs are reported (what ``train_arbiter.py`` fits on)."""
    if not chosen_by_rule or not len(sig.steps):
        return None
    x = features(sig, scores, free, need, unheld, stream)
    block: dict[str, Any] = {"rule": rule, "probabilities": None,
                             "features": {k: (None if np.isnan(v) else round(v, 6))
                                          for k, v in x.items()}}
    fitted = model()
    if fitted is None:
        return {"name": rule, "confidence": None, "arbiter": block}
    p = fitted.probabilities(x)
    block["probabilities"] = {k: round(v, 4) for k, v in p.items()}
    beyond = outside(fitted.ranges, x)
    if beyond:
        block["outside"] = beyond
    d = decide(rule, p, knee_confidence, beyond)
    out: dict[str, Any] = {"name": d.name, "confidence": d.confidence, "arbiter": block}
    if d.candidates:
        out["candidates"] = d.candidates
    return out
