"""``loadlab analyze RUN``: write analysis.json and print the step table and the verdict.

``--json FILE`` also writes the analysis to FILE, ``--json -`` prints only it on stdout
(the same ``--json`` as ``loadlab compare``); the bare ``--json`` of earlier releases still
prints it, with a deprecation line.

Before analysing: a manifest that is not JSON, or that does not fit its model (a step
window without its numbers, say), is an input error (exit 2, one line naming the file
and field: :func:`loadlab.runstore.manifest.load_manifest`); a part file
that cannot be read is one too (naming the file: :func:`loadlab.runstore.read_table`);
a run whose manifest still says ``running`` while its writer is gone gets a warning
line (it was cut off, the figures cover what was recorded).

A run folder that cannot be written (read-only, an archive) is still analysed: the
verdict is printed, one line on stderr says analysis.json was not written there, and
``--json FILE`` keeps the analysis elsewhere.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from loadlab.analyze.analysis import analyze_run
from loadlab.analyze.display import format_details, format_step_table
from loadlab.cli.options import deprecated, json_option, write_json
from loadlab.errors import StorageError
from loadlab.runstore.analysis_model import Analysis, write_analysis_file
from loadlab.runstore.claim import unfinished_note
from loadlab.runstore.layout import ANALYSIS
from loadlab.runstore.manifest import load_manifest


@click.command()
@click.argument("run_dir", type=click.Path(path_type=Path), required=False, metavar="RUN_DIR")
@json_option("Also write analysis.json's content to FILE ('-': print only the JSON, on stdout).",
             was_flag=True)
@click.option("--slo", default=None, metavar="NAME=VALUE,...",
              help="SLO targets, e.g. ttft_p99_ms=500,itl_p99_ms=50 (ttft|itl|e2e, pNN, ms|s).")
def analyze(run_dir: Path | None, json_out: str | None, slo: str | None) -> None:
    """Analyse RUN_DIR: the per-step table (client latency beside the server's running,
    waiting and KV usage, warm-up cut), the knee with its confidence, the stall's cause
    with its evidence and knob, and the capacity check. Writes RUN_DIR/analysis.json.
    """
    run_dir, json_out = _old_json_form(run_dir, json_out)
    note = unfinished_note(load_manifest(run_dir))
    if note:
        click.echo(f"warning: {note}", err=True)
    analysis = analyze_run(run_dir, slo=slo)
    path = _keep(run_dir, analysis)
    data = analysis.as_json()
    if json_out:
        write_json(json.dumps(data, indent=2), json_out)
    if json_out == "-":
        return
    click.echo(format_step_table(data["steps"]))
    click.echo("")
    click.echo(format_details(data))
    click.echo(f"\n{analysis.verdict}")
    if path:
        click.echo(f"(written to {path})")


def _keep(run_dir: Path, analysis: Analysis) -> Path | None:
    """analysis.json written into the run folder; None, with one line, where it cannot be.

    Tried rather than checked beforehand: permission bits do not bind root, and a read-only
    mount or an immutable folder only shows when a file is written.
    """
    try:
        return write_analysis_file(run_dir, analysis)
    except StorageError as exc:
        cause = exc.__cause__
        reason = cause.strerror if isinstance(cause, OSError) and cause.strerror else exc
        click.echo(f"note: {run_dir} is not writable ({reason}): {ANALYSIS} not "
                   "written there (--json FILE keeps it elsewhere)", err=True)
        return None


def _old_json_form(run_dir: Path | None, json_out: str | None) -> tuple[Path, str | None]:
    """``analyze --json RUN_DIR`` (the flag before the folder) read RUN_DIR as --json's FILE."""
    if run_dir is not None:
        return run_dir, json_out
    if json_out and Path(json_out).is_dir():
        deprecated("--json without a FILE", "--json -")
        return Path(json_out), "-"
    raise click.MissingParameter(param_hint="'RUN_DIR'", param_type="argument")
