"""Fit a profile's prefix structure from prefix-block hash ids (no raw rows leave here).

Steps and defaults
1. Common prefix: leading block positions whose modal id is in at least
   ``COMMON_SHARE`` (90%) of requests.
2. Chains, in time order (file order without timestamps): a request's hit is the
   leading run of its blocks an earlier request held (a trie of block paths), in
   tokens ``blocks x block_tokens`` capped at its input. When the run goes beyond the
   common prefix, its parent is the latest earlier request holding the whole run.
   A session is a request without a parent and its descendants (in both Mooncake
   traces nearly every parent has one child, none more than two: sessions are chains).
3. Later turns (requests with a parent) *extend* when they hold all their parent's
   full blocks and are not shorter (growth = input - parent's input), else *branch*
   (keep = hit / parent's input, new = input - hit, at least 1).
4. Classes: sessions by turns from ``TURN_CLASS_MINS`` (1, 2, 3, 5, 10; a class of
   fewer than ``MIN_SESSIONS`` (30) sessions joins the one below); previous prompts
   by context edges at the ``CONTEXT_CLASSES`` (4)-quantiles of the parents' inputs.
   How a conversation goes on depends on both: in the Mooncake conversation trace,
   sessions of 10+ turns grow ~730 tokens a turn and those of 2 turns ~2,700, and a
   turn after a 16-32k prompt branches (drops part of it) 32% of the time, after a
   prompt under 4k 1%. Pooled over both, the sampler's reuse came out at 0.43 against
   the trace's 0.37; with both, 0.374.
5. Cells (turn class with sessions of 2+ turns x context class) take their figures
   from their own later turns when there are at least ``MIN_CELL`` (30), else from
   their context class over all turn classes: extend share, growth (extends), keep
   and new (branches).
6. Tables: turns per session on ``PROBS``, first prompts per class on
   ``COARSE_PROBS``, cell tables on ``CELL_PROBS``. ``active`` = ``ACTIVE_SESSIONS``
   (16), an assumption of the load test, not a trace figure (the trace's sessions ran
   for minutes, hundreds at once); ``loadlab profile show`` prints the cache it needs.
7. Reuse figures in time order with an infinite cache: block reuse ratio, token
   prefix hit ratio, the same when every extending turn hits its parent's whole prompt
   (what a 16-token-block cache would see, which 512-token blocks cannot show), sessions,
   turns, and the gap from a turn's parent in seconds and requests.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from loadlab.workload.model import Prefix, Sessions, Transition, TurnClass
from loadlab.workload.tables import quantile_table, summary

COMMON_SHARE = 0.9
TURN_CLASS_MINS = (1, 2, 3, 5, 10)
MIN_SESSIONS = 30
CONTEXT_CLASSES = 4
MIN_CELL = 30
ACTIVE_SESSIONS = 16
COARSE_PROBS: list[float] = sorted({k / 40 for k in range(41)} | {0.99, 0.999})
CELL_PROBS: list[float] = [0.0, 0.01, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99,
                           1.0]


@dataclass(frozen=True)
class Chains:
    """Per request, in time order: hit tokens, parent (-1: none) and session root."""

    order: np.ndarray
    inputs: np.ndarray
    blocks: np.ndarray
    hit: np.ndarray
    lead: np.ndarray
    parent: np.ndarray
    root: np.ndarray


def common_blocks(hash_ids: list[list[int]]) -> int:
    """Step 1: leading positions whose modal id opens at least COMMON_SHARE of requests."""
    common = 0
    while True:
        at_k = Counter(ids[common] for ids in hash_ids if len(ids) > common)
        if not at_k or at_k.most_common(1)[0][1] < COMMON_SHARE * len(hash_ids):
            return common
        common += 1


def chains(hash_ids: list[list[int]], inputs: np.ndarray, block: int, common: int,
           times: np.ndarray | None) -> Chains:
    """Step 2, in time order (stable, so ties keep file order)."""
    n = len(hash_ids)
    order = np.argsort(times, kind="stable") if times is not None else np.arange(n)
    node_of: dict[tuple[int, int], int] = {}
    holder: list[int] = []  # node -> latest request (position in order) that held it
    lead = np.zeros(n, dtype=np.int64)
    parent = np.full(n, -1, dtype=np.int64)
    for pos, r in enumerate(order):
        node, path = -1, []
        for b in hash_ids[r]:
            node = node_of.setdefault((node, b), len(holder))
            if node == len(holder):
                holder.append(-1)
            path.append(node)
        seen = 0
        while seen < len(path) and holder[path[seen]] >= 0:
            seen += 1
        lead[pos] = seen
        if seen > common:
            parent[pos] = holder[path[seen - 1]]
        for nd in path:
            holder[nd] = pos
    ins = inputs[order].astype(np.int64)
    root = np.arange(n)
    for pos in range(n):
        if parent[pos] >= 0:
            root[pos] = root[parent[pos]]
    blocks = np.array([len(hash_ids[r]) for r in order], dtype=np.int64)
    return Chains(order, ins, blocks, np.minimum(lead * block, ins), lead, parent, root)


def reuse_stats(hash_ids: list[list[int]], ch: Chains, block: int) -> dict[str, float]:
    """Step 7 (figures not tied to the session model)."""
    seen: set[int] = set()
    reused = 0
    for r in ch.order:
        ids = hash_ids[r]
        reused += sum(1 for b in ids if b in seen)
        seen.update(ids)
    later = ch.parent >= 0
    whole = ch.hit.copy()
    extends = _extends(ch)
    whole[later] = np.where(extends, np.maximum(ch.inputs[ch.parent[later]], ch.hit[later]),
                            ch.hit[later])
    total = float(ch.inputs.sum())
    return {
        "block_reuse_ratio": round(reused / int(ch.blocks.sum()), 4),
        "token_prefix_hit_ratio": round(float(ch.hit.sum()) / total, 4),
        "token_hit_ratio_whole_parent": round(float(whole.sum()) / total, 4),
        "requests": float(len(hash_ids)),
    }


def _extends(ch: Chains) -> np.ndarray:
    """Step 3, per later turn (requests with a parent, in time order)."""
    later = np.flatnonzero(ch.parent >= 0)
    par = ch.parent[later]
    return (ch.lead[later] >= ch.blocks[par] - 1) & (ch.inputs[later] >= ch.inputs[par])


def _transition(turns: np.ndarray, ch: Chains, extends: np.ndarray) -> Transition:
    """One cell's figures from its later turns (indices into the later-turn arrays)."""
    later = np.flatnonzero(ch.parent >= 0)[turns]
    par = ch.parent[later]
    ext = extends[turns]
    growth = ch.inputs[later][ext] - ch.inputs[par][ext]
    branch = ~ext
    hit, prev = ch.hit[later][branch], ch.inputs[par][branch]
    return Transition(
        samples=int(turns.size),
        extend_share=round(float(ext.mean()), 4),
        growth_tokens=quantile_table(growth, CELL_PROBS) if growth.size else None,
        keep_share=quantile_table(np.minimum(hit / prev, 1.0), CELL_PROBS) if hit.size else None,
        new_tokens=quantile_table(np.maximum(ch.inputs[later][branch] - hit, 1), CELL_PROBS)
        if hit.size else None,
    )


def _within(turns: np.ndarray, mins: list[int], k: int) -> np.ndarray:
    """Which of ``turns`` fall in class ``k`` (from mins[k] up to the next class's)."""
    inside = turns >= mins[k]
    return inside & (turns < mins[k + 1]) if k + 1 < len(mins) else inside


def _class_mins(turns: np.ndarray) -> list[int]:
    """Step 4's turn classes, each of at least MIN_SESSIONS sessions but the first."""
    mins = [m for m in TURN_CLASS_MINS if (turns >= m).any()]
    for k in range(len(mins) - 1, 0, -1):
        if _within(turns, mins, k).sum() < MIN_SESSIONS:
            del mins[k]
    return mins


def fit_sessions(ch: Chains, times: np.ndarray | None) -> Sessions:
    """Steps 3-6."""
    roots, turns = np.unique(ch.root, return_counts=True)
    n_turns = dict(zip(roots.tolist(), turns.tolist()))
    later = np.flatnonzero(ch.parent >= 0)
    prev = ch.inputs[ch.parent[later]]
    edges = [0.0] + sorted({float(round(q)) for q in np.quantile(
        prev, [k / CONTEXT_CLASSES for k in range(1, CONTEXT_CLASSES)])} - {0.0})
    context = np.searchsorted(edges, prev, side="right") - 1
    session_turns = np.array([n_turns[int(r)] for r in ch.root[later]])
    extends = _extends(ch)
    mins = _class_mins(turns)
    pooled = [_transition(np.flatnonzero(context == c), ch, extends)
              for c in range(len(edges))]
    classes = []
    for k, lo in enumerate(mins):
        in_class = _within(turns, mins, k)
        transitions = []
        if k + 1 == len(mins) or mins[k + 1] > 2:  # the class has sessions of 2+ turns
            for c in range(len(edges)):
                cell = np.flatnonzero((context == c) & _within(session_turns, mins, k))
                transitions.append(_transition(cell, ch, extends)
                                   if cell.size >= MIN_CELL else pooled[c])
        first = quantile_table(ch.inputs[roots[in_class]], COARSE_PROBS)
        classes.append(TurnClass(min_turns=lo, sessions=int(in_class.sum()), first_tokens=first,
                                 transitions=transitions))
    gap = None
    if times is not None:
        ordered = times[ch.order]
        gap = summary(ordered[later] - ordered[ch.parent[later]])
    return Sessions(active=ACTIVE_SESSIONS, turns=quantile_table(turns), context_edges=edges,
                    classes=classes, gap_s=gap)


def fit_prefix(hash_ids: list[list[int]], inputs: np.ndarray, block: int,
               times: np.ndarray | None) -> Prefix:
    """The prefix structure of a hash-id trace: sessions, or a shared prefix, or none."""
    common = common_blocks(hash_ids)
    ch = chains(hash_ids, inputs, block, common, times)
    stats = reuse_stats(hash_ids, ch, block)
    common_tokens = common * block
    if not (ch.parent >= 0).any():
        return Prefix(kind="shared" if common_tokens else "none", block_tokens=block,
                      common_tokens=common_tokens, stats=stats)
    sessions = fit_sessions(ch, times)
    later = ch.parent >= 0
    stats |= {
        "sessions": float(np.unique(ch.root).size),
        "later_turn_share": round(float(later.mean()), 4),
        "gap_requests_p50": float(np.median(np.flatnonzero(later) - ch.parent[later])),
    }
    return Prefix(kind="sessions", block_tokens=block, common_tokens=common_tokens,
                  sessions=sessions, stats=stats)
