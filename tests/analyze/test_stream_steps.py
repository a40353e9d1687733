"""The engine steps read back from the client's token streams (loadlab.analyze.stream_steps),
on hand-built streams whose steps, queue and pool are known."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from loadlab.analyze import stream_steps
from loadlab.analyze.stream_steps import FEATURES, step_ends, step_figures
from loadlab.runstore import REQUESTS, PartWriter
from loadlab.runstore.layout import REQUESTS_TABLE

STEP = 0.01


def _streams(requests: list[tuple[float, list[float], int, int]]) -> pd.DataFrame:
    """Client records from (sent, token times, prompt tokens, output tokens)."""
    return pd.DataFrame([{
        "t_sent": sent, "t_first_token": times[0], "t_done": times[-1],
        "prompt_tokens": prompt, "output_tokens": output, "itl_p50_s": STEP,
        "chunk_offsets_s": [t - sent for t in times],
    } for sent, times, prompt, output in requests])


def _steps(first: int, last: int) -> list[float]:
    """Step end times ``first`` to ``last`` (step k ends at k x STEP)."""
    return [k * STEP for k in range(first, last + 1)]


WINDOW = pd.DataFrame({"t_start": [0.0], "t_end": [1.0]})


def test_tokens_a_fraction_of_a_step_apart_are_one_step() -> None:
    ends = step_ends(np.array([0.0300, 0.0100, 0.0101, 0.0200, 0.0203]), 0.002)
    assert ends.tolist() == [0.01, 0.02, 0.03]
    assert len(step_ends(np.array([]), 0.002)) == 0


def test_two_seats_taken_while_two_requests_wait_read_as_a_full_batch() -> None:
    # two seats: A and B decode steps 1-5, C and D wait from 0 and decode steps 6-10
    streams = _streams([(0.0, _steps(1, 5), 32, 5), (0.0, _steps(1, 5), 32, 5),
                        (0.0, _steps(6, 10), 32, 5), (0.0, _steps(6, 10), 32, 5)])
    got = step_figures(streams, WINDOW, pool=10_000, block_size=16, typical_blocks=3)
    assert got["stream_queued_mean"] == pytest.approx(0.5)   # steps 1-5 of 10
    assert got["stream_full_batch"] == 1.0
    assert got["stream_head_short"] == 0.0 and got["stream_neither"] == 0.0
    assert math.isnan(got["stream_head_short_room"])        # the head never lacked blocks
    assert got["stream_decoding_rel"] == 1.0


def test_a_long_head_short_of_blocks_with_seats_free() -> None:
    # A (4 prompt blocks) runs in a pool of 10 blocks; C, the head, has a 160-token prompt
    # that needs 11: it waits until A is done, and B (1 block) behind it, with seats free
    # (the batch is 1 of the 2 it reaches later)
    a = (0.0, _steps(1, 8), 64, 8)
    c = (0.001, _steps(9, 12), 160, 4)
    b = (0.002, _steps(9, 12), 16, 4)
    streams = _streams([a, b, c])
    got = step_figures(streams, WINDOW, pool=10, block_size=16, typical_blocks=2)
    assert got["stream_head_short"] == 1.0
    assert got["stream_head_short_seats"] == 1.0 and got["stream_full_batch"] == 0.0
    assert got["stream_head_short_room"] == 1.0              # 2 blocks would have fitted
    got = step_figures(streams, WINDOW, pool=10, block_size=16, typical_blocks=8)
    # 8 blocks fit only in the step A finished (all 10 free, still short of C's 11)
    assert got["stream_head_short_room"] == pytest.approx(1 / 8)


def test_only_the_steps_inside_the_windows_count() -> None:
    streams = _streams([(0.0, _steps(1, 5), 32, 5), (0.0, _steps(6, 10), 32, 5)])
    early = step_figures(streams, pd.DataFrame({"t_start": [0.0], "t_end": [0.055]}),
                         pool=100, block_size=16, typical_blocks=3)
    late = step_figures(streams, pd.DataFrame({"t_start": [0.055], "t_end": [1.0]}),
                        pool=100, block_size=16, typical_blocks=3)
    assert early["stream_queued_mean"] == 1.0 and late["stream_queued_mean"] == 0.0


def test_without_streams_or_a_pool_every_figure_is_unknown() -> None:
    streams = _streams([(0.0, _steps(1, 5), 32, 5)])
    unstreamed = streams.assign(chunk_offsets_s=[None])
    for got in (step_figures(unstreamed, WINDOW, 100, 16, 3),
                step_figures(streams, WINDOW, None, 16, 3),
                step_figures(streams, WINDOW, 100, None, 3),
                step_figures(streams.iloc[0:0], WINDOW, 100, 16, 3)):
        assert set(got) == set(FEATURES) and all(math.isnan(v) for v in got.values())


def test_only_requests_in_flight_are_read_and_a_run_past_the_limit_not_at_all(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    requests = PartWriter(tmp_path / REQUESTS_TABLE, REQUESTS, writer_id="t")
    for row in _streams([(0.0, _steps(1, 5), 32, 5), (0.0, _steps(6, 10), 32, 5)]).to_dict(
            "records"):
        requests.add({**row, "n_chunks": len(row["chunk_offsets_s"])})
    requests.close()
    assert len(stream_steps.read_streams(tmp_path, 0.0)) == 2
    assert len(stream_steps.read_streams(tmp_path, 0.06)) == 1   # the first was done at 0.05
    monkeypatch.setattr(stream_steps, "MAX_TOKENS", 9)            # 10 tokens streamed
    assert stream_steps.read_streams(tmp_path, 0.0).empty
