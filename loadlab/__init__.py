"""loadlab: find where a vLLM server's scheduler stalls, why, and which flag moves it.

The Python API, for notebooks and scripts (the CLI calls the same functions)::

    import loadlab
    scenario = loadlab.load_scenario("demo")                 # a shipped name, or a file
    sweep = loadlab.run_sweep(scenario, out, what_if=True)   # every point, virtual time
    point = sweep.manifest.points[0].folder(out)             # one point's run folder
    analysis = loadlab.analyze_run(point)                    # knee, cause, knob
    loadlab.write_report(out)                                # report.html

Importing this package imports nothing but the version (and picks Arrow's allocator,
below): each name below is imported on
first use (PEP 562), so ``import loadlab`` and ``loadlab --help`` stay fast and Locust,
pandas and plotly load only with the function that needs them. Live points run Locust
in a child process (:mod:`loadlab.experiment.child`), so gevent never patches the caller.
No module inside the package imports this one (the version lives in
:mod:`loadlab.version`), so these lazy imports cannot close a cycle between the layers.
"""

import importlib as _importlib
import os as _os
from typing import TYPE_CHECKING as _TYPE_CHECKING
from typing import Any as _Any

from loadlab.version import __version__

# Arrow's allocator is read once, when pyarrow loads, so it is chosen here, before any
# module imports pyarrow; a user's own ARROW_DEFAULT_MEMORY_POOL stands. Its default,
# mimalloc, asks for transparent huge pages, and where the kernel defragments on a fault
# for such memory (transparent_hugepage/defrag "madvise", this machine's), some
# processes pay 40-60 ms of system time more for the same ten-minute replay: a third of
# them, by where their memory happened to land. The system allocator showed no such runs,
# and read an analysis's metrics in half the time with a fifth less peak memory
# (benchmarks/README.md, "Ninth pass").
_os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")

if _TYPE_CHECKING:
    from loadlab.analyze.analysis import analyze_run
    from loadlab.experiment.point import PointSpec, run_point
    from loadlab.experiment.replay_scenario import replay_point
    from loadlab.experiment.runner import run_sweep
    from loadlab.experiment.scenarios import load_scenario
    from loadlab.report.compare import compare
    from loadlab.report.page import write_report

# public name -> "module:attribute"
_API: dict[str, str] = {
    "load_scenario": "loadlab.experiment.scenarios:load_scenario",
    "PointSpec": "loadlab.experiment.point:PointSpec",
    "run_point": "loadlab.experiment.point:run_point",
    "run_sweep": "loadlab.experiment.runner:run_sweep",
    "replay_point": "loadlab.experiment.replay_scenario:replay_point",
    "analyze_run": "loadlab.analyze.analysis:analyze_run",
    "write_report": "loadlab.report.page:write_report",
    "compare": "loadlab.report.compare:compare",
}

__all__ = [
    "PointSpec", "__version__", "analyze_run", "compare", "load_scenario", "replay_point",
    "run_point", "run_sweep", "write_report",
]


def __getattr__(name: str) -> _Any:
    if name not in _API:
        raise AttributeError(f"module 'loadlab' has no attribute {name!r}")
    module, attr = _API[name].split(":")
    value = getattr(_importlib.import_module(module), attr)
    globals()[name] = value   # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*__all__, *(name for name in globals() if name.startswith("__"))})
