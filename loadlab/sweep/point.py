"""One load point: start the server, run the load, scrape, write the manifest, stop.

The one home of that sequence: ``loadlab run``, every point of ``loadlab sweep`` and
``loadlab demo`` call :func:`run_point` with a :class:`PointSpec`.

Import order (the rule lives here and only here): importing Locust monkey-patches the
process with gevent, and httpx/httpcore (the launcher's health checks, the scraper's
fetches) must be imported before that, unpatched. This module imports the launcher and
the scraper at its top and the load driver (Locust) only inside :func:`run_point`, so
any caller gets the right order; nothing else in loadlab imports the driver.

Steps of :func:`run_point`:

1. Target: with ``launch`` a fresh server (:func:`loadlab.sweep.launcher.launch_target`:
   a free port, its log in the point's folder, its whole process group stopped and
   waited for at the end); else the URL as given. Then the preflight
   (:func:`loadlab.loadgen.preflight.preflight`): the key works, the model is served (the
   first listed when none is named), its ``max_model_len`` that lengths are fitted to.
2. Scraper (unless ``collect`` is off): samples the target's ``/metrics`` into the same
   folder every ``collect_interval_s`` for as long as the load runs.
3. The load (:func:`loadlab.loadgen.driver.run_load`), which writes the manifest and
   the request records and polls the launched server, so a server that dies mid-step
   ends the point as failed with the reason.
4. On the way out, also on errors and Ctrl-C: the scraper is stopped and flushed, then
   the server is stopped.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from loadlab.collect.scraper import Scraper
from loadlab.config import LoadgenSettings, LoadPlan, Point, Scenario, Target, Workload
from loadlab.loadgen.preflight import preflight
from loadlab.sweep.launcher import launch_target
from loadlab.sweep.server_flags import to_argv

STDERR_LINE = partial(print, file=sys.stderr, flush=True)


@dataclass
class PointSpec:
    """Everything one point needs (plain data; nothing starts until :func:`run_point`)."""

    out: Path
    target: Target
    workload: Workload
    plan: LoadPlan
    loadgen: LoadgenSettings = field(default_factory=LoadgenSettings)
    point: str = ""                                   # stored in every request row
    server_args: list[str] = field(default_factory=list)   # launched server: flags after MODEL
    collect: bool = True
    nonce: str = "r"
    remote_workers: int = 0
    master_bind: str = "127.0.0.1:0"
    manifest_extra: dict[str, Any] = field(default_factory=dict)
    progress: Callable[[str], None] = STDERR_LINE
    judge: Callable[[int], bool] | None = None        # knee search: did step k stall?


@dataclass
class _Live:
    base_url: str
    model: str | None                 # None: the first the server lists
    extra: dict[str, Any]
    target_check: Callable[[], str | None] | None = None


def point_spec(scenario: Scenario, point: Point, out: Path, progress: Callable[[str], None],
               judge: Callable[[int], bool] | None) -> PointSpec:
    """The spec of one sweep point: the scenario with the point's flags."""
    flags = dict(point.flags)
    if scenario.target.launch == "sim" and scenario.target.model and "model" not in flags:
        flags = {"model": scenario.target.model, **flags}
    return PointSpec(out=out, target=scenario.target, workload=scenario.workload, plan=scenario.load,
                     loadgen=scenario.loadgen, point=point.name, server_args=to_argv(flags),
                     nonce=f"{scenario.name}-{scenario.workload.seed}", progress=progress, judge=judge,
                     manifest_extra={"scenario": scenario.name})


@contextmanager
def _target(spec: PointSpec) -> Iterator[_Live]:
    target = spec.target
    if target.launch is None:
        assert target.url is not None
        yield _Live(target.url.rstrip("/"), target.model, {})
        return
    model = target.model if target.launch == "vllm" else None
    with launch_target(target.launch, spec.server_args, spec.out, model=model,
                       startup_timeout_s=target.startup_timeout_s) as launched:
        spec.progress(f"{target.launch} server up at {launched.base_url} in {launched.startup_s:.1f} s")
        extra = {"target": {"launch": launched.manifest_entry()}, "server": launched.server_settings()}
        yield _Live(launched.base_url, launched.model, extra, launched.exit_reason)


def run_point(spec: PointSpec) -> dict[str, Any]:
    """Run one point (see the module docstring); returns its final manifest."""
    with _target(spec) as live:
        info = preflight(live.base_url, live.model, spec.target.api_key_env)
        extra = {**spec.manifest_extra, **live.extra}
        extra["target"] = {**extra.get("target", {}), "max_model_len": info.max_model_len}
        scraper = (Scraper([live.base_url], spec.out, interval_s=spec.loadgen.collect_interval_s,
                           api_key_env=spec.target.api_key_env)
                   if spec.collect else None)
        from loadlab.loadgen import driver  # Locust: only now (see the module docstring)
        from loadlab.loadgen.context import RunSettings

        settings = RunSettings(
            base_url=live.base_url, model=live.model or info.models[0], api=spec.target.api,
            seed=spec.workload.seed, max_model_len=info.max_model_len,
            profile=None if spec.plan.trace else spec.workload.profile, trace=spec.plan.trace,
            time_scale=spec.plan.time_scale, timeout_s=spec.loadgen.timeout_s,
            api_key_env=spec.target.api_key_env, point=spec.point, nonce=spec.nonce,
            calibrate=spec.workload.calibrate, plan=spec.plan.describe(),
        )
        opts = driver.RunOptions(out=spec.out, workers=spec.loadgen.workers,
                                 remote_workers=spec.remote_workers, master_bind=spec.master_bind,
                                 drain_s=spec.loadgen.drain_s, progress=spec.progress,
                                 target_check=live.target_check)
        if scraper is not None:
            scraper.start()
        try:
            return driver.run_load(settings, spec.plan, opts, extra)
        finally:
            if scraper is not None:
                scraper.stop()
