"""One writer per run folder: the claim is exclusive while held, free once its holder is gone,
and parts of two writers never share a name."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from loadlab.errors import InputError
from loadlab.runstore import REQUESTS, PartWriter, read_table
from loadlab.runstore.claim import claim_run_dir, held_claim_fds, lock_run_dir
from loadlab.runstore.layout import CLAIM, MANIFEST


def _holding(run: Path) -> subprocess.Popen:
    """Another process that claims ``run`` and keeps it until killed (it says when it holds)."""
    code = ("import sys; from loadlab.runstore.claim import claim_run_dir\n"
            f"claim = claim_run_dir({str(run)!r})\nprint('held', flush=True)\nsys.stdin.read()")
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "held\n"
    return proc


def test_a_folder_another_process_holds_is_refused_naming_it_and_the_holder(tmp_path):
    run = tmp_path / "run"
    holder = _holding(run)
    try:
        for overwrite in (False, True):    # --overwrite never takes a folder being written
            with pytest.raises(InputError) as refused:
                claim_run_dir(run, overwrite=overwrite)
            message = str(refused.value)
            assert refused.value.exit_code == 2 and str(run) in message
            assert f"is being written by another run (pid {holder.pid} on " in message
    finally:
        holder.kill()
        holder.wait()


def test_a_killed_holder_never_blocks_the_folder(tmp_path):
    """SIGKILL leaves the lock file and a manifest still 'running': the lock is gone with the
    process, so the folder is an old run's (refused, then cleared by --overwrite)."""
    run = tmp_path / "run"
    holder = _holding(run)
    (run / MANIFEST).write_text(json.dumps({"status": "running"}))
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    assert json.loads((run / CLAIM).read_text())["pid"] == holder.pid   # left behind
    with pytest.raises(InputError, match="already holds a run"):
        claim_run_dir(run)
    with claim_run_dir(run, overwrite=True) as claim:
        assert not (run / MANIFEST).exists()
        assert json.loads((run / CLAIM).read_text())["pid"] == os.getpid()
        assert held_claim_fds() == (claim.fd,)
    assert held_claim_fds() == ()


def test_one_process_cannot_claim_a_folder_twice_and_release_frees_it(tmp_path):
    run = tmp_path / "sweep"
    first = lock_run_dir(run, "--resume")
    with pytest.raises(InputError, match="--resume: is being written by another run"):
        lock_run_dir(run, "--resume")
    first.release()
    lock_run_dir(run).release()


def test_two_writers_of_one_table_never_share_a_part_name(tmp_path):
    """Same writer id, same folder (two runs that slipped past every check): no part of one
    replaces a part of the other, so every row of both is still there."""
    table = tmp_path / "requests.parquet"
    writers = [PartWriter(table, REQUESTS, writer_id="master", flush_rows=2,
                          flush_interval_s=math.inf) for _ in range(2)]
    assert writers[0].part_name(1) != writers[1].part_name(1)
    assert f"-{os.getpid()}x" in writers[0].part_name(1)
    for n, writer in enumerate(writers):
        with writer:
            writer.extend({"seq": 10 * n + i, "status": "ok"} for i in range(3))
    assert len(list(table.glob("part-*.parquet"))) == 4
    assert sorted(read_table(table, REQUESTS).seq) == [0, 1, 2, 10, 11, 12]


def test_a_sweep_and_a_replay_into_a_held_folder_are_refused_before_they_write(tmp_path):
    from click.testing import CliRunner

    from loadlab.cli.sim import sim
    from loadlab.experiment.runner import run_sweep
    from loadlab.experiment.scenarios import load_scenario, scenario_path

    run = tmp_path / "held"
    holder = _holding(run)
    try:
        with pytest.raises(InputError, match=f"--out: is being written by .*pid {holder.pid} "):
            run_sweep(load_scenario(scenario_path("demo")), run, what_if=True)
        replay = CliRunner().invoke(sim, ["replay", "--concurrency", "2", "--step-duration", "5",
                                          "--out", str(run)])
        assert isinstance(replay.exception, InputError)
        assert f"is being written by another run (pid {holder.pid} " in str(replay.exception)
        assert sorted(p.name for p in run.iterdir()) == [CLAIM]
    finally:
        holder.kill()
        holder.wait()
