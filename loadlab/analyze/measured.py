"""The measured verdict: the knee and cause read from the scheduler's own refusals.

The inferred verdict (:mod:`loadlab.analyze.knee`, :mod:`loadlab.analyze.cause`) reads
what any vLLM exposes: gauges, counters, client latencies. loadlab's simulator (and a
vLLM with loadlab's probe) also exports why the scheduler left the head of the waiting
queue waiting, one engine step at a time, following ``Scheduler.schedule`` in
vllm-project/vllm ``vllm/v1/core/sched/scheduler.py``:

- ``loadlab:scheduler_steps`` (counter): engine steps;
- ``loadlab:scheduler_refused_steps{reason}`` (counter): steps that ended with a non-empty
  waiting queue, by the limit that stopped the waiting loop (``preempted``,
  ``token_budget``, ``seq_cap``, ``kv_blocks``, ``other``);
- gauges of the last refused step: ``loadlab:scheduler_head_blocks_needed``,
  ``loadlab:scheduler_head_free_blocks``, ``loadlab:scheduler_head_running``.

Per load step (its measured window, after the warm-up cut) the *refused share* is the
counter increase of refused steps over that of engine steps. Steps at one level (a top
level run twice) are added up. The measured knee is the lowest level from which every
higher level has a refused share of at least :data:`MATERIAL_REFUSED_SHARE`; the measured
cause is the reason behind most refused steps of those stalled levels, named as the
analyzer names causes (:data:`CAUSE_OF_REASON`; a ``kv_blocks`` refusal becomes
``head_blocked`` or ``kv_exhausted`` by :func:`kv_cause`). A folder without these series
(a live vLLM) has no measured verdict: :func:`measure` returns None.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from loadlab.analyze.windows import counter_windows, gauge_windows, resolve_family, snapshots

SERIES_PREFIX = "loadlab:"
STEPS = "loadlab:scheduler_steps"
REFUSED = "loadlab:scheduler_refused_steps"
HEAD_NEEDED = "loadlab:scheduler_head_blocks_needed"
HEAD_FREE = "loadlab:scheduler_head_free_blocks"
HEAD_RUNNING = "loadlab:scheduler_head_running"
REASONS = ("preempted", "token_budget", "seq_cap", "kv_blocks", "other")

MATERIAL_REFUSED_SHARE = 0.5
"""A level is stalled when the scheduler refuses the head in at least half its engine
steps. Below a sustained overload the queue forms at a burst and is drained within a
step or two, so refusals stay a small share (well under a tenth on the simulator's
ground-truth scenarios below their knee); past it the queue stays, and nearly every step
ends with someone waiting. Half is the point where waiting is the rule rather than the
exception: the same bar the analyzer's ground truth uses for the time the queue is
non-empty (tests/analyze/groundtruth.py)."""

CAUSE_OF_REASON: Mapping[str, str] = {
    "preempted": "kv_exhausted",   # vLLM preempts only when a running request needs a block
    "token_budget": "token_budget",
    "seq_cap": "seq_cap",
    "kv_blocks": "kv_exhausted",   # or head_blocked: see kv_cause
    "other": "unknown",
}


def has_refusals(metrics: pd.DataFrame) -> bool:
    """Whether the folder's metrics carry the scheduler's step counter."""
    return not metrics.empty and bool((metrics["family"] == STEPS).any())


def measure(metrics: pd.DataFrame, table: pd.DataFrame,
            typical_blocks: float | None = None) -> dict[str, dict[str, Any]] | None:
    """``{"knee": ..., "cause": ...}`` measured from the refusal series, or None without them.

    ``table``: the load steps' measured windows with their level (the analyzer's step
    table, or :func:`loadlab.analyze.steps.measured_windows` with a ``level``).
    ``typical_blocks``: :func:`typical_request_blocks` of the requests sent, which splits
    ``kv_blocks`` (:func:`kv_cause`); besides the ``loadlab:`` series only vLLM's KV usage
    gauge is read, and only to report it.
    """
    if not has_refusals(metrics) or table.empty:
        return None
    wins = table[["t_start", "t_end"]]
    steps = _deltas(counter_windows(metrics, STEPS, wins))
    refused = {reason: _deltas(counter_windows(metrics, REFUSED, wins, where={"reason": reason}))
               for reason in REASONS}
    frame = pd.DataFrame({"level": table["level"].to_numpy(dtype=float), "steps": steps,
                          **refused})
    by_level = frame.groupby("level", sort=True).sum()
    total = by_level[list(REASONS)].sum(axis=1)
    share = (total / by_level["steps"].where(by_level["steps"] > 0)).fillna(0.0)
    knee = knee_of(share)
    stalled = (frame["level"] >= knee["upper"]).to_numpy() if knee["found"] else np.zeros(
        len(frame), dtype=bool)
    return {"knee": knee, "cause": _cause(metrics, table, frame, stalled, typical_blocks)}


def _deltas(frame: pd.DataFrame) -> np.ndarray:
    """A counter's increase per window, 0 where the window had no sample."""
    return frame["delta"].fillna(0.0).to_numpy(dtype=float)


def knee_of(share: pd.Series) -> dict[str, Any]:
    """The measured knee of refused shares by level (ascending): the lowest level from
    which every higher level is stalled."""
    stalled = (share >= MATERIAL_REFUSED_SHARE).to_numpy()
    levels = [plain_level(v) for v in share.index]
    upper_i = next((i for i in range(len(levels)) if stalled[i:].all()), None)
    lower: int | float | None
    upper: int | float | None
    if upper_i is None:   # never stalled: judged up to the top level, as the analyzer says
        lower, upper = levels[-1], None
    else:
        lower, upper = (levels[upper_i - 1] if upper_i > 0 else None), levels[upper_i]
    return {
        "found": upper is not None,
        "lower": lower,
        "upper": upper,
        "material_share": MATERIAL_REFUSED_SHARE,
        "refused_share": [{"level": lv, "share": round(float(s), 4)}
                          for lv, s in zip(levels, share.to_numpy())],
    }


def _cause(metrics: pd.DataFrame, table: pd.DataFrame, frame: pd.DataFrame,
           stalled: np.ndarray, typical_blocks: float | None) -> dict[str, Any]:
    counts = {r: float(frame.loc[stalled, r].sum()) for r in REASONS}
    refused = sum(counts.values())
    out: dict[str, Any] = {
        "name": "none",
        "refused_steps": int(refused),
        "engine_steps": int(frame.loc[stalled, "steps"].sum()),
        "reason_share": {r: round(c / refused, 4) for r, c in counts.items()} if refused else {},
    }
    if not stalled.any() or not refused:
        return out
    reason = max(REASONS, key=lambda r: counts[r])
    wins = table.loc[stalled, ["t_start", "t_end"]]
    family = resolve_family(metrics, "kv_usage")
    heads = _kv_refusals(metrics, wins)
    fits = (heads["free"] >= typical_blocks).mean() if typical_blocks and len(heads) else None
    out.update(reason=reason, head_blocks_needed=_median(heads["needed"]),
               head_free_blocks=_median(heads["free"]),
               head_running=_gauge(metrics, HEAD_RUNNING, wins),
               kv_usage=_gauge(metrics, family, wins, 4) if family else None,
               typical_request_blocks=typical_blocks,
               typical_fits_share=None if fits is None else round(float(fits), 4))
    out["name"] = kv_cause(fits) if reason == "kv_blocks" else CAUSE_OF_REASON[reason]
    return out


HEAD_BLOCKED_SHARE = 0.5
"""The share of ``kv_blocks`` refusals whose free blocks would have held a typical request
from which the head, not the pool, is named (:func:`kv_cause`): most of them."""


def kv_cause(typical_fits_share: float | None) -> str:
    """``head_blocked`` when, in most ``kv_blocks`` refusals, the blocks left free would
    have held a typical request (:func:`typical_request_blocks`): the head's own size held
    the queue, and the requests behind it would have fitted. Else ``kv_exhausted``: the
    pool had no room for an ordinary request either. A fixed bar on KV usage cannot tell
    the two apart: with requests of a sixth of the pool, a full pool reads anywhere from
    80% to 100%."""
    return "head_blocked" if typical_fits_share is not None \
        and typical_fits_share >= HEAD_BLOCKED_SHARE else "kv_exhausted"


def typical_request_blocks(requests: pd.DataFrame, block_size: int | None) -> float | None:
    """Blocks the median request sent holds at its end, ceil((prompt + output) /
    block_size), as reserve-full-ISL asks for it at admission; None without the block size
    or the lengths. The median, not the mean: a few long documents are the head's story,
    not the typical request's."""
    if not block_size or requests.empty:
        return None
    prompt = requests.get("target_prompt_tokens", requests.get("prompt_tokens"))
    output = requests.get("target_output_tokens", requests.get("output_tokens"))
    if prompt is None or output is None:
        return None
    tokens = (prompt.astype(float) + output.astype(float)).dropna()
    return float(np.median(np.ceil(tokens / block_size))) if len(tokens) else None


def _kv_refusals(metrics: pd.DataFrame, wins: pd.DataFrame) -> pd.DataFrame:
    """The head gauges' scrapes inside ``wins`` that show a ``kv_blocks`` refusal (the
    head needed more blocks than were free; other reasons record 0 needed), paired by
    endpoint and scrape time: columns ``needed`` and ``free``."""
    needed = snapshots(metrics, HEAD_NEEDED).rename(columns={"value": "needed"})
    free = snapshots(metrics, HEAD_FREE).rename(columns={"value": "free"})
    pairs = needed.merge(free, on=["endpoint", "t"])
    inside = np.zeros(len(pairs), dtype=bool)
    for w in wins.itertuples(index=False):
        inside |= ((pairs["t"] >= w.t_start) & (pairs["t"] < w.t_end)).to_numpy()
    pairs = pairs[inside]
    return pairs[pairs["needed"] > pairs["free"]]


def _median(x: pd.Series) -> float | None:
    return round(float(x.median()), 2) if len(x) else None


def _gauge(metrics: pd.DataFrame, family: str, wins: pd.DataFrame,
           digits: int = 2) -> float | None:
    """A head gauge's typical value over the windows: the median of the per-window means
    (a burst of odd refusals in one window does not move it); None without samples."""
    stats = gauge_windows(metrics, family, wins, by=())
    values = stats["mean"].dropna() if "mean" in stats else pd.Series(dtype=float)
    return round(float(values.median()), digits) if len(values) else None


def plain_level(v: float) -> int | float:
    """A level as JSON writes it: 8, not 8.0."""
    return int(v) if float(v).is_integer() else float(v)
