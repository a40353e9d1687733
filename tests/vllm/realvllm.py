"""Where the real vLLM and the tiny model are, the flags test servers get, and how they start.

Shared by conftest.py (fixtures), the test modules of this folder and the benchmarks that
drive a real vLLM.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil

from loadlab.sweep.launcher import LaunchedTarget, find_vllm, launch_target
from loadlab.sweep.server_flags import to_argv

# The checkout holding these tests (not loadlab's install location: under tox loadlab is
# installed into .tox, while .vllm-venv, .cache and tools/ stay in the checkout).
REPO_ROOT = Path(__file__).resolve().parents[2]

ENABLE_HINT = "real vLLM not installed: run `bash tools/install_vllm.sh` to enable these tests"
VLLM_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "VLLM_HOST_IP": "127.0.0.1",
}
# Flags every test server gets unless a test overrides them (vLLM names, underscores).
BASE_FLAGS: dict[str, object] = {
    "served_model_name": "tiny",
    "max_model_len": 1024,
    "block_size": 32,
    "gpu_memory_utilization": 0.5,
    "enforce_eager": True,
    "max_num_batched_tokens": 256,
}


def tiny_model_dir() -> Path:
    return Path(os.environ.get("LOADLAB_TINY_MODEL", REPO_ROOT / ".cache" / "tiny-llama"))


def vllm_python() -> Path | None:
    vllm = find_vllm()
    python = vllm.parent / "python" if vllm else None
    return python if python and python.exists() else None


def missing_reason() -> str | None:
    if find_vllm() is None or vllm_python() is None:
        return ENABLE_HINT
    if not (tiny_model_dir() / "config.json").exists():
        return f"tiny model missing at {tiny_model_dir()}: run `bash tools/install_vllm.sh`"
    return None


# vLLM's engine-core process busy-polls its worker (sched_yield for a second after each
# read) on the one core the CPU backend leaves to everything but the worker, so on 2
# cores the API server and the client starve beside it: about 10-40% of streams at
# concurrency 1-2 reached the client whole at the end (client TTFT mean 39-87 ms against
# 19-21 ms once the engine core yields). A GPU host gives the API server a core of its
# own; lowering the engine core's priority is the 2-core stand-in for that.
ENGINE_CORE_NICE = 10


@contextmanager
def tiny_vllm(run_dir: Path, startup_timeout_s: float = 300, **overrides: object) -> Iterator[LaunchedTarget]:
    """``vllm serve`` of the tiny model with BASE_FLAGS + overrides, engine core deprioritised."""
    argv = [str(tiny_model_dir()), *to_argv({**BASE_FLAGS, **overrides})]
    with launch_target("vllm", argv, run_dir, env=VLLM_ENV, startup_timeout_s=startup_timeout_s) as target:
        deprioritise_engine_core(target.pid)
        yield target


def deprioritise_engine_core(server_pid: int) -> int:
    """Renice every thread of the server's engine-core process; returns how many."""
    count = 0
    for child in psutil.Process(server_pid).children(recursive=True):
        if child.name().startswith("VLLM::EngineCor"):
            for thread in child.threads():
                os.setpriority(os.PRIO_PROCESS, thread.id, ENGINE_CORE_NICE)
                count += 1
    return count
