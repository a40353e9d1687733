"""Fit a server's step-time model from its own real runs, and check it on others.

``fit_runs(paths) -> Calibration`` (:mod:`loadlab.calibrate.fit`) and
``check_runs(cal, paths) -> table`` (:mod:`loadlab.calibrate.check`); the calibration is
:class:`loadlab.sim.engine.calibration.Calibration`, which the simulator's engines use.
"""

from loadlab.calibrate.check import check_runs
from loadlab.calibrate.fit import fit_runs

__all__ = ["check_runs", "fit_runs"]
