"""Failed requests per step, by the side that failed, and what the analyzer says of them.

The load generator writes each failed request's kind into ``failure``
(:mod:`loadlab.runstore.failures`); rows written before that column existed (and
``sim replay``'s) get it inferred from their status and error text
(:func:`with_failures`). Per step (:func:`step_counts`): ``n_server_err`` and its kinds
(``server_errors``: kind -> count), ``server_err_share`` of the requests begun, and
``n_cancelled`` (in flight when the run ended: not a failure of either side).

A step whose ``server_err_share`` reaches
:data:`~loadlab.runstore.failures.SERVER_FAILURE_SHARE` measured the server's failures:
its users were out of flight because their requests failed fast, so the load
generator's in-flight shortfall there is not the client's (:func:`unblame_client`), and
the cause ``server_errors`` (:func:`server_errors`) names the kinds.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from loadlab.runstore.failures import (
    CANCELLED,
    SERVER_FAILURE_SHARE,
    SERVER_FAILURES,
    infer_failure,
)


def with_failures(requests: pd.DataFrame) -> pd.DataFrame:
    """``requests`` with ``failure`` filled in where a writer left it out (plain strings)."""
    if requests.empty:
        return requests.assign(failure=pd.Series(dtype=object))
    failure = (requests["failure"].astype(object) if "failure" in requests
               else pd.Series(None, index=requests.index, dtype=object))
    missing = failure.isna() & (requests["status"].astype(object) != "ok")
    if missing.any():
        keys = ["status", "http_status", "error"]
        known = [k for k in keys if k in requests]
        sub = requests.loc[missing, known].astype(object)
        sub = sub.where(sub.notna(), None)  # NaN != NaN: it cannot key the lookup below
        combos = sub.drop_duplicates()
        kinds = {tuple(row): infer_failure(*(dict(zip(known, row)).get(k) for k in keys))
                 for row in combos.itertuples(index=False, name=None)}
        failure = failure.copy()
        failure[missing] = [kinds[tuple(row)] for row in sub.itertuples(index=False, name=None)]
    return requests.assign(failure=failure)


def step_counts(sent: pd.DataFrame) -> dict[str, Any]:
    """The failure figures of one step's requests (module docstring)."""
    kinds = sent["failure"].value_counts() if "failure" in sent else pd.Series(dtype=int)
    server = {str(k): int(n) for k, n in kinds.items() if k in SERVER_FAILURES and n}
    n_server = sum(server.values())
    return {
        "n_server_err": n_server,
        "n_cancelled": int(kinds.get(CANCELLED, 0)),
        "server_err_share": n_server / len(sent) if len(sent) else float("nan"),
        "server_errors": server,
    }


def failing_steps(table: pd.DataFrame) -> np.ndarray:
    """Per step: did a material share of its requests fail server-side?"""
    share = table["server_err_share"].to_numpy(dtype=float) if "server_err_share" in table \
        else np.full(len(table), np.nan)
    return np.nan_to_num(share) >= SERVER_FAILURE_SHARE


def server_errors(table: pd.DataFrame) -> tuple[float, list[dict[str, Any]]]:
    """The ``server_errors`` candidate: (share of steps failing server-side, evidence: the
    share and each kind's count per failing step)."""
    failing = failing_steps(table)
    if not len(table) or not failing.any():
        return 0.0, []
    evidence: list[dict[str, Any]] = []
    for row in table[failing].itertuples(index=False):
        step = int(row.step)
        evidence.append({"what": "share of requests failed server-side",
                         "value": round(float(row.server_err_share), 4), "step": step})
        evidence += [{"what": f"server failures: {kind}", "value": n, "step": step}
                     for kind, n in sorted(row.server_errors.items())]
    return float(failing.mean()), evidence


def server_errors_knob(table: pd.DataFrame) -> str:
    """The knob of ``server_errors``, with the run's share and kinds."""
    sent = int(np.nansum(table["n_sent"].to_numpy(dtype=float)))
    kinds: dict[str, int] = {}
    for counts in table["server_errors"]:
        for kind, n in (counts or {}).items():
            kinds[kind] = kinds.get(kind, 0) + n
    failed = sum(kinds.values())
    share = f"{failed / sent:.0%}" if sent else "some"
    detail = ", ".join(f"{k} {n}" for k, n in sorted(kinds.items(), key=lambda kv: -kv[1]))
    return (f"the server failed {share} of requests ({detail}): check its log / fix the endpoint "
            "before reading latency or capacity from this run")


def unblame_client(table: pd.DataFrame, server: dict[str, Any]) -> None:
    """Clear the load generator's ``client_limited`` flag (``client_limited_manifest``) on
    steps where the server, not the client, explains the shortfall, and say why in
    ``client_limited_overruled``:

    - a material share of the step's requests failed server-side (they end in
      milliseconds, so users are out of flight between them);
    - the server was saturated: requests waiting (time-mean > 0) with running at its cap
      (``max_num_seqs`` from the manifest; without it, waiting in at least half of the
      snapshots): vLLM queues only what it cannot schedule, so the load did arrive.
    """
    cap = server.get("max_num_seqs")
    failing = failing_steps(table)
    waiting = np.fmax(_col(table, "waiting_mean"), _col(table, "waiting_little"))
    if cap:
        at_cap = _col(table, "running_max") >= float(cap)
    else:
        at_cap = _col(table, "waiting_occupancy") >= 0.5
    saturated = (np.nan_to_num(waiting) > 0) & at_cap
    reasons: list[str | None] = []
    for fail, sat, share in zip(failing, saturated, _col(table, "server_err_share")):
        reasons.append(f"{share:.0%} of requests failed server-side" if fail
                       else "the server queued requests with running at its cap" if sat else None)
    if "client_limited_manifest" not in table:
        table["client_limited_manifest"] = [None] * len(table)
    table["client_limited_overruled"] = reasons
    table["client_limited_manifest"] = [False if why else flag for why, flag
                                        in zip(reasons, table["client_limited_manifest"])]


def failure_warnings(table: pd.DataFrame) -> list[str]:
    """One line per step with requests that failed server-side, cancellations apart."""
    out = []
    for row in table.itertuples(index=False):
        kinds = getattr(row, "server_errors", None) or {}
        cancelled = int(getattr(row, "n_cancelled", 0) or 0)
        if kinds:
            detail = ", ".join(f"{k} {n}" for k, n in sorted(kinds.items(), key=lambda kv: -kv[1]))
            out.append(f"step {row.step}: {sum(kinds.values())} of {row.n_sent} requests failed "
                       f"server-side ({row.server_err_share:.0%}: {detail})"
                       + (f"; {cancelled} more cancelled at the end of the run (not failures)"
                          if cancelled else ""))
    return out


def _col(table: pd.DataFrame, name: str) -> np.ndarray:
    return table[name].to_numpy(dtype=float) if name in table else np.full(len(table), np.nan)
