"""The run-folder tables survive crashes and concurrent writers."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

import pyarrow as pa
import pytest
from pydantic import ValidationError

from loadlab.errors import InputError
from loadlab.runstore import (
    METRICS,
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
    w = PartWriter(tmp_path / "t.parquet", SMALL, writer_id="w1", flush_rows=3, flush_interval_s=3600)
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
    """A process killed with SIGKILL after two flushes leaves two readable parts."""
    table = tmp_path / "r.parquet"
    code = textwrap.dedent(
        f"""
        import os, signal
        import pyarrow as pa
        from loadlab.runstore import PartWriter
        s = pa.schema([("a", pa.int64()), ("b", pa.string())])
        w = PartWriter({str(table)!r}, s, writer_id="x", flush_rows=5, flush_interval_s=3600)
        for i in range(12):
            w.add({{"a": i, "b": "x"}})
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], check=False)
    assert proc.returncode == -9
    df = read_table(table, SMALL)
    assert df["a"].tolist() == list(range(10))
    assert not [p for p in os.listdir(table) if p.endswith(".tmp") and not p.startswith(".")]


def test_concurrent_threads_lose_nothing(tmp_path):
    w = PartWriter(tmp_path / "m.parquet", SMALL, writer_id="t", flush_rows=50)

    def work(base: int) -> None:
        for i in range(500):
            w.add({"a": base + i, "b": "t"})

    threads = [threading.Thread(target=work, args=(k * 1000,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    w.close()
    got = sorted(read_table(tmp_path / "m.parquet", SMALL)["a"].tolist())
    assert got == sorted(k * 1000 + i for k in range(4) for i in range(500))
    assert w.rows_written == 2000


def test_schema_mismatch_is_rejected(tmp_path):
    w = PartWriter(tmp_path / "x.parquet", METRICS, flush_rows=1)
    try:
        w.add({"t": "not a float"})
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        pass
    else:  # pragma: no cover - the assertion is the point
        raise AssertionError("a string in a float64 column must be refused")


def test_manifest_updates_merge_one_level(tmp_path):
    update_manifest(tmp_path, status="running", target={"base_url": "http://x"})
    step = {"step": 0, "t_start": 1.0, "t_end": 2.0}
    update_manifest(tmp_path, target={"model": "m"}, steps=[step])
    m = read_manifest(tmp_path)
    assert m == {"status": "running", "target": {"base_url": "http://x", "model": "m"}, "steps": [step]}
    assert not list(tmp_path.glob(".*.tmp"))


def test_manifest_checked_on_write_and_typed_on_read(tmp_path):
    with pytest.raises(ValidationError):
        update_manifest(tmp_path, status="done")         # not a status
    with pytest.raises(ValidationError):
        update_manifest(tmp_path, steps=[{"step": 0}])   # a window without its times
    assert not (tmp_path / "manifest.json").exists()
    update_manifest(tmp_path, kind="run", status="complete", custom={"kept": True},
                    steps=[{"step": 0, "t_start": 1.0, "t_end": 2.0, "concurrency": 4, "inflight_mean": 3.9}])
    manifest = load_manifest(tmp_path)
    assert isinstance(manifest, RunManifest) and manifest.steps[0].inflight_mean == 3.9
    assert manifest.custom == {"kept": True} and manifest.steps[0].client_limited is None
    assert read_manifest(tmp_path)["steps"][0] == {"step": 0, "t_start": 1.0, "t_end": 2.0,
                                                   "concurrency": 4, "inflight_mean": 3.9}
    sweep = tmp_path / "sweep"
    write_manifest(sweep, SweepManifest(sweep=SweepInfo(mode="ab", baseline="a"),
                                        points=[PointRecord(name="a", dir="a", status="failed", error="died")]))
    loaded = load_manifest(sweep)
    assert isinstance(loaded, SweepManifest) and loaded.points[0].error == "died"


@pytest.mark.parametrize("text", ["{not json", '{"kind": "sweep", "points": []}', ""])
def test_broken_manifest_is_an_input_error_naming_the_file(tmp_path, text):
    if text:
        (tmp_path / "manifest.json").write_text(text)
    with pytest.raises(InputError) as info:
        load_manifest(tmp_path)
    assert "manifest.json" in str(info.value) or not text
