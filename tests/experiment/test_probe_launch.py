"""``probe`` on targets loadlab cannot load it into: refused before anything starts (exit 2)."""

from __future__ import annotations

import pytest

from loadlab.errors import InputError
from loadlab.experiment.launcher import launch_target
from loadlab.spec.scenario import Target
from loadlab.spec.validate import validate


@pytest.mark.parametrize("fields", [{"launch": "sim", "probe": True},
                                    {"url": "http://127.0.0.1:8000", "probe": True}])
def test_probe_needs_a_launched_vllm(fields):
    with pytest.raises(InputError, match="probe is for a vllm loadlab launches"):
        validate(Target, fields)


def test_launcher_refuses_probe_for_sim_and_a_taken_scheduler_cls(tmp_path, monkeypatch):
    with pytest.raises(InputError, match="loads into vLLM"), \
            launch_target("sim", [], tmp_path, probe=True):
        pass
    monkeypatch.setenv("LOADLAB_VLLM_BIN", "/bin/true")
    with pytest.raises(InputError, match="--scheduler-cls is taken"), \
            launch_target("vllm", ["m", "--scheduler-cls", "x.Y"], tmp_path, probe=True):
        pass
    assert not list(tmp_path.iterdir())  # refused before the server's log was made
