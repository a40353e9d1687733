"""The ``loadlab`` command.

Each subcommand is a thin module under :mod:`loadlab.cli` (flags declared there, shared
ones in :mod:`loadlab.cli.options`; the work done by the layers below) and is imported only
when invoked, so ``loadlab --help`` and ``loadlab analyze`` never pay for importing Locust
or the simulator. ``loadlab --help`` lists them under the sections of :data:`SECTIONS`.
Errors derived from :class:`loadlab.errors.LoadlabError` become a one-line message on
stderr and the class's exit code (2 for bad input).
"""

from __future__ import annotations

import importlib
import sys

import click

from loadlab.errors import LoadlabError
from loadlab.version import __version__

# name -> ("module:attribute", one-line help shown by `loadlab --help`)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "run": ("loadlab.cli.run:run",
            "Drive a load (steps, Poisson/gamma rate, trace replay) at a server; record every "
            "request."),
    "sweep": ("loadlab.cli.sweep:sweep",
              "Run a scenario's points (A/B arms or a flag matrix), each on a fresh server."),
    "collect": ("loadlab.cli.collect:collect",
                "Sample a server's /metrics (or read them from Prometheus) into a run folder."),
    "diagnose": ("loadlab.cli.diagnose:diagnose",
                 "Read a live server's /metrics for a few seconds and name why it stalls now."),
    "analyze": ("loadlab.cli.analyze:analyze",
                "Analyse a run folder: per-step table, the knee, the stall's cause and its knob."),
    "report": ("loadlab.cli.report:report",
               "Write the self-contained HTML report of a run or sweep folder."),
    "compare": ("loadlab.cli.report:compare",
                "Compare two runs' knees and SLO-limited levels; exit 1 on a regression "
                "(CI gate)."),
    "sim": ("loadlab.cli.sim:sim",
            "The built-in vLLM V1 scheduling simulator: serve it, or replay a workload in virtual "
            "time."),
    "demo": ("loadlab.cli.demo:demo",
             "Run the built-in simulator through a sweep and print what was measured."),
    "profile": ("loadlab.cli.profile:profile",
                "Workload profiles: list, show their quantiles, build one from your own trace."),
    "tune": ("loadlab.cli.tune:tune",
             "Which flag change moves the knee: replay a run's server over a flag grid, "
             "ranked by predicted knee."),
    "probe": ("loadlab.cli.probe:probe",
              "The scheduler probe a vLLM server loads to export why it refuses requests."),
}
# the sections of `loadlab --help`, in the order a first-time user meets them
SECTIONS: dict[str, tuple[str, ...]] = {
    "Measure": ("run", "sweep", "collect", "diagnose", "probe"),
    "Judge": ("analyze", "report", "compare"),
    "Simulate": ("sim", "tune", "demo"),
    "Workloads": ("profile",),
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
        """The commands under their sections (from the table: nothing is imported)."""
        listed = {name for names in SECTIONS.values() for name in names}
        others = tuple(name for name in self.list_commands(ctx) if name not in listed)
        width = max(map(len, SUBCOMMANDS))  # one column for every section
        for section, names in (*SECTIONS.items(), ("Other", others)):
            if names:
                with formatter.section(section):
                    formatter.write_dl([(n.ljust(width), SUBCOMMANDS[n][1]) for n in names])


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
