"""Launched servers die with their launcher, however it dies; an unfinished run says so."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil

HERE = Path(__file__).parent


def _group_gone(pgid: int, timeout_s: float = 60.0) -> bool:
    """Wait until no process is left in group ``pgid`` (True), or the deadline (False)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)  # polling the process table, not standing in for an event
    return False


def _wait_for(path: Path, proc: subprocess.Popen, what) -> dict | str:
    deadline = time.monotonic() + 60
    while True:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"{path} never showed {what}"
        if path.exists():
            text = path.read_text()
            found = what(text)
            if found:
                return found
        time.sleep(0.05)


def _run_with_launched_sim(out: Path) -> tuple[subprocess.Popen, dict]:
    """``loadlab run --launch sim`` with a long step, and its manifest once the server is up."""
    argv = [sys.executable, "-m", "loadlab", "run", "--launch", "sim", "--profile", "azure-conv",
            "--concurrency", "2", "--step-duration", "120", "--workers", "0", "--out", str(out),
            "--", "--max-num-seqs", "2"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def launched(text: str) -> dict | None:
        try:
            manifest = json.loads(text)
        except ValueError:
            return None
        return manifest if manifest.get("steps") == [] and "launch" in manifest["target"] else None

    try:
        return proc, _wait_for(out / "manifest.json", proc, launched)
    except BaseException:
        proc.kill()
        proc.wait()
        raise


def test_sigkill_of_the_point_process_takes_the_launched_simulator_with_it(tmp_path) -> None:
    out = tmp_path / "run"
    proc, manifest = _run_with_launched_sim(out)
    try:
        server = manifest["target"]["launch"]["pid"]
        # the point runs in a child of `loadlab run` (loadlab.experiment.child): it owns the
        # run folder and launched the server, so it is the process a crash takes away
        owner = manifest["owner"]["pid"]
        assert owner in {c.pid for c in psutil.Process(proc.pid).children()}
        os.kill(server, 0)  # running
        os.kill(owner, signal.SIGKILL)
        _, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 1 and b"before answering" in stderr, stderr
    assert _group_gone(server), "the simulator outlived its launcher"
    assert json.loads((out / "manifest.json").read_text())["status"] == "running"
    res = subprocess.run(
        [sys.executable, "-m", "loadlab", "analyze", str(out)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    assert res.stderr.startswith("warning: unfinished run") and f"pid {owner}" in res.stderr, (
        res.stderr
    )


def test_sigkill_of_loadlab_run_ends_its_point_cleanly(tmp_path) -> None:
    """The caller killed outright: the kernel tells the point process (PR_SET_PDEATHSIG),
    which ends its load as on Ctrl-C: records flushed, server stopped, run interrupted."""
    out = tmp_path / "run"
    proc, manifest = _run_with_launched_sim(out)
    server, point = manifest["target"]["launch"]["pid"], psutil.Process(manifest["owner"]["pid"])
    proc.kill()
    proc.wait()
    gone, alive = psutil.wait_procs([point], timeout=60)
    assert gone and not alive, "the point process outlived loadlab run"
    assert _group_gone(server), "the simulator outlived its launcher"
    assert json.loads((out / "manifest.json").read_text())["status"] == "interrupted"


def test_killed_launcher_takes_the_servers_children_with_it(tmp_path, monkeypatch) -> None:
    vllm = tmp_path / "vllm"
    vllm.write_text(f"#!/bin/sh\nexec {sys.executable} {HERE / 'fake_server.py'} \"$@\"\n")
    vllm.chmod(0o755)
    child_file = tmp_path / "child.pid"
    script = textwrap.dedent(f"""
        import time
        from loadlab.experiment.launcher import launch_target
        with launch_target("vllm", ["m"], {str(tmp_path / "run")!r},
                           startup_timeout_s=60) as target:
            print(target.pid, flush=True)
            time.sleep(600)
        """)
    env = {**os.environ, "LOADLAB_VLLM_BIN": str(vllm), "FAKE_CHILD_PID_FILE": str(child_file)}
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        server = int(proc.stdout.readline())
        child = int(_wait_for(child_file, proc, str.strip))
        assert os.getpgid(child) == server  # an engine-core-like child in the server's group
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert _group_gone(server)
