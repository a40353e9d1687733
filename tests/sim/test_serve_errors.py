"""`loadlab sim serve` refuses what it cannot serve: one line, exit 2, nothing left listening."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest


def _serve(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "loadlab", "sim", "serve", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _one_line(res: subprocess.CompletedProcess, *needles: str) -> None:
    err = res.stderr.strip()
    assert res.returncode == 2 and "\n" not in err and err.startswith("loadlab: error:"), res.stderr
    assert all(n in err for n in needles), err


def test_port_in_use() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        _one_line(
            _serve("--port", str(port)),
            "--host/--port",
            f"cannot listen on 127.0.0.1:{port}",
            "address already in use",
        )


@pytest.mark.parametrize("host,needle", [("999.1.1.1", "cannot listen on 999.1.1.1:0"),
                                         ("192.0.2.1", "cannot assign requested address")])
def test_host_that_is_not_this_machine(host, needle) -> None:
    _one_line(_serve("--host", host, "--port", "0"), "--host/--port", needle)


@pytest.mark.parametrize("flag,value,needle", [("--output-len-mean", "-5", "must be > 0"),
                                               ("--output-len-mean", "0", "must be > 0"),
                                               ("--output-len-sigma", "-1", "must be >= 0"),
                                               ("--step-jitter", "-0.1", "must be >= 0")])
def test_negative_output_length_parameters(flag, value, needle) -> None:
    _one_line(_serve(flag, value, "--port", "0"), flag, needle)
