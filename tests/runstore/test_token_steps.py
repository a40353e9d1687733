"""A replay's token offsets stored as pointers into step-end timelines read back as lists."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from loadlab.errors import InputError
from loadlab.runstore import REQUESTS, STEP_ENDS, PartWriter, compact_run, read_table
from loadlab.runstore.layout import REQUESTS_TABLE, STEP_ENDS_TABLE

# two timelines (replicas) of step ends on the replay's clock
ENDS = {0: [0.5, 0.75, 1.0 / 3.0 + 1.0, 2.1], 1: [0.2, 0.9, 1.7]}


def write_run(run, parts: int) -> None:
    """Rows of every kind: pointing into each timeline, own offsets (preempted), no token
    (own, empty), the load generator's (no pointer); step ends in ``parts`` parts."""
    ends = PartWriter(run / STEP_ENDS_TABLE, STEP_ENDS, writer_id="t")
    rows = [(tl, k, t) for tl, ts in ENDS.items() for k, t in enumerate(ts)]
    for chunk in np.array_split(np.arange(len(rows)), parts):
        tl, k, t = zip(*(rows[i] for i in chunk), strict=True)
        ends.write_table(pa.Table.from_arrays(
            [pa.array(tl, pa.int32()), pa.array(k, pa.int32()), pa.array(t)], schema=STEP_ENDS))
    requests = PartWriter(run / REQUESTS_TABLE, REQUESTS, writer_id="t", flush_rows=2)
    requests.extend([
        {"seq": 0, "n_chunks": 3, "token_timeline": 0, "token_step": 1, "t_sent_clock_s": 0.3},
        {"seq": 1, "n_chunks": 2, "chunk_offsets_s": [0.25, 0.5]},
        {"seq": 2, "n_chunks": 3, "token_timeline": 1, "token_step": 0, "t_sent_clock_s": 0.1},
        {"seq": 3, "n_chunks": 0, "chunk_offsets_s": []},
        {"seq": 4, "n_chunks": 1, "token_timeline": 0, "token_step": 3, "t_sent_clock_s": 2.0},
    ])
    requests.close()


@pytest.mark.parametrize("parts", [1, 3])
def test_pointers_read_back_as_the_offsets_they_stand_for(tmp_path, parts):
    write_run(tmp_path, parts)
    want = [[t - 0.3 for t in ENDS[0][1:4]], [0.25, 0.5], [t - 0.1 for t in ENDS[1]], [],
            [ENDS[0][3] - 2.0]]
    for _ in range(2):    # as parts, then compacted (step_ends too)
        got = read_table(tmp_path / REQUESTS_TABLE, REQUESTS)
        assert [list(v) for v in got.chunk_offsets_s] == want    # exactly: same subtraction
        picked = read_table(tmp_path / REQUESTS_TABLE, REQUESTS, columns=["chunk_offsets_s"])
        assert list(picked.columns) == ["chunk_offsets_s"]
        assert [list(v) for v in picked.chunk_offsets_s] == want
        compact_run(tmp_path)
    assert len(list((tmp_path / STEP_ENDS_TABLE).glob("part-*"))) == 1


def test_pointing_past_the_step_ends_names_them(tmp_path):
    write_run(tmp_path, 3)
    first = sorted((tmp_path / STEP_ENDS_TABLE).glob("part-*"))[0]
    first.unlink()
    with pytest.raises(InputError, match="step_ends"):
        read_table(tmp_path / REQUESTS_TABLE, REQUESTS)
    assert len(read_table(tmp_path / REQUESTS_TABLE, REQUESTS, columns=["seq"])) == 5
