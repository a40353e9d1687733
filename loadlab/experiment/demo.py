"""The whole loop on the built-in simulator, no GPU needed (what ``loadlab demo`` runs).

1. Live: the shipped ``scenarios/demo.yaml`` as a sweep: prefix caching on and off
   crossed with two ``--max-num-seqs`` caps, each point a fresh ``loadlab sim serve``
   (Llama-3.1-8B on one H100, modelled) driven by Locust users with the same seeded
   shared-system-prompt requests while the collector samples ``/metrics``; every point
   analysed (knee, cause) and the HTML report written.
2. What-if: the same scenario on the simulator in virtual time (seconds), the verdicts
   it predicts printed beside the live ones.

``quick`` shortens the live plan (two levels, 4 s steps) for a smoke test. Everything
lands under ``out``: ``live/`` (the sweep folder, with ``report.html``) and ``whatif/``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from loadlab.errors import InputError
from loadlab.experiment.runner import run_sweep
from loadlab.experiment.scenarios import load_scenario, scenario_path
from loadlab.runstore.analysis_model import read_analysis

QUICK_PLAN = {"concurrency": [4, 16], "step_duration_s": 4.0, "warmup_s": 1.0}


def run_demo(out: Path | None = None, quick: bool = False,
             say: Callable[[str], None] = print) -> Path:
    """Run the demo scenario live and in virtual time, ``say`` the verdicts; the folder."""
    out = out or Path("reports") / f"demo-{time.strftime('%Y%m%d-%H%M%S')}"
    scenario = load_scenario(scenario_path("demo"))
    if quick:
        plan = scenario.load.model_copy(update=QUICK_PLAN)
        scenario = scenario.model_copy(update={"load": plan})
    say(f"demo: {len(scenario.points())} points on the simulator "
        f"({', '.join(p.name for p in scenario.points())}); {out}")
    live = run_sweep(scenario, out / "live")
    predicted = run_sweep(scenario, out / "whatif", what_if=True, progress=lambda line: None)
    say("\nverdicts (live | predicted in virtual time):")
    for record in live.manifest.points:
        say(f"  {record.name}: {record.status}")
        say(f"    live:      {live.verdicts.get(record.name) or record.error}")
        say(f"    predicted: {predicted.verdicts.get(record.name, '-')}")
    say("\nprefix caching, live (hit rate over the steps; TTFT p50 at the first level):")
    for record in live.manifest.points:
        say(f"  {record.name}: {_cache_line(record.folder(live.out))}")
    say(f"\nreport: {live.report or 'not written'}")
    say(f"sweep folders: {out / 'live'} and {out / 'whatif'}; "
        f"re-run any point's analysis with `loadlab analyze DIR`.")
    return out


def _cache_line(folder: Path) -> str:
    """Hit rate and first-level TTFT of a point, from its analysis.json."""
    try:
        steps = [row.model_dump(exclude_unset=True) for row in read_analysis(folder).steps]
    except InputError:
        return "no analysis"
    hits = [s["prefix_hit_rate"] for s in steps if s.get("prefix_hit_rate") is not None]
    ttft = steps[0].get("ttft_p50_ms") if steps else None
    return (f"hit rate {sum(hits) / len(hits):.2f}" if hits else "no cache hits") + \
        (f", TTFT p50 {ttft:.0f} ms" if ttft is not None else "")
