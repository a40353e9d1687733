"""Start loadlab's own Python processes without the working directory on their path.

``python -m pkg`` puts the current directory first on ``sys.path``, so a user's
``inspect.py`` or ``random.py`` lying where ``loadlab run`` was started would replace the
standard module of that name in the point's child, its Locust workers and a launched
simulator: they crash at import, and the run waits for workers that never join. The
``loadlab`` console script itself has no such entry (its ``sys.path[0]`` is its own bin
folder); the processes it starts must not get one either. Python 3.11 has ``-P`` for
exactly this; on 3.10 the same start goes through ``runpy`` after dropping the entry.
"""

from __future__ import annotations

import sys

# python -c: sys.path[0] is '' (the working directory), sys.argv is ['-c', MODULE, ARGS...]
_WITHOUT_CWD = ("import runpy, sys; del sys.path[0]; sys.argv.pop(0); "
                "runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)")


def module_argv(module: str, *args: str) -> list[str]:
    """The argv of ``python -m module args`` whose ``sys.path`` leaves the working
    directory out."""
    if sys.version_info >= (3, 11):
        return [sys.executable, "-P", "-m", module, *args]
    return [sys.executable, "-c", _WITHOUT_CWD, module, *args]
