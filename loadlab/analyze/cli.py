"""``loadlab analyze RUN``: write analysis.json and print the step table and the verdict."""

from __future__ import annotations

import json
from pathlib import Path

import click

from loadlab.analyze.analysis import write_analysis
from loadlab.analyze.display import format_details, format_step_table


@click.command()
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print analysis.json instead of the text.")
@click.option("--slo", default=None, metavar="NAME=VALUE,...",
              help="SLO targets, e.g. ttft_p99_ms=500,itl_p99_ms=50 (ttft|itl|e2e, pNN, ms|s).")
def analyze(run_dir: Path, as_json: bool, slo: str | None) -> None:
    """Analyse RUN_DIR: the per-step table (client latency beside the server's running,
    waiting and KV usage, warm-up cut), the knee with its confidence, the stall's cause
    with its evidence and knob, and the capacity check. Writes RUN_DIR/analysis.json.
    """
    path = write_analysis(run_dir, slo=slo)
    analysis = json.loads(path.read_text())
    if as_json:
        click.echo(json.dumps(analysis, indent=2))
        return
    click.echo(format_step_table(analysis["steps"]))
    click.echo("")
    click.echo(format_details(analysis))
    click.echo(f"\n{analysis['verdict']}")
    click.echo(f"(written to {path})")
