"""``loadlab analyze RUN``: print the per-step table of a run folder."""

from __future__ import annotations

from pathlib import Path

import click

from loadlab.analyze.steps import format_step_table, step_table


@click.command()
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the table as JSON records instead.")
def analyze(run_dir: Path, as_json: bool) -> None:
    """Per-step table of RUN_DIR: client latency and throughput beside the server's
    running / waiting / KV usage / preemptions in the same windows (warm-up cut).

    Knee detection and cause diagnosis build on this table in a later release.
    """
    table = step_table(run_dir)
    if as_json:
        click.echo(table.to_json(orient="records", indent=2))
    else:
        click.echo(format_step_table(table))
