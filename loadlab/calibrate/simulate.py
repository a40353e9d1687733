"""One closed-loop level of a real run, replayed through the engine in virtual time.

Each of ``concurrency`` users sends the level's recorded requests (their prompt and
output lengths, in send order, cycled); a request reaches the engine a front end after it
is sent (drawn per request), and its user sends the next one a turnaround after it
finished, both about the calibration's lines at the level's users
(:class:`~loadlab.sim.engine.step_model.Delays`).
The requests measured are those sent after the warm-up and before the level's end,
however late they finish, as the real run's client figures count a step's requests
(:mod:`loadlab.calibrate.runs`): the users go on sending until the last of them is done.
Counting only those finished by the level's end would keep the short ones, and none at
all where a request lasts about half the level. Beside the
client-side latencies, every request carries the sums of the step-time features
(:func:`loadlab.sim.engine.step_model.step_features`) over its prefill steps (first
scheduled to first token) and its decode steps (after the first token to the last): the
fit's linear observations, since a step-time model linear in its terms makes each of
those durations the same linear form of the summed features.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass

import numpy as np

from loadlab.calibrate.runs import Level
from loadlab.sim.engine.calibration import TERMS
from loadlab.sim.engine.core import Engine
from loadlab.sim.engine.step_model import Delays, StepTime, step_features
from loadlab.sim.engine.types import BatchShape, EngineRequest, SchedulerSettings

WARMUP_FRACTION = 0.15   # of the level's duration, cut before measuring (as the real run's)


@dataclass
class LevelTrace:
    """The measured part of one simulated level."""

    ttft_s: np.ndarray          # send -> first token, per request
    e2e_s: np.ndarray           # send -> last token
    itl_p50_s: np.ndarray       # median gap between a request's tokens
    prefill_x: np.ndarray       # (requests, terms) feature sums over prefill steps
    decode_x: np.ndarray        # (requests, terms) over decode steps
    decode_gaps: np.ndarray     # output tokens - 1, per request


def simulate_level(settings: SchedulerSettings, level: Level, step_time: StepTime,
                   delays: Delays) -> LevelTrace:
    """Run ``level`` closed-loop for its duration plus a warm-up; see the module docstring."""
    features: list[tuple[float, ...]] = []

    def timed(batch: BatchShape) -> float:
        features.append(step_features(batch))
        return step_time(batch)

    engine = Engine(settings, timed)
    lengths, warmup = level.lengths, WARMUP_FRACTION * level.duration_s
    t_stop = warmup + level.duration_s
    # users start at seeded random times in the warm-up: in a real step load they join at
    # step boundaries, beside users already mid-request, so they are not in lockstep
    rng = random.Random(level.concurrency)
    sends = sorted((rng.uniform(0.0, warmup / 2), user) for user in range(level.concurrency))
    sent: dict[str, tuple[float, int]] = {}          # rid -> send time, user
    first_step: dict[str, int] = {}
    token_steps: dict[str, list[int]] = {}
    ends: list[float] = []
    done: list[tuple[str, int]] = []                  # (rid, finishing step)
    now, seq = 0.0, 0
    pending: list[tuple[float, int, str, int, int]] = []   # engine arrival, seq, rid, lengths
    measured_open = 0                                 # sent in the window, not finished
    while now < t_stop or measured_open:
        while sends and sends[0][0] <= now:
            t, user = heapq.heappop(sends)
            prompt, output = lengths[seq % len(lengths)]
            rid = f"c{seq}"
            heapq.heappush(pending, (t + delays.front(level.concurrency), seq, rid, prompt,
                                     output))
            sent[rid], seq = (t, user), seq + 1
            measured_open += warmup <= t < t_stop
        while pending and pending[0][0] <= now:
            t, n, rid, prompt, output = heapq.heappop(pending)
            ids = [100_000 + n, *range(1, prompt)]   # unique first token: no prefix hits
            engine.add_request(EngineRequest(rid, ids, output, output, t))
        out = engine.step(now)
        if out is None:
            upcoming = [s[0] for s in sends[:1]] + [p[0] for p in pending[:1]]
            if not upcoming and now >= t_stop:
                break          # nothing left that could finish a measured request
            now = min(upcoming + ([t_stop] if now < t_stop else []))
            continue
        index, now = len(ends), out.t_end
        ends.append(now)
        for rid in out.scheduled:
            first_step.setdefault(rid, index)
        for rid, n in out.new_tokens.items():
            if n:
                token_steps.setdefault(rid, []).append(index)
        for fin in out.finished:
            done.append((fin.request_id, index))
            t_sent, user = sent[fin.request_id]
            measured_open -= warmup <= t_sent < t_stop
            heapq.heappush(sends, (now + delays.turnaround(level.concurrency), user))
    return _trace(np.asarray(features, float).reshape(-1, len(TERMS)), np.asarray(ends), sent,
                  first_step, token_steps, done, (warmup, t_stop))


def _trace(features: np.ndarray, ends: np.ndarray, sent: dict[str, tuple[float, int]],
           first_step: dict[str, int], token_steps: dict[str, list[int]],
           done: list[tuple[str, int]], window: tuple[float, float]) -> LevelTrace:
    """Per request sent in ``window`` (after the warm-up, before the level's end): its
    latencies and feature sums (``cum`` prefix sums over steps, so a span of steps is one
    subtraction)."""
    cum = np.vstack([np.zeros((1, len(TERMS))), np.cumsum(features, axis=0)])
    rows = []
    for rid, last in done:
        t_send = sent[rid][0]
        steps = token_steps.get(rid, [])
        if not window[0] <= t_send < window[1] or not steps:
            continue
        first, times = steps[0], ends[steps]
        gaps = np.diff(times)
        rows.append((times[0] - t_send, times[-1] - t_send,
                     float(np.median(gaps)) if len(gaps) else np.nan,
                     cum[first + 1] - cum[first_step[rid]], cum[last + 1] - cum[first + 1],
                     len(steps) - 1))
    if not rows:
        empty = np.zeros((0, len(TERMS)))
        return LevelTrace(np.array([]), np.array([]), np.array([]), empty, empty, np.array([]))
    ttft, e2e, itl, pre, dec, gaps = (np.array(c, float) for c in zip(*rows, strict=True))
    return LevelTrace(ttft, e2e, itl, pre, dec, gaps)
