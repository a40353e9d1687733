"""``loadlab demo``: its flags (what it runs: :mod:`loadlab.experiment.demo`)."""

from __future__ import annotations

from pathlib import Path

import click

from loadlab.cli.options import out_option


@click.command()
@out_option("Folder for the demo's sweeps [default: reports/demo-<time>].")
@click.option("--quick", is_flag=True, help="Two short live steps per point, for a smoke test.")
def demo(out: Path | None, quick: bool) -> None:
    """Run the demo scenario on the simulator (A/B + sweep), write the report, print verdicts."""
    from loadlab.experiment.demo import run_demo

    run_demo(out, quick, say=click.echo)
