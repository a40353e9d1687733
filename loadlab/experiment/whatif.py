"""A sweep point on the simulator in virtual time (``loadlab sweep --what-if``).

The point's server flags become a :class:`~loadlab.sim.engine.config.SimConfig`: the model
profile is the scenario's own for a simulator target, else ``what_if.model``; the GPU
is ``what_if.gpu`` unless the flags name one; ``what_if.flags`` are added last; a
``what_if.calibration`` (``loadlab sim calibrate``) replaces both profiles' step time. vLLM flags
the simulator does not model (``enforce_eager``, ``trust_remote_code``, ...) are left
out. A fleet's flags (``replicas``, ``router``, pools: the scenario's ``fleet:`` block)
make a fleet of such engines. The same plan and seeded workload then run through
:func:`loadlab.replay.driver.run_replay` into the point's folder (manifest kind
"sim-replay"): minutes of load in seconds, to see where each point's knee should fall
before spending GPU time on it.

With ``what_if.trace`` (a recorded run), every point re-sends that run's own requests
and steps instead (:mod:`loadlab.replay.trace`): the sweep compares the configurations
on the workload the run measured, not on a resample of its profile.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loadlab.sim.fleet.config import FleetConfig
from loadlab.spec.scenario import Point, Scenario

if TYPE_CHECKING:
    from loadlab.workload.recorded import RecordedWorkload


def sim_config(scenario: Scenario, point: Point) -> FleetConfig:
    """The simulator configuration (one engine, or a fleet) that stands in for ``point``'s
    server."""
    from loadlab.sim.fleet.config import fleet_config

    model = scenario.target.model if scenario.target.launch == "sim" and scenario.target.model \
        else scenario.what_if.model
    params: dict[str, Any] = {"model": model, "gpu": scenario.what_if.gpu, **point.flags,
                              **scenario.what_if.flags}
    if scenario.what_if.calibration:
        params["calibration"] = scenario.what_if.calibration
    return fleet_config(params)


def run_whatif_point(
    scenario: Scenario,
    point: Point,
    out: Path,
    judge: Callable[[int], bool] | None,
    progress: Callable[[float, float | None], None] | None = None,
) -> None:
    """Replay the scenario's plan and workload (or its recorded run) for ``point`` into
    ``out``."""
    from loadlab.replay.driver import ReplayOptions, run_replay
    from loadlab.replay.trace import run_trace

    opts = ReplayOptions(point=point.name, metrics_interval_s=scenario.loadgen.collect_interval_s)
    recorded = recorded_workload(scenario)
    if recorded is not None:
        run_trace(sim_config(scenario, point), recorded, out, scenario.what_if.loop, opts,
                  progress, loop_field="what_if.loop")
        return
    run_replay(
        sim_config(scenario, point), scenario.load, scenario.workload, out, opts, progress, judge
    )


def recorded_workload(scenario: Scenario) -> RecordedWorkload | None:
    """The run ``what_if.trace`` names, read; None without one. InputError naming
    ``what_if.trace`` (or the file and column) when it is no run, or ``what_if.loop``
    when the run cannot be replayed in that loop."""
    from loadlab.replay.trace import check_loop
    from loadlab.workload.recorded import read_recorded

    if scenario.what_if.trace is None:
        return None
    recorded = read_recorded(scenario.what_if.trace, field="what_if.trace")
    check_loop(recorded, scenario.what_if.loop, "what_if.loop")
    return recorded
