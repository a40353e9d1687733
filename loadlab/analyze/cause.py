"""Why the queue formed: ranked candidate causes, each with its evidence and its knob.

Scored over the knee's stalled steps (every judged step from the first stalled one up)
with figures that survive gauge lag: maxima of gauges (a lagging gauge reads low, never
high), counter rates and histogram deltas. :func:`signatures` is the pure part, shared
with ``loadlab diagnose`` (which feeds it one live window). Each score is the share of
stalled steps that show the signature (0..1):

- ``seq_cap``: running max reached the cap and KV max stayed below KV_FULL (0.9). The
  cap is ``server.max_num_seqs`` from the manifest, else inferred: running max equal in
  every stalled step and within 1.5 of the hinge's psi (score x 0.9 when inferred).
- ``kv_exhausted``: KV max >= KV_FULL with running below the cap (or preemptions); an
  inferred cap does not count against it (a full pool makes a running plateau too).
- ``dashboard_caliber``: a KV-exhausted step whose token-level usage (client lengths x
  running / pool tokens) is below CALIBER (half) of the block-level gauge: block
  rounding, not tokens, fills the pool. Takes the KV score; kv_exhausted keeps 0.6 of it.
- ``token_budget``: tokens per engine step ((prompt computed + generated tokens/s) x
  mean ITL) >= BUDGET_FILL (0.8) of ``max_num_batched_tokens``, running below the cap,
  KV below full. Without the flag: tokens per step within 15% across the stalled steps
  (a ceiling), score x 0.6.
- ``prefix_held``: prefix caching on, hit rate >= 0.5, KV max in [0.5, KV_FULL),
  running below the cap and the budget not filled: blocks held by shared prefixes.
- ``frontend_starved`` (every step with server figures): client TTFT mean exceeds the
  server's own by max(50 ms, the server's figure) and >= 20% of streams came whole.
- ``client_limited``: a client-limited step at or below the knee (1.0).
- ``server_errors`` (every step): the share of steps in which at least
  ``SERVER_FAILURE_SHARE`` of the requests failed server-side
  (:mod:`loadlab.analyze.failures`).

Choice: server_errors when it scores >= 0.5, or at all with no knee found or a knee
precluded by the client (a server that fails its requests is never a client's
shortfall); client_limited when the knee was precluded by the client; unknown without
server metrics; with no knee, frontend_starved if it scores >= 0.5, else none; with a
knee, the best server cause scoring >= 0.5, else frontend_starved, else unknown.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from loadlab.analyze.capacity import as_int
from loadlab.analyze.detectors import column
from loadlab.analyze.failures import server_errors, server_errors_knob

KV_FULL = 0.9
CALIBER = 0.5
BUDGET_FILL = 0.8
MIN_SCORE = 0.5
SERVER_CAUSES = ("seq_cap", "kv_exhausted", "dashboard_caliber", "token_budget", "prefix_held")


@dataclass
class Signals:
    """What the cause signatures read: per stalled step, plus the run's settings."""

    steps: list[int]
    levels: list[float]
    running_max: np.ndarray
    kv_max: np.ndarray
    preemptions: np.ndarray
    waiting: np.ndarray
    tokens_per_step: np.ndarray
    fill: np.ndarray
    hit_rate: np.ndarray
    cap: int | None = None
    cap_inferred: bool = False
    budget: int | None = None
    prefix_caching: bool | None = None
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Verdict:
    """What the knee said, as the cause choice needs it."""

    knee_found: bool
    client_before: bool
    client_limited_steps: list[int]
    server_metrics: bool
    psi: float | None = None
    closed_loop: bool = True


@dataclass
class Candidate:
    name: str
    score: float
    evidence: list[dict[str, Any]]


def signals(rows: pd.DataFrame, server: dict[str, Any], config: dict[str, Any],
            fill: np.ndarray, psi: float | None) -> Signals:
    """Collect the stalled steps' figures and the cap/budget (flags, else inferred)."""
    sig = Signals(
        steps=[int(s) for s in rows["step"]],
        levels=rows["level"].astype(float).tolist(),
        running_max=column(rows, "running_max"),
        kv_max=column(rows, "kv_max"),
        preemptions=column(rows, "preemptions"),
        waiting=np.where(
            np.isnan(column(rows, "waiting_little")),
            column(rows, "waiting_mean"),
            column(rows, "waiting_little"),
        ),
        tokens_per_step=tokens_per_step(rows),
        fill=fill,
        hit_rate=column(rows, "prefix_hit_rate"),
        budget=as_int(server.get("max_num_batched_tokens")),
        prefix_caching=_bool(
            config.get("enable_prefix_caching", server.get("enable_prefix_caching"))
        ),
    )
    sig.cap = as_int(server.get("max_num_seqs"))
    runs = sig.running_max[~np.isnan(sig.running_max)]
    plateau = len(runs) > 0 and np.ptp(runs) == 0 and runs[0] > 0
    if sig.cap is None and plateau and (psi is None or abs(psi - runs[0]) <= 1.5):
        sig.cap, sig.cap_inferred = int(runs[0]), True
        sig.notes.append(
            f"max_num_seqs not known: inferred {int(runs[0])} from the running plateau"
        )
    return sig


def assess(stalled: pd.DataFrame, table: pd.DataFrame, server: dict[str, Any],
           config: dict[str, Any], capacity: dict[str, Any], verdict: Verdict) -> dict[str, Any]:
    """The ``cause`` block of analysis.json: scores, choice, evidence, facts and knob.

    ``stalled``: the knee's stalled steps (step-table rows with ``token_fill``);
    ``table``: every step (for frontend_starved). ``notes`` says what was inferred.
    """
    fill = stalled["token_fill"].to_numpy(dtype=float) if "token_fill" in stalled else \
        np.full(len(stalled), np.nan)
    sig = signals(stalled, server, config, fill, verdict.psi)
    candidates = signatures(sig) + [frontend_starved(table)]
    limited = verdict.client_limited_steps
    candidates.append(Candidate(
        "client_limited", 1.0 if verdict.client_before else 0.5 * bool(limited),
        [{"what": "client-limited step", "value": 1, "step": s} for s in limited]))
    candidates.append(Candidate("server_errors", *server_errors(table)))
    name = choose(candidates, verdict.knee_found, verdict.client_before, verdict.server_metrics)
    chosen = next((c for c in candidates if c.name == name), None)
    ranked = sorted(candidates, key=lambda c: -c.score)
    return {"name": name, "evidence": chosen.evidence if chosen else [],
            "knob": server_errors_knob(table) if name == "server_errors"
            else knob(name, sig, capacity), "facts": facts(sig, verdict.closed_loop),
            "ranked": [{"name": c.name, "score": round(c.score, 3)} for c in ranked],
            "notes": sig.notes}


def facts(sig: Signals, closed_loop: bool = True) -> dict[str, Any]:
    """The headline figures of the stalled steps, for the verdict's words (``waiting_excess``
    = mean of waiting - (c - cap): closed loop only)."""
    excess = None
    if sig.cap and sig.levels and closed_loop:
        diff = sig.waiting - (np.asarray(sig.levels) - sig.cap)
        excess = None if np.all(np.isnan(diff)) else round(float(np.nanmean(diff)), 2)
    return {"cap": sig.cap, "cap_inferred": sig.cap_inferred, "budget": sig.budget,
            "kv_max": _agg(np.nanmax, sig.kv_max), "running_max": _agg(np.nanmax, sig.running_max),
            "waiting_excess": excess, "preemptions": _agg(np.nansum, sig.preemptions),
            "token_fill": _agg(np.nanmin, sig.fill),
            "tokens_per_step": _agg(np.nanmax, sig.tokens_per_step)}


def _agg(fn: Any, x: np.ndarray) -> float | None:
    return None if x.size == 0 or np.all(np.isnan(x)) else round(float(fn(x)), 4)


def tokens_per_step(rows: pd.DataFrame) -> np.ndarray:
    """(prompt tokens computed + generated) per second x mean engine step (server ITL)."""
    prompt = column(rows, "prompt_tok_rate") - np.nan_to_num(column(rows, "cached_tok_rate"))
    return (prompt + column(rows, "gen_tok_rate")) * column(rows, "server_itl_mean_ms") / 1e3


def signatures(sig: Signals) -> list[Candidate]:
    """Score every server-side cause on the stalled steps (pure; see the module docstring)."""
    n = len(sig.steps)
    if n == 0:
        return []
    cap = sig.cap
    # An inferred cap is only a running plateau, which a full pool makes too.
    below_cap = (sig.running_max < cap) if cap and not sig.cap_inferred else np.ones(n, dtype=bool)
    kv_ok = sig.kv_max < KV_FULL
    kv_full = sig.kv_max >= KV_FULL
    out: list[Candidate] = []
    at_cap = (sig.running_max >= cap) & kv_ok if cap else np.zeros(n, dtype=bool)
    score = float(at_cap.mean()) * (0.9 if sig.cap_inferred else 1.0)
    out.append(
        Candidate(
            "seq_cap",
            score,
            _ev(
                sig,
                [
                    ("running max", sig.running_max),
                    ("KV usage max", sig.kv_max),
                    ("waiting (mean)", sig.waiting),
                ],
                extra=[]
                if cap is None
                else [
                    {
                        "what": "max_num_seqs" + (" (inferred)" if sig.cap_inferred else ""),
                        "value": cap,
                        "step": sig.steps[0],
                    }
                ],
            ),
        )
    )
    kv_like = kv_full & (below_cap | (np.nan_to_num(sig.preemptions) > 0))
    caliber = kv_like & (sig.fill < CALIBER)
    kv_score = float(kv_like.mean())
    cal_score = float(caliber.mean())
    out.append(
        Candidate(
            "kv_exhausted",
            kv_score - 0.4 * cal_score,
            _ev(
                sig,
                [
                    ("KV usage max", sig.kv_max),
                    ("preemptions", sig.preemptions),
                    ("running max", sig.running_max),
                ],
            ),
        )
    )
    out.append(Candidate("dashboard_caliber", cal_score, _ev(sig, [
        ("token-level / block-level KV usage", sig.fill), ("KV usage max", sig.kv_max)])))
    out.append(_budget(sig, below_cap, kv_ok))
    held = (kv_ok & (sig.kv_max >= 0.5) & below_cap & (sig.hit_rate >= 0.5)
            & (_budget_fill(sig) < BUDGET_FILL) if sig.prefix_caching else np.zeros(n, dtype=bool))
    out.append(Candidate("prefix_held", float(held.mean()), _ev(sig, [
        ("prefix hit rate", sig.hit_rate), ("KV usage max", sig.kv_max)])))
    return out


def _budget(sig: Signals, below_cap: np.ndarray, kv_ok: np.ndarray) -> Candidate:
    fill = _budget_fill(sig)
    if sig.budget:
        hit = (fill >= BUDGET_FILL) & below_cap & kv_ok
        score = float(hit.mean())
        extra = [{"what": "max_num_batched_tokens", "value": sig.budget, "step": sig.steps[0]}]
    else:
        tps = sig.tokens_per_step[~np.isnan(sig.tokens_per_step)]
        flat = len(tps) >= 2 and tps.min() >= 0.85 * tps.max()
        score = 0.6 * float((below_cap & kv_ok).mean()) if flat else 0.0
        extra = []
    return Candidate(
        "token_budget",
        score,
        _ev(sig, [("tokens per engine step", sig.tokens_per_step)], extra=extra),
    )


def _budget_fill(sig: Signals) -> np.ndarray:
    if not sig.budget:
        return np.full(len(sig.steps), np.nan)
    return sig.tokens_per_step / sig.budget


def frontend_starved(table: pd.DataFrame) -> Candidate:
    """Client TTFT far above vLLM's own while streams arrive whole (the ``bursts`` column)."""
    server, client = column(table, "server_ttft_mean_ms"), column(table, "ttft_mean_ms")
    bursts = column(table, "burst_share")
    known = ~(np.isnan(server) | np.isnan(client))
    if not known.any():
        return Candidate("frontend_starved", 0.0, [])
    gap = client - server
    hit = known & (gap >= np.maximum(50.0, server)) & (bursts >= 0.2)
    steps = table["step"].astype(int).tolist()
    ev = [{"what": "client - server TTFT mean (ms)", "value": round(float(g), 1), "step": s}
          for g, s, k in zip(gap, steps, known) if k]
    ev += [{"what": "streams delivered whole", "value": round(float(b), 3), "step": s}
           for b, s in zip(bursts, steps) if not np.isnan(b)]
    return Candidate("frontend_starved", float(hit[known].mean()), ev)


def choose(candidates: list[Candidate], knee_found: bool, client_before: bool,
           server_metrics: bool) -> str:
    """The named cause (see the module docstring's last paragraph)."""
    scores = {c.name: c.score for c in candidates}
    failing = scores.get("server_errors", 0.0)
    if failing >= MIN_SCORE or (failing > 0 and (client_before or not knee_found)):
        return "server_errors"
    if client_before:
        return "client_limited"
    if not server_metrics:
        return "unknown"
    if not knee_found:
        return "frontend_starved" if scores.get("frontend_starved", 0) >= MIN_SCORE else "none"
    best = max(SERVER_CAUSES, key=lambda n: scores.get(n, 0.0))
    if scores.get(best, 0.0) >= MIN_SCORE:
        return best
    return "frontend_starved" if scores.get("frontend_starved", 0) >= MIN_SCORE else "unknown"


def _ev(sig: Signals, series: list[tuple[str, np.ndarray]],
        extra: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    ev = list(extra or [])
    for what, values in series:
        for s, v in zip(sig.steps, values):
            if not np.isnan(v):
                ev.append({"what": what, "value": round(float(v), 4), "step": s})
    return ev


def _bool(v: Any) -> bool | None:
    if isinstance(v, str):
        return v.lower() == "true"
    return None if v is None else bool(v)


def knob(name: str, sig: Signals | None, capacity: dict[str, Any]) -> str:
    """The setting that moves this cause, with the run's numbers where known."""
    fits = capacity.get("formula_max_concurrency")
    fits_txt = f" (the KV pool fits ~{fits:.0f})" if fits else ""
    cap = sig.cap if sig else None
    budget = sig.budget if sig else None
    size = capacity.get("block_size")
    return {
        "seq_cap": f"raise --max-num-seqs{f' above {cap}' if cap else ''}{fits_txt}",
        "kv_exhausted": "give the KV cache more blocks: raise --gpu-memory-utilization, "
                        "--kv-cache-dtype fp8, lower --max-model-len, or more GPUs (tensor "
                        "parallel); or lower --max-num-seqs to stop preemption churn",
        "dashboard_caliber": f"lower --block-size{f' (now {size})' if size else ''}: requests fill "
                             "a small part of their blocks; watch block-level KV usage, not "
                             "token counts",
        "token_budget": f"raise --max-num-batched-tokens{f' (now {budget})' if budget else ''}, or "
                        "set --long-prefill-token-threshold so one long prompt cannot take the "
                        "whole step",
        "prefix_held": "more KV blocks, or --no-enable-prefix-caching if the shared prefixes "
                       "are not reused",
        "frontend_starved": "give vLLM's API server CPU of its own (pin the server and the "
                            "client to separate cores), or --api-server-count > 1",
        "client_limited": "give the load generator more CPU (--workers, separate cores from "
                          "the server) and rerun: the server was not the bottleneck",
        "server_errors": "the server failed requests: check its log / fix the endpoint",
        "none": "load beyond the highest level tried to find the knee",
        "unknown": "collect the server's /metrics (loadlab run --collect) to name the cause",
    }[name]
