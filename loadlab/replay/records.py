"""Replay's request records: token times per request, and REQUESTS rows built in bulk.

:class:`TokenTimes` keeps each request's token times as a slice of the step-end
timeline. :class:`RequestRows` keeps, per request done, one tuple and its token times
(a numpy view, no copy) and builds every REQUESTS column at a flush with numpy: the
ITL figures of a request whose times are a timeline slice from order statistics of
windows of the step gaps, for all such requests at once (:func:`window_gap_quantiles`),
the others' from the gaps of a few dozen requests' times at a time
(:func:`gap_quantiles`: each one's gaps sorted in place), the constant columns as
constants. Per request that leaves one tuple append: a
dict per row and per-row quantiles cost ~28 us a request, a third of the replay's own
work (``benchmarks/bench_sim_replay.py``). A request whose times are a slice of its
replica's timeline is written as pointers into it (REQUESTS ``token_timeline``,
``token_step``, ``t_sent_clock_s``), the timelines' new step ends as a STEP_ENDS part
before each requests part: the 2.5M token offsets of a 10-minute replay at 256 users
(20 MB) were the largest part of its writes, and readers rebuild them exactly
(:mod:`loadlab.runstore.token_steps`). Only rows with their own times (preempted) get
a ``chunk_offsets_s`` list. Only string columns are dictionary-encoded
(:func:`loadlab.runstore.encoding.string_columns`: a dictionary of distinct floats is
costly and useless).
Flushing: every ``flush_rows`` rows or when the oldest buffered row is
``flush_interval_s`` wall seconds old, and at :meth:`close`.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from loadlab.replay.order_stats import kth_smallest
from loadlab.runstore import REQUESTS, STEP_ENDS, PartWriter
from loadlab.runstore.encoding import string_columns
from loadlab.sim.engine.types import StepOutput

_OFFSETS = "chunk_offsets_s"
ENDPOINT = "sim://replay"   # the endpoint and worker columns of a replay's rows
WORKER = "sim-replay"
_ABORTED = "aborted at end of plan"
_CHUNK = 32   # requests whose gaps, or offsets, are made in one array operation: that
              # array (~100 kB) stays under malloc's mmap threshold, so reuses warm memory


class SentRequest(NamedTuple):
    """What the record of a request in flight needs besides its token times: a tuple in
    the order of its REQUESTS columns, so that a part's rows transpose into columns at
    once (``zip(*requests)``)."""

    step: int
    user: int | None
    seq: int
    t_sent: float
    prompt_len: int
    target_prompt: int
    target_output: int
    group: int | None
    prefix: int
    replica: int


# A row queued at a request's end: what it was sent as, its id, ok, t_done, its load
# step's concurrency and target rate, and its first token's step (-1: its own times).
_Row = tuple[SentRequest, str, bool, float, int | None, float | None, int]


class TokenTimes:
    """Each request's token times, without touching every request at every step.

    A decoding request nearly always emits at every step end from its first token to
    its last, so its times are a slice of the step-end timeline (a numpy view, no copy).
    Only a request that skips a step while alive (preempted, or left without token
    budget) gets its own list, from the skip on. Which requests skipped, the engine's
    metrics already work out for the ITL histogram (``EngineMetrics.stopped``): per
    step, that is all this reads besides the step's first tokens.
    """

    def __init__(self) -> None:
        self._ends = np.empty(4096)
        self._n = 0
        self._first: dict[str, int] = {}          # id -> index of its first-token step
        self._own: dict[str, list[float]] = {}    # ids that skipped a step: explicit times

    def observe(self, out: StepOutput, stopped: Collection[str]) -> None:
        """Step ``out`` ended; ``stopped``: the ids alive that emitted at the previous
        step end and not at this one (``EngineMetrics.stopped``, after it saw ``out``)."""
        j, t = self._n, out.t_end
        if j == len(self._ends):
            self._ends = np.concatenate((self._ends, np.empty(j)))
        self._ends[j] = t
        self._n = j + 1
        first = self._first
        for rid in out.first_token:
            first[rid] = j
        own = self._own
        for rid in stopped:
            start = first.get(rid)   # (None: popped already, its record written)
            if start is not None and rid not in own:
                own[rid] = self._ends[start:j].tolist()
        if own:
            for rid in out.emitted & own.keys():
                own[rid].append(t)

    def pop(self, rid: str) -> tuple[np.ndarray, int | None]:
        """Token times of a request that is done (finished, or aborted after the last
        step), and the index of its first token's step when they are the timeline's
        from there on (None: its own times, or none)."""
        first = self._first.pop(rid, None)
        own = self._own.pop(rid, None)
        if own is not None:
            return np.array(own), None
        if first is None:
            return np.empty(0), None
        return self._ends[first:self._n], first

    @property
    def steps(self) -> int:
        """Step ends seen so far."""
        return self._n

    def ends(self, since: int) -> np.ndarray:
        """The step ends from index ``since`` on (a view)."""
        return self._ends[since:self._n]


def segment_quantile(gaps: np.ndarray, start: np.ndarray, count: np.ndarray,
                     q: float) -> np.ndarray:
    """Linear-interpolation quantile (numpy's default method) of each sorted segment
    ``gaps[start:start + count]`` (count >= 1), for all segments at once."""
    pos = q * (count - 1)
    lo = pos.astype(np.int64)
    hi = np.minimum(lo + 1, count - 1)
    low = gaps[start + lo]
    return low + (gaps[start + hi] - low) * (pos - lo)


def gap_quantiles(times: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(p50, p99, max) of the gaps between successive token times of each request
    (0 for a request of fewer than two tokens).

    _CHUNK requests at a time: their times joined in one small array, its gaps made and
    each request's sorted in place. No array of every token or every gap is made: that
    was a fresh 8 bytes a token, whose page faults cost more than the sorting on this VM
    (~0.1 s of sys time for the 4M tokens of a 2-minute 8 x 256 fleet replay), and a
    replay's times are views of its timelines that nothing else needs joined.
    """
    n = len(times)
    out = np.zeros((3, n))
    for i in range(0, n, _CHUNK):
        j = min(i + _CHUNK, n)
        part = np.concatenate(times[i:j])
        count = np.fromiter(map(len, times[i:j]), np.int64, j - i) - 1
        multi = count > 0
        start = (np.cumsum(count + 1) - count - 1)[multi]
        count = count[multi]
        gaps = part[1:] - part[:-1]
        for lo, c in zip(start.tolist(), count.tolist()):
            gaps[lo:lo + c].sort()
        rows = np.flatnonzero(multi) + i
        out[0, rows] = segment_quantile(gaps, start, count, 0.5)
        out[1, rows] = segment_quantile(gaps, start, count, 0.99)
        out[2, rows] = gaps[start + count - 1]
    return out[0], out[1], out[2]


def window_gap_quantiles(timelines: Sequence[np.ndarray], timeline: np.ndarray,
                         first: np.ndarray, count: np.ndarray) -> np.ndarray:
    """(p50, p99, max), as rows of one array, of the gaps between the ``count`` (>= 2)
    successive step ends from ``first`` of ``timelines[timeline]``, for every request:
    :func:`gap_quantiles`' figures, from order statistics of windows of the step gaps
    (:func:`~loadlab.replay.order_stats.kth_smallest`) instead of a sort per request."""
    gaps = [t[1:] - t[:-1] for t in timelines]
    base = np.zeros(len(gaps), np.int64)
    np.cumsum([len(g) for g in gaps[:-1]], out=base[1:])
    m = count - 1                                   # each request's gaps
    lo = base[timeline] + first
    pos = [q * (m - 1) for q in (0.5, 0.99)]
    low = [p.astype(np.int64) for p in pos]
    ranks = [low[0], np.minimum(low[0] + 1, m - 1), low[1], np.minimum(low[1] + 1, m - 1),
             m - 1]
    v = kth_smallest(np.concatenate(gaps), np.tile(lo, 5), np.tile(lo + m, 5),
                     np.concatenate(ranks)).reshape(5, -1)
    return np.stack((v[0] + (v[1] - v[0]) * (pos[0] - low[0]),
                     v[2] + (v[3] - v[2]) * (pos[1] - low[1]), v[4]))


class RequestRows:
    """REQUESTS rows of one replay: a tuple and the token times per request, one table
    per part (module docstring). ``epoch`` is the unix time of virtual 0. Token times
    that are a slice of a replica's step ends (``timelines[replica]``) are written as
    pointers into them; those step ends go to ``step_ends`` (STEP_ENDS) first, so a
    requests part on disk never points past the step ends on disk."""

    def __init__(self, writer: PartWriter, step_ends: PartWriter, timelines: Sequence[TokenTimes],
                 point: str, epoch: float, flush_rows: int = 20_000,
                 flush_interval_s: float = 30.0) -> None:
        self.writer = writer
        self.step_ends = step_ends
        self.timelines = timelines
        self.point = point
        self.epoch = epoch
        self.flush_rows = flush_rows
        self.flush_interval_s = flush_interval_s
        self._rows: list[_Row] = []
        self._times: list[np.ndarray] = []
        self._written = [0] * len(timelines)   # step ends of each timeline on disk
        self._last_flush = time.monotonic()

    def add(self, req: SentRequest, rid: str, ok: bool, t_done: float, concurrency: int | None,
            target_rate: float | None, times: np.ndarray, first: int | None) -> None:
        """Queue the row of a request done at virtual ``t_done`` (``ok``: finished, else
        aborted at the end of the plan) whose tokens came at virtual ``times``, which are
        its replica's step ends from index ``first`` on unless that is None;
        ``concurrency`` / ``target_rate``: its load step's."""
        self._rows.append((req, rid, ok, t_done, concurrency, target_rate,
                           -1 if first is None else first))
        self._times.append(times)
        if (len(self._rows) >= self.flush_rows
                or time.monotonic() - self._last_flush >= self.flush_interval_s):
            self.flush()

    def flush(self) -> None:
        rows, times = self._rows, self._times
        self._rows, self._times = [], []
        self._last_flush = time.monotonic()
        if rows:
            self._write_step_ends()
            self.writer.write_table(self._table(rows, times),
                                    dictionary_columns=string_columns(REQUESTS))

    def _write_step_ends(self) -> None:
        """The step ends each timeline gained since the last flush, as one STEP_ENDS part."""
        counts = [t.steps for t in self.timelines]
        if counts == self._written:
            return
        ends = [t.ends(k) for t, k in zip(self.timelines, self._written, strict=True)]
        sizes = [len(e) for e in ends]
        step = np.concatenate([np.arange(k, n) for k, n in zip(self._written, counts,
                                                                 strict=True)])
        self.step_ends.write_table(pa.Table.from_arrays([
            pa.array(np.repeat(np.arange(len(ends), dtype=np.int32), sizes)),
            pa.array(step.astype(np.int32)),
            pa.array(np.concatenate(ends))], schema=STEP_ENDS),
            dictionary_columns=string_columns(STEP_ENDS))
        self._written = counts

    def _table(self, rows: list[_Row], times: list[np.ndarray]) -> pa.Table:
        """The REQUESTS table of ``rows``: every column a numpy or pyarrow operation."""
        n, epoch = len(rows), self.epoch
        reqs, rids, oks, dones, concurrency, target_rate, firsts = zip(*rows, strict=True)
        step, user, seq, sent, prompt, target_prompt, target_output, group, prefix, replica = zip(
            *reqs, strict=True)
        t_sent = np.array(sent)
        t_done = np.array(dones)
        ok = np.array(oks)
        token_step = np.array(firsts)
        pointed = token_step >= 0
        lens = np.fromiter(map(len, times), np.int64, n)
        has = lens > 0
        timeline = np.array(replica)
        first, last = self._first_last(times, timeline, token_step, lens)
        multi = lens > 1
        itl_mean = np.zeros(n)
        itl_mean[multi] = (last[multi] - first[multi]) / (lens[multi] - 1)
        p50, p99, top = self._itl_quantiles(times, timeline, token_step, lens)
        itl = {"itl_mean_s": itl_mean, "itl_p50_s": p50, "itl_p99_s": p99, "itl_max_s": top}
        ttft = pa.array(first - t_sent, mask=~has)
        e2e = pa.array(t_done - t_sent, mask=~ok)
        scheduled = pa.array(epoch + t_sent)
        n_tokens = pa.array(lens, pa.int32())
        done_ok = pa.array(ok)
        columns: dict[str, pa.Array] = {
            "point": pa.repeat(self.point, n),
            "step": pa.array(step, pa.int32()),
            "concurrency": pa.array(concurrency, pa.int32()),
            "target_rate": pa.array(target_rate, pa.float64()),
            "worker": pa.repeat(WORKER, n),
            "user": pa.array(user, pa.int32()),
            "request_id": pa.array(rids, pa.string()),
            "seq": pa.array(seq, pa.int64()),
            "endpoint": pa.repeat(ENDPOINT, n),
            "api": pa.repeat("completions", n),
            "t_scheduled": scheduled, "t_issued": scheduled, "t_sent": scheduled,
            "t_first_token": pa.array(epoch + first, mask=~has),
            "t_done": pa.array(epoch + t_done),
            "send_lag_s": pa.array(np.zeros(n)),
            "ttft_s": ttft, "ttft_from_scheduled_s": ttft,
            "e2e_s": e2e, "e2e_from_scheduled_s": e2e,
            "n_chunks": n_tokens, "output_tokens": n_tokens,
            _OFFSETS: _own_offsets(times, t_sent, lens, pointed),
            "prompt_tokens": pa.array(prompt, pa.int32()),
            "target_prompt_tokens": pa.array(target_prompt, pa.int32()),
            "target_output_tokens": pa.array(target_output, pa.int32()),
            "prefix_group": pa.array(group, pa.int32()),
            "prefix_tokens": pa.array(prefix, pa.int32()),
            "status": pc.if_else(done_ok, "ok", "aborted"),
            "http_status": pa.array(np.full(n, 200, np.int32)),
            "error": pc.if_else(done_ok, pa.scalar(None, pa.string()), _ABORTED),
            "failure": pa.nulls(n, pa.string()),
            "token_timeline": pa.array(timeline.astype(np.int32), mask=~pointed),
            "token_step": pa.array(token_step.astype(np.int32), mask=~pointed),
            "t_sent_clock_s": pa.array(t_sent, mask=~pointed),
        }
        for name, values in itl.items():
            columns[name] = pa.array(values, mask=~multi)
        return pa.Table.from_arrays([columns[f.name] for f in REQUESTS], schema=REQUESTS)

    def _first_last(self, times: list[np.ndarray], replica: np.ndarray, token_step: np.ndarray,
                    lens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each request's first and last token time (0 without tokens): gathered from its
        timeline where its times are a slice of it, else read off its own times."""
        first, last = np.zeros(len(times)), np.zeros(len(times))
        pointed = (token_step >= 0) & (lens > 0)
        for k, timeline in enumerate(self.timelines):
            rows = np.flatnonzero(pointed & (replica == k))
            if len(rows):
                ends, at = timeline.ends(0), token_step[rows]
                first[rows] = ends[at]
                last[rows] = ends[at + lens[rows] - 1]
        own = np.flatnonzero(~pointed & (lens > 0))
        first[own] = [times[i][0] for i in own]
        last[own] = [times[i][-1] for i in own]
        return first, last

    def _itl_quantiles(self, times: list[np.ndarray], replica: np.ndarray,
                       token_step: np.ndarray,
                       lens: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(p50, p99, max) of each request's token gaps (0 below two tokens): those whose
        times are timeline slices from a window of their timeline's step gaps
        (:func:`window_gap_quantiles`), the rest by :func:`gap_quantiles`."""
        out = np.zeros((3, len(times)))
        window = (token_step >= 0) & (lens > 1)
        rest = np.flatnonzero(~window & (lens > 1))
        if window.any():
            # each timeline from the first step these requests read on: its history before
            # that was read at an earlier flush, and a long replay flushes many times
            tl, first = replica[window], token_step[window]
            since = np.full(len(self.timelines), np.iinfo(np.int64).max)
            np.minimum.at(since, tl, first)
            out[:, window] = window_gap_quantiles(
                [t.ends(min(int(k), t.steps)) for t, k in zip(self.timelines, since)], tl,
                first - since[tl], lens[window])
        if len(rest):
            out[:, rest] = gap_quantiles([times[i] for i in rest])
        return out[0], out[1], out[2]

    def close(self) -> None:
        self.flush()


def _own_offsets(times: list[np.ndarray], t_sent: np.ndarray, lens: np.ndarray,
                 pointed: np.ndarray) -> pa.ListArray:
    """``chunk_offsets_s``: each token time minus its send, for the rows that keep their
    own times; null where the row points into its timeline."""
    own = np.flatnonzero(~pointed)
    bounds = np.zeros(len(times) + 1, np.int64)
    np.cumsum(np.where(pointed, 0, lens), out=bounds[1:])
    flat = (np.concatenate([times[i] for i in own]).astype(np.float64, copy=False)
            - np.repeat(t_sent[own], lens[own])) if len(own) else np.empty(0)
    return pa.ListArray.from_arrays(pa.array(bounds.astype(np.int32)), pa.array(flat),
                                    mask=pa.array(pointed))
