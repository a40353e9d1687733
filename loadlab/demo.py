"""``loadlab demo``: the whole loop on the built-in simulator, no GPU needed.

1. Live: start ``loadlab sim serve`` (Llama-3.1-8B on one H100, modelled) with a
   small ``--max-num-seqs`` so the knee falls inside a short run; drive closed-loop
   steps with Locust users drawing lengths from a real-trace profile while the
   collector samples ``/metrics``; print the per-step table. The table shows the
   "KV cache low yet requests waiting" picture once users exceed the cap, and the
   analyzer's verdict: where the knee is, why, and the knob.
2. What-if, in virtual time (seconds): the same workload replayed against two
   ``--max-num-seqs`` settings, each with its table and verdict, showing which way the
   knob moves the stall.

Everything lands in one run folder per part under ``--out``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import click

from loadlab.analyze.analysis import write_analysis
from loadlab.analyze.display import format_step_table

DEMO_PROFILE = "azure-conv"
LIVE_FLAGS = ["--model", "llama-3.1-8b", "--gpu", "h100", "--max-num-seqs", "12", "--seed", "0"]
LIVE_LEVELS = (3, 6, 12, 24)
WHATIF_SEQS = (12, 48)
WHATIF_LEVELS = (6, 12, 24, 48, 96)


@click.command()
@click.option("--out", type=click.Path(file_okay=False, path_type=Path),
              help="Folder for the demo's run folders (default reports/demo-<time>).")
@click.option("--step-duration", type=float, default=8.0, show_default=True,
              help="Seconds per live load step.")
@click.option("--quick", is_flag=True, help="Shorter live steps (4 s), for a smoke test.")
def demo(out: Path | None, step_duration: float, quick: bool) -> None:
    """Run the built-in simulator through a step load and print what was measured."""
    out = out or Path("reports") / f"demo-{time.strftime('%Y%m%d-%H%M%S')}"
    if quick:
        step_duration = 4.0
    live_dir = out / "live"
    _live(live_dir, step_duration)
    click.echo(f"\nLive run ({' -> '.join(map(str, LIVE_LEVELS))} users, max_num_seqs=12), {live_dir}:")
    verdicts = {"live": _analysed(live_dir)}
    click.echo("\nWhat-if in virtual time: the same traffic at two --max-num-seqs settings")
    for seqs in WHATIF_SEQS:
        run_dir = out / f"whatif-max-num-seqs-{seqs}"
        _whatif(run_dir, seqs)
        click.echo(f"\n--max-num-seqs {seqs}  ({run_dir})")
        verdicts[f"what-if --max-num-seqs {seqs}"] = _analysed(run_dir)
    click.echo("\nVerdicts:")
    for name, line in verdicts.items():
        click.echo(f"  {name}: {line}")
    click.echo(f"\nRun folders under {out}, each with analysis.json; re-print any with "
               "`loadlab analyze DIR`.")


def _analysed(run_dir: Path) -> str:
    """Print a run's step table and verdict (analysis.json written); return the verdict."""
    analysis = json.loads(write_analysis(run_dir).read_text())
    click.echo(format_step_table(analysis["steps"]))
    click.echo(analysis["verdict"])
    return analysis["verdict"]


def _live(run_dir: Path, step_duration: float) -> None:
    from loadlab.sweep.launcher import launch_target

    with launch_target("sim", LIVE_FLAGS, run_dir) as target:
        # Locust (gevent monkey-patching) is imported only now, after the launcher's
        # httpx/httpcore have loaded unpatched, as `loadlab run --launch` does.
        from loadlab.loadgen import driver
        from loadlab.loadgen.context import RunSettings
        from loadlab.loadgen.shapes import concurrency_steps

        plan = concurrency_steps(list(LIVE_LEVELS), step_duration, step_duration / 4)
        click.echo(f"simulator up at {target.base_url} in {target.startup_s:.1f} s; "
                   f"{len(LIVE_LEVELS)} steps of {step_duration:g} s")
        settings = RunSettings(
            base_url=target.base_url, model=target.model, api="completions", seed=0,
            profile=DEMO_PROFILE, trace=None, time_scale=1.0, timeout_s=120.0,
            api_key_env="LOADLAB_API_KEY", point="live", nonce="demo", calibrate=True,
            plan=plan.describe(),
        )
        opts = driver.RunOptions(out=run_dir, drain_s=5.0, progress_s=step_duration,
                                 collect_interval_s=0.5)
        extra = {"target": {"launch": target.manifest_entry()}, "server": target.server_settings()}
        driver.run_load(settings, plan, opts, manifest_extra=extra)


def _whatif(run_dir: Path, max_num_seqs: int) -> None:
    from loadlab.config import LoadPlan, Workload
    from loadlab.sim.config import SimConfig
    from loadlab.sim.replay import ReplayOptions, run_replay

    cfg = SimConfig(model="llama-3.1-8b", gpu="h100", max_num_seqs=max_num_seqs, seed=0)
    plan = LoadPlan(concurrency=list(WHATIF_LEVELS), step_duration_s=60.0, warmup_s=15.0)
    run_replay(cfg, plan, Workload(profile=DEMO_PROFILE, seed=0), run_dir,
               ReplayOptions(point=f"max-num-seqs-{max_num_seqs}"))
