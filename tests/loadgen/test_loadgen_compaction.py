"""A live run ends with its tables compacted, one part each, every row kept."""

from __future__ import annotations

from loadlab.runstore import CLIENT, METRICS, SCRAPES, read_table


def test_a_live_run_leaves_one_part_per_table_and_every_row(
    cli, load, tiny_profile, tmp_path
) -> None:
    out = tmp_path / "run"
    # 7 s of load: the Recorder (5 s), client samples (2 s) and the scraper (5 s) each flush mid-run
    res = cli(
        "--launch",
        "sim",
        "--profile",
        str(tiny_profile),
        "--concurrency",
        "2",
        "--step-duration",
        "7",
        "--warmup",
        "0",
        "--collect",
        "--interval",
        "0.5",
        "--workers",
        "1",
        "--out",
        str(out),
        "--",
        "--max-num-seqs",
        "4",
        "--time-scale",
        "5",
    )
    assert res.returncode == 0, res.stderr
    parts = {t: sorted(p.name for p in (out / t).glob("part-*.parquet"))
             for t in ("requests.parquet", "client.parquet", "metrics.parquet", "scrapes.parquet")}
    assert all(len(names) == 1 for names in parts.values()), parts
    assert "~" in parts["client.parquet"][0]                # compacted from several parts
    df, manifest = load(out)
    assert manifest["status"] == "complete" and len(df) == manifest["records"]["rows"] > 0
    assert manifest["records"]["missing_by_worker"] == {}
    scrapes = read_table(out / "scrapes.parquet", SCRAPES)
    assert (
        len(read_table(out / "metrics.parquet", METRICS))
        == scrapes.loc[scrapes.ok, "n_samples"].sum()
        > 0
    )
    assert len(read_table(out / "client.parquet", CLIENT)) >= 5     # a sample a second per worker
