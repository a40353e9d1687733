"""Fixtures for the load generator's tests: real servers on port 0, runs as subprocesses.

``loadlab run`` imports Locust, which monkey-patches the process with gevent; runs
therefore happen in subprocesses (as a user runs them) and this test process stays
unpatched. The simulator comes from :func:`loadlab.sim.testing.running_sim`; the
fault-injecting server from ``fault_server.py`` beside this file.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
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
def tiny_profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A profile of short requests (prompts 20-60 tokens, outputs 4-12), so runs are quick."""
    path = tmp_path_factory.mktemp("profiles") / "tiny.yaml"
    path.write_text(textwrap.dedent("""\
        format_version: 1
        name: tiny
        description: short prompts and outputs for load-generator tests
        source: {dataset: none, origin: tests/loadgen/conftest.py, licence: none, citation: none,
                 derivation: hand-written}
        lengths:
          input: {p: [0.0, 1.0], v: [20, 60]}
          output: {p: [0.0, 1.0], v: [4, 12]}
          input_summary: {n: 2, mean: 40, p10: 24, p25: 30, p50: 40, p75: 50, p90: 56, p99: 60, max: 60}
          output_summary: {n: 2, mean: 8, p10: 5, p25: 6, p50: 8, p75: 10, p90: 11, p99: 12, max: 12}
        arrivals: {process: none}
        prefix: {kind: none}
        """))
    return path


def run_cli(*args: str, timeout_s: float = 120.0, env: dict | None = None) -> subprocess.CompletedProcess:
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
