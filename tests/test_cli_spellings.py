"""One spelling per concept on the command line; the old spellings hidden but still working.

Every check runs the real command (``loadlab.cli.main`` in this process, or ``python -m
loadlab``), the simulator's virtual-time replay standing in for a server where a run is needed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from loadlab.cli import SECTIONS, SUBCOMMANDS, main
from loadlab.errors import InputError
from loadlab.runstore import METRICS, read_table
from loadlab.spec.validate import plan_from_flags

DEPRECATION = "loadlab: {old} is deprecated, use {new} (the old spelling goes in the next release)"
REPLAY = ["sim", "replay", "--concurrency", "2,4", "--step-duration", "6", "--warmup", "1",
          "--max-num-seqs", "2"]
# command -> (new spelling shown in --help, old spelling hidden from it)
RENAMED = [(["run"], "--interval", "--collect-interval"),
           (["sim", "replay"], "--interval", "--metrics-interval"),
           (["diagnose"], "--target", "--url")]


def cli(capsys, *args: str) -> tuple[int, str, str]:
    """``loadlab ARGS`` in this process: exit code, stdout, stderr."""
    try:
        main(list(args))
        code = 0
    except SystemExit as exc:
        code = exc.code or 0
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A small finished run folder (virtual time, seconds of wall time)."""
    out = tmp_path_factory.mktemp("spellings") / "run"
    main([*REPLAY, "--out", str(out)])  # returns: a failure would exit
    return out


def test_top_level_help_lists_every_command_once_under_its_section(capsys) -> None:
    code, out, _ = cli(capsys, "--help")
    assert code == 0
    listed = [name for names in SECTIONS.values() for name in names]
    assert sorted(listed) == sorted(SUBCOMMANDS)  # each command in exactly one section
    headings = [out.index(f"\n{section}:\n") for section in SECTIONS]
    assert headings == sorted(headings) and "Commands:" not in out
    for section, names in SECTIONS.items():
        body = out.split(f"\n{section}:\n", 1)[1].split("\n\n", 1)[0]
        assert [line.split()[0] for line in body.splitlines() if not line.startswith("   ")] == \
            list(names)


def test_top_level_help_imports_no_subcommand() -> None:
    code = ("import sys; from loadlab.cli import main\n"
            "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "heavy = [m for m in ('locust', 'pandas', 'pyarrow', 'loadlab.sim', 'loadlab.cli.run')"
            " if m in sys.modules]\nprint('HEAVY', heavy, file=sys.stderr)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "HEAVY []" in proc.stderr, proc.stderr


@pytest.mark.parametrize(("command", "new", "old"), RENAMED)
def test_old_spellings_are_hidden_from_help(capsys, command, new, old) -> None:
    code, out, _ = cli(capsys, *command, "--help")
    assert code == 0 and f"{new} " in out and old not in out


@pytest.mark.parametrize("command", [["run"], ["collect"], ["diagnose"]])
def test_shared_options_read_the_same_everywhere(capsys, command) -> None:
    code, out, _ = cli(capsys, *command, "--help")
    assert code == 0
    assert "--target URL" in out and "--api-key-env VAR" in out and "--interval FLOAT" in out


def test_collect_target_is_repeatable_and_the_positional_form_is_hidden(capsys) -> None:
    code, out, _ = cli(capsys, "collect", "--help")
    assert code == 0 and "Usage: loadlab collect [OPTIONS]\n" in out and "ENDPOINT" not in out


def test_replay_interval_and_its_old_spelling_set_the_same_sampling(capsys, tmp_path) -> None:
    spacing = {}
    for flag in ("--interval", "--metrics-interval"):
        out = tmp_path / flag.strip("-")
        code, _, err = cli(capsys, *REPLAY, flag, "0.5", "--out", str(out))
        assert code == 0, err
        said = [line for line in err.splitlines() if "deprecated" in line]
        assert said == ([DEPRECATION.format(old=flag, new="--interval")]
                        if flag == "--metrics-interval" else [])
        times = np.unique(read_table(out / "metrics.parquet", METRICS)["t"].to_numpy())
        spacing[flag] = float(np.median(np.diff(times)))
    assert spacing == {"--interval": pytest.approx(0.5), "--metrics-interval": pytest.approx(0.5)}


def test_analyze_json_file_is_written_and_parses(capsys, run_dir, tmp_path) -> None:
    target = tmp_path / "analysis-copy.json"
    code, out, err = cli(capsys, "analyze", str(run_dir), "--json", str(target))
    assert code == 0, err
    written = json.loads(target.read_text())
    assert written == json.loads((run_dir / "analysis.json").read_text())
    assert written["steps"] and written["verdict"] in out  # the text is still printed
    assert "deprecated" not in err


def test_analyze_json_dash_prints_only_the_json(capsys, run_dir) -> None:
    code, out, err = cli(capsys, "analyze", str(run_dir), "--json", "-")
    assert code == 0 and json.loads(out)["steps"] and "deprecated" not in err


@pytest.mark.parametrize("order", ["after", "before"])
def test_analyze_bare_json_flag_still_prints_the_json(capsys, run_dir, order) -> None:
    args = [str(run_dir), "--json"] if order == "after" else ["--json", str(run_dir)]
    code, out, err = cli(capsys, "analyze", *args)
    assert code == 0, err
    assert json.loads(out)["steps"]
    assert err.splitlines() == [DEPRECATION.format(old="--json without a FILE", new="--json -")]


def test_analyze_json_into_a_missing_folder_is_an_input_error(capsys, run_dir, tmp_path) -> None:
    code, _, err = cli(capsys, "analyze", str(run_dir), "--json", str(tmp_path / "no" / "a.json"))
    assert code == 2 and "--json: cannot write the JSON here" in err and "Traceback" not in err


@pytest.mark.parametrize(("flags", "field"), [
    ({"geometric": "1:0.5:8"}, "--geometric"),
    ({"search": "2:64"}, "--search"),
    ({"concurrency": "1,2", "geometric": "1:2:8"}, "plan"),
    ({"trace": "t.csv", "rate": "1"}, "plan"),
])
def test_plan_flag_errors_name_the_flag(flags, field) -> None:
    with pytest.raises(InputError) as info:
        plan_from_flags(**flags)
    assert info.value.field == field and info.value.fix


def test_a_trace_plan_takes_its_span_from_the_reader() -> None:
    plan = plan_from_flags(trace="t.csv", time_scale=2.0, step_duration_s=60.0,
                           trace_span=lambda trace, scale: 7.5 * scale)
    assert plan.mode == "replay" and plan.trace_duration_s == 15.0
