"""The built wheel works outside the checkout: shipped data, the CLI, the demo, a shipped scenario.

Builds the wheel from a copy of the sources (so nothing a checkout build left behind, such
as ``build/``, slips in), installs it with ``--no-deps`` into a fresh venv in a temporary
folder (``--system-site-packages``: the dependencies are already installed, nothing is
downloaded) and runs ``loadlab`` from there: in a folder outside the checkout, PYTHONPATH
unset, so only what the wheel carries can be found. The build uses the running
interpreter's setuptools when it is recent enough (``--no-build-isolation``), else pip
fetches the build requirements from the package index, as a user's ``pip install .`` does.

On a 2-core machine: the build and install about 10 s, the quick demo (four live points
and their what-if twins) about 2 minutes, the rest seconds.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest

from loadlab.runstore.manifest import SweepManifest, load_manifest

REPO = Path(__file__).resolve().parents[1]
SOURCES = ("pyproject.toml", "setup.py", "README.md", "loadlab", "profiles", "scenarios")
DATA_FOLDERS = ("profiles", "scenarios")
DEMO_TIMEOUT_S = 900


def _run(argv: list[str], cwd: Path, bin_dir: Path | None = None,
         timeout_s: float = 300) -> subprocess.CompletedProcess:
    """Run to completion with PYTHONPATH unset (and the venv first on PATH); must exit 0."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if bin_dir is not None:
        env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
        env["VIRTUAL_ENV"] = str(bin_dir.parent)
    res = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s,
                         check=False)
    assert res.returncode == 0, f"{' '.join(argv)}\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    return res


def _isolation() -> list[str]:
    """``--no-build-isolation`` when this interpreter has pyproject's build requirements."""
    try:
        recent = int(version("setuptools").split(".")[0]) >= 68
        version("wheel")
    except (PackageNotFoundError, ValueError):
        return []
    return ["--no-build-isolation"] if recent else []


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
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", *_isolation(),
          "-w", str(root / "dist"), str(src)], root)
    wheel = next((root / "dist").glob("loadlab-*.whl"))
    venv = root / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(venv)], root)
    _run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
          "--no-deps", "--force-reinstall", str(wheel)], root)
    return wheel, venv / "bin"


def test_wheel_holds_every_package_file_and_every_shipped_data_file(installed):
    wheel, _ = installed
    names = set(zipfile.ZipFile(wheel).namelist())
    files = {p.relative_to(REPO).as_posix() for p in (REPO / "loadlab").rglob("*")
             if p.is_file() and "__pycache__" not in p.parts}
    templates = {f"loadlab/report/templates/{name}" for name in ("report.html.j2", "report.css")}
    assert templates <= files
    assert files <= names, sorted(files - names)  # a package or data file setup.py missed
    for folder in DATA_FOLDERS:
        shipped = {f"loadlab/{folder}/{p.name}" for p in (REPO / folder).iterdir()
                   if p.suffix in (".yaml", ".md")}
        assert shipped and shipped <= names, sorted(shipped - names)


def test_installed_cli_lists_profiles_and_replays_outside_the_checkout(installed, tmp_path):
    _, bin_dir = installed
    where = _run([str(bin_dir / "python"), "-c", "import loadlab; print(loadlab.__file__)"],
                 tmp_path)
    assert Path(where.stdout.strip()).is_relative_to(bin_dir.parent)  # not the checkout's loadlab
    listed = _run([str(bin_dir / "loadlab"), "profile", "list"], tmp_path).stdout.split()
    assert {p.stem for p in (REPO / "profiles").glob("*.yaml")} <= set(listed)
    out = tmp_path / "replay"
    res = _run([str(bin_dir / "loadlab"), "sim", "replay", "--profile", "sharegpt",
                "--concurrency", "2", "--step-duration", "5", "--warmup", "1",
                "--max-num-seqs", "4", "--out", str(out)], tmp_path)
    assert "requests" in res.stdout
    assert (out / "manifest.json").is_file()
    assert any((out / "requests.parquet").glob("part-*.parquet"))


def test_every_shipped_scenario_loads_by_name_from_the_installed_package(installed, tmp_path):
    """Each scenario is found inside the venv and its profile (or trace) resolves there."""
    _, bin_dir = installed
    names = sorted(p.stem for p in (REPO / "scenarios").glob("*.yaml"))
    script = ("import sys\n"
              "from loadlab.experiment.scenarios import load_scenario, scenario_path\n"
              "from loadlab.spec.datafiles import checkout_root\n"
              "assert checkout_root() is None, checkout_root()\n"
              "for name in sys.argv[1:]:\n"
              "    s = load_scenario(name)\n"
              "    print(name, scenario_path(name), s.workload.profile, len(s.points()))\n")
    res = _run([str(bin_dir / "python"), "-c", script, *names], tmp_path, bin_dir)
    lines = res.stdout.splitlines()
    assert [line.split()[0] for line in lines] == names
    for line in lines:
        assert Path(line.split()[1]).is_relative_to(bin_dir.parent), line


def test_shipped_scenario_by_name_sweeps_in_virtual_time(installed, tmp_path):
    _, bin_dir = installed
    out = tmp_path / "whatif"
    res = _run([str(bin_dir / "loadlab"), "sweep", "demo", "--what-if", "--out", str(out)],
               tmp_path, bin_dir)
    manifest = load_manifest(out)
    assert isinstance(manifest, SweepManifest) and manifest.status == "complete"
    assert len(manifest.points) == 4 and all(p.status == "complete" and p.what_if
                                             for p in manifest.points)
    for point in manifest.points:
        assert (out / point.dir / "analysis.json").is_file(), point.name
        assert point.name in res.stdout
    assert (out / "report.html").is_file()


@pytest.mark.timeout(DEMO_TIMEOUT_S)
def test_demo_from_the_wheel_sweeps_ab_and_caps_reports_and_prints_verdicts(installed, tmp_path):
    """The README's first command, as a fresh machine runs it: ``loadlab demo`` from the
    installed wheel (the quick variant), outside the checkout."""
    _, bin_dir = installed
    out = tmp_path / "demo"
    res = _run([str(bin_dir / "loadlab"), "demo", "--quick", "--out", str(out)], tmp_path, bin_dir,
               timeout_s=DEMO_TIMEOUT_S - 60)
    live, whatif = load_manifest(out / "live"), load_manifest(out / "whatif")
    assert isinstance(live, SweepManifest) and isinstance(whatif, SweepManifest)
    assert live.status == whatif.status == "complete" and live.sweep.mode == "matrix"
    names = [p.name for p in live.points]
    assert names == [p.name for p in whatif.points] and len(names) == 4
    assert all(p.status == "complete" for p in live.points) and all(
        p.what_if for p in whatif.points)
    # the report is written, its path printed, and it shows every point
    report = out / "live" / "report.html"
    assert report.is_file() and str(report) in res.stdout
    html = report.read_text()
    for name in names:
        assert name in html, name
    analyses = {p.name: json.loads((out / "live" / p.dir / "analysis.json").read_text())
                for p in live.points}
    for name, analysis in analyses.items():
        assert analysis["verdict"] in res.stdout
        # 16 users against 8 slots (and 24): the sequence cap, KV far from full
        if name.startswith("max-num-seqs-8_"):
            assert analysis["knee"]["upper"] == 16 and analysis["cause"]["name"] == "seq_cap", (
                analysis["verdict"])
    # prefix caching: hits with it on, none off; the same seeded requests went to every point
    on = analyses["max-num-seqs-8_enable-prefix-caching-on"]["steps"]
    off = analyses["max-num-seqs-8_enable-prefix-caching-off"]["steps"]
    assert all(s["prefix_hit_rate"] > 0.2 for s in on) and not any(
        s["prefix_hit_rate"] for s in off)
    assert on[0]["ttft_p50_ms"] < off[0]["ttft_p50_ms"]
    assert "predicted:" in res.stdout and "hit rate" in res.stdout
