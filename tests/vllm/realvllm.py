"""Where the real vLLM and the tiny model are, and the flags test servers get.

Shared by conftest.py (fixtures) and the test modules of this folder.
"""

from __future__ import annotations

import os
from pathlib import Path

from loadlab.sweep.launcher import find_vllm

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


def flag_list(flags: dict[str, object]) -> list[str]:
    """{'max_num_seqs': 4, 'enforce_eager': True, 'enable_prefix_caching': False} -> argv."""
    argv: list[str] = []
    for key, value in flags.items():
        name = "--" + key.replace("_", "-")
        if value is True:
            argv.append(name)
        elif value is False:
            argv.append("--no-" + key.replace("_", "-"))
        else:
            argv += [name, str(value)]
    return argv
