"""The suite's own rules: where everything must run, a skip fails (tests/conftest.py); no
comment or docstring in loadlab/ points at a document outside the repository."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

CONFTEST = Path(__file__).with_name("conftest.py")
SKIPPING = '''
import pytest

def test_needs_a_widget():
    pytest.skip("no widget here: apt-get install widget")

@pytest.mark.prometheus
def test_needs_prometheus():
    pytest.skip("needs a Prometheus binary")
'''
MODULE_SKIP = '''
import pytest
pytest.importorskip("no_such_module_anywhere")

def test_never_collected():
    pass
'''


def _pytest(folder: Path, **env: str) -> subprocess.CompletedProcess:
    clean = {
        k: v for k, v in os.environ.items() if k != "CI" and not k.startswith("LOADLAB_REQUIRE")
    }
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:locust",
            "-c",
            os.devnull,
            "-W",
            "ignore::pytest.PytestUnknownMarkWarning",
            "--rootdir",
            str(folder),
            str(folder),
        ],
        capture_output=True,
        text=True,
        env={**clean, **env},
        timeout=120,
        check=False,
    )


@pytest.fixture
def suite(tmp_path: Path) -> Path:
    (tmp_path / "conftest.py").write_text(CONFTEST.read_text())
    (tmp_path / "test_skipping.py").write_text(SKIPPING)
    return tmp_path


def test_skips_are_skips_on_a_workstation(suite):
    res = _pytest(suite)
    assert res.returncode == 0 and "2 skipped" in res.stdout, res.stdout


@pytest.mark.parametrize("env", [{"CI": "true"}, {"LOADLAB_REQUIRE_ALL": "1"}])
def test_any_skip_fails_in_ci_naming_test_and_reason(suite, env):
    res = _pytest(suite, **env)
    assert res.returncode == 1, res.stdout
    assert "test_skipping.py::test_needs_a_widget skipped" in res.stdout
    assert "no widget here: apt-get install widget" in res.stdout
    assert "2 failed" in res.stdout


def test_a_module_skipped_at_import_fails_collection_in_ci(suite):
    (suite / "test_module_skip.py").write_text(MODULE_SKIP)
    res = _pytest(suite, LOADLAB_REQUIRE_ALL="1")
    assert res.returncode != 0, res.stdout
    assert "test_module_skip.py skipped" in res.stdout and "no_such_module_anywhere" in res.stdout


def test_require_prometheus_fails_only_the_prometheus_tests(suite):
    res = _pytest(suite, LOADLAB_REQUIRE_PROMETHEUS="1")
    assert res.returncode == 1, res.stdout
    assert (
        "test_needs_prometheus skipped, which LOADLAB_REQUIRE_PROMETHEUS=1 does not allow"
        in res.stdout
    )
    assert "1 failed, 1 skipped" in res.stdout


REPO = Path(__file__).resolve().parents[1]
# A document named by file (``DESIGN.md``) or by its short name (``vllm-facts``), or a path
# on one machine (``/tmp/briefs``).
POINTER = re.compile(
    r"[\w./-]*\.md\b|\b(?:vllm-facts|real-vllm)\b|(?<![\w.])/(?:tmp|work|home|root)/\S*"
)


def test_loadlab_cites_no_document_outside_the_repository():
    """A reader of the code has the repository, not the notes it was written from: every
    ``*.md`` named must be a file in the repository, and no machine-local path appears."""
    shipped = {p.name for p in REPO.rglob("*.md") if ".git" not in p.parts} | \
        {str(p.relative_to(REPO)) for p in REPO.rglob("*.md") if ".git" not in p.parts}
    outside = [f"{path.relative_to(REPO)}:{n}: {hit}"
               for path in sorted((REPO / "loadlab").rglob("*.py"))
               for n, line in enumerate(path.read_text().splitlines(), 1)
               for hit in POINTER.findall(line) if hit not in shipped]
    assert outside == [], "cite the public source (a vLLM file, a paper) or say it in place:\n" + \
        "\n".join(outside)


def test_the_pointer_rule_catches_what_it_is_for():
    found = POINTER.findall(
        '"""see DESIGN.md, /tmp/briefs/SIM_TYPES.md, vllm-facts; vllm/v1/x.py"""'
    )
    assert found == ["DESIGN.md", "/tmp/briefs/SIM_TYPES.md", "vllm-facts"]


def test_every_part_of_the_package_sits_in_a_layer():
    """lint-imports checks only the modules its contract names: a new subpackage left out
    of ``[tool.importlinter]`` would import anything unchecked."""
    import tomllib

    layers = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"][
        "contracts"][0]["layers"]
    named = {name.strip() for layer in layers for name in layer.split("|")}
    parts = {f"loadlab.{p.stem}" for p in (REPO / "loadlab").iterdir()
             if (p.suffix == ".py" and p.stem not in ("__init__", "__main__"))
             or (p.is_dir() and (p / "__init__.py").exists())}
    parts = {p for p in parts if p != "loadlab.sim"} | {
        f"loadlab.sim.{p.name}" for p in (REPO / "loadlab" / "sim").iterdir()
        if (p / "__init__.py").exists()}
    assert sorted(parts - named) == []


def test_test_modules_have_unique_names():
    """Test folders are not packages: pytest imports each module by its file name, so two
    ``test_x.py`` in different folders stop the whole collection ("import file mismatch")."""
    names = [p.name for p in (REPO / "tests").rglob("*.py")
             if p.name not in ("conftest.py", "__init__.py")]
    assert sorted({n for n in names if names.count(n) > 1}) == []
