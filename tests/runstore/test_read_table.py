"""read_table reads many parts in one pass: same rows and order as part by part, fewer
columns on request."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from loadlab.runstore import METRICS, PartWriter, read_table

OLD = pa.schema([("a", pa.int64()), ("b", pa.string())])
NEW = pa.schema([("a", pa.int64()), ("b", pa.string()), ("c", pa.float64())])


def metrics_parts(table_dir, rng: np.random.Generator, writers: int = 3, parts: int = 40) -> None:
    """Random METRICS rows from several writers, in many small parts."""
    families = [f"vllm:f{i}" for i in range(7)]
    for w in range(writers):
        writer = PartWriter(table_dir, METRICS, writer_id=f"w{w}", flush_rows=10**9)
        for _ in range(parts):
            n = int(rng.integers(1, 30))
            writer.extend(
                {
                    "t": float(rng.uniform(0, 100)),
                    "scrape_s": None,
                    "endpoint": f"http://e{w}",
                    "family": str(rng.choice(families)),
                    "type": "gauge",
                    "metric": "m",
                    "labels": f'{{"engine":"{rng.integers(0, 3)}"}}',
                    "value": float(rng.normal()),
                    "source": "direct",
                }
                for _ in range(n)
            )
            writer.flush()


def reference(table_dir, schema: pa.Schema) -> pd.DataFrame:
    """Part by part, in name order: what read_table returned before it read in one pass."""
    parts = sorted(table_dir.glob("part-*.parquet"))
    return pa.concat_tables([pq.read_table(p, schema=schema) for p in parts]).to_pandas()


def test_one_pass_matches_part_by_part(tmp_path):
    metrics_parts(tmp_path / "m.parquet", np.random.default_rng(5))
    got = read_table(tmp_path / "m.parquet", METRICS)
    pd.testing.assert_frame_equal(got, reference(tmp_path / "m.parquet", METRICS))
    assert len(got) > 1000


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_columns_rows_and_categoricals_match_a_pandas_filter(tmp_path, seed):
    rng = np.random.default_rng(seed)
    metrics_parts(tmp_path / "m.parquet", rng)
    full = reference(tmp_path / "m.parquet", METRICS)
    wanted = sorted(rng.choice(full["family"].unique(), 3, replace=False).tolist())
    got = read_table(tmp_path / "m.parquet", METRICS, columns=["t", "family", "labels", "value"],
                     where=pc.field("family").isin(wanted), categorical=["family", "labels"])
    expected = full.loc[full["family"].isin(wanted), ["t", "family", "labels", "value"]]
    assert list(got.columns) == ["t", "family", "labels", "value"]
    assert isinstance(got["family"].dtype, pd.CategoricalDtype)
    assert (
        got["family"].cat.categories.tolist() == wanted
    )  # sorted; filtered-out names are not categories
    as_str = got.astype({"family": str, "labels": str})
    pd.testing.assert_frame_equal(as_str.reset_index(drop=True), expected.reset_index(drop=True),
                                  check_dtype=False)


def test_the_frame_read_can_be_edited(tmp_path):
    """Also from one part, whose columns Arrow could hand over without a copy (read-only)."""
    metrics_parts(tmp_path / "m.parquet", np.random.default_rng(4), writers=1, parts=1)
    for frame in (read_table(tmp_path / "m.parquet", METRICS),
                  read_table(tmp_path / "m.parquet", METRICS, categorical=["family"])):
        frame.loc[frame["t"] > 50, "value"] = 0.0
        assert (frame.loc[frame["t"] > 50, "value"] == 0).all() and (frame["value"] != 0).any()


def test_parts_from_before_a_column_was_added_read_as_nulls(tmp_path):
    table = tmp_path / "t.parquet"
    with PartWriter(table, OLD, writer_id="a") as old:
        old.add({"a": 1, "b": "x"})
    with PartWriter(table, NEW, writer_id="b") as new:
        new.add({"a": 2, "b": "y", "c": 0.5})
    got = read_table(table, NEW)
    assert got["a"].tolist() == [1, 2]
    assert np.isnan(got["c"].iloc[0]) and got["c"].iloc[1] == 0.5


def test_absent_table_reads_empty_with_the_columns_asked_for(tmp_path):
    got = read_table(
        tmp_path / "none.parquet", METRICS, columns=["t", "family"], categorical=["family"]
    )
    assert got.empty and list(got.columns) == ["t", "family"]
    assert isinstance(got["family"].dtype, pd.CategoricalDtype)
