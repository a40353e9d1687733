"""Streaming OpenAI client: one request in, one raw-timestamped record out.

Steps of :meth:`StreamingClient.send`:

1. POST the prepared JSON body (``stream: true``, ``stream_options.include_usage``)
   through the :class:`~loadlab.loadgen.transport.Transport` seam; the transport
   stamps ``t_sent`` just before the bytes are written.
2. Split the SSE body on blank lines as bytes arrive; every event in one socket read
   gets that read's arrival time (they did arrive together), so the events of a read
   are counted, not handled one by one, whenever they are plain content chunks
   (:mod:`loadlab.loadgen.sse`).
3. A *content* event is a completions chunk with non-empty ``choices[0].text`` or a
   chat chunk with non-empty ``choices[0].delta.content`` (the empty role chunk is
   not content). The first sets ``t_first_token``; every one adds an offset from
   ``t_sent`` to ``chunk_offsets_s``. The ``usage`` chunk gives the server's token
   counts; ``data: {"error": ...}`` mid-stream makes the record an error;
   ``data: [DONE]`` ends it.
4. Latencies (TTFT, E2E, ITL mean/p50/p99/max) are derived from the raw times by
   :class:`Timings`, ``None`` where the data is missing (GuideLLM's habit).

Status: ``ok``; ``http_error`` (non-200, or an error event; ``http_status`` keeps
what HTTP said, ``error`` the server's message); ``timeout`` (the per-request
deadline passed); ``aborted`` (cut short: the connection dropped mid-stream, or the
run cancelled it); ``client_error`` (no connection, or a response that is not an OpenAI
stream: bad JSON, an event that is not a JSON object, a chunk of the wrong shape, a 200
that is not ``text/event-stream``). ``failure`` says which side failed
(:mod:`loadlab.runstore.failures`): every kind but ``cancelled`` is the server's.
Nothing here raises for a failed request: failures are records.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from operator import sub
from typing import Any, Literal

from loadlab.loadgen.sse import (
    CHAT_MARKER,
    TEXT_MARKER,
    SseBuffer,
    content_end,
    count_content,
    event_payloads,
    quick_kind,
)
from loadlab.loadgen.transport import (
    ConnectionFailed,
    StreamClosed,
    Transport,
    TransportTimeout,
)
from loadlab.runstore.failures import CANCELLED, http_failure

# Skips json.loads' encoding sniffing and whitespace regexes: events are compact JSON text.
_decode = json.JSONDecoder().decode
PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
_ERROR_TEXT_MAX = 500


class NotOpenAIStream(ValueError):
    """The server sent an event an OpenAI stream never holds: the request's record says
    what came, the run goes on."""


@dataclass
class Timings:
    """Raw times of one request (unix seconds) and the latencies derived from them.

    ``t_issued``: the client began the request (before connecting); ``t_sent``: the
    request bytes were written (None when no connection was made).
    """

    t_issued: float | None = None
    t_sent: float | None = None
    t_first_token: float | None = None
    t_done: float | None = None
    chunk_offsets_s: list[float] = field(default_factory=list)

    def mark_sent(self, t: float) -> None:
        self.t_sent = t

    @property
    def ttft_s(self) -> float | None:
        if self.t_sent is None or self.t_first_token is None:
            return None
        return self.t_first_token - self.t_sent

    @property
    def e2e_s(self) -> float | None:
        if self.t_sent is None or self.t_done is None:
            return None
        return self.t_done - self.t_sent

    def itl_summary(self) -> dict[str, float | None]:
        """Gaps between successive content chunks: mean, p50, p99, max (None if < 2 chunks)."""
        offs = self.chunk_offsets_s
        if len(offs) < 2:
            return {"itl_mean_s": None, "itl_p50_s": None, "itl_p99_s": None, "itl_max_s": None}
        gaps = list(map(sub, offs[1:], offs[:-1]))   # C-level, no Python frame per gap
        gaps.sort()
        n = len(gaps)
        return {
            "itl_mean_s": (offs[-1] - offs[0]) / n,
            "itl_p50_s": _quantile(gaps, 0.5),
            "itl_p99_s": _quantile(gaps, 0.99),
            "itl_max_s": gaps[-1],
        }


def _quantile(sorted_values: list[float], q: float) -> float:
    """Linear-interpolated quantile of an already sorted list (numpy's default method)."""
    pos = q * (len(sorted_values) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


@dataclass
class Outcome:
    """What came back for one request, before run context (step, user...) is added."""

    timings: Timings
    status: str = "ok"
    http_status: int | None = None
    error: str | None = None
    failure: str | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None

    def fail(self, status: str, failure: str, error: str) -> None:
        self.status, self.failure, self.error = status, failure, error[:_ERROR_TEXT_MAX]

    def fields(self) -> dict[str, Any]:
        """The REQUESTS columns this outcome fills."""
        t = self.timings
        return {
            "t_issued": t.t_issued,
            "t_sent": t.t_sent,
            "t_first_token": t.t_first_token,
            "t_done": t.t_done,
            "ttft_s": t.ttft_s,
            "e2e_s": t.e2e_s,
            **t.itl_summary(),
            "n_chunks": len(t.chunk_offsets_s),
            "chunk_offsets_s": t.chunk_offsets_s,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "status": self.status,
            "http_status": self.http_status,
            "error": self.error,
            "failure": self.failure,
        }


class StreamingClient:
    """Sends prepared request bodies to one endpoint and times their streams.

    ``headers`` may carry ``Authorization``; it is sent and never stored.
    """

    def __init__(
        self,
        transport: Transport,
        api: str,
        *,
        headers: dict[str, str] | None = None,
        timeout_s: float = 600.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if api not in PATHS:
            raise ValueError(f"api must be one of {sorted(PATHS)}, got {api!r}")
        self.transport = transport
        self.api = api
        self.path = PATHS[api]
        self.timeout_s = timeout_s
        self.clock = clock
        self.last: Outcome | None = None
        self.headers = {
            "Content-Type": "application/json",
            "Accept": "text/event-stream",
            **(headers or {}),
        }

    def send(self, body: bytes, headers: dict[str, str] | None = None) -> Outcome:
        """Send one request and return its outcome; never raises for request failures.

        A cancellation arriving mid-request (``GreenletExit``, ``KeyboardInterrupt``)
        marks :attr:`last` as ``aborted`` and propagates; the caller records ``last``.
        """
        timings = Timings(t_issued=self.clock())
        outcome = Outcome(timings=timings)
        self.last = outcome
        deadline = time.monotonic() + self.timeout_s
        response = None
        try:
            all_headers = {**self.headers, **headers} if headers else self.headers
            response = self.transport.open("POST", self.path, all_headers, body, deadline,
                                           on_sent=timings.mark_sent)
            timings.t_sent = response.sent_at
            outcome.http_status = response.status
            kind = response.headers.get("content-type")
            if response.status != 200:
                outcome.fail("http_error", http_failure(response.status),
                             _error_text(response.read_all()))
            elif kind is not None and not kind.startswith("text/event-stream"):
                outcome.fail("client_error", "not_event_stream",
                             f"HTTP 200 {kind} is not an event stream: "
                             f"{_error_text(response.read_all())}")
            else:
                self._consume(response, outcome)
        except TransportTimeout as exc:
            outcome.fail("timeout", "timeout", f"timeout after {self.timeout_s:g} s ({exc})")
        except ConnectionFailed as exc:
            outcome.fail("client_error", "reset", str(exc))
        except StreamClosed as exc:
            outcome.fail("aborted" if outcome.http_status else "client_error", "reset", str(exc))
        except NotOpenAIStream as exc:
            outcome.fail("client_error", "bad_stream", f"not an OpenAI stream: {exc}")
        except (ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
            # AttributeError: a chunk whose parts have the wrong JSON type ("choices": ["x"])
            outcome.fail("client_error", "bad_stream", f"unparseable response: {exc!r}")
        except BaseException as exc:
            outcome.fail("aborted", CANCELLED, f"cancelled by the run ({type(exc).__name__})")
            raise
        finally:
            if response is not None:
                response.close()
            if timings.t_done is None:
                timings.t_done = self.clock()
        return outcome

    def _consume(self, response: Any, outcome: Outcome) -> None:
        timings = outcome.timings
        assert timings.t_sent is not None  # send() stamps it before any body is read
        chat = self.api == "chat"
        marker = CHAT_MARKER if chat else TEXT_MARKER
        offsets = timings.chunk_offsets_s
        clock = self.clock
        sse = SseBuffer()
        for piece in response.body:
            now = clock()
            events = sse.feed(piece)
            if not events:
                continue
            cut = content_end(events, marker)
            n = count_content(events, marker, cut) if cut else None
            if n is None:
                cut = 0   # walk every event of the read
            elif n:
                if timings.t_first_token is None:
                    timings.t_first_token = now
                offsets += [now - timings.t_sent] * n
            if cut < len(events):   # usage, [DONE], an error, or a shape the count cannot vouch for
                state = self._events(events[cut:] if cut else events, marker, chat, now, outcome)
                if state == "stop":
                    return
                if state == "done":
                    for (
                        _
                    ) in response.body:  # read the chunked terminator: keeps the connection alive
                        pass
                    return
        if outcome.status == "ok":
            outcome.fail("aborted", "truncated", "stream ended without [DONE]")

    def _events(self, events: bytes, marker: bytes, chat: bool, now: float,
                outcome: Outcome) -> Literal["more", "done", "stop"]:
        """Apply complete events one by one, up to ``[DONE]`` ("done") or an error event
        ("stop")."""
        timings = outcome.timings
        assert timings.t_sent is not None  # send() stamps it before any body is read
        for data in event_payloads(events):
            if data == b"[DONE]":
                timings.t_done = now
                return "done"
            kind = quick_kind(data, marker)
            if kind is not None:  # compact content or empty chunk: no JSON parse needed
                if kind:
                    if timings.t_first_token is None:
                        timings.t_first_token = now
                    timings.chunk_offsets_s.append(now - timings.t_sent)
                continue
            if not self._handle(_decode(data.decode()), chat, now, timings, outcome):
                return "stop"
        return "more"

    def _handle(
        self, obj: Any, chat: bool, now: float, timings: Timings, outcome: Outcome
    ) -> bool:
        """Apply one SSE JSON event; False stops reading (an error event)."""
        assert timings.t_sent is not None  # send() stamps it before any body is read
        if type(obj) is not dict:
            raise NotOpenAIStream(f"an event that is not a JSON object: {type(obj).__name__}")
        if "error" in obj:
            outcome.fail("http_error", "error_event", _message_of(obj))
            return False
        choices = obj.get("choices")
        if choices:
            choice = choices[0]
            text = (choice.get("delta") or {}).get("content") if chat else choice.get("text")
            if text:
                if timings.t_first_token is None:
                    timings.t_first_token = now
                timings.chunk_offsets_s.append(now - timings.t_sent)
        usage = obj.get("usage")
        if usage:
            outcome.prompt_tokens = usage.get("prompt_tokens")
            outcome.output_tokens = usage.get("completion_tokens")
        return True


def _message_of(obj: dict) -> str:
    err = obj.get("error")
    if isinstance(err, dict):
        text = err.get("message") or json.dumps(err)
    else:
        text = str(err)
    return text[:_ERROR_TEXT_MAX]


def _error_text(body: bytes) -> str:
    try:
        return _message_of(json.loads(body))
    except (ValueError, AttributeError):
        return body[:_ERROR_TEXT_MAX].decode("utf-8", "replace")
