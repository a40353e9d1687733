"""``loadlab analyze RUN``: print the per-step table of a run folder.

Before the table: a manifest that is not JSON, or whose step windows lack their
numbers, is an input error (exit 2, one line naming the file and field); a part file
that cannot be read is one too (naming the file); a run whose manifest still says
``running`` while its writer is gone gets a warning line (it was cut off, the figures
cover what was recorded).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from loadlab.analyze.steps import format_step_table, step_table
from loadlab.errors import InputError
from loadlab.runstore import read_manifest
from loadlab.runstore.claim import unfinished_note
from loadlab.runstore.manifest import MANIFEST

_STEP_NUMBERS = ("step", "t_start", "t_end")


def check_manifest(run_dir: Path) -> dict[str, Any]:
    """The manifest, with each step window's numbers present (InputError otherwise)."""
    manifest = read_manifest(run_dir)
    steps = manifest.get("steps") or []
    for i, entry in enumerate(steps if isinstance(steps, list) else [None]):
        missing = [k for k in _STEP_NUMBERS
                   if not isinstance(entry, dict) or not isinstance(entry.get(k), (int, float))]
        if missing:
            raise InputError(f"step window {i} has no number for {', '.join(missing)}",
                             source=run_dir / MANIFEST, field=f"steps[{i}]",
                             fix="restore the manifest, or rerun: it is written by the run itself")
    return manifest


@click.command()
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the table as JSON records instead.")
def analyze(run_dir: Path, as_json: bool) -> None:
    """Per-step table of RUN_DIR: client latency and throughput beside the server's
    running / waiting / KV usage / preemptions in the same windows (warm-up cut).

    Knee detection and cause diagnosis build on this table in a later release.
    """
    import pyarrow as pa

    note = unfinished_note(check_manifest(run_dir))
    if note:
        click.echo(f"warning: {note}", err=True)
    try:
        table = step_table(run_dir)
    except pa.ArrowException as exc:
        raise InputError(f"a table part cannot be read ({exc})", source=run_dir,
                         fix="move the damaged part file out of its table folder and rerun") from None
    if as_json:
        click.echo(table.to_json(orient="records", indent=2))
    else:
        click.echo(format_step_table(table))
