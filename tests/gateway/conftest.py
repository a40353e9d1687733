"""Fixtures of the gateway tests: a real nginx (https, self-signed certificate made here)
balancing ``/v1/`` over replicas that are separate server processes.

Without nginx the tests skip saying how to install it; under ``LOADLAB_REQUIRE_ALL=1``
(``.ci/run``, which installs it) or ``LOADLAB_REQUIRE_NGINX=1`` that skip is a failure
(tests/conftest.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
from nginx_gateway import Gateway, running_gateway


@pytest.fixture(scope="session")
def cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(certificate, key): the gateway's self-signed certificate, which runs trust with
    ``--ca-bundle``."""
    pytest.importorskip("cryptography", reason="pip install cryptography (makes the certificate)")
    from loadlab.sim.serve.selfsigned import self_signed

    return self_signed(tmp_path_factory.mktemp("certs"), "gateway")


@pytest.fixture
def gateway(cert: tuple[Path, Path], tmp_path: Path) -> Iterator[Callable[..., Gateway]]:
    """Factory: ``gateway(replica_urls, method)`` -> a started nginx, stopped at teardown."""
    with ExitStack() as stack:
        def start(replicas: list[str], method: str = "round-robin") -> Gateway:
            folder = tmp_path / f"nginx-{method}"
            return stack.enter_context(running_gateway(folder, replicas, *cert, method=method))

        yield start

