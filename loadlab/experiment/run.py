"""One load run at a server, from plain values: what ``loadlab run`` does, callable from code.

Load plan: a :class:`~loadlab.spec.plan.LoadPlan` (built from flags by
:func:`loadlab.spec.validate.plan_from_flags`): closed-loop steps, an adaptive knee search
over users (:mod:`loadlab.spec.knee_search`: each step judged by the analyzer before the
next is chosen, so give ``collect=True`` for it to see the server's queue), open-loop
Poisson/gamma rates, or a trace's recorded arrivals (x ``time_scale``).

Workers: ``workers`` local worker processes (0 runs in this process). Across machines the
master binds ``master_bind`` and waits for ``remote_workers``; each other machine runs
:func:`join_worker` (same loadlab version, the API key variable set there too; records
travel to the master, which alone writes the run folder).

CPU isolation (client and server on one host): ``client_cpus`` runs the load generator
and its local workers on those CPUs; with ``launch``, ``server_cpus`` runs every thread of
the server's process tree on its own (:mod:`loadlab.experiment.cpus`). Each step records
the load it achieved; when the client fell short at any step (too few in flight, late
sends, a lagging event loop: :mod:`loadlab.loadgen.achieved`) the run is still complete
and written, and :func:`run_load` raises :class:`~loadlab.errors.ClientLimited` (exit 3)
naming the steps and why. A run in which not one request succeeded (the server hung, cut
every stream, or sent something that is not an OpenAI stream, but never refused enough
in a row to stop the run) is written too, and raises :class:`~loadlab.errors.NoSuccess`
(exit 4) naming the most common error: such a folder measured nothing.

The values map onto the scenario models of :mod:`loadlab.spec.scenario` (their validation,
errors naming the flag) and run as one :func:`loadlab.experiment.point.run_point`, the
sequence every sweep point runs. Bad input raises InputError (exit 2) before anything
starts or is written, and so does a user count the process's open-file limit cannot hold
(:mod:`loadlab.experiment.fdlimit`, after raising it to the hard limit). The API key is
read from the variable named by ``api_key_env`` and sent as ``Authorization: Bearer``; it
is never printed or recorded.

Locust is imported only once a run starts (:mod:`loadlab.experiment.point` fixes the
import order), so bad input and ``join_worker``'s address check never pay for it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from loadlab.errors import ClientLimited, InputError, NoSuccess
from loadlab.experiment.fdlimit import ensure_open_files
from loadlab.runstore.claim import claim_run_dir
from loadlab.spec.plan import LoadPlan
from loadlab.spec.scenario import Isolation, LoadgenSettings, Target, Workload
from loadlab.spec.validate import validate

# model field -> the flag it comes from, so validation errors name the flag
TARGET_FLAGS = {"": "--model", "url": "--target", "launch": "--launch", "model": "--model",
                "api": "--api", "api_key_env": "--api-key-env", "probe": "--probe",
                "ca_bundle": "--ca-bundle", "insecure": "--insecure",
                "replica_metrics": "--replica-metrics"}
WORKLOAD_FLAGS = {"profile": "--profile", "seed": "--seed"}
LOADGEN_FLAGS = {"workers": "--workers", "timeout_s": "--timeout", "drain_s": "--drain",
                 "collect_interval_s": "--interval"}
CPU_FLAGS = {"": "--server-cpus/--client-cpus", "server_cpus": "--server-cpus",
             "client_cpus": "--client-cpus"}
Say = Callable[[str], None]


@dataclass
class RunRequest:
    """Everything one run takes besides its plan, as ``loadlab run``'s flags give it."""

    target: str | None = None            # a running server's base URL, or
    launch: Literal["sim", "vllm"] | None = None   # start one (flags in server_args)
    model: str | None = None
    api: Literal["completions", "chat"] = "completions"
    api_key_env: str = "LOADLAB_API_KEY"
    probe: bool = False                  # launched vllm: with loadlab_probe
    ca_bundle: str | None = None         # https: trust this PEM file's CAs, or
    insecure: bool = False               # verify nothing (warned, recorded)
    profile: str = "sharegpt"
    seed: int = 0
    calibrate: bool = True
    workers: int = 1
    remote_workers: int = 0
    master_bind: str = "127.0.0.1:0"
    timeout_s: float = 600.0
    drain_s: float = 30.0
    collect: bool = False
    replica_metrics: tuple[str, ...] = ()   # a gateway's replicas: their /metrics, scraped
    interval_s: float = 1.0              # between /metrics scrapes, with collect
    server_cpus: str | None = None
    client_cpus: str | None = None
    server_args: tuple[str, ...] = ()
    out: Path | None = None              # default reports/run-<time>
    overwrite: bool = False
    point: str = ""                      # sweep point name stored in every row


def isolation(server_cpus: str | None, client_cpus: str | None,
              launch: str | None) -> Isolation:
    """The CPU sets as an Isolation, checked against this machine."""
    from loadlab.experiment.cpus import check_available

    if server_cpus and not launch:
        raise InputError("--server-cpus pins a server loadlab starts", field="--server-cpus",
                         fix="use it with --launch sim|vllm, or pin your server yourself (taskset)")
    return check_available(validate(Isolation, {"server_cpus": server_cpus,
                                                "client_cpus": client_cpus}, names=CPU_FLAGS))


def join_worker(address: str, cpus: Isolation) -> None:
    """Worker mode: serve the master at ``address`` (on the client CPUs when given)."""
    import os

    from loadlab.experiment.cpus import pin_threads
    from loadlab.loadgen.preflight import split_address

    split_address(address, "--join", need_port=True)
    from loadlab.loadgen.worker import join_master

    if cpus.client_cpus is not None:
        pin_threads(os.getpid(), cpus.client_cpus)
    join_master(address)


def trace_span_s(trace: str, time_scale: float) -> float:
    """The last arrival offset of a trace (x ``time_scale``); InputError without timestamps."""
    from loadlab.loadgen.prepare import TraceSpecs

    offsets = [s.arrival_s for s in TraceSpecs(trace, time_scale).specs]
    known = [o for o in offsets if o is not None]
    if len(known) < len(offsets):
        raise InputError("the trace has no timestamps to replay", source=trace, field="time column",
                         fix="use a trace with a time column, or --rate with a profile")
    return max(known)


def run_load(request: RunRequest, plan: LoadPlan, *, say: Say = print,
             note: Say | None = None) -> dict[str, Any]:
    """Check the request, run it, report it; the run's manifest.

    ``say`` gets the outcome lines, ``note`` (default stderr) the step summary, warnings
    and progress. Raises ClientLimited after a complete run whose client fell short.
    """
    from loadlab.experiment.point import STDERR_LINE, PointSpec, run_point

    note = note or STDERR_LINE
    cpus = isolation(request.server_cpus, request.client_cpus, request.launch)
    _check(request)
    ensure_open_files(plan, request.workers, request.remote_workers)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    loadgen = {"workers": request.workers, "timeout_s": request.timeout_s,
               "drain_s": request.drain_s}
    collect = request.collect or bool(request.replica_metrics)
    if collect:
        loadgen["collect_interval_s"] = request.interval_s
    spec = PointSpec(
        out=request.out or Path("reports") / f"run-{stamp}",
        target=validate(Target, _target_fields(request), names=TARGET_FLAGS),
        workload=validate(Workload, {"profile": request.profile, "seed": request.seed,
                                     "calibrate": request.calibrate}, names=WORKLOAD_FLAGS),
        plan=plan,
        loadgen=validate(LoadgenSettings, loadgen, names=LOADGEN_FLAGS),
        isolation=cpus, point=request.point, server_args=list(request.server_args),
        collect=collect, nonce=f"r{stamp}", remote_workers=request.remote_workers,
        master_bind=request.master_bind, progress=note,
    )
    if plan.trace is None:
        from loadlab.workload import load_profile

        load_profile(spec.workload.profile)  # fail fast, exit 2, before any process starts
    with claim_run_dir(spec.out, request.overwrite):   # held until the point has ended
        manifest = run_point(spec)
    report_run(manifest, spec.out, say=say, note=note)
    return manifest


def _check(r: RunRequest) -> None:
    """The flag combinations, the URL, the master's address and the API key; InputError if off."""
    from loadlab.loadgen.preflight import api_key, check_url, split_address

    if r.server_args and not r.launch:
        raise InputError(f"unexpected arguments {' '.join(r.server_args)!r}", field="SERVER_ARGS",
                         fix="server flags go after '--' together with --launch sim|vllm")
    if r.launch and r.target:
        raise InputError("--target and --launch both name the server", field="--target/--launch",
                         fix="use --target URL for a running server, "
                         "or --launch sim|vllm to start one")
    if not r.launch and (not r.target or not r.model):
        raise InputError("--target and --model are required (or --launch sim|vllm)",
                         field="--target/--model",
                         fix="e.g. --target http://127.0.0.1:8000 --model my-model")
    if r.replica_metrics and not r.target:
        raise InputError("--replica-metrics names the replicas behind a --target gateway",
                         field="--replica-metrics",
                         fix="give --target GATEWAY_URL; --launch sim scrapes its fleet's "
                         "replicas itself")
    if r.target:
        check_url(r.target)
    if r.workers or r.remote_workers:
        split_address(r.master_bind, "--master-bind")
    api_key(r.api_key_env)  # a key that cannot be a header: exit 2 now, not a worker failure later


def _target_fields(r: RunRequest) -> dict[str, Any]:
    """The Target's fields; a launched vllm serves ``model``, else the MODEL in server_args."""
    model = r.model
    if r.launch == "vllm" and not model:
        from loadlab.experiment.server_flags import parse_flags

        model = next(iter(parse_flags(list(r.server_args)).positional), None)
    fields = {"url": r.target, "launch": r.launch, "model": model, "api": r.api,
              "api_key_env": r.api_key_env, "probe": r.probe or None,
              "ca_bundle": r.ca_bundle, "insecure": r.insecure,
              "replica_metrics": list(r.replica_metrics) or None}
    return {k: v for k, v in fields.items() if v is not None}


def report_run(manifest: dict[str, Any], out: Path, *, say: Say = print,
               note: Say | None = None) -> None:
    """The step summary, the outcome, notes; NoSuccess (exit 4) when no request succeeded,
    else ClientLimited (exit 3) when the client fell short."""
    from loadlab.experiment.point import STDERR_LINE
    from loadlab.experiment.verdicts import client_limited_message
    from loadlab.loadgen.achieved import format_summary

    note = note or STDERR_LINE
    rec = manifest.get("records", {})
    note(format_summary(manifest["steps"]))
    say(f"run {manifest['status']}: {rec.get('rows', 0)} requests recorded in {out}")
    if manifest.get("search"):
        found = manifest["search"]
        say(f"knee search: last good {found['lower']}, first stalled {found['upper']} users "
            f"({len(found['steps'])} steps)")
    workload = manifest.get("workload", {})
    if workload.get("calibrate") and workload.get("calibrated") is False:
        note(f"note: prompt lengths not exact: {workload['calibration_reason']}")
    if rec.get("unwritten"):
        note(f"warning: {rec['unwritten']} requests could not be written: "
             f"{'; '.join(rec['write_errors'])}")
    if not rec.get("unwritten"):   # rows kept in memory may hold the successes
        failed = no_success_message(out)
        if failed:
            raise NoSuccess(failed)
    limited = client_limited_message(out, manifest)
    if limited:
        raise ClientLimited(limited)


def no_success_message(out: Path) -> str | None:
    """One line when no request of the run folder ``out`` succeeded, naming its most common
    error; None when one did."""
    from loadlab.loadgen.guards import brief
    from loadlab.runstore import REQUESTS, read_table
    from loadlab.runstore.layout import REQUESTS_TABLE

    rows = read_table(out / REQUESTS_TABLE, REQUESTS, columns=["status", "error"],
                      categorical=["status", "error"])
    if (rows.status == "ok").any():
        return None
    if rows.empty:
        return "no request succeeded: none was recorded"
    common = rows.groupby(["status", "error"], dropna=False, observed=True).size()
    (status, error), count = common.idxmax(), int(common.max())
    said = f": {brief(error)}" if isinstance(error, str) and error else ""
    return (f"no request succeeded (0 of {len(rows)} ok); the most common error, "
            f"{count} of them: {status}{said}")
