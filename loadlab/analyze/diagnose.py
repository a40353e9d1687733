"""``loadlab diagnose --target URL``: why a live vLLM stalls now, from its /metrics alone.

Read-only: it only GETs /metrics (the collector's scraper, API key from
``$LOADLAB_API_KEY`` or ``--api-key-env``, never printed), for ``--duration`` seconds
(default 10) every ``--interval`` seconds (default 1), into a temporary folder that is
removed afterwards. The duration is cut into up to :data:`WINDOWS` windows (each at least
:data:`MIN_SCRAPES` scrapes long), each a step of a small run
(:func:`steps.build_step_table`), and the checklist walks them:

1. caliber: which names the server exposes (V1/V0) and what KV usage means there
   (block-level, cached prefix blocks counted free), the pool from ``cache_config_info``;
2. running vs waiting vs the cap (``--max-num-seqs`` if given, else inferred only from a
   running max that stays the same in every queued window: one window's running max is
   whatever running happened to be), queue occupancy and time-mean queue length;
3. KV usage; 4. preemptions; 5. the prefix cache's hit rate;
6. the probe: where the server exports loadlab's ``loadlab:scheduler_*`` series (the
   simulator; a vLLM with the probe), the reason the scheduler itself gave for leaving the
   head of waiting waiting (:func:`loadlab.analyze.measured.measure`), beside the
   inference and saying when the two disagree.

A window counts as stalled by the knee's own step detectors (queue-time share of TTFT,
occupancy, Little's law); the server is queueing when most windows are. The likely cause
is :func:`cause.assess` over the queued windows, the same signatures ``loadlab analyze``
uses, with token-level usage from the server's prompt and generation length histograms,
and its confidence (``cause.confidence``). ``--watch`` repeats until Ctrl-C, a line each
(:func:`watch_line`). The command's flags are declared in :mod:`loadlab.cli.diagnose`.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from loadlab.analyze import cause as causes
from loadlab.analyze import detectors as det
from loadlab.analyze.capacity import capacity, pool_config, token_fill
from loadlab.analyze.display import cause_text
from loadlab.analyze.knee import step_states, waiting_level
from loadlab.analyze.measured import measure
from loadlab.analyze.steps import RunData, build_step_table
from loadlab.analyze.tables import read_metrics
from loadlab.analyze.windows import histogram_windows, resolve_family
from loadlab.collect import catalog
from loadlab.collect.scraper import Scraper
from loadlab.errors import InputError
from loadlab.runstore import read_manifest, read_table
from loadlab.runstore.layout import SCRAPES_TABLE
from loadlab.runstore.schema import REQUESTS, SCRAPES

WINDOWS = 3
"""Windows a diagnosis is cut into. Three is the fewest where a running plateau means
something (two windows agree by chance more often) that still leaves the default 10 s of
1 s scrapes three samples a window."""
MIN_SCRAPES = 2
"""Scrapes a window needs at least: a counter's increase takes two samples."""


def sample(url: str, duration_s: float, interval_s: float, api_key_env: str) -> RunData:
    """Scrape ``url`` for ``duration_s`` into a temporary folder; its windows as the steps
    of a run (:func:`windows`)."""
    with tempfile.TemporaryDirectory(prefix="loadlab-diagnose-") as tmp:
        out = Path(tmp)
        t0 = time.time()
        with Scraper([url], out, interval_s=interval_s, api_key_env=api_key_env):
            time.sleep(duration_s)  # the scraper's threads sample meanwhile
        t1 = time.time()
        metrics = read_metrics(out)
        scrapes = read_table(out / SCRAPES_TABLE, SCRAPES)
        manifest = read_manifest(out)
    if metrics.empty:
        errors = scrapes["error"].dropna()
        why = errors.mode().iloc[0] if len(errors) else "no samples"
        raise InputError(f"no vLLM metrics came back from {url} in {duration_s:g} s ({why})",
                         field="--target", fix="give the server's base URL, e.g. http://127.0.0.1:8000")
    manifest.update(steps=windows(t0, t1, interval_s),
                    metrics={**(manifest.get("metrics") or {}), "interval_s": interval_s})
    return RunData(Path(url), manifest, REQUESTS.empty_table().to_pandas(), metrics, scrapes)


def windows(t0: float, t1: float, interval_s: float) -> list[dict[str, Any]]:
    """``[t0, t1]`` cut into up to :data:`WINDOWS` equal steps of >= :data:`MIN_SCRAPES`
    scrapes each (one step when the duration holds fewer)."""
    n = int(max(1, min(WINDOWS, (t1 - t0) / interval_s // MIN_SCRAPES)))
    edges = np.linspace(t0, t1, n + 1)
    return [{"step": i, "t_start": float(a), "t_end": float(b), "warmup_s": 0.0}
            for i, (a, b) in enumerate(zip(edges[:-1], edges[1:]))]


def diagnose_window(run: RunData, server: dict[str, Any]) -> dict[str, Any]:
    """Checklist figures, the likely cause of the sampled windows and, with the probe, the
    measured one. ``row``: the figures over the whole duration; ``windows``: per window."""
    table = _table(run)
    votes = det.step_votes(table, True, waiting_level(table), None)
    states = step_states(votes, [False] * len(table))
    queued = np.array([s == "stalled" for s in states])
    stalled = bool(queued.sum() * 2 > len(table))
    config = pool_config(run.metrics, run.manifest)
    table["token_fill"] = token_fill(table, config)
    v0 = catalog.engine_generation(run.metrics["family"].unique()) == "v0"
    cap = capacity(config, run.requests, v0, None)
    rows = table[queued] if stalled else table.iloc[0:0]
    cause = causes.assess(rows, table, server, config, cap,
                          causes.Verdict(stalled, False, [], True, None, one_load=True))
    whole = _table(_one_window(run))
    whole["token_fill"] = token_fill(whole, config)
    return {"row": whole.iloc[0].to_dict(), "stalled": stalled, "config": config, "v0": v0,
            "cause": cause, "windows": table.assign(state=states),
            "measured": measure(run.metrics, table.assign(level=0.0))}


def _table(run: RunData) -> pd.DataFrame:
    """The step table of the sampled windows, their level the requests the server held."""
    table = build_step_table(run)
    table["level"] = np.nan_to_num(table["running_mean"]) + np.nan_to_num(table["waiting_mean"])
    _server_lengths(table, run.metrics)
    return table


def _one_window(run: RunData) -> RunData:
    """The same samples as one step over the whole duration (the checklist's figures)."""
    steps = run.manifest["steps"]
    one = {"step": 0, "t_start": steps[0]["t_start"], "t_end": steps[-1]["t_end"],
           "warmup_s": 0.0}
    return replace(run, manifest={**run.manifest, "steps": [one]})


def checklist(url: str, result: dict[str, Any], duration_s: float, interval_s: float) -> list[str]:
    """The findings, a line per checklist item, then the likely cause and how sure it is."""
    r, cfg, c = result["row"], result["config"], result["cause"]
    facts = c["facts"]
    names = "V0-era names" if result["v0"] else "V1 names"
    pool = (f"{cfg.get('num_gpu_blocks')} blocks of {cfg.get('block_size')} tokens"
            if cfg.get("num_gpu_blocks") else "pool size not exposed")
    fill = r.get("token_fill")
    held = f"; tokens held fill ~{fill:.0%} of the blocks in use" if _ok(fill) else ""
    inferred = " (inferred from a plateau across windows)" if facts.get("cap_inferred") else ""
    caching = "on" if cfg.get("enable_prefix_caching") else "off or unknown"
    wins = result["windows"]
    per_window = ", ".join(f"{_f(m)} ({s})" for m, s in zip(wins["running_max"], wins["state"]))
    lines = [
        f"diagnose {url}: {duration_s:g} s of /metrics every {interval_s:g} s in "
        f"{len(wins)} window(s) ({names})",
        f"  caliber   KV usage is block-level ({pool}); cached prefix blocks count as free{held}",
        (
            f"  queue     running mean {_f(r.get('running_mean'))} max {_f(r.get('running_max'))}; "
            f"waiting mean {_f(r.get('waiting_mean'))} max {_f(r.get('waiting_max'))}, "
            f"present in {_pct(r.get('waiting_occupancy'))} of samples; "
            f"cap {facts.get('cap') or 'unknown'}{inferred}"
        ),
        f"  windows   running max per window: {per_window}",
        f"  KV        usage mean {_pct(r.get('kv_mean'))}, max {_pct(r.get('kv_max'))}",
        f"  preempt   {_f(r.get('preemptions'))} preemptions in the window",
        f"  prefix    hit rate {_pct(r.get('prefix_hit_rate'))}, caching {caching}",
    ]
    probe = probe_line(result)
    if probe:
        lines.append(f"  probe     {probe}")
    state = "requests are queueing" if result["stalled"] else "no persistent queue"
    knob = "nothing stalls at this load" if c["name"] == "none" else c["knob"]
    sure = "" if c["name"] == "none" else f" ({c.get('confidence', 'low')} confidence)"
    lines.append(f"{state}; likely cause: {cause_text(c)}{sure}; {knob}")
    return lines


def probe_line(result: dict[str, Any]) -> str | None:
    """The scheduler's own reason for the queue (the probe's series) and whether the inferred
    cause agrees; None where the server exports no probe."""
    m = result.get("measured")
    if m is None:
        return None
    share = m["knee"]["refused_share"][0]["share"] if m["knee"]["refused_share"] else 0.0
    cause = m["cause"]
    said = f"the scheduler left the head of waiting waiting in {share:.0%} of engine steps"
    if cause.get("reason"):
        said += (f", {cause['reason']} in {cause['reason_share'][cause['reason']]:.0%} of "
                 f"those: measured cause {cause['name']}")
    else:
        said += ": measured cause none"
    inferred = result["cause"]
    if inferred["name"] == cause["name"]:
        return said + " — agrees with the inference"
    if cause["name"] in (inferred.get("candidates") or []):
        return said + " — it settles the inferred " + " or ".join(inferred["candidates"])
    return said + f" — DISAGREES with the inferred {inferred['name']}"


def watch_line(result: dict[str, Any]) -> str:
    """One diagnosis in a line, for watching a server window after window."""
    r, c = result["row"], result["cause"]
    m = result.get("measured")
    probe = f"; measured {m['cause']['name']}" if m is not None else ""
    return (f"{time.strftime('%H:%M:%S')} running {_f(r.get('running_max'))} max, waiting "
            f"{_f(r.get('waiting_max'))} max, KV {_pct(r.get('kv_max'))} max: "
            f"{cause_text(c)} ({c.get('confidence', 'low')} confidence){probe}")


def _server_lengths(table: pd.DataFrame, metrics: pd.DataFrame) -> None:
    """Mean prompt and output lengths from vLLM's own per-request histograms."""
    span = table[["t_start", "t_end"]]
    for role, col in (("request_prompt_tokens", "prompt_tokens_mean"),
                      ("request_generation_tokens", "output_tokens_mean")):
        family = resolve_family(metrics, role)
        if family:
            table[col] = histogram_windows(metrics, family, span, quantiles=())["mean"].to_numpy()


def _ok(v: Any) -> bool:
    return v is not None and not (isinstance(v, float) and np.isnan(v))


def _f(v: Any) -> str:
    return f"{float(v):.1f}".rstrip("0").rstrip(".") if _ok(v) else "-"


def _pct(v: Any) -> str:
    return f"{float(v):.0%}" if _ok(v) else "-"
