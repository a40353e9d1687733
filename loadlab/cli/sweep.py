"""``loadlab sweep SCENARIO [--what-if] [--resume RUN] [--out RUN]``."""

from __future__ import annotations

import time
from pathlib import Path

import click

from loadlab.cli.options import out_option
from loadlab.errors import InputError, LoadlabError


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("scenario", required=False)
@click.option(
    "--what-if",
    is_flag=True,
    help="Run every point on the simulator in virtual time: each point's knee in seconds.",
)
@click.option("--resume", type=click.Path(file_okay=False, path_type=Path), metavar="RUN",
              help="Continue the sweep in RUN: finished points are kept, the others run again.")
@out_option("Sweep folder to write [default: reports/sweep-<scenario>-<time>].", metavar="RUN")
def sweep(scenario: str | None, what_if: bool, resume: Path | None, out: Path | None) -> None:
    """Run every point of SCENARIO (a file, or a shipped name: demo, prefix-caching-ab, ...).

    Each server configuration gets a fresh server; the same seeded workload goes to every
    point; a point that fails is recorded with its reason and the sweep goes on. Ends with
    each point's verdict and the report's path.
    """
    from loadlab.experiment.runner import run_sweep
    from loadlab.experiment.scenarios import load_scenario, scenario_path

    if resume is not None and out is not None:
        raise InputError("give --resume RUN or --out RUN, not both", field="--resume/--out",
                         fix="--resume continues the sweep in RUN")
    if resume is not None and what_if:
        raise InputError("a resumed sweep keeps how it ran", field="--what-if",
                         fix="drop --what-if when resuming")
    if scenario is None and resume is None:
        raise InputError("no scenario given", field="SCENARIO",
                         fix="e.g. loadlab sweep scenarios/demo.yaml (or --resume RUN)")
    loaded = load_scenario(scenario_path(scenario)) if scenario is not None else None
    if resume is None and out is None:
        assert loaded is not None
        out = Path("reports") / f"sweep-{loaded.name}-{time.strftime('%Y%m%d-%H%M%S')}" \
            f"{'-whatif' if what_if else ''}"
    folder = resume or out
    assert folder is not None
    result = run_sweep(loaded, folder, what_if=what_if, resume=resume is not None)
    click.echo(f"\nsweep {result.manifest.status}: {folder}")
    for record in result.manifest.points:
        text = result.verdicts.get(record.name) or next(iter((record.error or "").splitlines()), "")
        click.echo(f"  {record.name}: {record.status}{': ' + text if text else ''}")
    click.echo(
        f"report: {result.report}"
        if result.report
        else f"report: not written (try `loadlab report {folder}`)"
    )
    failed = [r.name for r in result.manifest.points if r.status == "failed"]
    if failed:
        raise LoadlabError(
            f"{len(failed)} of {len(result.manifest.points)} points failed "
            f"({', '.join(failed)}); their reasons are in {folder / 'manifest.json'}"
        )
