"""A scenario ready to run: read, then checked against what the run will use.

:func:`load_scenario` is :func:`loadlab.spec.scenario_file.read_scenario` plus the checks
only the layers above the models can make: the workload profile loads, and every flag
of a simulator point is one ``loadlab sim serve`` takes. Nothing is started until all
of this passed, so a typo fails in a second, not after the first point's server.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from loadlab.errors import InputError
from loadlab.sim.serve.flags import accepted_flags
from loadlab.spec.scenario import Scenario
from loadlab.spec.scenario_file import read_scenario, scenario_path
from loadlab.workload import load_profile

__all__ = ["load_scenario", "scenario_path"]


def load_scenario(path: str | Path) -> Scenario:
    """Read a scenario file by path, or a shipped one by name; InputError if anything is off."""
    path = scenario_path(str(path))
    scenario = read_scenario(path)
    if scenario.target.launch == "sim":
        _check_sim_flags(scenario, path)
    if scenario.load.trace is None:
        try:
            load_profile(scenario.workload.profile)
        except InputError as exc:
            raise InputError(
                exc.message, source=path, field="workload.profile", fix=exc.fix
            ) from None
    return scenario


def _check_sim_flags(scenario: Scenario, path: Path) -> None:
    """Every flag of every point must be one ``loadlab sim serve`` takes."""
    known = accepted_flags()
    arms = scenario.sweep.arms if scenario.sweep and scenario.sweep.arms else {}
    matrix = scenario.sweep.matrix if scenario.sweep and scenario.sweep.matrix else {}
    places: list[tuple[str, Mapping[str, object]]] = [
        ("flags", scenario.flags), ("sweep.matrix", matrix),
        *((f"sweep.arms.{name}", arm) for name, arm in arms.items())]
    for where, flags in places:
        for name in flags:
            if name not in known:
                raise InputError(
                    f"the simulator has no flag --{name.replace('_', '-')}",
                    source=path,
                    field=f"{where}.{name}",
                    fix=f"use one of: {', '.join(sorted(known))}",
                )
