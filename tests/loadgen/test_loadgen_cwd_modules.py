"""A file named like a standard module where ``loadlab run`` starts breaks none of its processes.

``python -m`` put the working directory first on the path of the point's child, its Locust
worker and the launched simulator, so an ``inspect.py`` there replaced the standard
``inspect``: on main the worker died at import and the run waited 60 s for it to join.
"""

from __future__ import annotations

import json
import subprocess

from loadlab.pystart import module_argv


def test_a_run_started_beside_a_broken_inspect_py_completes(tiny_profile, tmp_path) -> None:
    cwd = tmp_path / "work"
    cwd.mkdir()
    for name in ("inspect.py", "random.py"):
        (cwd / name).write_text(f"raise RuntimeError('the user\\'s own {name} was imported')\n")
    out = tmp_path / "run"
    # started as the ``loadlab`` console script starts: no working directory on its own path
    argv = module_argv("loadlab", "run", "--launch", "sim", "--profile", str(tiny_profile),
                       "--concurrency", "2", "--step-duration", "2", "--warmup", "0.2",
                       "--workers", "1", "--no-calibrate", "--out", str(out))
    r = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "was imported" not in r.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "complete" and manifest["records"]["rows"] > 0
