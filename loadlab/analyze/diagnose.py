"""``loadlab diagnose --target URL``: why a live vLLM stalls now, from its /metrics alone.

Read-only: it only GETs /metrics (the collector's scraper, API key from
``$LOADLAB_API_KEY`` or ``--api-key-env``, never printed), for ``--duration`` seconds
(default 10) every ``--interval`` seconds (default 1), into a temporary folder that is
removed afterwards. That window becomes a one-step run (:func:`steps.build_step_table`)
and the checklist walks it:

1. caliber: which names the server exposes (V1/V0) and what KV usage means there
   (block-level, cached prefix blocks counted free), the pool from ``cache_config_info``;
2. running vs waiting vs the cap (``--max-num-seqs`` if given, else inferred from a
   running plateau while requests wait), queue occupancy and time-mean queue length;
3. KV usage; 4. preemptions in the window; 5. the prefix cache's hit rate.

The window counts as stalled by the knee's own step detectors (queue-time share of
TTFT, occupancy, Little's law); the likely cause is :func:`cause.assess`, the same
signatures ``loadlab analyze`` uses, with token-level usage from the server's prompt and
generation length histograms. ``--watch`` repeats windows until Ctrl-C, a line each
(:func:`watch_line`). The command's flags are declared in :mod:`loadlab.cli.diagnose`.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from loadlab.analyze import cause as causes
from loadlab.analyze import detectors as det
from loadlab.analyze.capacity import capacity, pool_config, token_fill
from loadlab.analyze.display import cause_text
from loadlab.analyze.knee import step_states, waiting_level
from loadlab.analyze.steps import RunData, build_step_table
from loadlab.analyze.tables import read_metrics
from loadlab.analyze.windows import histogram_windows, resolve_family
from loadlab.collect import catalog
from loadlab.collect.scraper import Scraper
from loadlab.errors import InputError
from loadlab.runstore import read_manifest, read_table
from loadlab.runstore.layout import SCRAPES_TABLE
from loadlab.runstore.schema import REQUESTS, SCRAPES


def sample(url: str, duration_s: float, interval_s: float, api_key_env: str) -> RunData:
    """Scrape ``url`` for ``duration_s`` into a temporary folder; the window as a one-step run."""
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
    manifest.update(steps=[{"step": 0, "t_start": t0, "t_end": t1, "warmup_s": 0.0}],
                    metrics={**(manifest.get("metrics") or {}), "interval_s": interval_s})
    return RunData(Path(url), manifest, REQUESTS.empty_table().to_pandas(), metrics, scrapes)


def diagnose_window(run: RunData, server: dict[str, Any]) -> dict[str, Any]:
    """Checklist figures and the likely cause of one sampled window."""
    table = build_step_table(run)
    table["level"] = np.nan_to_num(table["running_mean"]) + np.nan_to_num(table["waiting_mean"])
    _server_lengths(table, run.metrics)
    votes = det.step_votes(table, True, waiting_level(table), None)
    stalled = step_states(votes, [False])[0] == "stalled"
    config = pool_config(run.metrics, run.manifest)
    table["token_fill"] = token_fill(table, config)
    v0 = catalog.engine_generation(run.metrics["family"].unique()) == "v0"
    cap = capacity(config, run.requests, v0, None)
    rows = table if stalled else table.iloc[0:0]
    cause = causes.assess(rows, table, server, config, cap,
                          causes.Verdict(stalled, False, [], True, None))
    return {"row": table.iloc[0].to_dict(), "stalled": stalled, "config": config,
            "v0": v0, "cause": cause, "votes": votes.iloc[0].to_dict()}


def checklist(url: str, result: dict[str, Any], duration_s: float, interval_s: float) -> list[str]:
    """The findings, a line per checklist item, then the likely cause."""
    r, cfg, c = result["row"], result["config"], result["cause"]
    facts = c["facts"]
    names = "V0-era names" if result["v0"] else "V1 names"
    pool = (f"{cfg.get('num_gpu_blocks')} blocks of {cfg.get('block_size')} tokens"
            if cfg.get("num_gpu_blocks") else "pool size not exposed")
    fill = r.get("token_fill")
    held = f"; tokens held fill ~{fill:.0%} of the blocks in use" if _ok(fill) else ""
    inferred = " (inferred)" if facts.get("cap_inferred") else ""
    caching = "on" if cfg.get("enable_prefix_caching") else "off or unknown"
    lines = [
        f"diagnose {url}: {duration_s:g} s of /metrics every {interval_s:g} s ({names})",
        f"  caliber   KV usage is block-level ({pool}); cached prefix blocks count as free{held}",
        (
            f"  queue     running mean {_f(r.get('running_mean'))} max {_f(r.get('running_max'))}; "
            f"waiting mean {_f(r.get('waiting_mean'))} max {_f(r.get('waiting_max'))}, "
            f"present in {_pct(r.get('waiting_occupancy'))} of samples; "
            f"cap {facts.get('cap') or 'unknown'}{inferred}"
        ),
        f"  KV        usage mean {_pct(r.get('kv_mean'))}, max {_pct(r.get('kv_max'))}",
        f"  preempt   {_f(r.get('preemptions'))} preemptions in the window",
        f"  prefix    hit rate {_pct(r.get('prefix_hit_rate'))}, caching {caching}",
    ]
    state = "requests are queueing" if result["stalled"] else "no persistent queue"
    knob = "nothing stalls at this load" if c["name"] == "none" else c["knob"]
    lines.append(f"{state}; likely cause: {cause_text(c)}; {knob}")
    return lines


def watch_line(result: dict[str, Any]) -> str:
    """One window in a line, for watching a server window after window."""
    r = result["row"]
    return (f"{time.strftime('%H:%M:%S')} running {_f(r.get('running_max'))} max, waiting "
            f"{_f(r.get('waiting_max'))} max, KV {_pct(r.get('kv_max'))} max: "
            f"{cause_text(result['cause'])}")


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
