"""The readers (`analyze`, `report`, `compare`) on a damaged or read-only run folder.

A damaged part file is bad input (exit 2, one line naming the file and the fix): a
verdict computed without its rows would pass for the run's, and for `compare` any
other exit (1) reads as a regression. A read-only folder reads as a writable one;
only what a command must write there is refused, in one line.

Read-only is made the way the file system enforces it for the user running the
tests: permission bits for an ordinary user, the immutable attribute (``chattr +i``)
for root, whom permission bits do not bind.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from loadlab.analyze.analysis import analyze_run
from loadlab.replay.driver import run_replay
from loadlab.runstore.analysis_model import write_analysis_file
from loadlab.sim.engine.config import SimConfig
from loadlab.spec.plan import LoadPlan
from loadlab.spec.scenario import Workload


def _loadlab(*args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "loadlab", *map(str, args)],
                          check=False, capture_output=True, text=True)


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """A replayed run with its analysis.json: the BASE every test compares against."""
    out = tmp_path_factory.mktemp("base") / "run"
    run_replay(SimConfig(max_num_seqs=4, model="llama-3.1-8b", gpu="h100"),
               LoadPlan(concurrency=[2, 8], step_duration_s=6.0, warmup_s=1.0),
               Workload(profile="azure-conv", seed=1), out)
    write_analysis_file(out, analyze_run(out))
    return out


@pytest.fixture
def new(base, tmp_path) -> Path:
    """Tonight's copy of the run, not yet analysed (as a nightly job finds it)."""
    run = tmp_path / "new"
    shutil.copytree(base, run)
    (run / "analysis.json").unlink()
    return run


def _split(table_dir: Path, parts: int = 5) -> list[Path]:
    """The table's single part rewritten as several, as a run that was never compacted."""
    [single] = table_dir.glob("part-*.parquet")
    table = pq.read_table(single)
    single.unlink()
    size = -(-table.num_rows // parts)
    paths = [table_dir / f"part-w1-{i:06d}.parquet" for i in range(parts)]
    for i, path in enumerate(paths):
        pq.write_table(table.slice(i * size, size), path)
    return paths


def _truncate(part: Path) -> Path:
    part.write_bytes(part.read_bytes()[: part.stat().st_size // 2])
    return part


@pytest.fixture(params=["many parts", "compacted"])
def damaged(new, request) -> tuple[Path, Path]:
    """NEW with one requests part cut in half; the run folder and that part."""
    table = new / "requests.parquet"
    if request.param == "many parts":
        part = _split(table)[2]
    else:
        [part] = table.glob("part-*.parquet")
    return new, _truncate(part)


def _one_line_error(res: subprocess.CompletedProcess, *needles: str) -> None:
    err = res.stderr.strip()
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in err and "\n" not in err and err.startswith("loadlab: error: "), err
    for needle in needles:
        assert needle in err, err


def test_compare_on_a_damaged_part_is_bad_input_not_a_verdict(base, damaged, tmp_path):
    run, part = damaged
    _one_line_error(_loadlab("compare", base, run), str(part), "fix: restore it, or move it out")
    _one_line_error(_loadlab("compare", run, base), str(part))      # BASE damaged: the same
    part.rename(tmp_path / part.name)                               # the fix, as it says
    res = _loadlab("compare", base, run)
    assert res.returncode in (0, 1) and "Traceback" not in res.stderr, res.stderr


def test_report_and_analyze_on_a_damaged_part_are_exit_2(damaged):
    run, part = damaged
    _one_line_error(_loadlab("report", run), str(part), "fix:")
    _one_line_error(_loadlab("analyze", run), str(part), "fix:")
    assert not (run / "report.html").exists() and not (run / "analysis.json").exists()


@contextmanager
def _read_only(folder: Path) -> Iterator[None]:
    """``folder`` refuses new files for whoever runs the tests; restored afterwards."""
    if os.geteuid() == 0:
        if shutil.which("chattr") is None:
            pytest.skip("as root, needs chattr (e2fsprogs) to make a folder read-only")
        made = subprocess.run(["chattr", "+i", str(folder)], capture_output=True, text=True)
        undo = ["chattr", "-i", str(folder)]
    else:
        folder.chmod(0o555)
        made, undo = subprocess.CompletedProcess([], 0), ["chmod", "755", str(folder)]
    try:
        if made.returncode != 0:
            pytest.skip(f"this file system has no immutable attribute: {made.stderr.strip()}")
        try:
            (folder / "probe").write_text("x")
        except OSError:
            pass
        else:
            pytest.skip(f"{folder} stayed writable; nothing to test")
        yield
    finally:
        subprocess.run(undo, check=False)


def _listing(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def test_analyze_on_a_read_only_run_prints_the_verdict_and_says_it_wrote_nothing(new, tmp_path):
    before = _listing(new)
    kept = tmp_path / "kept.json"
    with _read_only(new):
        res = _loadlab("analyze", new, "--json", kept)
        assert _listing(new) == before
    assert res.returncode == 0, res.stderr
    assert json.loads(kept.read_text())["verdict"] in res.stdout
    assert "written to" not in res.stdout
    [line] = res.stderr.strip().splitlines()
    assert line.startswith(f"note: {new} is not writable (") and "analysis.json not written" in line


def test_report_on_a_read_only_run_asks_for_out_and_writes_there(new, tmp_path):
    page = tmp_path / "elsewhere" / "report.html"
    before = _listing(new)
    with _read_only(new):
        refused = _loadlab("report", new)
        written = _loadlab("report", new, "--out", page)
        assert _listing(new) == before
    _one_line_error(refused, str(new / "report.html"), "(fix: give --out FILE)")
    assert written.returncode == 0, written.stderr
    assert written.stdout.strip() == str(page) and "</html>" in page.read_text()


def test_compare_reads_read_only_runs_without_writing_into_them(base, new):
    other = new.parent / "other"
    shutil.copytree(new, other)
    before = _listing(new), _listing(other)
    with _read_only(new), _read_only(other):
        res = _loadlab("compare", new, other, "--json", "-")
        assert (_listing(new), _listing(other)) == before
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    assert summary["points"][0]["knee"]["new_text"] == summary["points"][0]["knee"]["base_text"]
