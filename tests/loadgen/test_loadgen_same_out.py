"""Two `loadlab run`s into one --out: one is refused before it starts anything, and the other
keeps every row it counted."""

from __future__ import annotations

import json
import subprocess
import sys

from loadlab.runstore import REQUESTS, read_table


def test_two_runs_started_together_into_one_folder_one_is_refused_the_other_loses_nothing(
        tiny_profile, tmp_path) -> None:
    """Both pass every check of their flags at about the same moment, seconds before either
    has launched its server or written a manifest: exactly the window where a check of the
    folder's contents lets both through. The claim lets one through, whichever it is."""
    out = tmp_path / "same"
    argv = [sys.executable, "-m", "loadlab", "run", "--launch", "sim", "--profile",
            str(tiny_profile), "--concurrency", "2", "--step-duration", "3", "--warmup", "0.5",
            "--workers", "0", "--no-calibrate", "--out", str(out)]
    runs = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(2)]
    ended = [(run, *run.communicate(timeout=180)) for run in runs]
    codes = sorted(run.returncode for run in runs)
    assert codes == [0, 2], [err[-3000:] for _, _, err in ended]
    (winner, stdout, stderr), = [e for e in ended if e[0].returncode == 0]
    (_, _, refused), = [e for e in ended if e[0].returncode == 2]
    # The loser may read the claim before the winner has written its pid into it.
    named = (f"(pid {winner.pid} on ", "(a process that has just claimed it; ")
    assert refused.startswith(tuple(f"loadlab: error: {out}: --out: is being written by another "
                                    f"run {who}" for who in named)), refused
    assert len(refused.splitlines()) == 1     # refused before it launched a server or any load
    manifest = json.loads((out / "manifest.json").read_text())
    rows = len(read_table(out / "requests.parquet", REQUESTS))
    assert manifest["status"] == "complete" and manifest["records"]["rows"] == rows > 0
    assert f"{rows} requests recorded in {out}" in stdout
