"""Shared fixtures: the public traces beside the clone (``<repo>/../shared/traces``)."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TRACES = REPO.parent / "shared" / "traces"


@pytest.fixture(scope="session")
def traces_dir() -> Path:
    if not (TRACES / "README.md").is_file():
        pytest.skip(
            f"public traces not found at {TRACES}: clone the project's shared/ folder "
            "beside the repository to check the shipped profiles against their sources"
        )
    return TRACES
