"""``loadlab report RUN``."""

from __future__ import annotations

from pathlib import Path

import click


@click.command()
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option("--out", type=click.Path(path_type=Path, dir_okay=False),
              help="Where to write the HTML file.  [default: RUN_DIR/report.html]")
def report(run_dir: Path, out: Path | None) -> None:
    """Write the HTML report of RUN_DIR (a run folder or a sweep folder) and print its path.

    One self-contained file (charts included, no network needed): the verdict per point,
    latency and throughput against load, queue and KV usage over time, A/B deltas,
    capacity against the measurement, and each run's manifest.
    """
    from loadlab.report.page import write_report

    click.echo(str(write_report(run_dir, out)))

