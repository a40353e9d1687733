"""``probe`` on targets loadlab cannot load it into: refused before anything starts (exit 2)."""

from __future__ import annotations

import socket

import pytest

from loadlab.errors import InputError
from loadlab.experiment import launcher
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


def test_the_probe_port_is_free_and_below_the_ports_the_kernel_hands_out(tmp_path, monkeypatch):
    # vLLM opens sockets on kernel-chosen (ephemeral) ports before the probe binds its own;
    # a port from that range picked at launch can be taken by then
    low = int(launcher.EPHEMERAL_RANGE.read_text().split()[0])
    for _ in range(5):
        port = launcher.port_outside_ephemeral()
        assert low - 8192 <= port < low - 4096
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))            # free when handed out
    # every port of the span taken but one: that one is found
    fake = tmp_path / "range"
    fake.write_text("40000\t60999\n")
    monkeypatch.setattr(launcher, "EPHEMERAL_RANGE", fake)
    taken = set(range(40000 - 8192, 40000 - 4096)) - {33333}
    real_bind = socket.socket.bind

    def bind(self, address):
        if address[1] in taken:
            raise OSError(98, "Address already in use")
        return real_bind(self, address)

    monkeypatch.setattr(socket.socket, "bind", bind)
    assert launcher.port_outside_ephemeral() == 33333
