"""Replay's prompts: token ids with real prefix sharing, described as runs of consecutive ids.

A replay prompt is the profile's common tokens (ids 0..), then its prefix group's tokens
(``group * GROUP_STRIDE + position``), then ids only this request has
(``UNIQUE_BASE + seq * GROUP_STRIDE + position``). Each part is a run of consecutive
ids, so the prompt is a few ``(first id, length)`` runs (merged where they touch, which
makes the description canonical: equal token sequences give equal runs).

The engine's prefix cache only compares chained block hashes, so a replay can hand it
hashes computed from the runs instead of materialising ~2,000 token ids per request and
hashing 16-id tuples (:func:`loadlab.sim.blocks.prompt_block_hashes`): a block lying
inside one run is keyed by its first id, a block spanning runs by its tuple of
``(first id, length)`` pieces. Two blocks get equal keys exactly when their ids are
equal, so hits and misses are those of token hashing; only the hash values differ, and
within one replay every prompt uses this scheme. About 8x cheaper per request.
"""

from __future__ import annotations

from collections.abc import Sequence

from loadlab.sim.types import EngineRequest

GROUP_STRIDE = 1 << 20        # > any max_model_len: group g's ids start at g * GROUP_STRIDE
UNIQUE_BASE = 1 << 40         # request seq's own ids start at UNIQUE_BASE + seq * GROUP_STRIDE


def prompt_runs(seq: int, prompt_len: int, group: int | None, prefix_len: int,
                common: int) -> list[tuple[int, int]]:
    """The prompt as maximal runs of consecutive ids: [(first id, length), ...]."""
    own = UNIQUE_BASE + seq * GROUP_STRIDE
    if group is None or prefix_len <= 0:
        return [(own, prompt_len)]
    shared_common = min(common, prefix_len)
    runs: list[tuple[int, int]] = []
    for first, n in ((0, shared_common),
                     (group * GROUP_STRIDE + shared_common, prefix_len - shared_common),
                     (own + prefix_len, prompt_len - prefix_len)):
        if n <= 0:
            continue
        if runs and runs[-1][0] + runs[-1][1] == first:  # group 0 continues the common ids
            runs[-1] = (runs[-1][0], runs[-1][1] + n)
        else:
            runs.append((first, n))
    return runs


def prompt_ids(seq: int, prompt_len: int, group: int | None, prefix_len: int,
               common: int) -> list[int]:
    """Token ids: common prefix, then the group's prefix, then ids only this request has."""
    ids: list[int] = []
    for first, n in prompt_runs(seq, prompt_len, group, prefix_len, common):
        ids.extend(range(first, first + n))
    return ids


def run_block_hashes(runs: Sequence[tuple[int, int]], block_size: int) -> list[int]:
    """Chained hashes of the full blocks of a prompt given as maximal runs (tail not hashed)."""
    hashes: list[int] = []
    append = hashes.append
    h = 0
    pieces: list[tuple[int, int]] = []  # the block being assembled across runs
    filled = 0
    for first, n in runs:
        if filled:
            take = min(block_size - filled, n)
            pieces.append((first, take))
            filled += take
            if filled < block_size:
                continue
            h = hash((h, tuple(pieces)))
            append(h)
            pieces, filled = [], 0
            first, n = first + take, n - take
        end = first + n // block_size * block_size
        for start in range(first, end, block_size):
            h = hash((h, start))
            append(h)
        if end < first + n:
            pieces, filled = [(end, first + n - end)], first + n - end
    return hashes


def replay_request(request_id: str, seq: int, prompt_len: int, group: int | None,
                   prefix_len: int, common: int, output_len: int, now: float,
                   block_size: int) -> EngineRequest:
    """The engine request of a replay send, with its prompt's block hashes precomputed.

    An unshared prompt is passed as a ``range`` (the engine only takes its length when
    hashes come with it); a shared one as the id list.
    """
    runs = prompt_runs(seq, prompt_len, group, prefix_len, common)
    ids: Sequence[int] = (range(runs[0][0], runs[0][0] + prompt_len) if len(runs) == 1
                          else prompt_ids(seq, prompt_len, group, prefix_len, common))
    return EngineRequest(request_id, ids, output_len, output_len, now,
                         block_hashes=run_block_hashes(runs, block_size))
