"""Compaction keeps every row once and in order, whenever it is interrupted."""

from __future__ import annotations

import fcntl
import os

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from loadlab.collect.parse import ExpositionParser
from loadlab.collect.sink import MetricsSink
from loadlab.runstore import METRICS, REQUESTS, PartWriter, compact, compact_run, read_table
from loadlab.runstore import compaction as compact_module

SCHEMA = pa.schema([("a", pa.int64()), ("s", pa.string()), ("x", pa.list_(pa.float64()))])


def write_parts(
    table, rng: np.random.Generator, writers=("m", "w1", "w2"), parts=25, start=0
) -> None:
    for w in writers:
        writer = PartWriter(table, SCHEMA, writer_id=w, flush_rows=10**9)
        writer._part = start
        for _ in range(parts):
            for _ in range(int(rng.integers(1, 20))):
                writer.add(
                    {
                        "a": int(rng.integers(0, 10**9)),
                        "s": str(rng.choice(["ok", "err", None])),
                        "x": rng.uniform(0, 1, int(rng.integers(0, 5))).tolist(),
                    }
                )
            writer.flush()


def part_names(table) -> list[str]:
    return sorted(p.name for p in table.glob("part-*.parquet"))


@pytest.fixture
def table(tmp_path):
    path = tmp_path / "t.parquet"
    write_parts(path, np.random.default_rng(11))
    return path


def test_compaction_keeps_rows_and_order_in_one_part(table):
    before = read_table(table, SCHEMA)
    out = compact(table, SCHEMA, row_group_bytes=2000)
    assert part_names(table) == [out.name]
    pd.testing.assert_frame_equal(read_table(table, SCHEMA), before)
    assert pq.ParquetFile(out).num_row_groups > 1  # row groups bounded by size
    assert compact(table, SCHEMA) == out            # one part: nothing to do


def test_parts_written_later_stay_after_the_compacted_rows(table):
    compact(table, SCHEMA)
    write_parts(table, np.random.default_rng(12), writers=("m",), parts=3, start=25)
    before = read_table(table, SCHEMA)
    compact(table, SCHEMA)
    assert len(part_names(table)) == 1
    pd.testing.assert_frame_equal(read_table(table, SCHEMA), before)


def test_killed_before_the_old_parts_are_deleted_reads_each_row_once(table, monkeypatch):
    before = read_table(table, SCHEMA)

    def killed(paths):
        for p in paths[:10]:           # some deleted, then the process dies
            p.unlink()
        raise KeyboardInterrupt

    monkeypatch.setattr(compact_module, "_remove", killed)
    with pytest.raises(KeyboardInterrupt):
        compact(table, SCHEMA)
    assert len(part_names(table)) > 1
    pd.testing.assert_frame_equal(read_table(table, SCHEMA), before)
    monkeypatch.undo()
    out = compact(table, SCHEMA)       # the next compaction removes the leftovers
    assert part_names(table) == [out.name]
    pd.testing.assert_frame_equal(read_table(table, SCHEMA), before)


def test_killed_before_the_rename_leaves_only_a_hidden_file(table, monkeypatch):
    before = read_table(table, SCHEMA)
    names = part_names(table)

    def killed(src, dst):
        raise KeyboardInterrupt

    monkeypatch.setattr(compact_module.os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        compact(table, SCHEMA)
    monkeypatch.undo()
    assert part_names(table) == names and list(table.glob(".compact-*.tmp"))
    pd.testing.assert_frame_equal(read_table(table, SCHEMA), before)
    compact(table, SCHEMA)
    assert not list(table.glob(".compact-*.tmp"))
    pd.testing.assert_frame_equal(read_table(table, SCHEMA), before)


def test_a_table_being_compacted_elsewhere_is_left_alone(table):
    fd = os.open(table / compact_module.LOCK, os.O_CREAT | os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        names = part_names(table)
        assert compact(table, SCHEMA) is None
        assert part_names(table) == names
    finally:
        os.close(fd)


def test_parts_of_an_older_schema_get_nulls(tmp_path):
    old = pa.schema([("a", pa.int64()), ("s", pa.string())])
    with PartWriter(tmp_path / "t.parquet", old, writer_id="a", flush_rows=1) as w:
        w.extend([{"a": 1, "s": "x"}, {"a": 2, "s": "y"}])
    compact(tmp_path / "t.parquet", SCHEMA)
    got = read_table(tmp_path / "t.parquet", SCHEMA)
    assert got["a"].tolist() == [1, 2] and got["x"].isna().all()


def test_a_string_column_missing_from_older_parts_reads_as_nulls(tmp_path):
    # compaction reads string columns as dictionaries: one a part lacks is a null one
    old = pa.schema([("a", pa.int64())])
    with PartWriter(tmp_path / "t.parquet", old, writer_id="a", flush_rows=1) as w:
        w.extend([{"a": 1}, {"a": 2}])
    with PartWriter(tmp_path / "t.parquet", SCHEMA, writer_id="b", flush_rows=1) as w:
        w.add({"a": 3, "s": "ok", "x": [0.5]})
    compact(tmp_path / "t.parquet", SCHEMA)
    got = read_table(tmp_path / "t.parquet", SCHEMA)
    assert got["a"].tolist() == [1, 2, 3] and got["s"].isna().tolist() == [True, True, False]
    assert got["s"].iloc[2] == "ok"


def test_metrics_parts_of_dictionary_strings_compact_to_the_same_rows_read_as_strings(tmp_path):
    """The sink writes its series strings as dictionaries; compaction reads and writes
    them as dictionaries too, and the compacted part reads back as plain strings."""
    path = tmp_path / "metrics.parquet"
    pages = ['vllm:num_requests_running{model_name="m"} 3\n'
             'vllm:num_requests_waiting{model_name="m"} 1\n',
             'vllm:num_requests_running{model_name="m"} 4\n'
             'vllm:gpu_cache_usage_perc{model_name="m"} 0.5\n']
    for endpoint in ("http://a/metrics", "http://b/metrics"):
        parser = ExpositionParser()
        sink = MetricsSink(path, parser, endpoint=endpoint, flush_rows=1)
        for t, page in enumerate(pages * 3):
            sink.add_scrape(float(t), 0.01, parser.parse(page))
        sink.close()
    before = read_table(path, METRICS)
    assert len(part_names(path)) == 12
    out = compact(path, METRICS)
    assert part_names(path) == [out.name]
    pd.testing.assert_frame_equal(read_table(path, METRICS), before)
    stored = pq.read_table(out).schema
    assert all(stored.field(f.name).type == pa.string() for f in METRICS if f.type == pa.string())
    assert compact_module._replaces(out) and len(compact_module._replaces(out)) == 12


def test_compact_run_covers_every_table_and_skips_absent_ones(tmp_path):
    with PartWriter(tmp_path / "requests.parquet", REQUESTS, writer_id="m", flush_rows=1) as w:
        w.extend([{"step": i, "status": "ok", "chunk_offsets_s": [0.1, 0.2]} for i in range(5)])
    before = read_table(tmp_path / "requests.parquet", REQUESTS)
    done = compact_run(tmp_path)
    assert [p.parent.name for p in done] == ["requests.parquet"]
    pd.testing.assert_frame_equal(read_table(tmp_path / "requests.parquet", REQUESTS), before)


def test_an_unreadable_part_stays_outside_the_compacted_part(table):
    before = read_table(table, SCHEMA)
    broken = table / "part-zz-000001.parquet"
    broken.write_bytes(b"PAR1 truncated")
    with pytest.warns(UserWarning, match="part-zz-000001.parquet: unreadable part left out"):
        out = compact(table, SCHEMA)
    assert part_names(table) == sorted([out.name, broken.name])
    assert broken.read_bytes() == b"PAR1 truncated"
    broken.unlink()
    pd.testing.assert_frame_equal(read_table(table, SCHEMA), before)


def test_a_part_failing_while_copied_stops_compaction_with_nothing_changed(table, monkeypatch):
    names = part_names(table)
    row_groups = compact_module._row_groups

    def failing(parts, schema, limit):
        yield from row_groups(parts[:3], schema, 1)   # some row groups written, then a bad page
        raise pa.ArrowInvalid("corrupt page")

    monkeypatch.setattr(compact_module, "_row_groups", failing)
    with pytest.raises(pa.ArrowInvalid):
        compact(table, SCHEMA)
    assert part_names(table) == names and not list(table.glob(".compact-*"))


@pytest.fixture
def two_tables(tmp_path, monkeypatch):
    """A run folder whose requests and client tables hold SCHEMA parts (3 writers x 3 parts)."""
    monkeypatch.setattr(
        compact_module, "TABLES", {"requests.parquet": SCHEMA, "client.parquet": SCHEMA}
    )
    for seed, name in enumerate(("requests.parquet", "client.parquet")):
        write_parts(tmp_path / name, np.random.default_rng(seed), parts=3)
    return tmp_path


def test_compact_run_tells_progress_only_when_there_is_much_to_do(two_tables, monkeypatch):
    lines: list[str] = []
    monkeypatch.setattr(compact_module, "NOTICE_PARTS", 19)
    compact_run(two_tables, progress=lines.append)
    assert lines == []                                          # 18 parts: quick, nothing said
    write_parts(two_tables / "client.parquet", np.random.default_rng(7), parts=6, start=3)
    before = read_table(two_tables / "client.parquet", SCHEMA)
    compact_run(two_tables, progress=lines.append)              # 2 + 18 new
    assert len(lines) == 2, lines
    assert lines[0].startswith("compacting 20 part files (") and lines[0].endswith(
        f"in {two_tables}..."
    )
    assert lines[1].startswith("compacted 20 part files into 2 in ")
    assert len(part_names(two_tables / "client.parquet")) == 1
    pd.testing.assert_frame_equal(read_table(two_tables / "client.parquet", SCHEMA), before)


def test_compact_run_leaves_the_tables_it_is_not_given(two_tables):
    done = compact_run(two_tables, tables=("client.parquet",))
    assert [p.parent.name for p in done] == ["client.parquet"]
    assert len(part_names(two_tables / "requests.parquet")) == 9
    assert len(part_names(two_tables / "client.parquet")) == 1


def test_a_table_that_fails_to_compact_is_kept_and_the_others_compacted(two_tables, monkeypatch):
    tmp_path = two_tables
    names = part_names(tmp_path / "requests.parquet")
    before = read_table(tmp_path / "requests.parquet", SCHEMA)
    rewrite = compact_module._rewrite

    def full_disk(parts, dest, schema, limit):
        if dest.parent.name == "requests.parquet":
            raise OSError(28, "No space left on device")
        rewrite(parts, dest, schema, limit)

    monkeypatch.setattr(compact_module, "_rewrite", full_disk)
    with pytest.warns(UserWarning, match="requests.parquet: not compacted, its parts are kept"):
        done = compact_run(tmp_path)
    assert [p.parent.name for p in done] == ["client.parquet"]
    assert part_names(tmp_path / "requests.parquet") == names
    assert not list((tmp_path / "requests.parquet").glob(".compact-*"))
    pd.testing.assert_frame_equal(read_table(tmp_path / "requests.parquet", SCHEMA), before)
