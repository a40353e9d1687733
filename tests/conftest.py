"""Suite-wide guard: nothing may gevent-monkey-patch the pytest process.

Importing Locust runs gevent's ``monkey.patch_all()``. Inside the test process that
silently turns every later test's threads into greenlets and breaks ssl (RecursionError),
in-thread servers (never start) and asyncio — failures that show up far from their cause.
Tests that need Locust run ``loadlab run`` (or a helper script) in a subprocess. This guard
names the offending test instead of letting the damage surface elsewhere.
"""

from __future__ import annotations

import sys

import pytest


def _patched() -> bool:
    if "gevent.monkey" not in sys.modules:
        return False
    return bool(sys.modules["gevent.monkey"].is_module_patched("socket"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item):
    already = _patched()
    yield
    if not already and _patched():
        pytest.fail(
            f"{item.nodeid} gevent-monkey-patched the test process (it imported Locust in-process); "
            "run that code in a subprocess (python -m loadlab run ...) so later tests keep real threads",
            pytrace=False,
        )


def pytest_collection_finish(session: pytest.Session) -> None:
    if _patched():
        raise pytest.UsageError(
            "a test module imported Locust (gevent monkey-patching) at collection time; "
            "import it inside a subprocess instead"
        )
