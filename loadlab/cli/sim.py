"""``loadlab sim``: serve the simulator over HTTP, or replay a workload in virtual time.

Flags use ``vllm serve``'s own names, so a flag list written for vLLM configures the
simulator unchanged. The engine flags (model, GPU, scheduler, cache, timing) are
declared once in :data:`ENGINE_OPTIONS` and shared by ``serve`` and ``replay``.
A few vLLM flags that change nothing in a simulation (``--enforce-eager``,
``--disable-log-requests``, ...) are accepted and ignored, so a real server's flag list
still parses. Impossible configurations raise :class:`~loadlab.errors.InputError`
(exit 2) from :func:`loadlab.sim.engine.hardware.resolve`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from loadlab.cli.options import interval_option, out_option
from loadlab.errors import InputError
from loadlab.sim.serve.flags import (
    ENGINE_OPTIONS,
    FLEET_OPTIONS,
    PLAN_SECTION,
    SERVE_OPTIONS,
    GroupedCommand,
    GroupedOption,
    option,
    tls_context,
    with_options,
)
from loadlab.spec.scenario import Workload

if TYPE_CHECKING:
    from loadlab.workload.recorded import Loop


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def sim() -> None:
    """The built-in vLLM V1 scheduling simulator.

    `serve` answers vLLM's OpenAI API in real time; `replay` runs a workload through
    the same engine in virtual time and writes a run folder.
    """


@sim.command(cls=GroupedCommand)
@with_options(SERVE_OPTIONS)
@with_options(ENGINE_OPTIONS)
@with_options(FLEET_OPTIONS)
def serve(model_tag: str | None, host: str, port: int, **params: Any) -> None:
    """Serve vLLM's OpenAI API (completions, chat, /metrics) from the simulator.

    Example: loadlab sim serve --gpu h100 --max-num-seqs 64 --port 0

    A fleet: loadlab sim serve --replicas 4 --router least-waiting --port 0
    """
    from loadlab.sim.engine.hardware import resolve
    from loadlab.sim.fleet.config import fleet_config
    from loadlab.sim.serve.server import serve as run_server

    if model_tag is not None:
        params["model"] = model_tag
    tls = tls_context(params.pop("ssl_certfile"), params.pop("ssl_keyfile"))
    fleet = fleet_config(params)
    cfg = fleet.configs[0]
    resolved = resolve(cfg)
    for i, replica_cfg in enumerate(fleet.configs):
        head = f"replica {i} ({fleet.pools[i] or fleet.router}): " if fleet.size > 1 else ""
        for line in resolve(replica_cfg).startup_lines():
            click.echo(f"INFO loadlab.sim: {head}{line}")

    def announce(url: str) -> None:
        click.echo(f"INFO loadlab.sim: serving {resolved.served_model_name!r} on {url}")
        click.echo(f"Starting vLLM API server on {url}")
        sys.stdout.flush()

    run_server(fleet, host, port, resolved, announce, tls)


REPLAY_OPTIONS: list[Callable] = [
    option("--profile", section=PLAN_SECTION, default="sharegpt", show_default=True,
         help="Workload profile name or path (see `loadlab profile list`)."),
    option("--concurrency", section=PLAN_SECTION,
         help="Closed-loop steps: users per step, e.g. 1,2,4,8 or 1:2:64 (start:factor:max)."),
    option("--rate", section=PLAN_SECTION,
         help="Open-loop steps: requests/s per step, e.g. 0.5,1,2 or 0.5:2:8."),
    option("--trace", section=PLAN_SECTION, type=click.Path(path_type=Path),
         help="Re-send a recorded run's requests and steps: RUN or RUN/requests.parquet "
              "(instead of --profile and --concurrency/--rate)."),
    option("--loop", section=PLAN_SECTION, type=click.Choice(["open", "closed"]), default=None,
         help="With --trace: open (recorded send times) or closed (each recorded user's "
              "requests, one after another) [default: as the run was recorded]."),
    option("--burstiness", section=PLAN_SECTION, type=float, default=1.0, show_default=True,
         help="Gamma shape of open-loop gaps (1 = Poisson)."),
    option("--step-duration", section=PLAN_SECTION, type=float, default=60.0, show_default=True,
         help="Virtual seconds per step."),
    option("--warmup", section=PLAN_SECTION, type=float, default=None,
         help="Seconds at the start of each step the analyzer cuts "
              "[default: a fifth of the step, at most 10]."),
    interval_option("Virtual seconds between /metrics samples.", cls=GroupedOption,
                    section=PLAN_SECTION, aliases=("--metrics-interval",)),
    option("--metrics-names", section=PLAN_SECTION, type=click.Choice(["v1", "v0"]), default="v1",
         show_default=True, help="Metric names of vLLM V1 or of the V0 era."),
    out_option("Run folder to write (requests.parquet, metrics.parquet, manifest.json).",
               required=True, cls=GroupedOption, section=PLAN_SECTION),
    option("--overwrite", section=PLAN_SECTION, is_flag=True,
         help="Reuse an --out folder that holds a run: its tables and manifest are removed first."),
]


@sim.command(cls=GroupedCommand)
@with_options(REPLAY_OPTIONS)
@with_options(ENGINE_OPTIONS)
@with_options(FLEET_OPTIONS)
def replay(profile: str, concurrency: str | None, rate: str | None, trace: Path | None,
           loop: Loop | None, burstiness: float, step_duration: float, warmup: float | None,
           interval_s: float, out: Path, overwrite: bool, **params: Any) -> None:
    """Run a step load through the simulator in virtual time and write a run folder.

    Example: loadlab sim replay --concurrency 1,2,4,8 --step-duration 60 --out runs/sim

    A recorded run's own requests: loadlab sim replay --trace runs/live --out runs/whatif
    """
    from loadlab.replay.driver import ReplayOptions, run_replay
    from loadlab.replay.trace import run_trace
    from loadlab.runstore.claim import claim_run_dir
    from loadlab.sim.fleet.config import fleet_config
    from loadlab.spec.validate import plan_from_flags, validate
    from loadlab.workload.recorded import read_recorded

    fleet = fleet_config(params)
    cfg = fleet.configs[0]
    if trace is not None:
        if concurrency is not None or rate is not None:
            raise InputError("--trace replays the run's own steps", field="--concurrency/--rate",
                             fix="drop --concurrency and --rate, or drop --trace")
        recorded = read_recorded(trace)
    else:
        if loop is not None:
            raise InputError("--loop chooses how a trace is replayed", field="--loop",
                             fix="add --trace RUN, or drop --loop")
        plan = plan_from_flags(concurrency=concurrency, rate=rate,
                               step_duration_s=step_duration, warmup_s=warmup,
                               burstiness=burstiness)
        workload = validate(Workload, {"profile": profile, "seed": cfg.seed},
                            names={"seed": "--seed"})
    claim = claim_run_dir(out, overwrite)
    shown = [-1]

    def progress(virtual_s: float, total_s: float | None) -> None:
        tenth = int(10 * virtual_s / total_s) if total_s else 10
        if tenth > shown[0]:
            shown[0] = tenth
            click.echo(f"replay: {virtual_s:,.0f} / {total_s:,.0f} virtual s", err=True)

    opts = ReplayOptions(metrics_interval_s=interval_s)
    def notice(line: str) -> None:
        click.echo(f"replay: {line}", err=True)

    with claim:
        summary = (run_trace(fleet, recorded, out, loop, opts, progress, notice)
                   if trace is not None
                   else run_replay(fleet, plan, workload, out, opts, progress, notice=notice))
    click.echo(f"replay: {summary.requests} requests ({summary.completed} completed, "
               f"{summary.aborted} aborted at the end), {summary.engine_steps} engine steps, "
               f"{summary.virtual_s:,.0f} virtual s in {summary.wall_s:.1f} s "
               f"({summary.speed:,.0f}x); run folder {summary.run_dir}")


@sim.command()
@click.argument("runs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--out", "out", required=True, type=click.Path(path_type=Path),
              help="Calibration YAML to write (for --calibration).")
@click.option("--check", "check", multiple=True, type=click.Path(path_type=Path),
              help="A run folder held out of the fit: report its errors too (repeatable).")
def calibrate(runs: tuple[Path, ...], out: Path, check: tuple[Path, ...]) -> None:
    """Fit THIS server's step time, front end and turnaround from its real run folders.

    Each RUN is a closed-loop step load recorded with /metrics collected (`loadlab run
    --collect`) on one server. The fit's errors per level are printed, and with --check
    those of runs held out of it; --calibration FILE then makes `sim serve`, `sim replay`
    and what-if scenarios use the fit.

    Example: loadlab sim calibrate runs/steps --out my-server.yaml --check runs/other
    """
    from loadlab.calibrate import check_runs
    from loadlab.calibrate.check import format_table
    from loadlab.calibrate.fit import fit_with_table
    from loadlab.calibrate.runs import read_run

    cal, fitted = fit_with_table([read_run(p) for p in runs])
    kept = {k: v for k, v in cal.step.model_dump().items() if v}
    click.echo("step time: " + ", ".join(f"{k} {v:.4g}" for k, v in kept.items()))
    click.echo(f"front end: {cal.front_s * 1e3:.2f} ms, + {cal.front_busy_s * 1e3:.2f} ms with "
               f"another request in flight, + {cal.front_per_in_flight_s * 1e3:.2f} ms "
               f"per request in flight; turnaround {cal.turnaround_s * 1e3:.2f} ms + "
               f"{cal.turnaround_per_in_flight_s * 1e3:.2f} ms per request in flight")
    click.echo(f"jitter: vLLM's mean token gap over the client's median with one request "
               f"running, {cal.mean_over_median:.3f} (the fit's means divided by it; replays draw "
               f"each step about the fitted median with that mean)")
    for term, why in cal.dropped.items():
        click.echo(f"dropped {term}: {why}")
    click.echo("fit (the runs fitted):")
    for line in format_table(fitted):
        click.echo("  " + line)
    if check:
        click.echo("held out (--check):")
        for line in format_table(check_runs(cal, check)):
            click.echo("  " + line)
    cal.save(out)
    click.echo(f"calibration written to {out}")
