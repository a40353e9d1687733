"""loadlab_probe under data parallelism: each engine core serves on the port plus its rank,
and a port it cannot bind costs the server nothing.

Every engine core of a data-parallel ``vllm serve`` builds its own scheduler and inherits
the same ``LOADLAB_PROBE_PORT``. The probe module is imported as vLLM imports it (its folder
on the path, in the vLLM venv); engines 0 and 1 start on one base port that something else
already holds: engine 0 must carry on without /metrics, engine 1 must serve its series,
labelled with its rank, on the next port.
"""

from __future__ import annotations

import os
import socket
import subprocess

import pytest
from realvllm import VLLM_ENV

from loadlab.probe import probe_dir

pytestmark = pytest.mark.vllm

SCRIPT = """
import sys, urllib.request
from loadlab_probe import Counters, serve_engine
base = int(sys.argv[1])
assert serve_engine(Counters({"engine": "0"}), base, 0) is None
counters = Counters({"engine": "1"})
counters.record(None)
server = serve_engine(counters, base, 1)
print(urllib.request.urlopen(f"http://127.0.0.1:{base + 1}/metrics", timeout=5).read().decode())
server.shutdown()
"""


def _held_port_with_a_free_next() -> tuple[socket.socket, int]:
    """A socket holding a port whose successor is free (retried: the successor may be taken)."""
    for _ in range(50):
        held = socket.socket()
        held.bind(("0.0.0.0", 0))
        held.listen()
        port = held.getsockname()[1]
        with socket.socket() as probe:
            try:
                probe.bind(("0.0.0.0", port + 1))
            except OSError:
                held.close()
                continue
        return held, port
    raise AssertionError("no port with a free successor in 50 tries")


def test_engines_serve_on_port_plus_rank_and_a_taken_port_is_survived(require_vllm) -> None:
    held, port = _held_port_with_a_free_next()
    with held:
        proc = subprocess.run([str(require_vllm), "-c", SCRIPT, str(port)], capture_output=True,
                              text=True, timeout=180, check=False, cwd=probe_dir(),
                              env={**os.environ, **VLLM_ENV, "PYTHONPATH": str(probe_dir())})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert 'loadlab:scheduler_steps_total{engine="1"} 1' in proc.stdout, proc.stdout
    log = proc.stdout + proc.stderr   # vLLM's logger writes to stdout
    assert f"engine 0 cannot serve /metrics on port {port}" in log, log[-3000:]
