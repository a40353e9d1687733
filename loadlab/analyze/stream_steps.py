"""The scheduler's engine steps as a streaming client sees them.

/metrics are scraped every 1 to 15 s; the scheduler decides at every engine step, a few to a
few tens of milliseconds apart. A streaming client sees each step: every request decoding in
it receives its token when the step ends, so the arrival times of all streams cluster at the
step ends. From the client's own records, at each step end:

- the requests decoding (past their first token, not yet at their last), against the most
  decoding at once over the steps read: near it, the batch is full. Counted this way, not
  as the tokens that arrived together, because a real client reads one step's chunks a few
  milliseconds apart, or two steps' in one read (a tiny model on vLLM's CPU backend: a cap
  of 4 read as clusters of 1 to 8);
- whether a request waited (sent, no first token yet; a prompt still in chunked prefill
  counts too);
- the blocks held: per request between its first and last token, ``ceil(prompt /
  block_size)`` plus its output so far (interpolated between the two), against the pool's
  ``num_gpu_blocks``;
- the head of the queue (the earliest sent of the waiting requests) and the blocks its prompt
  needs.

These are the checks ``Scheduler.schedule`` makes before admitting the head of its waiting
queue (vllm-project/vllm ``vllm/v1/core/sched/scheduler.py``: seats, then blocks from
``KVCacheManager.allocate_slots``). How often each held over the steps that ended with a
queue is an input of the cause arbiter (:mod:`loadlab.analyze.arbiter`). Scrapes cannot
give it: a window holds 1 to 15 gauge samples and hundreds of steps.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.compute as pc

from loadlab.runstore.layout import REQUESTS_TABLE
from loadlab.runstore.schema import REQUESTS
from loadlab.runstore.writer import read_table

COLUMNS = ["t_sent", "t_first_token", "t_done", "prompt_tokens", "output_tokens", "itl_p50_s",
           "chunk_offsets_s"]
FULL_BATCH = 0.95
"""A step decodes a full batch when it decodes at least this share of the most requests
decoding at once (:data:`MOST_QUANTILE`): the seats were all taken."""
MOST_QUANTILE = 0.99
"""The most requests decoding at once is this quantile over the steps read, not the maximum:
a request whose last chunk the client reads just after the next request's first would lift
a maximum above the cap for one step."""
SAME_STEP = 0.2
"""Tokens that arrive within this share of the median inter-token gap of each other came out
of one engine step. The simulator stamps a step's tokens with one time; a real server's
front end writes them a few milliseconds apart, a step lasting tens."""
MAX_TOKENS = 20_000_000
"""The most streamed tokens read (160 MB of offsets; at this many the figures cost about
2.7 s and 650 MB, benchmarks/bench_stream_steps.py); a longer stalled span goes without
them (NaN) rather than exhausting memory."""
FEATURES = ("stream_queued_mean", "stream_queued_min", "stream_full_batch", "stream_head_short",
            "stream_head_short_room", "stream_head_short_seats", "stream_neither",
            "stream_decoding_rel", "stream_free_rel")
"""What :func:`step_figures` returns, over the steps that ended with a request waiting: the
share of steps with a queue per stalled window (mean, least); the share that decoded a full
batch; the share where the head needed more blocks than were free; of those, the share whose
free blocks would have held a median request (the head's own size stopped it); the share
where the head was short of blocks with seats free; the share with neither; the batch decoded
over the most decoding at once; the free blocks over the pool."""


def run_figures(run_dir: str | Path, windows: pd.DataFrame, pool: int | None,
                block_size: int | None, typical_blocks: float | None) -> dict[str, float]:
    """:func:`step_figures` of a run folder's streams over ``windows`` (the stalled steps)."""
    if windows.empty or not pool or not block_size:
        return dict.fromkeys(FEATURES, np.nan)
    streams = read_streams(run_dir, float(windows["t_start"].min()))
    return step_figures(streams, windows, pool, block_size, typical_blocks)


def read_streams(run_dir: str | Path, t_from: float) -> pd.DataFrame:
    """The client records of the requests still in flight at ``t_from`` or later (those done
    before it neither wait nor hold blocks after it), with their token offsets; empty when
    the run streamed more tokens than :data:`MAX_TOKENS` in that span or none at all."""
    path = Path(run_dir) / REQUESTS_TABLE
    done_after = pc.field("t_done") >= t_from
    sizes = read_table(path, REQUESTS, columns=["n_chunks"], where=done_after)
    if sizes.empty or float(sizes["n_chunks"].fillna(0).sum()) > MAX_TOKENS:
        return pd.DataFrame(columns=COLUMNS)
    return read_table(path, REQUESTS, columns=COLUMNS, where=done_after)


def step_ends(times: np.ndarray, same_step_s: float) -> np.ndarray:
    """The engine steps' end times from every token's arrival time: sorted, a step ends
    where the next arrival is more than ``same_step_s`` later (its first arrival stands
    for it)."""
    t = np.sort(times)
    if not len(t):
        return t
    return t[np.concatenate([[True], np.diff(t) > same_step_s])]


def step_figures(streams: pd.DataFrame, windows: pd.DataFrame, pool: int | None,
                 block_size: int | None, typical_blocks: float | None) -> dict[str, float]:
    """:data:`FEATURES` over the engine steps that end inside ``windows`` (``t_start``,
    ``t_end``); NaN each where the run has no streams, no pool or no block size."""
    empty = dict.fromkeys(FEATURES, np.nan)
    r = streams[streams["t_first_token"].notna() & streams["t_done"].notna()]
    if r.empty or not pool or not block_size or windows.empty:
        return empty
    r = r.sort_values("t_sent", kind="stable")
    sent, first, done = (r[c].to_numpy(dtype=float) for c in ("t_sent", "t_first_token", "t_done"))
    prompt = r["prompt_tokens"].to_numpy(dtype=float)
    output = r["output_tokens"].to_numpy(dtype=float)
    streamed = [s + np.asarray(o, dtype=float) for s, o in zip(sent, r["chunk_offsets_s"])
                if o is not None and len(o)]
    if not streamed:
        return empty
    arrivals = np.concatenate(streamed)
    gap = float(np.nanmedian(r["itl_p50_s"].to_numpy(dtype=float)))
    ends = step_ends(arrivals, SAME_STEP * gap if np.isfinite(gap) else 0.0)
    sorted_first, sorted_done = np.sort(first), np.sort(done)

    def decoding(e: np.ndarray) -> np.ndarray:
        return (np.searchsorted(sorted_first, e, side="right")     # first token by e,
                - np.searchsorted(sorted_done, e, side="left"))     # last not before it

    full = max(float(np.quantile(decoding(ends), MOST_QUANTILE)), 1.0)
    held = _held_blocks(first, done, prompt, output, block_size)
    head_of = np.maximum.accumulate(first)   # head(e): the first in send order with first > e
    parts, queued_share = [], []
    for w in windows.itertuples(index=False):
        e = ends[(ends >= w.t_start) & (ends < w.t_end)]
        if not len(e):
            continue
        d = decoding(e)
        queued = np.searchsorted(sent, e, side="left") > np.searchsorted(sorted_first, e,
                                                                            side="right")
        queued_share.append(queued.mean())
        free = pool - held(e)
        head = np.minimum(np.searchsorted(head_of, e, side="right"), len(sent) - 1)
        short = np.ceil((prompt[head] + 1) / block_size) > free
        parts.append(pd.DataFrame({"queued": queued, "full": d >= FULL_BATCH * full,
                                   "short": short, "room": free >= (typical_blocks or np.inf),
                                   "decoding": d / full, "free": free / pool}))
    if not parts:
        return empty
    steps = pd.concat(parts)
    q = steps[steps["queued"]]
    n, short = max(len(q), 1), int(q["short"].sum())
    return {
        "stream_queued_mean": float(np.mean(queued_share)),
        "stream_queued_min": float(np.min(queued_share)),
        "stream_full_batch": float(q["full"].sum() / n),
        "stream_head_short": short / n,
        "stream_head_short_room": float((q["short"] & q["room"]).sum() / short) if short
        else np.nan,
        "stream_head_short_seats": float((q["short"] & ~q["full"]).sum() / n),
        "stream_neither": float((~q["short"] & ~q["full"]).sum() / n),
        "stream_decoding_rel": float(q["decoding"].mean()) if len(q) else np.nan,
        "stream_free_rel": float(q["free"].mean()) if len(q) else np.nan,
    }


def _held_blocks(first: np.ndarray, done: np.ndarray, prompt: np.ndarray, output: np.ndarray,
                 block_size: int) -> Callable[[np.ndarray], np.ndarray]:
    """Blocks held at any time, as a function of it: each request from its first token to its
    last holds its prompt's blocks and its output so far, grown evenly between the two (a
    sweep over the first and last tokens, so a step costs a lookup)."""
    rate = output / np.maximum(done - first, 1e-9) / block_size
    events = np.concatenate([first, done])
    order = np.argsort(events, kind="stable")
    t = events[order]
    blocks = np.cumsum(np.concatenate([np.ceil(prompt / block_size),
                                       -np.ceil(prompt / block_size)])[order])
    slope = np.cumsum(np.concatenate([rate, -rate])[order])
    offset = np.cumsum(np.concatenate([rate * first, -rate * first])[order])

    def at(e: np.ndarray) -> np.ndarray:
        k = np.searchsorted(t, e, side="right") - 1
        i = np.maximum(k, 0)
        return np.where(k >= 0, blocks[i] + e * slope[i] - offset[i], 0.0)
    return at
