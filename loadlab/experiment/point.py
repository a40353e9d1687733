"""One load point: start the server, run the load, scrape, write the manifest, stop.

The one home of that sequence: ``loadlab run``, every point of ``loadlab sweep`` and
``loadlab demo`` call :func:`run_point` with a :class:`PointSpec`. :func:`run_point` runs
it in a child process (:mod:`loadlab.experiment.child`), so the caller is never patched
by gevent; :func:`run_here` is the sequence itself, run in that child.

Import order (the rule lives here and only here): importing Locust monkey-patches the
process with gevent, and httpx/httpcore (the launcher's health checks, the preflight,
the scraper's fetches) must be imported before that, unpatched. This module imports the
launcher, the preflight and the scraper at its top and the load driver (Locust) only
inside :func:`run_here`, so the child gets the right order; nothing else in loadlab
imports the driver.

Steps of :func:`run_here`:

1. Target: with ``launch`` a fresh server (:func:`loadlab.experiment.launcher.launch_target`:
   a free port, its log in the point's folder, on ``isolation.server_cpus`` when given,
   its whole process group stopped and waited for at the end); a simulator is given
   ``target.model`` as its ``--model`` unless its flags name one. Else the URL as given.
2. The load generator's process goes onto ``isolation.client_cpus`` (every thread; its
   worker processes inherit them) until the point ends; the manifest records both sets
   under ``isolation``.
3. The preflight (:func:`loadlab.loadgen.preflight.preflight`): the key works, the model
   is served (for a URL target ``target.model``, or the first listed when none is named;
   a launched server's own), its ``max_model_len`` that lengths are fitted to.
4. The load (:func:`loadlab.loadgen.driver.run_load`), which writes the manifest and
   the request records and polls the launched server, so a server that dies mid-step
   ends the point as failed with the reason. A knee search (``plan.search``) judges each
   step with :func:`loadlab.experiment.verdicts.step_judge` over the point's folder once the
   scraper has sampled past the step's end and flushed
   (:meth:`~loadlab.collect.scraper.Scraper.sync`). Once the manifest is written (``on_open``)
   the scraper (unless ``collect`` is off) starts sampling the target's ``/metrics``
   into the same folder every ``loadgen.collect_interval_s``; this is the only place a
   scraper is started beside a load. Its threads start after Locust's patching, so they
   are greenlets of the master, which only records: no measurement shares their loop
   unless ``workers`` is 0.
5. On the way out, also on errors and Ctrl-C: the scraper is stopped and flushed and its
   tables (metrics, scrapes) compacted, the client's CPUs given back, then the server
   is stopped.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from loadlab.collect.fetch import endpoint_urls
from loadlab.collect.scraper import Scraper
from loadlab.experiment.child import run_in_child
from loadlab.experiment.cpus import pinned_process
from loadlab.experiment.launcher import launch_target
from loadlab.experiment.server_flags import parse_flags, to_argv
from loadlab.experiment.verdicts import step_judge
from loadlab.loadgen.preflight import preflight
from loadlab.runstore import compact_run
from loadlab.runstore.layout import SCRAPER_TABLES
from loadlab.spec.plan import LoadPlan
from loadlab.spec.scenario import Isolation, LoadgenSettings, Point, Scenario, Target, Workload
from loadlab.spec.tls import INSECURE_WARNING

STDERR_LINE = partial(print, file=sys.stderr, flush=True)


@dataclass
class PointSpec:
    """Everything one point needs (plain data; nothing starts until :func:`run_point`)."""

    out: Path
    target: Target
    workload: Workload
    plan: LoadPlan
    loadgen: LoadgenSettings = field(default_factory=LoadgenSettings)
    isolation: Isolation = field(default_factory=Isolation)
    point: str = ""                                   # stored in every request row
    server_args: list[str] = field(default_factory=list)   # launched server: flags after MODEL
    collect: bool = True
    nonce: str = "r"
    remote_workers: int = 0
    master_bind: str = "127.0.0.1:0"
    manifest_extra: dict[str, Any] = field(default_factory=dict)
    progress: Callable[[str], None] = STDERR_LINE


@dataclass
class _Live:
    base_url: str
    model: str | None                 # None: the first the server lists
    extra: dict[str, Any]
    target_check: Callable[[], str | None] | None = None
    metrics: list[str] = field(default_factory=list)   # more /metrics to scrape (the probe's)


def point_spec(
    scenario: Scenario, point: Point, out: Path, progress: Callable[[str], None]
) -> PointSpec:
    """The spec of one sweep point: the scenario with the point's flags."""
    return PointSpec(
        out=out,
        target=scenario.target,
        workload=scenario.workload,
        plan=scenario.load,
        loadgen=scenario.loadgen,
        isolation=scenario.isolation or Isolation(),
        point=point.name,
        server_args=to_argv(point.flags),
        nonce=f"{scenario.name}-{scenario.workload.seed}",
        progress=progress,
        manifest_extra={"scenario": scenario.name},
    )


def _server_args(spec: PointSpec) -> list[str]:
    """The launched server's flags; a simulator gets ``target.model`` unless they name a model."""
    target, args = spec.target, list(spec.server_args)
    if target.launch == "sim" and target.model:
        parsed = parse_flags(args)
        if "model" not in parsed.values and not parsed.positional:
            args = ["--model", target.model, *args]
    return args


@contextmanager
def _target(spec: PointSpec) -> Iterator[_Live]:
    target = spec.target
    if target.launch is None:
        assert target.url is not None
        yield _Live(target.url.rstrip("/"), target.model, {})
        return
    model = target.model if target.launch == "vllm" else None
    with launch_target(target.launch, _server_args(spec), spec.out, model=model,
                       startup_timeout_s=target.startup_timeout_s,
                       server_cpus=spec.isolation.server_cpus,
                       probe=target.probe) as launched:
        spec.progress(
            f"{target.launch} server up at {launched.base_url} in {launched.startup_s:.1f} s"
        )
        extra = {
            "target": {"launch": launched.manifest_entry()},
            "server": launched.server_settings(),
        }
        yield _Live(launched.base_url, launched.model, extra, launched.exit_reason,
                    launched.metrics_endpoints)


def _metrics_endpoints(spec: PointSpec, base_url: str) -> list[str]:
    """What the point scrapes: the server, or each replica of a simulated fleet on its own
    path (``/replica/<i>``, labelled apart in metrics.parquet), not its replica-0 /metrics,
    or the replicas a gateway target names (``target.replica_metrics``), not the gateway."""
    if spec.target.replica_metrics:
        return list(spec.target.replica_metrics)
    replicas = parse_flags(spec.server_args).values.get("replicas", 1)
    if spec.target.launch != "sim" or not isinstance(replicas, int) or replicas < 2:
        return [base_url]
    return [f"{base_url}/replica/{i}" for i in range(replicas)]


@contextmanager
def _scraping(spec: PointSpec, endpoints: list[str]) -> Iterator[Scraper | None]:
    """The point's scraper (None without ``collect``), not started yet; stops and flushes
    it and compacts its tables however the block ends."""
    if not spec.collect:
        yield None
        return
    scraper = Scraper(endpoints, spec.out, interval_s=spec.loadgen.collect_interval_s,
                      api_key_env=spec.target.api_key_env, tls=spec.target.tls)
    try:
        yield scraper
    finally:
        scraper.stop()
        compact_run(spec.out, tables=SCRAPER_TABLES, progress=spec.progress)


def run_point(spec: PointSpec) -> dict[str, Any]:
    """Run one point in a child process (see the module docstring); returns its final
    manifest, or raises what the point raised (same exception type)."""
    return run_in_child(spec)


def run_here(spec: PointSpec) -> dict[str, Any]:
    """Run one point in this process, which Locust then patches (only the child does this)."""
    with _target(spec) as live, pinned_process(spec.isolation.client_cpus):
        tls = spec.target.tls
        if tls.insecure:
            spec.progress(f"warning: {INSECURE_WARNING}")
        info = preflight(live.base_url, live.model, spec.target.api_key_env, tls)
        extra = {**spec.manifest_extra, **live.extra, "isolation": spec.isolation.manifest_entry()}
        https = live.base_url.startswith("https://")
        extra["target"] = {**extra.get("target", {}), "max_model_len": info.max_model_len,
                           "tls": tls.manifest_entry() if https else None}
        if spec.target.replica_metrics:   # the analysis judges each replica (analyze.fleet)
            extra["replicas"] = [endpoint_urls(u)[0] for u in spec.target.replica_metrics]
        from loadlab.loadgen import driver  # Locust: only now (see the module docstring)
        from loadlab.loadgen.context import RunSettings

        settings = RunSettings(
            base_url=live.base_url, model=live.model or info.models[0], api=spec.target.api,
            seed=spec.workload.seed, max_model_len=info.max_model_len,
            profile=None if spec.plan.trace else spec.workload.profile, trace=spec.plan.trace,
            time_scale=spec.plan.time_scale, timeout_s=spec.loadgen.timeout_s,
            api_key_env=spec.target.api_key_env, point=spec.point, nonce=spec.nonce,
            calibrate=spec.workload.calibrate, plan=spec.plan.describe(), tls=tls.to_dict(),
        )
        with _scraping(spec, [*_metrics_endpoints(spec, live.base_url), *live.metrics]) as scraper:
            opts = driver.RunOptions(
                out=spec.out,
                workers=spec.loadgen.workers,
                remote_workers=spec.remote_workers,
                master_bind=spec.master_bind,
                drain_s=spec.loadgen.drain_s,
                progress=spec.progress,
                target_check=live.target_check,
                on_open=scraper.start if scraper is not None else None,
                judge=_judge(spec, scraper),
            )
            return driver.run_load(settings, spec.plan, opts, extra)


def _judge(spec: PointSpec, scraper: Scraper | None) -> Callable[[int], bool] | None:
    """A knee search's verdict on step k: the analyzer over the point's folder, asked once
    the scraper has sampled the server past the step's end."""
    if spec.plan.search is None:
        return None
    judge = step_judge(spec.out)

    def synced(step: int) -> bool:
        if scraper is not None:
            scraper.sync()
        return judge(step)

    return synced
