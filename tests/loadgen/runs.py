"""Helpers for tests that watch a run while it goes: servers to kill, runs in the background.

Imported by ``conftest.py`` and by tests (this directory is on ``sys.path`` under pytest).
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

HERE = Path(__file__).parent


@contextmanager
def fault_server_process(pattern: str = "ok", ttft_ms: float = 5.0, itl_ms: float = 2.0,
                         *extra: str) -> Iterator[tuple[subprocess.Popen, str]]:
    """Start fault_server.py on an ephemeral port; yield (its process, its base URL)."""
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "fault_server.py"), "--pattern", pattern,
         "--ttft-ms", str(ttft_ms), "--itl-ms", str(itl_ms), *extra],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        line = proc.stdout.readline()  # blocks until the server prints its port (or dies)
        assert line.startswith("PORT "), f"fault server failed to start: {line!r}"
        yield proc, f"http://127.0.0.1:{int(line.split()[1])}"
    finally:
        proc.kill()
        proc.wait()


def wait_for_rows(proc: subprocess.Popen, out: Path, timeout_s: float = 60.0) -> None:
    """Block until the run in ``proc`` has written a requests part (the load is on)."""
    deadline = time.monotonic() + timeout_s
    parts = out / "requests.parquet"
    while not (parts.is_dir() and any(parts.glob("part-*.parquet"))):
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, "no rows written in time"
        time.sleep(0.05)  # polling the folder, not synchronising on a sleep


def start_run(*args: str, env: dict | None = None) -> subprocess.Popen:
    """``loadlab run ARGS`` started in the background (text pipes)."""
    return subprocess.Popen([sys.executable, "-m", "loadlab", "run", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
