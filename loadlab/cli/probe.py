"""``loadlab probe``: where the scheduler probe a vLLM server loads lies.

The probe (``loadlab_probe.ProbeScheduler``) runs inside the server, so a server started by
hand, in a container or on another host, needs its folder on PYTHONPATH: ``path`` prints
it (``PYTHONPATH=$(loadlab probe path) vllm serve ... --scheduler-cls
loadlab_probe.ProbeScheduler``).
"""

from __future__ import annotations

import click

from loadlab.probe import PORT_ENV, SCHEDULER_CLS, probe_dir


@click.group()
def probe() -> None:
    """The scheduler probe a vLLM server loads (--scheduler-cls) to export loadlab: series."""


@probe.command("path")
def path_cmd() -> None:
    """The folder to put on the server's PYTHONPATH."""
    click.echo(str(probe_dir()))


@probe.command("args")
def args_cmd() -> None:
    """The vllm serve arguments and environment that load it (port of your choice)."""
    click.echo(f"PYTHONPATH={probe_dir()} {PORT_ENV}=8001 vllm serve MODEL "
               f"--scheduler-cls {SCHEDULER_CLS}")
