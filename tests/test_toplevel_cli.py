"""The top-level command: help reads well, errors exit with the documented codes."""

from __future__ import annotations

import subprocess
import sys

import pytest

from loadlab.cli import SUBCOMMANDS, main
from loadlab.errors import InputError


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "loadlab", *args], capture_output=True, text=True)


def test_help_lists_every_subcommand():
    out = run_cli("--help")
    assert out.returncode == 0
    for name in SUBCOMMANDS:
        assert name in out.stdout


def test_unknown_subcommand_exits_2():
    out = run_cli("no-such-thing")
    assert out.returncode == 2
    assert "no-such-thing" in out.stderr


def test_input_error_message_names_source_field_and_fix():
    err = InputError(
        "must be positive",
        source="scenarios/x.yaml",
        field="steps[2].concurrency",
        fix="use 1 or more",
    )
    assert (
        str(err) == "scenarios/x.yaml: steps[2].concurrency: must be positive (fix: use 1 or more)"
    )
    assert err.exit_code == 2


def test_input_error_becomes_exit_2(monkeypatch, capsys):
    import click

    @click.command()
    def boom() -> None:
        raise InputError("bad value", field="--rate", fix="give a number > 0")

    monkeypatch.setitem(SUBCOMMANDS, "boom", ("tests.test_cli:_unused", "x"))
    from loadlab import cli as cli_mod

    monkeypatch.setattr(cli_mod.LazyGroup, "get_command", lambda self, ctx, name: boom)
    with pytest.raises(SystemExit) as exc:
        main(["boom"])
    assert exc.value.code == 2
    assert "--rate: bad value (fix: give a number > 0)" in capsys.readouterr().err
