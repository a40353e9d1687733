"""``loadlab run``: drive a load at a server and record every request.

Load plan (exactly one): ``--concurrency 1,2,4,8`` or ``--geometric 1:2:64``
(closed-loop steps of ``--step-duration`` seconds, first ``--warmup`` cut by the
analyzer); ``--rate R[,R2...]`` with optional ``--burstiness B`` (open-loop Poisson,
gamma when B != 1); ``--trace-replay FILE`` with ``--time-scale X`` (recorded
arrival times x X).

Workers: ``--workers N`` local worker processes (default 1; 0 runs in this process).
Across machines: start the master with ``--master-bind 0.0.0.0:5557
--remote-workers M`` and on each other machine ``loadlab run --join MASTER:5557``
(same loadlab version; the API key variable set there too; records travel to the
master, which alone writes the run folder).

CPU isolation (client and server on one host): ``--client-cpus 1`` runs the load
generator and its local workers on CPU 1; with ``--launch``, ``--server-cpus 0`` runs
every thread of the server's process tree on CPU 0 (:mod:`loadlab.sweep.cpus`). Each
step records the load it achieved; when the client fell short at any step (too few
in flight, late sends, a lagging event loop: :mod:`loadlab.loadgen.achieved`) the run
is still complete and written, and the command exits 3 naming the steps and why.

The API key is read from the environment variable named by ``--api-key-env``
(default ``LOADLAB_API_KEY``) and sent as ``Authorization: Bearer``; it is never
printed or recorded.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

import click

from loadlab.errors import ClientLimited, InputError
from loadlab.runstore.claim import claim_run_dir

if TYPE_CHECKING:
    from loadlab.sweep.cpus import Isolation


def _plan(concurrency: str | None, geometric: str | None, rate: str | None, trace: str | None,
          step_duration: float, warmup: float | None, burstiness: float | None, time_scale: float,
          max_in_flight: int):
    from loadlab.loadgen import shapes

    chosen = [n for n, v in (("--concurrency", concurrency), ("--geometric", geometric),
                             ("--rate", rate), ("--trace-replay", trace)) if v]
    if len(chosen) != 1:
        raise InputError(f"give exactly one load plan, got {', '.join(chosen) or 'none'}",
                         field="plan", fix="use one of --concurrency, --geometric, --rate, --trace-replay")
    if trace is None and warmup is None:
        warmup = shapes.default_warmup(step_duration)
    if concurrency:
        levels = shapes.parse_levels(concurrency, "--concurrency")
        if any(v != int(v) for v in levels):
            raise InputError(f"concurrency levels must be whole numbers, got {concurrency!r}",
                             field="--concurrency", fix="write e.g. 1,2,4,8")
        return shapes.concurrency_steps([int(v) for v in levels], step_duration, warmup)
    if geometric:
        return shapes.concurrency_steps(shapes.geometric_levels(geometric), step_duration, warmup)
    if rate:
        return shapes.rate_steps(shapes.parse_levels(rate, "--rate"), step_duration, warmup,
                                 burstiness, max_in_flight)
    from loadlab.loadgen.prepare import TraceSpecs

    specs = TraceSpecs(trace, time_scale)
    offsets = [s.arrival_s for s in specs.specs]
    if any(o is None for o in offsets):
        raise InputError("the trace has no timestamps to replay", source=trace, field="time column",
                         fix="use a trace with a time column, or --rate with a profile")
    return shapes.replay_plan(trace, max(offsets), time_scale, warmup, max_in_flight)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("server_args", nargs=-1, type=click.UNPROCESSED)
@click.option("--target", help="Base URL of the server, e.g. http://127.0.0.1:8000")
@click.option("--model", help="Model name to send (the server's served name).")
@click.option("--api", type=click.Choice(["completions", "chat"]), default="completions", show_default=True)
@click.option("--profile", default="sharegpt", show_default=True, help="Workload profile name or file.")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True)
@click.option("--concurrency", help="Closed-loop levels, e.g. 1,2,4,8.")
@click.option("--geometric", help="Closed-loop levels start:factor:max, e.g. 1:2:64.")
@click.option("--rate", help="Open-loop arrival rate(s) in requests/s, e.g. 5 or 5,10,20.")
@click.option("--burstiness", type=float, default=None, help="Gamma shape of inter-arrivals (1 = Poisson).")
@click.option("--trace-replay", "trace", type=click.Path(), help="Replay a trace's arrivals and lengths.")
@click.option("--time-scale", type=float, default=1.0, show_default=True, help="Replay: multiply recorded offsets.")
@click.option("--step-duration", type=float, default=60.0, show_default=True, help="Seconds per step.")
@click.option("--warmup", type=float, default=None,
              help="Seconds cut from each step's start [default: a fifth of the step, at most 10].")
@click.option("--max-in-flight", type=int, default=10000, show_default=True, help="Open loop: per-worker cap.")
@click.option("--workers", type=int, default=1, show_default=True, help="Local worker processes (0: in-process).")
@click.option("--remote-workers", type=int, default=0, show_default=True, help="Workers joining from other machines.")
@click.option("--master-bind", default="127.0.0.1:0", show_default=True, help="host:port the master listens on.")
@click.option("--join", "join", help="Run as a worker of the master at host:port (nothing else needed).")
@click.option("--out", type=click.Path(file_okay=False), help="Run folder (default reports/run-<time>).")
@click.option("--overwrite", is_flag=True,
              help="Reuse an --out folder that holds a run: its tables, manifest and server log are removed first.")
@click.option("--point", default="", help="Sweep point name stored in every row.")
@click.option("--api-key-env", default="LOADLAB_API_KEY", show_default=True, help="Env var holding the API key.")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=600.0, show_default=True,
              help="Per-request deadline, seconds.")
@click.option("--drain", type=click.FloatRange(min=0, min_open=True), default=30.0, show_default=True,
              help="Seconds in-flight requests get at the end.")
@click.option("--collect", is_flag=True, help="Also sample the target's /metrics into the run folder.")
@click.option("--collect-interval", type=float, default=1.0, show_default=True, help="Seconds between scrapes.")
@click.option("--launch", type=click.Choice(["sim", "vllm"]),
              help="Start the target first; server flags follow '--'. --target is then not needed.")
@click.option("--calibrate/--no-calibrate", default=True, show_default=True,
              help="Fit prompt text to exact token counts with the server's /tokenize.")
@click.option("--server-cpus", help="With --launch: run the server's every thread on these CPUs, e.g. 0 or 0-3.")
@click.option("--client-cpus", help="Run the load generator (and its local workers) on these CPUs, e.g. 1.")
def run(target, model, api, profile, seed, concurrency, geometric, rate, burstiness, trace, time_scale,
        step_duration, warmup, max_in_flight, workers, remote_workers, master_bind, join, out, overwrite, point,
        api_key_env, timeout, drain, collect, collect_interval, launch, calibrate, server_cpus, client_cpus,
        server_args) -> None:
    """Drive a load (steps, Poisson/gamma rate, trace replay) at a server and record every request.

    Example: loadlab run --launch sim --concurrency 1,2,4 --step-duration 20 --collect -- --max-num-seqs 4
    """
    from loadlab.loadgen.preflight import api_key, check_url, split_address

    isolation = _isolation(server_cpus, client_cpus, launch)
    if join:
        split_address(join, "--join", need_port=True)
        from loadlab.loadgen.worker import join_master

        _pin_client(isolation)
        join_master(join)
        return
    if server_args and not launch:
        raise InputError(f"unexpected arguments {' '.join(server_args)!r}", field="SERVER_ARGS",
                         fix="server flags go after '--' together with --launch sim|vllm")
    if launch and target:
        raise InputError("--target and --launch both name the server", field="--target/--launch",
                         fix="use --target URL for a running server, or --launch sim|vllm to start one")
    if not launch and (not target or not model):
        raise InputError("--target and --model are required (or --launch sim|vllm)", field="--target/--model",
                         fix="e.g. --target http://127.0.0.1:8000 --model my-model")
    if target:
        check_url(target)
    if workers < 0 or remote_workers < 0:
        raise InputError("worker counts must be >= 0", field="--workers/--remote-workers",
                         fix="use --workers 0 for one process, 1 or more for worker processes")
    if workers or remote_workers:
        split_address(master_bind, "--master-bind")
    if collect:
        from loadlab.collect.scraper import MIN_INTERVAL_S

        if not collect_interval >= MIN_INTERVAL_S:
            raise InputError(f"must be at least {MIN_INTERVAL_S} s, got {collect_interval:g}",
                             field="--collect-interval", fix="e.g. --collect-interval 1")
    api_key(api_key_env)  # a key that cannot be a header: exit 2 now, not a worker failure later
    plan = _plan(concurrency, geometric, rate, trace, step_duration, warmup, burstiness, time_scale,
                 max_in_flight)
    if trace is None:
        from loadlab.workload import load_profile

        load_profile(profile)  # fail fast, exit 2, before any process starts
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out_dir = claim_run_dir(Path(out) if out else Path("reports") / f"run-{stamp}", overwrite)
    params = click.get_current_context().params
    if launch:
        # Imported before Locust patches the process (httpx/httpcore must load unpatched).
        from loadlab.sweep.launcher import launch_target

        with launch_target(launch, list(server_args), out_dir, model=model,
                           server_cpus=isolation.server_cpus) as launched:
            extra = {"target": {"launch": launched.manifest_entry()}, "server": launched.server_settings(),
                     "isolation": isolation.manifest_entry()}
            _run(launched.base_url, model or launched.model, extra, out_dir, stamp, plan, trace, params,
                 isolation, target_check=launched.exit_reason)
        return
    _run(target, model, {"isolation": isolation.manifest_entry()}, out_dir, stamp, plan, trace, params,
         isolation)


def _isolation(server_cpus: str | None, client_cpus: str | None, launch: str | None) -> Isolation:
    """The CPU sets of --server-cpus / --client-cpus, checked (loadlab.sweep.cpus)."""
    from loadlab.sweep.cpus import check_isolation, parse_cpu_list

    if server_cpus and not launch:
        raise InputError("--server-cpus pins a server loadlab starts", field="--server-cpus",
                         fix="use it with --launch sim|vllm, or pin your server yourself (taskset)")
    return check_isolation(parse_cpu_list(server_cpus, "--server-cpus") if server_cpus else None,
                           parse_cpu_list(client_cpus, "--client-cpus") if client_cpus else None)


def _pin_client(isolation: Isolation) -> None:
    """Every thread of this process onto the client CPUs; worker processes inherit them."""
    import os

    from loadlab.sweep.cpus import pin_threads

    if isolation.client_cpus is not None:
        pin_threads(os.getpid(), isolation.client_cpus)


def _run(target: str, model: str, extra: dict, out_dir: Path, stamp: str, plan, trace: str | None,
         o: dict, isolation: Isolation, target_check=None) -> None:
    """Build the settings and drive the run (Locust is imported from here on); ``o``: the CLI params.
    Exits 3 (:class:`~loadlab.errors.ClientLimited`) after everything is written when the
    client fell short of the asked load at some step."""
    _pin_client(isolation)
    if o["collect"]:
        import loadlab.collect.scraper  # noqa: F401  (before Locust's monkey-patching, like httpx)
    from loadlab.loadgen.preflight import preflight

    api, seed, profile, time_scale, timeout = o["api"], o["seed"], o["profile"], o["time_scale"], o["timeout"]
    api_key_env, point, calibrate = o["api_key_env"], o["point"], o["calibrate"]
    info = preflight(target.rstrip("/"), model, api_key_env)
    extra = {**extra, "target": {**extra.get("target", {}), "max_model_len": info.max_model_len}}

    from loadlab.loadgen import driver  # Locust (gevent patching) from here on
    from loadlab.loadgen.achieved import format_summary, limited_message
    from loadlab.loadgen.context import RunSettings

    settings = RunSettings(
        base_url=target.rstrip("/"), model=model, api=api, seed=seed,
        profile=None if trace else profile, trace=trace, time_scale=time_scale, timeout_s=timeout,
        api_key_env=api_key_env, point=point, nonce=f"r{stamp}", calibrate=calibrate, plan=plan.describe(),
        max_model_len=info.max_model_len,
    )
    opts = driver.RunOptions(out=out_dir, workers=o["workers"], remote_workers=o["remote_workers"],
                             master_bind=o["master_bind"], drain_s=o["drain"],
                             collect_interval_s=o["collect_interval"] if o["collect"] else None,
                             target_check=target_check)
    manifest = driver.run_load(settings, plan, opts, extra)
    rec = manifest.get("records", {})
    click.echo(format_summary(manifest["steps"]), err=True)
    click.echo(f"run {manifest['status']}: {rec.get('rows', 0)} requests recorded in {out_dir}")
    workload = manifest.get("workload", {})
    if workload.get("calibrate") and workload.get("calibrated") is False:
        click.echo(f"note: prompt lengths not exact: {workload['calibration_reason']}", err=True)
    if rec.get("unwritten"):
        click.echo(f"warning: {rec['unwritten']} requests could not be written: {'; '.join(rec['write_errors'])}",
                   err=True)
    limited = limited_message(manifest["steps"])
    if limited:
        raise ClientLimited(limited)
