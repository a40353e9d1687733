"""The analyzer's readers return what read_table does, less the columns it never aggregates."""

from __future__ import annotations

import shutil

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from loadlab.analyze.steps import step_table
from loadlab.analyze.tables import REQUEST_COLUMNS, chunk_span_s, read_metrics, read_requests
from loadlab.loadgen.client import Outcome, Timings
from loadlab.replay.driver import run_replay
from loadlab.runstore import METRICS, REQUESTS, PartWriter, compact_run, read_table
from loadlab.sim.engine.config import SimConfig
from loadlab.spec.plan import LoadPlan
from loadlab.spec.scenario import Workload


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    cfg = SimConfig(max_num_seqs=8, model="qwen2.5-7b", gpu="h100")
    run_replay(cfg, LoadPlan(concurrency=[4, 12], step_duration_s=20.0, warmup_s=5.0),
               Workload(profile="azure-conv", seed=5), out)
    return out


def as_strings(frame: pd.DataFrame, like: pd.DataFrame) -> pd.DataFrame:
    """Categoricals back to ``like``'s string dtype (an all-null column's categories are
    object, whatever the file says)."""
    cats = [c for c in frame if isinstance(frame[c].dtype, pd.CategoricalDtype)]
    return frame.astype({c: like[c].dtype for c in cats})


def test_requests_read_as_read_table_in_the_analyzed_columns(run):
    full = read_table(run / "requests.parquet", REQUESTS)
    got = read_requests(run)
    assert list(got.columns) == REQUEST_COLUMNS and len(got) == len(full) > 50
    assert "chunk_offsets_s" not in got and "request_id" not in got
    assert isinstance(got["status"].dtype, pd.CategoricalDtype)
    pd.testing.assert_frame_equal(as_strings(got, full), full[REQUEST_COLUMNS])


def test_metrics_read_whole_or_by_family(run):
    full = read_table(run / "metrics.parquet", METRICS)
    pd.testing.assert_frame_equal(as_strings(read_metrics(run), full), full)
    families = ["vllm:num_requests_running", "vllm:inter_token_latency_seconds"]
    some = read_metrics(run, families)
    assert some["family"].cat.categories.tolist() == sorted(families)
    expected = full[full["family"].isin(families)].reset_index(drop=True)
    pd.testing.assert_frame_equal(as_strings(some, expected), expected)


def test_stream_span_from_the_mean_gap_is_the_offsets_span(run):
    full = read_table(run / "requests.parquet", REQUESTS)
    many = full[full.n_chunks > 1]
    exact = np.array([o.max() - o.min() for o in many.chunk_offsets_s])
    assert len(many) > 50
    np.testing.assert_allclose(chunk_span_s(many).to_numpy(), exact, rtol=1e-9, atol=1e-12)
    assert chunk_span_s(full[full.n_chunks == 1]).isna().all()


def test_the_load_generator_stores_the_mean_gap_the_span_needs():
    offsets = [0.11, 0.1102, 0.13, 0.2, 0.2001]
    row = Outcome(
        Timings(t_sent=5.0, t_first_token=5.11, t_done=5.3, chunk_offsets_s=offsets)
    ).fields()
    span = chunk_span_s(pd.DataFrame([row]))
    assert span.iloc[0] == pytest.approx(offsets[-1] - offsets[0], rel=1e-12)


def split(table_dir, schema, parts: int) -> None:
    """Rewrite a table as many parts, as a run that flushes every second leaves it."""
    table = pa.concat_tables(
        pq.read_table(p, schema=schema) for p in sorted(table_dir.glob("part-*"))
    )
    shutil.rmtree(table_dir)
    writer = PartWriter(table_dir, schema, writer_id="master")
    for rows in np.array_split(np.arange(table.num_rows), parts):
        writer.write_table(table.take(rows))


def test_step_table_is_the_same_after_compaction(run, tmp_path):
    copy = shutil.copytree(run, tmp_path / "run")
    split(copy / "requests.parquet", REQUESTS, 40)
    split(copy / "metrics.parquet", METRICS, 30)
    before = step_table(copy)
    compact_run(copy)
    for table in ("requests.parquet", "metrics.parquet"):
        assert len(list((copy / table).glob("part-*.parquet"))) == 1
    pd.testing.assert_frame_equal(step_table(copy), before)
