"""The run-folder tables survive crashes and concurrent writers."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
import threading
import time

import pandas as pd
import pyarrow as pa
import pytest
from pydantic import ValidationError

from loadlab.errors import InputError, StoreError
from loadlab.runstore import (
    REQUESTS,
    PartWriter,
    read_manifest,
    read_table,
    update_manifest,
    write_manifest,
)
from loadlab.runstore.manifest import (
    PointRecord,
    RunManifest,
    SweepInfo,
    SweepManifest,
    load_manifest,
)

SMALL = pa.schema([("a", pa.int64()), ("b", pa.string())])


def test_rows_flush_by_count_and_read_back_in_order(tmp_path):
    w = PartWriter(
        tmp_path / "t.parquet", SMALL, writer_id="w1", flush_rows=3, flush_interval_s=3600
    )
    for i in range(7):
        w.add({"a": i, "b": str(i)})
    # two full parts on disk, one row still buffered
    assert len(list((tmp_path / "t.parquet").glob("part-*.parquet"))) == 2
    assert len(read_table(tmp_path / "t.parquet", SMALL)) == 6
    w.close()
    df = read_table(tmp_path / "t.parquet", SMALL)
    assert df["a"].tolist() == list(range(7))


def test_missing_table_reads_as_empty_frame_with_columns(tmp_path):
    df = read_table(tmp_path / "absent.parquet", REQUESTS)
    assert df.empty
    assert list(df.columns) == REQUESTS.names


def test_killed_writer_loses_only_unflushed_rows(tmp_path):
    """SIGKILL in the middle of the third part's write: the two whole parts read back, the
    half-written file only ever existed under its hidden temporary name."""
    table = tmp_path / "r.parquet"
    code = textwrap.dedent(
        f"""
        import os, signal
        import pyarrow as pa
        from loadlab.runstore import writer
        real, calls = writer.pq.write_table, []
        def dying(table, where, **kw):
            calls.append(where)
            if len(calls) == 3:  # half a file on disk, then the process dies
                with open(where, "wb") as f:
                    f.write(b"PAR1 half a part")
                os.kill(os.getpid(), signal.SIGKILL)
            real(table, where, **kw)
        writer.pq.write_table = dying
        s = pa.schema([("a", pa.int64()), ("b", pa.string())])
        w = writer.PartWriter({str(table)!r}, s, writer_id="x", flush_rows=5, flush_interval_s=3600)
        print(*(w.part_name(n) for n in (1, 2, 3)), flush=True)
        for i in range(17):
            w.add({{"a": i, "b": "x"}})
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True,
                          text=True)
    assert proc.returncode == -9
    first, second, third = proc.stdout.split()
    assert sorted(os.listdir(table)) == [f".{third}.tmp", first, second]
    assert read_table(table, SMALL)["a"].tolist() == list(range(10))
    assert pd.read_parquet(table)["a"].tolist() == list(range(10))  # plain readers skip it too


def test_concurrent_threads_lose_nothing(tmp_path):
    """Four adding threads and a timer flushing every millisecond: no row lost or doubled."""
    w = PartWriter(
        tmp_path / "m.parquet", SMALL, writer_id="t", flush_rows=50, flush_interval_s=0.001
    )

    def work(base: int) -> None:
        for i in range(500):
            w.add({"a": base + i, "b": "t"})

    threads = [threading.Thread(target=work, args=(k * 1000,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    w.close()
    got = read_table(tmp_path / "m.parquet", SMALL)["a"].tolist()
    assert sorted(got) == sorted(k * 1000 + i for k in range(4) for i in range(500))
    for k in range(4):  # each thread's rows in the order it added them
        assert [a for a in got if a // 1000 == k] == [k * 1000 + i for i in range(500)]
    assert (w.rows_written, w.rows_pending) == (2000, 0)


def test_row_that_does_not_fit_is_set_aside_named_and_the_rest_written(tmp_path, caplog):
    table = tmp_path / "x.parquet"
    w = PartWriter(table, SMALL, writer_id="w", flush_rows=3, flush_interval_s=math.inf)
    w.add({"a": 0, "b": "ok"})
    w.add({"a": "not an int", "b": "bad"})
    w.add({"a": 2, "b": "ok"})  # the flush this triggers writes two rows and logs the third
    assert "column 'a' (int64)" in caplog.text
    assert read_table(table, SMALL)["a"].tolist() == [0, 2]
    assert (w.rows_written, w.rows_pending, w.rows_rejected) == (2, 0, 1)
    w.add({"a": 3, "b": "ok"})
    w.add({"a": 4, "b": ["not", "a", "string"]})
    with pytest.raises(StoreError, match=r"column 'b' \(string\).*_rejected-w.jsonl"):
        w.close()
    assert read_table(table, SMALL)["a"].tolist() == [0, 2, 3]
    kept = [json.loads(line) for line in (table / "_rejected-w.jsonl").read_text().splitlines()]
    assert kept == [{"a": "not an int", "b": "bad"}, {"a": 4, "b": ["not", "a", "string"]}]
    assert pd.read_parquet(table)["a"].tolist() == [0, 2, 3]


def test_disk_full_keeps_rows_buffered_until_a_write_succeeds(tmp_path, caplog):
    """Parts 1 and 2 land on /dev/full (ENOSPC from the kernel): nothing is lost or counted."""
    table = tmp_path / "full.parquet"
    w = PartWriter(table, SMALL, writer_id="w", flush_rows=3, flush_interval_s=math.inf)
    for part in (1, 2):
        (table / f".{w.part_name(part)}.tmp").symlink_to("/dev/full")
    for i in range(3):
        w.add({"a": i, "b": "x"})  # the third add's flush fails: logged, the row kept, no raise
    assert "No space left" in caplog.text and "No space left" in w.error
    assert (w.rows_written, w.rows_pending) == (0, 3)
    for i in range(3, 5):
        w.add({"a": i, "b": "x"})  # no retry per row: the next attempt waits for a batch more
    assert w.rows_pending == 5
    with pytest.raises(StoreError, match="No space left.*5 rows kept in memory"):
        w.flush()
    w.flush()  # space again
    assert (w.rows_written, w.rows_pending, w.error) == (5, 0, None)
    assert read_table(table, SMALL)["a"].tolist() == list(range(5))
    assert sorted(os.listdir(table)) == [w.part_name(3)]


def test_missing_folder_fails_the_write_and_the_retry_writes_everything(tmp_path):
    table = tmp_path / "gone.parquet"
    w = PartWriter(table, SMALL, writer_id="w", flush_rows=100, flush_interval_s=math.inf)
    w.add({"a": 1, "b": "x"})
    table.rmdir()
    table.write_text("a file where the table folder was")
    with pytest.raises(StoreError, match="gone.parquet"):
        w.close()
    assert w.rows_pending == 1 and w.rows_written == 0
    table.unlink()
    table.mkdir()
    w.close()
    assert read_table(table, SMALL)["a"].tolist() == [1]


def test_timer_writes_rows_that_stopped_arriving_and_close_stops_it(tmp_path):
    table = tmp_path / "slow.parquet"
    w = PartWriter(table, SMALL, writer_id="w", flush_rows=1000, flush_interval_s=0.05)
    w.add({"a": 7, "b": "x"})
    deadline = time.monotonic() + 60
    while w.rows_written == 0:  # nothing else adds, flushes or closes
        assert time.monotonic() < deadline, "the timer never wrote the buffered row"
        time.sleep(0.01)
    assert read_table(table, SMALL)["a"].tolist() == [7]
    timers = [t for t in threading.enumerate() if t.name == "flush slow.parquet"]
    assert len(timers) == 1
    w.close()
    assert not timers[0].is_alive()


def test_manifest_updates_merge_one_level(tmp_path):
    update_manifest(tmp_path, status="running", target={"base_url": "http://x"})
    step = {"step": 0, "t_start": 1.0, "t_end": 2.0}
    update_manifest(tmp_path, target={"model": "m"}, steps=[step])
    m = read_manifest(tmp_path)
    assert m == {
        "status": "running",
        "target": {"base_url": "http://x", "model": "m"},
        "steps": [step],
    }
    assert not list(tmp_path.glob(".*.tmp"))


def test_manifest_checked_on_write_and_typed_on_read(tmp_path):
    with pytest.raises(ValidationError):
        update_manifest(tmp_path, status="done")         # not a status
    with pytest.raises(ValidationError):
        update_manifest(tmp_path, steps=[{"step": 0}])   # a window without its times
    assert not (tmp_path / "manifest.json").exists()
    update_manifest(
        tmp_path,
        kind="run",
        status="complete",
        custom={"kept": True},
        steps=[{"step": 0, "t_start": 1.0, "t_end": 2.0, "concurrency": 4, "inflight_mean": 3.9}],
    )
    manifest = load_manifest(tmp_path)
    assert isinstance(manifest, RunManifest) and manifest.steps[0].inflight_mean == 3.9
    assert manifest.custom == {"kept": True} and manifest.steps[0].client_limited is None
    assert read_manifest(tmp_path)["steps"][0] == {"step": 0, "t_start": 1.0, "t_end": 2.0,
                                                   "concurrency": 4, "inflight_mean": 3.9}
    sweep = tmp_path / "sweep"
    write_manifest(
        sweep,
        SweepManifest(
            sweep=SweepInfo(mode="ab", baseline="a"),
            points=[PointRecord(name="a", dir="a", status="failed", error="died")],
        ),
    )
    loaded = load_manifest(sweep)
    assert isinstance(loaded, SweepManifest) and loaded.points[0].error == "died"


@pytest.mark.parametrize("text", ["{not json", '{"kind": "sweep", "points": []}', ""])
def test_broken_manifest_is_an_input_error_naming_the_file(tmp_path, text):
    if text:
        (tmp_path / "manifest.json").write_text(text)
    with pytest.raises(InputError) as info:
        load_manifest(tmp_path)
    assert "manifest.json" in str(info.value) or not text


@pytest.mark.parametrize("damage", ["truncated", "empty", "not parquet"])
def test_one_corrupt_part_is_an_input_error_naming_it_and_the_fix(tmp_path, damage):
    table = tmp_path / "c.parquet"
    with PartWriter(table, SMALL, writer_id="w", flush_rows=2, flush_interval_s=math.inf) as w:
        w.extend({"a": i, "b": "x"} for i in range(6))
    bad = table / w.part_name(2)
    data = bad.read_bytes()
    bad.write_bytes(
        {"truncated": data[: len(data) // 2], "empty": b"", "not parquet": b"a,b\n1,x\n"}[damage]
    )
    with pytest.raises(InputError) as info:
        read_table(table, SMALL)
    text = str(info.value)
    assert text.startswith(f"{bad}: unreadable Parquet (") and "\n" not in text
    assert info.value.fix == (
        f"restore it, or move it out of {table} and rerun (its rows are then left out)"
    )
    bad.rename(tmp_path / bad.name)                 # the fix: the other parts read
    assert read_table(table, SMALL)["a"].tolist() == [0, 1, 4, 5]
