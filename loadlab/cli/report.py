"""``loadlab report RUN`` and ``loadlab compare BASE NEW``."""

from __future__ import annotations

import json
from pathlib import Path

import click

from loadlab.cli.options import json_option, out_option, write_json


@click.command()
@click.argument("run_dir", type=click.Path(path_type=Path))
@out_option("Where to write the HTML file (needed when RUN_DIR is read-only).  "
            "[default: RUN_DIR/report.html]", file=True)
def report(run_dir: Path, out: Path | None) -> None:
    """Write the HTML report of RUN_DIR (a run folder or a sweep folder) and print its path.

    One self-contained file (charts included, no network needed): the verdict per point,
    latency and throughput against load, queue and KV usage over time, A/B deltas,
    capacity against the measurement, and each run's manifest.
    """
    from loadlab.report.page import write_report

    click.echo(str(write_report(run_dir, out)))


@click.command()
@click.argument("base", type=click.Path(path_type=Path))
@click.argument("new", type=click.Path(path_type=Path))
@click.option("--margin", default="10%", show_default=True,
              help="How far a knee or SLO-limited level may drop before it counts: 10% or 0.1.")
@json_option("Also write the JSON summary to FILE ('-': print only the JSON, on stdout).")
def compare(base: Path, new: Path, margin: str, json_out: str | None) -> None:
    """Compare NEW against BASE (run or sweep folders, points matched by name) and fail on a drop.

    Per point: the knee (its upper bound, or the highest level tried when none was found)
    and the SLO-limited level (when BASE set SLOs). Exit codes: 0 no regression; 1 the knee
    or the SLO-limited level of some point dropped by more than --margin (or the point is
    missing or failed in NEW); 2 bad input (no run folder, a damaged part or analysis,
    mismatched load). Nothing is written into BASE or NEW: a run without analysis.json is
    analysed in memory.
    """
    from loadlab.report.compare import compare as run_compare
    from loadlab.report.compare import format_text, parse_margin

    result = run_compare(base, new, parse_margin(margin))
    if json_out != "-":
        click.echo(format_text(result))
    if json_out:
        write_json(json.dumps(result.to_json(), indent=2), json_out)
    raise click.exceptions.Exit(result.exit_code)
