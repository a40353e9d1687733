"""The built wheel works outside the checkout: shipped profiles, the CLI, a replay.

Builds the wheel from a copy of the sources (pip, with build isolation, as a user's
``pip install .`` does; setuptools comes from the package index or pip's cache), installs
it into a fresh venv in a temporary folder (``--system-site-packages`` for the
dependencies, no PYTHONPATH) and runs ``loadlab`` from there, in that folder.
About 10-20 s on a 2-core machine, most of it the build.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SOURCES = ("pyproject.toml", "setup.py", "README.md", "loadlab", "profiles")


def _run(argv: list[str], cwd: Path, timeout_s: float = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    res = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s, check=False)
    assert res.returncode == 0, f"{' '.join(argv)}\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    return res


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the wheel, the venv's bin folder) of a wheel built from a copy of the sources."""
    root = tmp_path_factory.mktemp("wheel")
    src = root / "src"
    src.mkdir()
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(REPO / name, src / name)
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(root / "dist"), str(src)], root)
    wheel = next((root / "dist").glob("loadlab-*.whl"))
    venv = root / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(venv)], root)
    _run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
          "--no-deps", "--force-reinstall", str(wheel)], root)
    return wheel, venv / "bin"


def test_wheel_holds_every_package_file_and_every_shipped_profile(installed):
    wheel, _ = installed
    names = set(zipfile.ZipFile(wheel).namelist())
    files = {p.relative_to(REPO).as_posix() for p in (REPO / "loadlab").rglob("*")
             if p.is_file() and "__pycache__" not in p.parts}
    profiles = {f"loadlab/profiles/{p.name}" for p in (REPO / "profiles").glob("*.yaml")}
    assert files and files <= names, sorted(files - names)  # a package or data file setup.py missed
    assert profiles and profiles <= names, sorted(profiles - names)


def test_installed_cli_lists_profiles_and_replays_outside_the_checkout(installed, tmp_path):
    _, bin_dir = installed
    where = _run([str(bin_dir / "python"), "-c", "import loadlab; print(loadlab.__file__)"], tmp_path)
    assert Path(where.stdout.strip()).is_relative_to(bin_dir.parent)  # not the checkout's loadlab
    listed = _run([str(bin_dir / "loadlab"), "profile", "list"], tmp_path).stdout.split()
    assert {p.stem for p in (REPO / "profiles").glob("*.yaml")} <= set(listed)
    out = tmp_path / "replay"
    res = _run([str(bin_dir / "loadlab"), "sim", "replay", "--profile", "sharegpt", "--concurrency", "2",
                "--step-duration", "5", "--warmup", "1", "--max-num-seqs", "4", "--out", str(out)], tmp_path)
    assert "requests" in res.stdout
    assert (out / "manifest.json").is_file() and any((out / "requests.parquet").glob("part-*.parquet"))
