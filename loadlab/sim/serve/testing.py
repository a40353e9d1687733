"""Start the simulator for tests and benchmarks, and always stop it.

Two ways, both yielding the base URL (``http://127.0.0.1:PORT``) once ``GET /health``
answers 200:

- :func:`running_sim` (a subprocess): ``python -m loadlab sim serve --port 0 <flags>``.
  The port is read from the line the server prints when it is listening (no guessing of
  free ports, no sleeps); ``/health`` is then polled until a deadline. On exit the
  process gets SIGTERM, then SIGKILL after ``stop_timeout_s``. The server's output is
  kept; if it dies or misses the deadline, :class:`~loadlab.errors.TargetError` carries
  its last lines. Use it when the code under test must not share an event loop or a
  core with the server (load generators, collectors, benchmarks).
- :func:`running_sim_in_thread`: the same server in a thread of this process, for
  tests that want it cheap (no interpreter start, about 10 ms).

Flags are Python keywords in vLLM's spelling with underscores:
``running_sim(max_num_seqs=4, num_gpu_blocks_override=64, enable_prefix_caching=False,
time_scale=10)``. ``True`` gives ``--flag``, ``False`` gives ``--no-flag`` (for the
boolean switches), ``None`` omits it.

Example::

    from loadlab.sim.serve.testing import running_sim
    with running_sim(max_num_seqs=4, time_scale=20) as url:
        httpx.post(f"{url}/v1/completions", json={"prompt": "hi", "max_tokens": 8})
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx

from loadlab.errors import LoadlabError, TargetError
from loadlab.sim.engine.config import SimConfig
from loadlab.sim.fleet.config import FleetConfig

URL_LINE = re.compile(r"Starting vLLM API server on (https?://\S+)")
_BOOL_WITH_NO = {"enable_prefix_caching", "enable_chunked_prefill", "scheduler_reserve_full_isl"}


def sim_argv(**flags: Any) -> list[str]:
    """``loadlab sim serve`` arguments for keyword flags (see the module docstring)."""
    argv: list[str] = []
    for key, value in flags.items():
        if value is None:
            continue
        name = "--" + key.replace("_", "-")
        if value is True:
            argv.append(name)
        elif value is False:
            if key in _BOOL_WITH_NO:
                argv.append("--no-" + key.replace("_", "-"))
        else:
            argv += [name, str(value)]
    return argv


def wait_healthy(url: str, deadline: float, alive: Any = lambda: True) -> None:
    """Poll ``url/health`` until 200; TargetError at the deadline or if ``alive()`` fails.

    An https simulator's certificate is not checked here: tests make their own."""
    with httpx.Client(timeout=1.0, verify=False) as client:
        while True:
            if not alive():
                raise TargetError(f"the simulator at {url} exited before it became healthy")
            try:
                if client.get(f"{url}/health").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise TargetError(f"the simulator at {url} was not healthy in time")
            time.sleep(0.02)      # poll pause, not synchronisation: the deadline bounds it


@contextmanager
def running_sim(startup_timeout_s: float = 30.0, stop_timeout_s: float = 10.0,
                **flags: Any) -> Iterator[str]:
    """Run ``loadlab sim serve --port 0`` as a subprocess; yield its base URL."""
    flags.setdefault("host", "127.0.0.1")
    flags["port"] = 0
    argv = [sys.executable, "-m", "loadlab", "sim", "serve", *sim_argv(**flags)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env)
    tail: deque[str] = deque(maxlen=40)
    found: list[str] = []
    announced = threading.Event()

    def pump() -> None:
        # Reads every line so the child never blocks on a full pipe.
        assert proc.stdout is not None
        for line in proc.stdout:
            tail.append(line.rstrip())
            match = URL_LINE.search(line)
            if match and not found:
                found.append(match.group(1))
                announced.set()
        announced.set()

    reader = threading.Thread(target=pump, name="sim-stdout", daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + startup_timeout_s
        announced.wait(startup_timeout_s)
        if not found:
            raise TargetError("the simulator did not start:\n" + "\n".join(tail))
        try:
            wait_healthy(found[0], deadline, alive=lambda: proc.poll() is None)
        except TargetError as exc:
            raise TargetError(f"{exc}:\n" + "\n".join(tail)) from None
        yield found[0]
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(stop_timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        reader.join(timeout=stop_timeout_s)


@contextmanager
def running_sim_in_thread(cfg: SimConfig | FleetConfig | None = None,
                          host: str = "127.0.0.1",
                          startup_timeout_s: float = 10.0) -> Iterator[str]:
    """Run the server on its own event loop in a daemon thread; yield its base URL."""
    from loadlab.sim.serve import server

    cfg = cfg or SimConfig()
    loop = asyncio.new_event_loop()
    started = threading.Event()
    state: dict[str, Any] = {}

    def run() -> None:
        asyncio.set_event_loop(loop)
        try:
            state["runner"], state["url"] = loop.run_until_complete(server.start(cfg, host, 0))
        except (LoadlabError, OSError) as exc:   # re-raised in the caller's thread below
            state["error"] = exc
            started.set()
            return
        started.set()
        loop.run_forever()
        loop.run_until_complete(state["runner"].cleanup())
        loop.close()

    thread = threading.Thread(target=run, name="sim-server", daemon=True)
    thread.start()
    if not started.wait(startup_timeout_s):
        raise TargetError("the in-process simulator did not start in time")
    if "error" in state:
        raise state["error"]
    try:
        yield state["url"]
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
