"""A run folder written by the virtual-time driver, shared by the run-folder tests."""

from __future__ import annotations

import pytest

from loadlab.replay.driver import run_replay
from loadlab.sim.engine.config import SimConfig
from loadlab.spec.plan import LoadPlan
from loadlab.spec.scenario import Workload


@pytest.fixture(scope="module")
def replayed(tmp_path_factory):
    out = tmp_path_factory.mktemp("replayed")
    run_replay(SimConfig(max_num_seqs=4, model="llama-3.1-8b", gpu="h100"),
               LoadPlan(concurrency=[2, 8], step_duration_s=6.0, warmup_s=1.0),
               Workload(profile="azure-conv", seed=1), out)
    return out
