"""Why a request failed, as the request row's ``failure`` column says it.

``status`` says *that* a request failed; ``failure`` says on which side. A load
generator must never blame itself for what the server did: a server answering
``200 text/html`` or closing its streams early ends every request in a few
milliseconds, its users spend most of their time between requests, and the in-flight
count then reads like a starved client. The kinds:

- server side (:data:`SERVER_FAILURES`): ``http_4xx`` / ``http_5xx`` (the HTTP status
  class; 429 and vLLM's 400 for a too-long prompt are the server's answer too),
  ``error_event`` (``data: {"error": ...}`` in a 200 stream), ``not_event_stream`` (a
  response that is not ``text/event-stream``: a proxy's HTML page, a redirect),
  ``bad_stream`` (events that are not OpenAI chunks), ``truncated`` (the stream ended
  cleanly without ``data: [DONE]``), ``reset`` (connection refused, reset or closed
  mid-response), ``timeout`` (the per-request deadline passed);
- client side: ``cancelled`` (the run ended or was interrupted with the request in
  flight: no fault of the server's).

:data:`SERVER_FAILURE_SHARE` is the one threshold both the load generator (whose
in-flight shortfall is then the server's doing, not the client's) and the analyzer
(cause ``server_errors``) use.
"""

from __future__ import annotations

SERVER_FAILURES = ("http_4xx", "http_5xx", "error_event", "not_event_stream", "bad_stream",
                   "truncated", "reset", "timeout")
CANCELLED = "cancelled"
FAILURE_KINDS = (*SERVER_FAILURES, CANCELLED)

# A step whose requests failed server-side at least this often measured the server's
# failures, not its capacity. A healthy vLLM fails none below its queue limits, and one
# request in ten is far above the odd client timeout at the top of a sweep.
SERVER_FAILURE_SHARE = 0.1


def http_failure(status: int) -> str:
    """The kind of a non-200 answer: its status class (anything else is not a stream)."""
    if status >= 500:
        return "http_5xx"
    if status >= 400:
        return "http_4xx"
    return "not_event_stream"


def infer_failure(status: str | None, http_status: float | None, error: str | None) -> str | None:
    """The kind of a row written without a ``failure`` (older folders, ``sim replay``),
    from its status and error text as those writers phrased them; None for ``ok``."""
    text = error if isinstance(error, str) else ""  # a missing value reads as NaN
    if status in (None, "ok"):
        return None
    if status == "timeout":
        return "timeout"
    if status == "aborted":
        if "cancelled" in text or "end of plan" in text:
            return CANCELLED
        return "truncated" if "[DONE]" in text else "reset"
    if status == "http_error":
        code = int(http_status) if http_status is not None and http_status == http_status else 200
        return "error_event" if code == 200 else http_failure(code)
    if "cannot connect" in text or "connection" in text or "send failed" in text:
        return "reset"
    return "bad_stream"
