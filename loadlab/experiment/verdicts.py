"""What the analyzer says about a sweep point: per-step verdicts and the final analysis.

- :func:`step_judge`: for an adaptive knee search, whether step ``k`` stalled, from the
  analyzer's per-step state (``analysis.json`` ``steps[].state``: ok | stalled |
  client_limited | unjudged) over the point's folder as far as it got. Only "stalled"
  counts as a stall: a client-limited or unjudged step does not send the search down.
- :func:`analyze_point`: write ``analysis.json`` of a finished point with the scenario's
  SLOs, and return it.
- :func:`client_limited_message`: the exit-3 message of a finished run ("give the client
  more CPUs"), or None: only for steps the load generator flagged that the analyzer does
  not overrule (a server failing its requests, or queueing them with running at its cap,
  was the bottleneck: :func:`loadlab.analyze.failures.unblame_client`).

The analyzer reads only the run folder, so this works the same on a live point and on
a virtual-time replay.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from loadlab.runstore.analysis_model import Analysis, write_analysis_file
from loadlab.spec.plan import Slo


def slo_text(slo: Slo | None) -> str | None:
    """The analyzer's ``NAME=VALUE`` form of the objectives (``ttft_p99_s=2.0,...``)."""
    targets = slo.targets() if slo is not None else {}
    return ",".join(f"{name}={value:g}" for name, value in targets.items()) or None


def step_judge(run_dir: Path) -> Callable[[int], bool]:
    """``judge(k)``: did step ``k`` of the run in ``run_dir`` stall?"""
    from loadlab.analyze.analysis import analyze_run

    def judge(step: int) -> bool:
        rows = analyze_run(run_dir).steps
        return any(row.step == step and row.state == "stalled" for row in rows)

    return judge


def analyze_point(run_dir: Path, slo: Slo | None) -> Analysis:
    """Write ``run_dir/analysis.json`` and return it."""
    from loadlab.analyze.analysis import analyze_run

    analysis = analyze_run(run_dir, slo=slo_text(slo))
    write_analysis_file(run_dir, analysis)
    return analysis


def client_limited_message(run_dir: Path, manifest: dict[str, Any]) -> str | None:
    """The load generator's client-limited steps the analyzer upholds, in one line; None
    when there are none (see the module docstring)."""
    from loadlab.analyze.failures import unblame_client
    from loadlab.analyze.steps import build_step_table, load_run
    from loadlab.loadgen.achieved import limited_message

    steps = [s for s in manifest.get("steps") or [] if s.get("client_limited")]
    if not steps:
        return None
    table = build_step_table(load_run(run_dir))
    unblame_client(table, manifest.get("server") or {})
    overruled = {int(s) for s, why in zip(table["step"], table["client_limited_overruled"]) if why}
    return limited_message([s for s in steps if int(s["step"]) not in overruled])
