"""Fixtures of the collector tests: real /metrics pages served over HTTP on port 0."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from collect_pages import LOAD_PAGE

from loadlab.collect.testing import PageServer


@pytest.fixture
def vllm_page() -> str:
    return LOAD_PAGE.read_text()


@pytest.fixture
def page_server(vllm_page: str) -> Iterator[callable]:
    """Factory: ``page_server(mode)`` starts a PageServer, stopped at teardown."""
    started: list[PageServer] = []

    def start(mode: str = "ok") -> PageServer:
        server = PageServer(vllm_page, mode).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()
