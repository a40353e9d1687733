"""Sessions: which session and turn request ``seq`` is, and how long its prompt is.

A profile with ``prefix.kind: sessions`` describes conversations (a chat resends its
history every turn) and repeated questions on one document. Request ``seq`` stays a
pure function of (profile, seed, seq), so sessions are laid out over the seq space:

1. Slots. ``active`` sessions are in progress at once. Request ``seq`` is request
   ``k = seq // active`` of slot ``seq % active``. A slot runs its sessions one after
   another; session ``m`` of slot ``s`` has T turns drawn from ``turns`` by a uniform
   keyed by (seed, s, m), so a slot's session starts are a cumulative sum, extended
   once per process as far as asked and then bisected. A slot's first session is
   drawn length-biased (T with probability proportional to T x P(T), on
   ``FIRST_SESSION_GRID`` points of the table): the session a slot is in at a random
   moment, so a run's first minutes see the mix of turns of its later ones (with
   plain draws, mooncake-conversation's first 300 requests reused 0.33 of their
   tokens on average over seeds instead of 0.37). Consecutive turns of a session are
   ``active`` requests apart: at a concurrency up to
   ``active`` a turn is sent about when the one before it has been answered, and a
   server whose prefix cache holds ``active`` sessions' prompts reuses what the
   source reused within minutes of load (the source's turns came minutes apart,
   hundreds of requests apart). Session id = 1 + m * active + s (the ``prefix_group``;
   0 stays the common prefix's). Workers striding the seq space need no shared state.
2. Turns. A session's turns are drawn together from uniforms keyed by (seed, session
   id, turn) and kept in a small cache. The session's turn class (by T) gives its
   first prompt (``first_tokens``, at least the common prefix + 1). Turn j >= 1
   takes the transition of its cell (turn class, context class of turn j-1's
   prompt) and
   - extends, with probability ``extend_share``: prompt = the previous prompt +
     ``growth_tokens``, all of it but the last token session text;
   - or branches: it keeps the leading ``keep_share`` of the previous prompt (at
     least the common prefix, at most the session text sent so far) and adds
     ``new_tokens`` of its own.
3. Sharing. Each session has one text, opening with the common prefix. A turn's
   ``context_tokens`` (the spec's ``prefix_tokens``) are its leading tokens of that
   text: all but the last prompt token for a first or extending turn, what it keeps
   for a branching one; the rest of its prompt is its own. Two turns of a session
   share the shorter of their contexts, turns of different sessions the common
   prefix. ``reused_tokens`` = the longest context the session sent before, capped
   at this turn's (for a first turn the common prefix, which every request but
   request 0 finds sent): what a prefix cache that kept everything would hit.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np

from loadlab.workload import rng
from loadlab.workload.model import Sessions, Table
from loadlab.workload.quantile import QuantileFn

_TURNS_STREAM = 0x8D
_TURN_STREAM = 0x9E
FIRST_SESSION_GRID = 20_000


@dataclass(frozen=True)
class Turn:
    """One request of a session, in tokens."""

    session: int
    turn: int
    prompt_tokens: int
    context_tokens: int
    reused_tokens: int


class _Step:
    """A transition's tables as functions."""

    def __init__(self, extend_share: float, growth: Table | None, keep: Table | None,
                 new: Table | None) -> None:
        self.extend_share = extend_share
        self.growth = QuantileFn(growth) if growth else None
        self.keep = QuantileFn(keep) if keep else None
        self.new = QuantileFn(new) if new else None


class SessionLayout:
    """Turns of request ``seq`` for one (sessions model, common prefix, seed)."""

    def __init__(self, model: Sessions, common_tokens: int, seed: int,
                 active: int | None = None) -> None:
        self.active = int(active or model.active)
        self.common = int(common_tokens)
        self.seed = int(seed)
        self._turns = QuantileFn(model.turns)
        self._mins = [c.min_turns for c in model.classes]
        self._first = [QuantileFn(c.first_tokens) for c in model.classes]
        self._steps = [
            [_Step(t.extend_share, t.growth_tokens, t.keep_share, t.new_tokens)
             for t in c.transitions]
            for c in model.classes
        ]
        self._edges = list(model.context_edges)
        self._first_cum, self._first_turns = _length_biased(model.turns)
        self._starts: list[list[int]] = [[0] for _ in range(self.active)]
        self._session = lru_cache(maxsize=4 * self.active + 64)(self._draw_session)

    def turn(self, seq: int) -> Turn:
        """Request ``seq`` as a turn of its session (step 1 of the module docstring)."""
        slot, k = seq % self.active, seq // self.active
        starts = self._starts[slot]
        while starts[-1] <= k:
            starts.append(starts[-1] + self._session_turns(slot, len(starts) - 1))
        m = bisect_right(starts, k) - 1
        turn = self._session(1 + m * self.active + slot, starts[m + 1] - starts[m])[k - starts[m]]
        return replace(turn, reused_tokens=0) if seq == 0 else turn  # nothing was sent before

    def _session_turns(self, slot: int, m: int) -> int:
        u = rng.uniforms(rng.key(self.seed, _TURNS_STREAM, slot, m), 1)[0]
        if m == 0:
            return self._first_turns[min(bisect_right(self._first_cum, u),
                                         len(self._first_turns) - 1)]
        return max(1, round(self._turns(u)))

    def _draw_session(self, session: int, n_turns: int) -> list[Turn]:
        """Every turn of a session (steps 2 and 3 of the module docstring)."""
        cls = bisect_right(self._mins, n_turns) - 1
        u = rng.uniforms(rng.key(self.seed, _TURN_STREAM, session, 0), 1)[0]
        prompt = max(self.common + 1, round(self._first[cls](u)))
        sent = prompt - 1  # the longest context of the session so far
        turns = [Turn(session, 0, prompt, sent, min(self.common, sent))]
        for j in range(1, n_turns):
            step = self._steps[cls][bisect_right(self._edges, prompt) - 1]
            u_kind, u_a, u_b = rng.uniforms(rng.key(self.seed, _TURN_STREAM, session, j), 3)
            if u_kind < step.extend_share:  # the model guarantees the tables each kind needs
                assert step.growth is not None
                prompt += max(0, round(step.growth(u_a)))
                context = prompt - 1
                reused = min(context, sent)
                sent = max(sent, context)
            else:
                assert step.keep is not None and step.new is not None
                context = min(max(round(step.keep(u_a) * prompt), self.common), sent)
                prompt = context + max(1, round(step.new(u_b)))
                reused = context
            turns.append(Turn(session, j, prompt, context, reused))
        return turns


def _length_biased(table: Table) -> tuple[list[float], list[int]]:
    """Cumulative probabilities and turn counts of T drawn with weight T (step 1)."""
    grid = (np.arange(FIRST_SESSION_GRID) + 0.5) / FIRST_SESSION_GRID
    turns = np.maximum(1, np.round(np.interp(grid, table.p, table.v))).astype(int)
    return (np.cumsum(turns) / turns.sum()).tolist(), turns.tolist()
