"""The ``loadlab`` command.

Subcommands live next to the code they drive and are imported only when invoked,
so ``loadlab --help`` and ``loadlab analyze`` never pay for importing Locust or
the simulator. Errors derived from :class:`loadlab.errors.LoadlabError` become a
one-line message on stderr and the class's exit code (2 for bad input).
"""

from __future__ import annotations

import importlib
import sys

import click

from loadlab.version import __version__
from loadlab.errors import LoadlabError

# name -> ("module:attribute", one-line help shown by `loadlab --help`)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("loadlab.cli.demo:demo", "Run the built-in simulator through a step load and print what was measured."),
    "sim": ("loadlab.cli.sim:sim", "The built-in vLLM V1 scheduling simulator: serve it, or replay a workload in virtual time."),
    "run": ("loadlab.cli.run:run", "Drive a load (steps, Poisson/gamma rate, trace replay) at a server and record every request."),
    "profile": ("loadlab.cli.profile:profile", "Workload profiles: list, show their quantiles, build one from your own trace."),
    "analyze": ("loadlab.cli.analyze:analyze", "Analyse a run folder: per-step table, the knee, the stall's cause and its knob (analysis.json)."),
    "diagnose": ("loadlab.cli.diagnose:diagnose", "Read a live server's /metrics for a few seconds and name why it stalls now."),
    "collect": ("loadlab.cli.collect:collect", "Sample a server's /metrics (or read them from Prometheus) into a run folder."),
    "report": ("loadlab.cli.report:report", "Write the self-contained HTML report of a run or sweep folder."),
    "compare": ("loadlab.cli.report:compare", "Compare two runs' knees and SLO-limited levels; non-zero exit on a regression (CI gate)."),
    "sweep": ("loadlab.cli.sweep:sweep", "Run a scenario's points (A/B arms or a flag matrix), each on a fresh server; --what-if on the simulator."),
}


class LazyGroup(click.Group):
    """A click group whose subcommands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(SUBCOMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in SUBCOMMANDS:
            return None
        target, _ = SUBCOMMANDS[cmd_name]
        module_name, attr = target.split(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and exc.name.startswith(module_name):
                return _unavailable(cmd_name)
            raise
        return getattr(module, attr)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, SUBCOMMANDS[name][1]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


def _unavailable(name: str) -> click.Command:
    @click.command(name=name, help=SUBCOMMANDS[name][1])
    def missing() -> None:
        raise click.ClickException(f"'loadlab {name}' is not part of this build yet")

    return missing


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="loadlab")
def cli() -> None:
    """loadlab: load-test a vLLM (or OpenAI-compatible) server, find the concurrency
    where its scheduler stalls, and name why.

    Start with `loadlab demo`: it runs the built-in simulator, no GPU needed.
    """


def main(argv: list[str] | None = None) -> None:
    """Console entry point: turn loadlab's own errors into messages and exit codes."""
    try:
        # standalone_mode=False returns a command's ctx.exit(n) / Exit(n) code instead of exiting
        code = cli.main(args=argv, prog_name="loadlab", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("Aborted.", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except LoadlabError as exc:
        click.echo(f"loadlab: error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    if type(code) is int and code:  # a bool or another return value is no exit code
        sys.exit(code)


if __name__ == "__main__":
    main()
