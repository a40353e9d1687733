"""`loadlab sim replay`: a used --out is refused unless --overwrite; warm-up follows the step."""

from __future__ import annotations

import json

from click.testing import CliRunner

from loadlab.cli.sim import sim
from loadlab.errors import InputError


def test_reused_out_refused_then_overwritten_and_default_warmup_is_a_fifth(tmp_path):
    out = tmp_path / "run"
    args = [
        "replay",
        "--concurrency",
        "2",
        "--step-duration",
        "5",
        "--max-num-seqs",
        "4",
        "--out",
        str(out),
    ]
    first = CliRunner().invoke(sim, args)
    assert first.exit_code == 0, first.output
    m1 = json.loads((out / "manifest.json").read_text())
    assert m1["steps"][0]["warmup_s"] == 1.0
    again = CliRunner().invoke(sim, args)
    assert isinstance(again.exception, InputError) and again.exception.exit_code == 2
    assert "already holds a run" in str(again.exception)
    over = CliRunner().invoke(sim, [*args, "--overwrite"])
    assert over.exit_code == 0, over.output
    assert json.loads((out / "manifest.json").read_text())["created"] > m1["created"]
    assert len(list((out / "requests.parquet").glob("part-*"))) == 1
