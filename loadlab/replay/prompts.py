"""Replay's prompts: token ids with real prefix sharing, described as runs of consecutive ids.

A replay prompt is the profile's common tokens (ids 0..), then its prefix group's tokens
(``group * GROUP_STRIDE + position``), then ids only this request has
(``UNIQUE_BASE + seq * GROUP_STRIDE + position``). Each part is a run of consecutive
ids, so the prompt is a few ``(first id, length)`` runs (merged where they touch, which
makes the description canonical: equal token sequences give equal runs).

The engine's prefix cache only compares block hashes, so a replay can hand it keys
computed from the runs instead of materialising ~2,000 token ids per request and hashing
16-id tuples (:func:`loadlab.sim.engine.blocks.prompt_block_hashes`). In this layout a token id
determines every id before it in its prompt (the common ids, one group's ids and one
request's ids are each always preceded by the same ids), so a full block is keyed by
the id of its last token: two blocks get equal keys exactly when they and everything
before them are equal, as chained hashes of the ids would. A block ending in ids only its
request has is keyed at :data:`PRIVATE_KEY_BASE` + that id: private to it, in the engine's
sense (:data:`loadlab.sim.engine.blocks.PRIVATE_HASH_BASE`), and clear of its generated-block
keys. The keys of a run are
a ``range``, built in C (~15x cheaper than hashing per block); only their values differ
from token hashing, and within one replay every prompt uses this scheme.
"""

from __future__ import annotations

from collections.abc import Sequence

from loadlab.sim.engine.blocks import PRIVATE_HASH_BASE
from loadlab.sim.engine.types import EngineRequest

GROUP_STRIDE = 1 << 20        # > any max_model_len: group g's ids start at g * GROUP_STRIDE
UNIQUE_BASE = 1 << 60         # request seq's own ids start at UNIQUE_BASE + seq * GROUP_STRIDE:
                              # above 2**40 groups' ids (sessions: a group per session,
                              # ~1.6 requests each), below blocks.PRIVATE_HASH_BASE
PRIVATE_KEY_BASE = PRIVATE_HASH_BASE << 32  # keys of blocks ending in a request's own ids


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
    """Keys of the full blocks of a prompt given as runs (tail not keyed): each block's
    last id, offset into the private range when only this request has that id."""
    keys: list[int] = []
    pos = 0  # prompt position of the run's first id
    for first, n in runs:
        # the first block end (position + 1 a multiple of block_size) at or after pos
        last = first + (block_size - 1 - pos) % block_size
        offset = PRIVATE_KEY_BASE if first >= UNIQUE_BASE else 0
        keys += range(last + offset, first + n + offset, block_size)
        pos += n
    return keys


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
