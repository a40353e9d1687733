"""Fixtures for the load generator's tests: real servers on port 0, runs as subprocesses.

``loadlab run`` imports Locust, which monkey-patches the process with gevent; runs
therefore happen in subprocesses (as a user runs them) and this test process stays
unpatched. The simulator comes from :func:`loadlab.sim.serve.testing.running_sim`; the
fault-injecting server from ``fault_server.py`` beside this file.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from runs import fault_server_process

from loadlab.runstore import REQUESTS, read_manifest, read_table

HERE = Path(__file__).parent
MODEL = "test-model"


@contextmanager
def fault_server(pattern: str = "ok", ttft_ms: float = 5.0, itl_ms: float = 2.0,
                 tokenize: str = "ok") -> Iterator[str]:
    """Start fault_server.py on an ephemeral port; yield its base URL."""
    with fault_server_process(pattern, ttft_ms, itl_ms, "--tokenize-pattern", tokenize) as (_, url):
        yield url


@pytest.fixture(scope="session")
def tiny_profile(uniform_profile) -> Path:
    """A profile of short requests (prompts 20-60 tokens, outputs 4-12), so runs are quick."""
    return uniform_profile("tiny", (20, 60), (4, 12))


def run_cli(
    *args: str, timeout_s: float = 120.0, env: dict | None = None
) -> subprocess.CompletedProcess:
    """``loadlab run ARGS`` in a subprocess; returns the completed process (text output)."""
    return subprocess.run([sys.executable, "-m", "loadlab", "run", *args], capture_output=True,
                          text=True, timeout=timeout_s, env=env, check=False)


def load_run(out: Path) -> tuple:
    """(requests DataFrame, manifest dict) of a run folder."""
    return read_table(out / "requests.parquet", REQUESTS), read_manifest(out)


@pytest.fixture
def fault():
    """The :func:`fault_server` context manager."""
    return fault_server


@pytest.fixture
def cli():
    """:func:`run_cli`: run ``loadlab run`` in a subprocess."""
    return run_cli


@pytest.fixture
def load():
    """:func:`load_run`: read a run folder."""
    return load_run
