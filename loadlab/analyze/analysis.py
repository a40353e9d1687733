"""``analysis.json``: the analyzer's verdict on one run folder, read by the report,
``loadlab compare`` and CI jobs: a contract (``schema`` 1, raised when a reader would
have to change), modelled by :class:`loadlab.runstore.analysis_model.Analysis`.

:func:`analyze_run` reads the run folder once (:func:`loadlab.analyze.steps.load_run`),
builds the per-step table, finds the knee (:mod:`~loadlab.analyze.knee`), names the
cause (:mod:`~loadlab.analyze.cause`), checks capacity (:mod:`~loadlab.analyze.capacity`)
and the SLOs (:mod:`~loadlab.analyze.slo`), and lists in ``warnings`` what it could not
use. Where the server exports the scheduler's own refusals (loadlab's simulator), the
knee and cause measured from them (:mod:`~loadlab.analyze.measured`) sit beside the
inferred ones as ``knee.measured`` and ``cause.measured``. A fleet's run (several replicas'
series) adds each replica's knee and cause, the routing imbalance and, where the fleet
stalled while a replica had room, the cause ``routing_imbalance``
(:mod:`~loadlab.analyze.fleet`); its own table, knee and cause are judged on its replicas'
gauges added up (:mod:`~loadlab.analyze.fleet_view`), and its measured verdict is built
from each replica's (:mod:`~loadlab.analyze.fleet_measured`). It returns the typed
:class:`~loadlab.runstore.analysis_model.Analysis`; everything in it is plain JSON: NaN
becomes null. ``verdict`` is the one-line answer (:func:`loadlab.analyze.display.verdict_line`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from loadlab.analyze import cause as causes
from loadlab.analyze import fleet
from loadlab.analyze.capacity import as_int, capacity, pool_config, token_fill
from loadlab.analyze.display import verdict_line
from loadlab.analyze.failures import failure_warnings, unblame_client
from loadlab.analyze.fleet import Judged
from loadlab.analyze.fleet_view import fleet_run
from loadlab.analyze.knee import Knee, find_knee
from loadlab.analyze.measured import measure, typical_request_blocks
from loadlab.analyze.slo import evaluate, parse_slo
from loadlab.analyze.steps import RunData, build_step_table, load_run
from loadlab.analyze.stream_steps import run_figures
from loadlab.analyze.warnings import reset_warnings, scrape_warnings
from loadlab.collect import catalog
from loadlab.runstore.analysis_model import SCHEMA, Analysis
from loadlab.runstore.layout import MANIFEST, METRICS_TABLE, REQUESTS_TABLE

STALE_WARN = 0.2
COVERAGE_WARN = 0.9


def analyze_run(run_dir: str | Path, slo: str | None = None, seed: int = 0) -> Analysis:
    """The analysis of ``run_dir`` (see the module docstring)."""
    run = load_run(run_dir)
    targets = parse_slo(slo)
    members = fleet.replicas_of(run.manifest, run.metrics)
    whole = fleet_run(run, members, fleet.interval(run)) if len(members) > 1 else run
    judged = judge(whole, seed, streams=len(members) <= 1)
    table, knee, cause, cap = judged.table, judged.knee, judged.cause, judged.capacity
    warnings = _warnings(whole, table)
    replicas = fleet.assess(run, members, judged, lambda sub: judge(sub, seed))
    slo_block = evaluate(targets, run.requests, table)
    knee_block = knee.as_dict()
    truth = judged.measured
    if truth is not None:
        knee_block["measured"], cause["measured"] = truth["knee"], truth["cause"]
    out = {
        "schema": SCHEMA,
        "run": {"dir": str(run.run_dir), "kind": run.manifest.get("kind"),
                "status": run.manifest.get("status"), "point": run.manifest.get("point"),
                "unit": knee.unit, "server_metrics": not run.metrics.empty},
        "steps": _records(table),
        "knee": knee_block,
        "slo": slo_block,
        "cause": cause,
        "capacity": cap,
        "warnings": warnings + (cause.pop("notes") or []),
        **_plain(replicas),
    }
    out["verdict"] = verdict_line(out)
    return Analysis.model_validate(out)


def judge(run: RunData, seed: int = 0, streams: bool = False) -> Judged:
    """The step table, knee, cause and capacity of one loaded run (a whole run, or one
    replica's series of a fleet, :mod:`loadlab.analyze.fleet`). ``streams``: read the
    engine steps from the client's token streams (:mod:`loadlab.analyze.stream_steps`);
    only where one server answered them all, since a fleet's streams interleave its
    replicas' steps."""
    table = build_step_table(run)
    unblame_client(table, run.manifest.get("server") or {})
    knee = find_knee(run, table, seed=seed)
    table["state"] = knee.states
    config = pool_config(run.metrics, run.manifest)
    v0 = (
        catalog.engine_generation(run.metrics["family"].unique()) == "v0"
        if not run.metrics.empty
        else False
    )
    measured = knee.upper if knee.found else None
    cap = capacity(config, run.requests, v0, _plain(measured))
    table["token_fill"] = token_fill(table, config)
    typical = typical_request_blocks(run.requests, as_int(config.get("block_size")))
    truth = measure(run.metrics, table, typical)
    return Judged(table, knee, _cause(run, table, knee, config, cap, streams, typical), cap,
                  truth)


def _cause(run: RunData, table: pd.DataFrame, knee: Knee, config: dict[str, Any],
           cap: dict[str, Any], streams: bool, typical: float | None) -> dict[str, Any]:
    stalled = table[(table["state"] == "stalled")]
    if knee.found and knee.upper is not None:  # a found knee has its upper level
        stalled = stalled[stalled["level"].astype(float) >= float(knee.upper)]
    else:
        stalled = stalled.iloc[0:0]
    stream = run_figures(run.run_dir, stalled[["t_start", "t_end"]],
                         as_int(config.get("num_gpu_blocks")), as_int(config.get("block_size")),
                         typical) if streams else None
    limited = [int(s) for s, st in zip(table["step"], table["state"]) if st == "client_limited"]
    return causes.assess(stalled, table, run.manifest.get("server") or {}, config, cap,
                         causes.Verdict(knee.found, knee.client_limited_before, limited,
                                        not run.metrics.empty, knee.psi, run.closed_loop,
                                        knee.confidence),
                         run.requests, stream)


def _warnings(run: RunData, table: pd.DataFrame) -> list[str]:
    w: list[str] = []
    m, req = run.manifest, run.requests
    status = m.get("status")
    if status not in (None, "complete"):
        w.append(f"run status is {status!r}{': ' + str(m.get('error')) if m.get('error') else ''}; "
                 "analysed what was recorded")
    if m.get("stop_reason"):
        w.append(f"the run stopped early: {m['stop_reason']}")
    if len(table) == 0:
        w.append(f"{MANIFEST} lists no load steps: nothing to judge")
    elif len(table) == 1:
        w.append("one load step only: a knee needs at least two levels to bracket")
    if req.empty:
        w.append(f"{REQUESTS_TABLE} is missing or empty: no client-side figures")
    elif not (req["status"] == "ok").any():
        w.append(f"no request succeeded ({len(req)} failed: "
                 f"{', '.join(f'{k} {v}' for k, v in req['status'].value_counts().items())}): "
                 "latency figures and the knee are unavailable")
    w += failure_warnings(table)
    if m.get("kind") == "sweep":
        w.append("this is a sweep folder: analyse each point's folder")
    scraped = scrape_warnings(run.scrapes, not run.metrics.empty)
    w += run.notes + scraped
    if run.metrics.empty and not scraped:
        w.append(f"no server metrics ({METRICS_TABLE}): client-only verdict, cause unknown; "
                 "rerun with --collect")
    elif not run.metrics.empty:
        w += reset_warnings(table)
        gen = catalog.engine_generation(run.metrics["family"].unique())
        if gen == "v0" or any(catalog.BY_FAMILY.get(f) and catalog.BY_FAMILY[f].era == "renamed"
                              for f in run.metrics["family"].unique()):
            w.append(
                "V0-era metric names found (gpu_cache_usage_perc, ...): read as their V1 roles"
            )
        for col, what in (
            ("waiting_occupancy", "waiting gauge"),
            ("server_queue_mean_ms", "queue-time histogram"),
        ):
            if col not in table or table[col].isna().all():
                w.append(f"no {what} in {METRICS_TABLE}: its detector did not vote")
        for row in table.itertuples(index=False):
            cov = getattr(row, "coverage", np.nan)
            if not np.isnan(cov) and cov < COVERAGE_WARN:
                w.append(
                    f"step {row.step}: only {cov:.0%} of the expected scrapes came back "
                    "(scrape gap)"
                )
            stale = getattr(row, "gauge_stale", np.nan)
            if not np.isnan(stale) and stale > STALE_WARN:
                w.append(
                    f"step {row.step}: the running gauge read 0 while tokens flowed in "
                    f"{stale:.0%} of snapshots (lagging gauges): "
                    "the verdict uses counters and maxima"
                )
    return w


def _records(table: pd.DataFrame) -> list[dict[str, Any]]:
    return [{k: _plain(v) for k, v in row.items()} for row in table.to_dict("records")]


def _plain(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, (np.bool_, bool)):
        return bool(v)
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        f = float(v)
        if math.isnan(f) or math.isinf(f):
            return None
        return int(f) if f.is_integer() and abs(f) < 2**53 else round(f, 6)
    return v
