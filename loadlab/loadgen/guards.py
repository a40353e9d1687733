"""Stop conditions: when going on would only measure a broken target.

A run against a target that is gone, or that refuses every request, measures
nothing; worse, it hammers the target (a closed-loop user whose requests fail in a
millisecond sends about a thousand a second) and used to end "complete". Each
load-generator process watches its own rows with a :class:`FailureWatch`; the first
rule to trip stops that process's sending and tells the master, which stops the run
with status ``failed`` and the reason as ``stop_reason`` (everything measured so far
is kept; ``loadlab run`` exits 1).

Rules (per process, over rows in the order they finish):

- **No connection.** Every attempt for ``CONNECT_FAIL_S`` (5 s) and at least
  ``CONNECT_FAIL_MIN`` (10) attempts in a row got no HTTP response at all (refused,
  reset, unreachable, connect timeout). A server restarting in under 5 s does not
  stop the run; a dead one does. (A server that ``loadlab run --launch`` started is
  watched more directly: its process exit stops the run at once, see the driver.)
- **Every request refused.** ``REJECT_STREAK`` (20) requests in a row answered with an
  error (HTTP status >= 400, or an error event in the stream), none ok in between.
  The reason names the likely fix: 401/403 the API key, 404 the URL or model name.

Timeouts and streams cut short count for neither rule and reset neither: a slow,
overloaded server is a measurement, not a broken target. An ``ok`` row resets both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

CONNECT_FAIL_S = 5.0
CONNECT_FAIL_MIN = 10
REJECT_STREAK = 20


def _no_response(row: dict[str, Any]) -> bool:
    """The request got no HTTP response at all (never connected, or dropped before headers)."""
    status = row["status"]
    if status == "aborted":
        return False
    return row["t_sent"] is None or (status == "client_error" and row["http_status"] is None)


def brief(error: str | None, limit: int = 120) -> str:
    """A server's error text fit for one line: an HTML page is named, not printed."""
    if not error:
        return ""
    text = " ".join(error.split())
    if text.lstrip().startswith("<"):
        return "an HTML page"
    return text if len(text) <= limit else text[:limit - 3] + "..."


def rejection_reason(
    http_status: int | None, error: str | None, count: int, api_key_env: str
) -> str:
    """One line naming what the target answered and what to check."""
    said = f" ({brief(error)})" if error else ""
    if http_status in (401, 403):
        return f"{http_status} from the target{said}: check {api_key_env} (or --api-key-env)"
    if http_status == 404:
        return (f"404 from the target{said}: check --target (the server's base URL, without /v1) "
                f"and --model")
    what = f"HTTP {http_status}" if http_status and http_status != 200 else "an error event"
    return f"{count} requests in a row failed, the last with {what}{said}"


@dataclass
class FailureWatch:
    """Feeds on finished rows; :meth:`observe` returns a stop reason once a rule trips."""

    api_key_env: str = "LOADLAB_API_KEY"
    _no_conn: int = 0
    _no_conn_since: float | None = None
    _rejected: int = 0

    def observe(self, row: dict[str, Any]) -> str | None:
        status = row["status"]
        if status == "ok":
            self._no_conn, self._no_conn_since, self._rejected = 0, None, 0
            return None
        if _no_response(row):
            if self._no_conn_since is None:
                self._no_conn_since = row["t_issued"]
            self._no_conn += 1
            span = row["t_done"] - self._no_conn_since
            if self._no_conn >= CONNECT_FAIL_MIN and span >= CONNECT_FAIL_S:
                return (
                    f"no connection to the target for {span:.0f} s "
                    f"({self._no_conn} attempts in a row; "
                    f"last: {brief(row['error'])})"
                )
            return None
        if status == "http_error":
            self._no_conn, self._no_conn_since = 0, None
            self._rejected += 1
            if self._rejected >= REJECT_STREAK:
                return rejection_reason(
                    row["http_status"], row["error"], self._rejected, self.api_key_env
                )
        return None
