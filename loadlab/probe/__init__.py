"""The probe a vLLM server loads to count its scheduler's refusals (:mod:`loadlab_probe`).

``loadlab_probe.py`` is a top-level module on the server's side, imported by vLLM from its
PYTHONPATH, never by loadlab (it needs vLLM); this package only says where it lies.
"""

from __future__ import annotations

from pathlib import Path

MODULE = "loadlab_probe"
SCHEDULER_CLS = f"{MODULE}.ProbeScheduler"
PORT_ENV = "LOADLAB_PROBE_PORT"


def probe_dir() -> Path:
    """The folder to put on a server's PYTHONPATH for ``--scheduler-cls`` to find the probe."""
    return Path(__file__).resolve().parent
