"""One point of a scenario on the simulator in virtual time, by name: ``loadlab.replay_point``.

:func:`loadlab.replay.driver.run_replay` wants a simulator configuration, a plan and a
workload; from a notebook one has a scenario. :func:`replay_point` takes the scenario (or its
file, or a shipped name) and a point's name, and replays it the way ``loadlab sweep
--what-if`` replays that point (:mod:`loadlab.experiment.whatif`), a knee search judged
step by step as in a sweep.

It is not exported as ``loadlab.replay``: that is the subpackage :mod:`loadlab.replay`,
and importing any of its modules sets the package attribute to the module, so a function
by that name would turn into a module after the first what-if sweep.
"""

from __future__ import annotations

from pathlib import Path

from loadlab.errors import InputError
from loadlab.experiment.scenarios import load_scenario
from loadlab.experiment.verdicts import step_judge
from loadlab.experiment.whatif import run_whatif_point
from loadlab.spec.scenario import Scenario


def replay_point(
    scenario: Scenario | str | Path, out: str | Path, point: str | None = None
) -> Path:
    """Replay ``point`` (default: the scenario's first) into the run folder ``out``; returns it.

    The folder then reads like a live run's (manifest kind "sim-replay"):
    :func:`loadlab.analyze_run` and :func:`loadlab.write_report` take it as it is.
    """
    if not isinstance(scenario, Scenario):
        scenario = load_scenario(scenario)
    points = {p.name: p for p in scenario.points()}
    name = point or next(iter(points))
    if name not in points:
        raise InputError(f"the scenario has no point {name!r}", field="point",
                         fix=f"use one of: {', '.join(points)}")
    folder = Path(out)
    judge = step_judge(folder) if scenario.load.search is not None else None
    run_whatif_point(scenario, points[name], folder, judge)
    return folder
