"""The Python API (``import loadlab``): light to import, the README's example runs as
written, and a live point leaves the caller unpatched by gevent.

Everything that runs loadlab here runs in a subprocess: a live point's child imports
Locust, and the pytest process must never (tests/conftest.py); the import checks need
a fresh interpreter to see what ``import loadlab`` itself pulls in.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
API = ["PointSpec", "analyze_run", "compare", "load_scenario", "replay_point", "run_point",
       "run_sweep", "write_report"]
HEAVY = ("locust", "gevent", "pandas", "plotly", "pyarrow")


def _python(
    code: str, cwd: Path | None = None, timeout: float = 300, pool: str | None = None
) -> subprocess.CompletedProcess:
    """``python -c code``; ``pool``: its ARROW_DEFAULT_MEMORY_POOL (None: unset, which
    this process's own ``import loadlab`` has set)."""
    env = {
        **{k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"},
        **({} if pool is None else {"ARROW_DEFAULT_MEMORY_POOL": pool}),
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def readme_example() -> str:
    """The first ```python block of the README's "Python API" section."""
    text = (REPO / "README.md").read_text()
    section = text.split("\n## Python API\n", 1)[1].split("\n## ", 1)[0]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match, "the README's Python API section has no ```python block"
    return match.group(1)


def test_import_loadlab_is_light_and_lists_the_api():
    res = _python("import json, sys, loadlab\n"
                  f"print(json.dumps([[m for m in {HEAVY!r} if m in sys.modules],\n"
                  "                  [n for n in dir(loadlab) if not n.startswith('_')],\n"
                  "                  loadlab.__all__, loadlab.__version__]))")
    assert res.returncode == 0, res.stderr
    loaded, listed, exported, version = json.loads(res.stdout)
    assert loaded == [], f"import loadlab imported {loaded}"
    assert listed == API and sorted(exported) == sorted([*API, "__version__"])
    from loadlab.version import __version__

    assert version == __version__


def test_arrow_allocates_with_the_system_allocator_unless_the_user_chose_one():
    code = "import loadlab, pyarrow; print(pyarrow.default_memory_pool().backend_name)"
    chosen = _python(code)
    assert chosen.returncode == 0, chosen.stderr
    assert chosen.stdout.strip() == "system"
    own = _python(code, pool="mimalloc")
    assert own.returncode == 0, own.stderr
    assert own.stdout.strip() == "mimalloc"


def test_every_api_name_resolves_to_its_implementation_without_locust():
    res = _python("import sys, loadlab\n"
                  "from loadlab.experiment.point import run_point\n"
                  "from loadlab.analyze.analysis import analyze_run\n"
                  "assert loadlab.run_point is run_point and loadlab.analyze_run is analyze_run\n"
                  f"print([callable(getattr(loadlab, n)) for n in {API!r}])\n"
                  "print([m for m in ('locust', 'gevent') if m in sys.modules])\n"
                  "try:\n    loadlab.no_such_thing\nexcept AttributeError as exc:\n    print(exc)")
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == [repr([True] * len(API)), "[]",
                                       "module 'loadlab' has no attribute 'no_such_thing'"]


def test_the_readme_example_runs_as_written(tmp_path):
    res = _python(readme_example(), cwd=tmp_path, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    report = re.search(r"^report: (.+)$", res.stdout, re.MULTILINE)
    assert report, res.stdout
    assert (tmp_path / report.group(1)).is_file()
    verdicts = [line for line in res.stdout.splitlines() if line.startswith("max-num-seqs-")]
    assert len(verdicts) == 4 and all("knee between" in line for line in verdicts), res.stdout
    sweep = (tmp_path / report.group(1)).parent
    analysis = json.loads(
        (sweep / "max-num-seqs-8_enable-prefix-caching-on" / "analysis.json").read_text()
    )
    assert analysis["cause"]["name"] == "seq_cap", analysis["cause"]


LIVE_POINT = """
import sys
from pathlib import Path

import loadlab
from loadlab.errors import LoadlabError
from loadlab.spec.plan import LoadPlan
from loadlab.spec.scenario import LoadgenSettings, Target, Workload

lines = []
spec = loadlab.PointSpec(
    out=Path(sys.argv[1]), target=Target(launch="sim"), workload=Workload(profile=sys.argv[2]),
    plan=LoadPlan(concurrency=[2], step_duration_s=float(sys.argv[3]), warmup_s=0.0),
    loadgen=LoadgenSettings(drain_s=1.0, collect_interval_s=0.5),
    server_args=["--max-num-seqs", "2"],
    progress=lines.append)
try:
    manifest = loadlab.run_point(spec)
    print("status", manifest["status"], manifest["records"]["rows"])
except LoadlabError as exc:
    print("raised", type(exc).__name__, exc.exit_code)
print("progress", sum("sim server up" in line for line in lines))
print("patched", [m for m in ("gevent", "locust") if m in sys.modules])
"""


def _script(tmp_path: Path) -> Path:
    path = tmp_path / "point.py"
    path.write_text(LIVE_POINT)
    return path


def test_a_live_point_runs_in_a_child_and_never_patches_the_caller(tmp_path, uniform_profile):
    profile = uniform_profile("short", (8, 16), (4, 8))
    out = tmp_path / "point"
    res = subprocess.run([sys.executable, str(_script(tmp_path)), str(out), str(profile), "2"],
                         capture_output=True, text=True, timeout=300, check=False,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert res.returncode == 0, res.stderr[-3000:]
    status, progress, patched = res.stdout.splitlines()
    assert status.startswith("status complete ") and int(status.split()[-1]) > 0, res.stdout
    assert progress == "progress 1", "the child's progress lines reach the caller's callable"
    assert patched == "patched []"
    assert any((out / "metrics.parquet").glob("*.parquet")), "the child's scraper wrote metrics"


def test_sigterm_to_the_caller_interrupts_the_child_and_keeps_its_records(
    tmp_path, uniform_profile
):
    profile = uniform_profile("short", (8, 16), (4, 8))
    out = tmp_path / "point"
    proc = subprocess.Popen([sys.executable, str(_script(tmp_path)), str(out), str(profile), "120"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    deadline = time.monotonic() + 120
    while not any((out / "requests.parquet").glob("part-*.parquet")):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.05)  # polling the folder the child writes, not synchronising on a sleep
    family = psutil.Process(proc.pid).children(recursive=True)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr[-3000:]
    assert stdout.splitlines()[0] == "raised RunInterrupted 143", stdout + stderr[-3000:]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "interrupted" and manifest["records"]["rows"] > 0
    assert [p.pid for p in family if p.is_running() and p.status() != psutil.STATUS_ZOMBIE] == [], \
        "the child, its server and its workers all ended"


def test_an_input_error_in_the_child_reaches_the_caller_whole(tmp_path):
    res = _python(
        "from pathlib import Path\n"
        "import loadlab\n"
        "from loadlab.errors import InputError\n"
        "from loadlab.spec.plan import LoadPlan\n"
        "from loadlab.spec.scenario import Target, Workload\n"
        "spec = loadlab.PointSpec(out=Path('p'), "
        "target=Target(url='http://127.0.0.1:9', model='m'),\n"
        "    workload=Workload(), plan=LoadPlan(concurrency=[1], step_duration_s=1.0))\n"
        "try:\n    loadlab.run_point(spec)\n"
        "except InputError as exc:\n    print(exc.exit_code, exc.field, bool(exc.fix))",
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip() == "2 --target True"
