"""Text for a terminal: the per-step table, the one-line verdict and its details.

Everything here reads the analysis (the ``analysis.json`` dict, or a step table
DataFrame for the table alone) and computes nothing new, so the console and the HTML
report show the same words.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import pandas as pd

COLUMNS = [  # (column, header, format)
    ("step", "step", "{:.0f}"),
    ("concurrency", "users", "{:.0f}"),
    ("target_rate", "rate", "{:.1f}"),
    ("state", "state", "{}"),
    ("n_ok", "ok", "{:.0f}"),
    ("n_err", "err", "{:.0f}"),
    ("n_server_err", "srv err", "{:.0f}"),
    ("n_cancelled", "cancelled", "{:.0f}"),
    ("out_tok_s", "out tok/s", "{:.0f}"),
    ("ttft_p50_ms", "TTFT p50 ms", "{:.0f}"),
    ("ttft_p99_ms", "TTFT p99 ms", "{:.0f}"),
    ("itl_p50_ms", "ITL p50 ms", "{:.1f}"),
    ("burst_share", "bursts", "{:.2f}"),
    ("queue_share", "queue/TTFT", "{:.2f}"),
    ("running_mean", "running", "{:.1f}"),
    ("running_max", "run max", "{:.0f}"),
    ("running_itl", "run (ITL)", "{:.1f}"),
    ("gauge_stale", "stale 0s", "{:.2f}"),
    ("inflight", "in flight", "{:.1f}"),
    ("achieved_ratio", "achieved", "{:.0%}"),
    ("waiting_mean", "waiting", "{:.1f}"),
    ("waiting_little", "wait (Q)", "{:.1f}"),
    ("waiting_max", "wait max", "{:.0f}"),
    ("waiting_occupancy", "P(wait)", "{:.2f}"),
    ("kv_mean", "KV use", "{:.2f}"),
    ("kv_max", "KV max", "{:.2f}"),
    ("preemptions", "preempt", "{:.0f}"),
    ("prefix_hit_rate", "prefix hit", "{:.2f}"),
    ("client_cpu_cores", "client cpu", "{:.2f}"),
    ("goodput_rps", "goodput/s", "{:.2f}"),
]
UNITS = {"concurrency": "concurrent", "rate": "requests/s"}


def format_step_table(steps: pd.DataFrame | Iterable[dict[str, Any]]) -> str:
    """Plain-text table for a terminal; columns with no data at all are left out."""
    table = steps if isinstance(steps, pd.DataFrame) else pd.DataFrame(list(steps))
    cols = [c for c in COLUMNS if c[0] in table and table[c[0]].notna().any()]
    cells = [[h for _, h, _ in cols]]
    for row in table.to_dict("records"):
        cells.append([_fmt(row.get(c), f) for c, _, f in cols])
    widths = [max(len(r[i]) for r in cells) for i in range(len(cols))]
    return "\n".join("  ".join(v.rjust(w) for v, w in zip(r, widths)) for r in cells)


def verdict_line(analysis: dict[str, Any]) -> str:
    """One line: where the knee is, how sure, the cause with its numbers, and the knob."""
    knee, cause = analysis["knee"], analysis["cause"]
    return f"{knee_where(knee, cause)}; cause: {cause_text(cause)}; {cause['knob']}"


def knee_where(knee: dict[str, Any], cause: dict[str, Any]) -> str:
    """Where the knee is, with its confidence, in words."""
    unit = UNITS.get(str(knee.get("unit")), "")
    conf = knee.get("confidence")
    if cause.get("name") == "client_limited" and not knee["found"]:
        where = "no knee: the load generator could not apply the load"
        return where + (
            f" (judged up to {_n(knee['lower'])} {unit})" if knee.get("lower") is not None else ""
        )
    if not knee["found"]:
        return (f"never stalled up to {_n(knee['lower'])} {unit} ({conf})"
                if knee.get("lower") is not None else "no load step could be judged")
    if knee.get("lower") is None:
        return f"stalled at the first step, {_n(knee['upper'])} {unit} ({conf})"
    return f"knee between {_n(knee['lower'])} and {_n(knee['upper'])} {unit} ({conf})"


def replica_lines(analysis: dict[str, Any]) -> list[str]:
    """One line per replica of a fleet: its endpoint (and pool), its knee and cause at the
    fleet's load, the measured ones where the scheduler exported them, and its share of the
    queue stranded while another replica had room; [] for one server."""
    lines = []
    for r in analysis.get("replicas") or []:
        knee, cause = r["knee"], r.get("cause") or {}
        pool = f" (pool {r['pool']})" if r.get("pool") else ""
        share = r.get("imbalance_share")
        stranded = ("no queue stranded" if share is None
                    else f"{share:.0%} of the fleet's stranded queue")
        mk, mc = knee.get("measured"), cause.get("measured")
        measured = (f"; measured knee {_span(mk)}, cause {mc['name']}"
                    if mk is not None and mc is not None else "")
        lines.append(f"replica {r['endpoint']}{pool}: {knee_where(knee, cause)}, cause "
                     f"{cause.get('name')}{measured}; imbalance: {stranded}")
    return lines


def cause_text(cause: dict[str, Any]) -> str:
    """The cause's name in words with the figures that show it."""
    f = cause.get("facts") or {}
    name = cause["name"]
    cap, kv = f.get("cap"), f.get("kv_max")
    kv_txt = f"{kv:.1%}" if kv is not None else "?"
    if name == "seq_cap":
        flag = "the inferred max_num_seqs" if f.get("cap_inferred") else "--max-num-seqs"
        excess = f.get("waiting_excess")
        wait = (f"waiting = c - {cap}" if excess is not None and abs(excess) <= 1
                else f"waiting near c - {cap} (mean gap {excess:+.1f})" if excess is not None
                else "requests waiting")
        return (f"sequence cap — running held at {cap} = {flag} while KV usage stayed "
                f"<= {kv_txt} and {wait}")
    if name == "kv_exhausted":
        return (f"KV cache exhausted — usage reached {kv_txt} with running at most "
                f"{_n(f.get('running_max'))} and {_n(f.get('preemptions'))} preemptions")
    if name == "dashboard_caliber":
        fill = f.get("token_fill")
        return (f"dashboard caliber — the block-level KV pool is full ({kv_txt}) while the tokens "
                f"held fill only {fill:.0%} of it" if fill is not None else
                f"dashboard caliber — block-level KV usage {kv_txt}")
    if name == "token_budget":
        budget = f.get("budget")
        tps = f.get("tokens_per_step")
        against = f" of --max-num-batched-tokens {budget}" if budget else ""
        return (f"token budget — {_n(tps, 0)} tokens per engine step{against}, running below the "
                f"cap, KV at most {kv_txt}")
    if name == "head_blocked":
        need, free, mean = f.get("head_blocks_needed"), f.get("free_blocks"), f.get("kv_mean")
        sizes = (f" ({_n(need, 0)} blocks for a {_n(f.get('prompt_max'), 0)}-token prompt, "
                 f"~{_n(free, 0)} free)" if need is not None and free is not None else "")
        usage = f"KV usage mean {mean:.0%}, max {kv_txt}" if mean is not None else f"KV {kv_txt}"
        return (f"head blocked — the long prompt at the head of the queue needs more free "
                f"blocks than exist{sizes}, blocking everyone behind it while {usage}")
    if name == "undetermined":
        return ("undetermined — /metrics fit " + " or ".join(cause.get("candidates") or [])
                + f" (KV at most {kv_txt}, running at most {_n(f.get('running_max'))})")
    return {
        "frontend_starved": (
            "front end starved — vLLM's own TTFT is fine, the client's is not, "
            "streams arrive whole"
        ),
        "routing_imbalance": (
            f"routing imbalance — a replica queued while another had room in "
            f"{f.get('imbalanced_share') or 0:.0%} of the stalled steps (mean share of the "
            f"queue stranded {f.get('imbalance') or 0:.0%})"
        ),
        "client_limited": "client limited — the load generator, not the server, fell short",
        "server_errors": "server errors — the server failed a material share of the requests",
        "none": "none",
        "unknown": "unknown — no stall signature matched (or no server metrics)",
    }.get(name, name)


def measured_line(analysis: dict[str, Any]) -> str | None:
    """The verdict measured from the scheduler's own refusals, and whether the inferred one
    agrees; None where the server exported no refusals."""
    knee, cause = analysis["knee"], analysis["cause"]
    mk, mc = knee.get("measured"), cause.get("measured")
    if mk is None or mc is None:
        return None
    unit = UNITS.get(knee.get("unit"), "")
    where = (f"knee between {_n(mk['lower'])} and {_n(mk['upper'])} {unit}" if mk["found"]
             else f"never stalled up to {_n(mk['lower'])} {unit}")
    shares = mc.get("reason_share") or {}
    why = f"cause {mc['name']}" + (
        f" ({mc['reason']} in {shares.get(mc['reason'], 0):.0%} of refused steps)"
        if mc.get("reason") else "")
    off = []
    if (knee["found"], knee.get("upper")) != (mk["found"], mk.get("upper")):
        off.append(f"knee inferred {_span(knee)}, measured {_span(mk)}")
    settles = mc["name"] in (cause.get("candidates") or [])
    if cause.get("name") != mc["name"] and not settles:
        off.append(f"cause inferred {cause.get('name')}, measured {mc['name']}")
    settled = "it settles the inferred " + " or ".join(cause["candidates"]) if settles else ""
    verdict = ("DISAGREES with the inferred verdict: " + "; ".join(off) if off
               else settled or "agrees with the inferred verdict")
    if off and settled:
        verdict += f"; {settled}"
    return f"measured (the scheduler's own refusals): {where}, {why} — {verdict}"


def _span(knee: dict[str, Any]) -> str:
    return f"({_n(knee.get('lower'))}, {_n(knee.get('upper'))}]" if knee["found"] else "none"


def format_details(analysis: dict[str, Any]) -> str:
    """The measured verdict, a fleet's replicas, confidence reasons, ranked causes,
    capacity, SLOs and warnings, a line each."""
    knee, cause, cap = analysis["knee"], analysis["cause"], analysis["capacity"]
    measured = measured_line(analysis)
    lines = [measured] if measured else []
    lines += replica_lines(analysis)
    lines.append(f"confidence {knee['confidence']}: " + "; ".join(knee.get("reasons") or []))
    lines.append(
        "causes ranked: " + ", ".join(f"{c['name']} {c['score']:.2f}" for c in cause["ranked"])
    )
    if cap.get("formula_max_concurrency") is not None:
        lo, hi = cap["practical_range"]
        lines.append(
            f"capacity: {cap['usable_blocks']:.0f} usable blocks / {cap['blocks_per_request']:.1f} "
            f"per request = {cap['formula_max_concurrency']:.0f} concurrent "
            f"(practice {lo:.0f}-{hi:.0f})"
            + (
                f"; vLLM's kv_cache_max_concurrency {cap['vllm_kv_cache_max_concurrency']:g}"
                if cap.get("vllm_kv_cache_max_concurrency") is not None
                else ""
            )
            + (
                f"; measured knee {_n(cap['measured_knee'])}"
                if cap.get("measured_knee") is not None
                else ""
            )
        )
    slo = analysis.get("slo") or {}
    if slo.get("targets"):
        targets = ", ".join(f"{k}={v:g}" for k, v in slo["targets"].items())
        lines.append(
            f"SLO {targets}: highest level meeting them {_n(slo.get('max_level_meeting'))}"
        )
    lines += [f"warning: {w}" for w in analysis.get("warnings") or []]
    return "\n".join(lines)


def _n(v: Any, digits: int = 2) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "?"
    f = float(v)
    return str(int(f)) if f.is_integer() else f"{f:.{digits}f}"


def _fmt(value: Any, fmt: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if fmt == "{}":
        return str(value)
    return fmt.format(float(value))
