"""The run folder's file names: spelled once (runstore.layout), and what the stages write."""

from __future__ import annotations

from loadlab.runstore import layout
from loadlab.runstore.claim import claim_run_dir
from loadlab.runstore.compaction import TABLES


def test_names_did_not_drift():
    """Old run folders, CI jobs and users' scripts find files by these exact names."""
    assert (layout.MANIFEST, layout.ANALYSIS, layout.REPORT) == (
        "manifest.json", "analysis.json", "report.html")
    assert layout.TABLES == ("requests.parquet", "metrics.parquet", "scrapes.parquet",
                             "client.parquet", "step_ends.parquet")
    assert layout.server_log("vllm") == "vllm-server.log"
    assert layout.CLAIM == ".claim"    # hidden: readers listing a folder skip it
    assert (set(layout.LOADGEN_TABLES) | set(layout.SCRAPER_TABLES) | set(layout.REPLAY_TABLES)
            == set(layout.TABLES))
    assert set(TABLES) == set(layout.TABLES)    # compaction knows every table


def test_a_run_folder_holds_only_layout_names(replayed):
    written = {p.name for p in replayed.iterdir() if not p.name.startswith(".")}
    assert written == {layout.MANIFEST, *layout.REPLAY_TABLES}


def test_overwrite_clears_exactly_the_layout_files(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    for name in (layout.MANIFEST, layout.ANALYSIS, layout.server_log("sim")):
        (run / name).write_text("{}")
    (run / layout.REQUESTS_TABLE).mkdir()
    (run / "notes.txt").write_text("mine")
    with claim_run_dir(run, overwrite=True):
        assert sorted(p.name for p in run.iterdir()) == [layout.CLAIM, "notes.txt"]
