"""``loadlab analyze RUN``: write analysis.json and print the step table and the verdict.

Before analysing: a manifest that is not JSON, or that does not fit its model (a step
window without its numbers, say), is an input error (exit 2, one line naming the file
and field: :func:`loadlab.runstore.manifest.load_manifest`); a part file
that cannot be read is one too (naming the file); a run whose manifest still says
``running`` while its writer is gone gets a warning line (it was cut off, the figures
cover what was recorded).
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from loadlab.analyze.analysis import analyze_run
from loadlab.analyze.display import format_details, format_step_table
from loadlab.errors import InputError
from loadlab.runstore.analysis_model import write_analysis_file
from loadlab.runstore.claim import unfinished_note
from loadlab.runstore.manifest import load_manifest


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
    import pyarrow as pa

    note = unfinished_note(load_manifest(run_dir))
    if note:
        click.echo(f"warning: {note}", err=True)
    try:
        analysis = analyze_run(run_dir, slo=slo)
    except pa.ArrowException as exc:
        raise InputError(f"a table part cannot be read ({exc})", source=run_dir,
                         fix="move the damaged part file out of its table folder and rerun") from None
    path = write_analysis_file(run_dir, analysis)
    data = analysis.as_json()
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    click.echo(format_step_table(data["steps"]))
    click.echo("")
    click.echo(format_details(data))
    click.echo(f"\n{analysis.verdict}")
    click.echo(f"(written to {path})")
