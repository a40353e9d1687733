"""``loadlab run``: drive a load at a server and record every request.

Load plan (exactly one): ``--concurrency 1,2,4,8`` or ``--geometric 1:2:64``
(closed-loop steps of ``--step-duration`` seconds, first ``--warmup`` cut by the
analyzer); ``--search START:MAX:RESOLUTION`` (an adaptive knee search over closed-loop
users, :mod:`loadlab.spec.knee_search`: each step judged by the analyzer before the
next is chosen; give ``--collect`` so it sees the server's queue); ``--rate R[,R2...]`` with optional ``--burstiness B`` (open-loop Poisson,
gamma when B != 1); ``--trace-replay FILE`` with ``--time-scale X`` (recorded
arrival times x X).

Workers: ``--workers N`` local worker processes (default 1; 0 runs in this process).
Across machines: start the master with ``--master-bind 0.0.0.0:5557
--remote-workers M`` and on each other machine ``loadlab run --join MASTER:5557``
(same loadlab version; the API key variable set there too; records travel to the
master, which alone writes the run folder).

CPU isolation (client and server on one host): ``--client-cpus 1`` runs the load
generator and its local workers on CPU 1; with ``--launch``, ``--server-cpus 0`` runs
every thread of the server's process tree on CPU 0 (:mod:`loadlab.experiment.cpus`). Each
step records the load it achieved; when the client fell short at any step (too few
in flight, late sends, a lagging event loop: :mod:`loadlab.loadgen.achieved`) the run
is still complete and written, and the command exits 3 naming the steps and why.

``loadlab run`` maps its options onto the scenario models of :mod:`loadlab.spec.models`
(:class:`~loadlab.spec.models.Target`, :class:`~loadlab.spec.models.Workload`,
:class:`~loadlab.spec.models.LoadPlan`, :class:`~loadlab.spec.models.LoadgenSettings`,
:class:`~loadlab.spec.models.Isolation`: their validation, errors naming the flag) and runs
them as one :func:`loadlab.experiment.point.run_point`, the sequence every sweep point runs.
Bad input exits 2 before anything starts or is written.

The API key is read from the environment variable named by ``--api-key-env``
(default ``LOADLAB_API_KEY``) and sent as ``Authorization: Bearer``; it is never
printed or recorded.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click

from loadlab.spec.models import Isolation, LoadgenSettings, LoadPlan, Target, Workload
from loadlab.errors import ClientLimited, InputError
from loadlab.runstore.claim import claim_run_dir
from loadlab.spec.validate import PLAN_FLAGS, validate

# config field -> the flag it comes from, so validation errors name the flag
TARGET_FLAGS = {"": "--model", "url": "--target", "launch": "--launch", "model": "--model", "api": "--api",
                "api_key_env": "--api-key-env"}
WORKLOAD_FLAGS = {"profile": "--profile", "seed": "--seed"}
LOADGEN_FLAGS = {"workers": "--workers", "timeout_s": "--timeout", "drain_s": "--drain",
                 "collect_interval_s": "--collect-interval"}
CPU_FLAGS = {"": "--server-cpus/--client-cpus", "server_cpus": "--server-cpus", "client_cpus": "--client-cpus"}
PLANS = {"concurrency": "--concurrency", "geometric": "--geometric", "search": "--search", "rate": "--rate",
         "trace": "--trace-replay"}


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("server_args", nargs=-1, type=click.UNPROCESSED)
@click.option("--target", help="Base URL of the server, e.g. http://127.0.0.1:8000")
@click.option("--model", help="Model name to send (the server's served name). With --launch: the model to "
              "serve (vllm: its path or name, unless one follows --; sim: a model profile, e.g. qwen2.5-7b).")
@click.option("--api", type=click.Choice(["completions", "chat"]), default="completions", show_default=True)
@click.option("--profile", default="sharegpt", show_default=True, help="Workload profile name or file.")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True)
@click.option("--concurrency", help="Closed-loop levels, e.g. 1,2,4,8.")
@click.option("--geometric", help="Closed-loop levels start:factor:max, e.g. 1:2:64.")
@click.option("--search", help="Adaptive knee search over users start:max:resolution, e.g. 2:64:2.")
@click.option("--rate", help="Open-loop arrival rate(s) in requests/s, e.g. 5 or 5,10,20.")
@click.option("--burstiness", type=float, default=None, help="Gamma shape of inter-arrivals (1 = Poisson).")
@click.option("--trace-replay", "trace", type=click.Path(), help="Replay a trace's arrivals and lengths.")
@click.option("--time-scale", type=float, default=1.0, show_default=True, help="Replay: multiply recorded offsets.")
@click.option("--step-duration", type=float, default=60.0, show_default=True, help="Seconds per step.")
@click.option("--warmup", type=float, default=None,
              help="Seconds cut from each step's start [default: a fifth of the step, at most 10].")
@click.option("--max-in-flight", type=int, default=10000, show_default=True, help="Open loop: per-worker cap.")
@click.option("--workers", type=int, default=1, show_default=True, help="Local worker processes (0: in-process).")
@click.option("--remote-workers", type=click.IntRange(min=0), default=0, show_default=True, help="Workers joining from other machines.")
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
def run(server_args: tuple[str, ...], **o: Any) -> None:
    """Drive a load (steps, Poisson/gamma rate, trace replay) at a server and record every request.

    Example: loadlab run --launch sim --concurrency 1,2,4 --step-duration 20 --collect -- --max-num-seqs 4
    """
    isolation = _isolation(o)
    if o["join"]:
        _join(o["join"], isolation)
        return
    _check_flags(o, server_args)
    from loadlab.experiment.point import PointSpec, run_point

    plan = _plan(o)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    spec = PointSpec(
        out=Path(o["out"]) if o["out"] else Path("reports") / f"run-{stamp}",
        target=validate(Target, _target_fields(o, server_args), names=TARGET_FLAGS),
        workload=validate(Workload, {"profile": o["profile"], "seed": o["seed"], "calibrate": o["calibrate"]},
                          names=WORKLOAD_FLAGS),
        plan=plan,
        loadgen=validate(LoadgenSettings, {"workers": o["workers"], "timeout_s": o["timeout"],
                                           "drain_s": o["drain"],
                                           **({"collect_interval_s": o["collect_interval"]} if o["collect"] else {})},
                         names=LOADGEN_FLAGS),
        isolation=isolation, point=o["point"], server_args=list(server_args), collect=o["collect"],
        nonce=f"r{stamp}", remote_workers=o["remote_workers"], master_bind=o["master_bind"],
    )
    if plan.trace is None:
        from loadlab.workload import load_profile

        load_profile(spec.workload.profile)  # fail fast, exit 2, before any process starts
    spec.out = claim_run_dir(spec.out, o["overwrite"])
    _report(run_point(spec), spec.out)


def _isolation(o: dict[str, Any]) -> Isolation:
    """--server-cpus / --client-cpus as an Isolation, the CPUs checked against this machine."""
    from loadlab.experiment.cpus import check_available

    if o["server_cpus"] and not o["launch"]:
        raise InputError("--server-cpus pins a server loadlab starts", field="--server-cpus",
                         fix="use it with --launch sim|vllm, or pin your server yourself (taskset)")
    return check_available(validate(Isolation, {"server_cpus": o["server_cpus"], "client_cpus": o["client_cpus"]},
                                    names=CPU_FLAGS))


def _join(address: str, isolation: Isolation) -> None:
    """Worker mode: serve the master at ``address`` (on the client CPUs when given)."""
    import os

    from loadlab.loadgen.preflight import split_address
    from loadlab.experiment.cpus import pin_threads

    split_address(address, "--join", need_port=True)
    from loadlab.loadgen.worker import join_master

    if isolation.client_cpus is not None:
        pin_threads(os.getpid(), isolation.client_cpus)
    join_master(address)


def _check_flags(o: dict[str, Any], server_args: tuple[str, ...]) -> None:
    """The flag combinations, the URL, the master's address and the API key; InputError if off."""
    from loadlab.loadgen.preflight import api_key, check_url, split_address

    launch, target = o["launch"], o["target"]
    if server_args and not launch:
        raise InputError(f"unexpected arguments {' '.join(server_args)!r}", field="SERVER_ARGS",
                         fix="server flags go after '--' together with --launch sim|vllm")
    if launch and target:
        raise InputError("--target and --launch both name the server", field="--target/--launch",
                         fix="use --target URL for a running server, or --launch sim|vllm to start one")
    if not launch and (not target or not o["model"]):
        raise InputError("--target and --model are required (or --launch sim|vllm)", field="--target/--model",
                         fix="e.g. --target http://127.0.0.1:8000 --model my-model")
    if target:
        check_url(target)
    if o["workers"] or o["remote_workers"]:
        split_address(o["master_bind"], "--master-bind")
    api_key(o["api_key_env"])  # a key that cannot be a header: exit 2 now, not a worker failure later


def _target_fields(o: dict[str, Any], server_args: tuple[str, ...]) -> dict[str, Any]:
    """The Target's fields; a launched vllm serves --model, else the MODEL after --."""
    model = o["model"]
    if o["launch"] == "vllm" and not model:
        from loadlab.experiment.server_flags import parse_flags

        model = next(iter(parse_flags(list(server_args)).positional), None)
    fields = {"url": o["target"], "launch": o["launch"], "model": model, "api": o["api"],
              "api_key_env": o["api_key_env"]}
    return {k: v for k, v in fields.items() if v is not None}


def _plan(o: dict[str, Any]) -> LoadPlan:
    """The LoadPlan of exactly one of --concurrency, --geometric, --rate, --trace-replay."""
    chosen = [flag for key, flag in PLANS.items() if o[key]]
    if len(chosen) != 1:
        raise InputError(f"give exactly one load plan, got {', '.join(chosen) or 'none'}",
                         field="plan", fix=f"use one of {', '.join(PLANS.values())}")
    fields: dict[str, Any] = {"warmup_s": o["warmup"], "max_in_flight": o["max_in_flight"]}
    names = dict(PLAN_FLAGS)
    if o["trace"]:
        fields.update(trace=o["trace"], time_scale=o["time_scale"],
                      trace_duration_s=max(_trace_span_s(o["trace"], o["time_scale"]), 1e-3))
    else:
        fields["step_duration_s"] = o["step_duration"]
    if o["concurrency"] or o["geometric"]:
        fields["concurrency"] = o["concurrency"] or o["geometric"]
        names["concurrency"] = chosen[0]
    if o["search"]:
        fields["search"] = _search(o["search"])
    if o["rate"]:
        fields.update(rate=o["rate"], burstiness=o["burstiness"])
    return validate(LoadPlan, {k: v for k, v in fields.items() if v is not None}, names=names)


def _search(text: str) -> dict[str, int]:
    """``2:64:2`` -> the KneeSearch fields (start, max, resolution)."""
    parts = text.split(":")
    if len(parts) != 3 or not all(p.strip().isdigit() for p in parts):
        raise InputError(f"'{text}' is not START:MAX:RESOLUTION", field="--search",
                         fix="give three whole numbers of users, e.g. --search 2:64:2")
    return dict(zip(("start", "max", "resolution"), map(int, parts), strict=True))


def _trace_span_s(trace: str, time_scale: float) -> float:
    """The last arrival offset of a trace (x ``time_scale``); InputError without timestamps."""
    from loadlab.loadgen.prepare import TraceSpecs

    offsets = [s.arrival_s for s in TraceSpecs(trace, time_scale).specs]
    known = [o for o in offsets if o is not None]
    if len(known) != len(offsets):
        raise InputError("the trace has no timestamps to replay", source=trace, field="time column",
                         fix="use a trace with a time column, or --rate with a profile")
    return max(known)


def _report(manifest: dict[str, Any], out: Path) -> None:
    """The step summary, the outcome, notes; ClientLimited (exit 3) when the client fell short."""
    from loadlab.loadgen.achieved import format_summary, limited_message

    rec = manifest.get("records", {})
    click.echo(format_summary(manifest["steps"]), err=True)
    click.echo(f"run {manifest['status']}: {rec.get('rows', 0)} requests recorded in {out}")
    if manifest.get("search"):
        found = manifest["search"]
        click.echo(f"knee search: last good {found['lower']}, first stalled {found['upper']} users "
                   f"({len(found['steps'])} steps)")
    workload = manifest.get("workload", {})
    if workload.get("calibrate") and workload.get("calibrated") is False:
        click.echo(f"note: prompt lengths not exact: {workload['calibration_reason']}", err=True)
    if rec.get("unwritten"):
        click.echo(f"warning: {rec['unwritten']} requests could not be written: {'; '.join(rec['write_errors'])}",
                   err=True)
    limited = limited_message(manifest["steps"])
    if limited:
        raise ClientLimited(limited)
