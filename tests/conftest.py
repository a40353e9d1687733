"""Suite-wide rules: no skip where one is not allowed; nothing gevent-patches pytest.

Skips. A test skips, with instructions, when an optional real component is missing
(Prometheus, real vLLM, the shared traces). Where everything must run, a skip is a
failure naming the test and the skip's reason:

- ``CI`` set (to anything but ``""``, ``0`` or ``false``) or ``LOADLAB_REQUIRE_ALL=1``
  (``.ci/run`` sets it): any skip;
- ``LOADLAB_REQUIRE_PROMETHEUS=1``: a skip of a test marked ``prometheus``;
- ``LOADLAB_REQUIRE_VLLM=1``: a skip of a test marked ``vllm``;
- ``LOADLAB_REQUIRE_NGINX=1``: a skip of a test marked ``nginx`` (tests/gateway).

Monkey-patching. Importing Locust runs gevent's ``monkey.patch_all()``. Inside the test
process that silently turns every later test's threads into greenlets and breaks ssl
(RecursionError), in-thread servers (never start) and asyncio — failures that show up far
from their cause. Tests that need Locust run ``loadlab run`` (or a helper script) in a
subprocess. The guard names the offending test instead of letting the damage surface
elsewhere.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

REQUIRED_BY_MARKER = {"prometheus": "LOADLAB_REQUIRE_PROMETHEUS", "vllm": "LOADLAB_REQUIRE_VLLM",
                      "nginx": "LOADLAB_REQUIRE_NGINX"}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "nginx: needs an nginx binary (apt-get install -y nginx)")


def _forbidding_skip(item: pytest.Item | pytest.Collector) -> str | None:
    """The environment variable under which ``item`` may not skip, if one is set."""
    if os.environ.get("CI", "").lower() not in ("", "0", "false"):
        return "CI"
    if os.environ.get("LOADLAB_REQUIRE_ALL") == "1":
        return "LOADLAB_REQUIRE_ALL=1"
    for marker, var in REQUIRED_BY_MARKER.items():
        if item.get_closest_marker(marker) is not None and os.environ.get(var) == "1":
            return f"{var}=1"
    return None


def _fail_skip(report: pytest.TestReport | pytest.CollectReport, forbidden_by: str | None) -> None:
    if not report.skipped or hasattr(report, "wasxfail") or forbidden_by is None:
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    report.outcome = "failed"
    report.longrepr = f"{report.nodeid} skipped, which {forbidden_by} does not allow: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    _fail_skip(outcome.get_result(), _forbidding_skip(item))


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector):
    """A whole module skipped at import (``allow_module_level``, ``importorskip``)."""
    outcome = yield
    _fail_skip(outcome.get_result(), _forbidding_skip(collector))


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
            f"{item.nodeid} gevent-monkey-patched the test process "
            "(it imported Locust in-process); run that code in a subprocess "
            "(python -m loadlab run ...) so later tests keep real threads",
            pytrace=False,
        )


def pytest_collection_finish(session: pytest.Session) -> None:
    if _patched():
        raise pytest.UsageError(
            "a test module imported Locust (gevent monkey-patching) at collection time; "
            "import it inside a subprocess instead"
        )


ProfileWriter = Callable[[str, tuple[int, int], tuple[int, int]], Path]


@pytest.fixture(scope="session")
def tls_cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate and its key for 127.0.0.1 and localhost (https tests)."""
    from loadlab.sim.serve.selfsigned import self_signed

    return self_signed(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="session")
def uniform_profile(tmp_path_factory: pytest.TempPathFactory) -> ProfileWriter:
    """``uniform_profile(name, (lo, hi), (lo, hi))``: the path of a workload profile whose
    prompt and output lengths (tokens) are uniform over those ranges, no prefixes, no
    arrival process: short requests keep live runs quick."""
    def write(name: str, prompt: tuple[int, int], output: tuple[int, int]) -> Path:
        def lengths(lo: int, hi: int) -> str:
            at = {f"p{q}": lo + (hi - lo) * q / 100 for q in (10, 25, 50, 75, 90, 99)}
            summary = {"n": 2, "mean": (lo + hi) / 2, **at, "max": hi}
            return f"{{p: [0.0, 1.0], v: [{lo}, {hi}]}}", "{" + ", ".join(
                f"{k}: {v:g}" for k, v in summary.items()
            ) + "}"

        (inp, inp_summary), (out, out_summary) = lengths(*prompt), lengths(*output)
        path = tmp_path_factory.mktemp("profiles") / f"{name}.yaml"
        path.write_text(f"""format_version: 1
name: {name}
description: uniform lengths for tests
source: {{dataset: none, origin: tests/conftest.py, licence: none, citation: none,
         derivation: hand-written}}
lengths:
  input: {inp}
  output: {out}
  input_summary: {inp_summary}
  output_summary: {out_summary}
arrivals: {{process: none}}
prefix: {{kind: none}}
""")
        return path

    return write
