"""From sequence number to request body: the workload side of the load generator.

Request ``seq`` is a pure function of (workload, seed, seq): the spec comes from
``RequestSampler.spec(seq)`` (a profile) or trace row ``seq`` (a replay), the prompt
from :class:`loadlab.workload.prompts.PromptSynth`, the id from (seed, seq). So seq
``i`` is the same request at every sweep point, in every run with that seed and on
whichever worker sends it (workers take disjoint strides of the seq space:
``seq = worker_index + n_workers * k``).

Bodies always carry ``stream``, ``stream_options.include_usage``, ``max_tokens`` =
``min_tokens`` = the target output length and ``ignore_eos``, so output lengths are
controlled. With the server's ``max_model_len`` known, specs pass through
:class:`loadlab.workload.fit.ContextFit` first, so no body exceeds the context (a 400).
Prompt text is calibrated through the server's ``POST /tokenize`` when it has one
(``calibrate=True``); target and server-reported counts both land in the record. When
/tokenize is missing at start, or fails for a prompt mid-run (one of ``CALIBRATION_ERRORS``:
the server restarting, overloaded, answering without a count), prompts are sized by estimate
instead and :class:`Calibration` says so and why; the run's manifest carries it
(``workload.calibrated``, ``workload.calibration_reason``). :class:`Prefetcher` builds
requests ahead of use in a background greenlet so a closed-loop user never pauses between
requests to count tokens.
"""

from __future__ import annotations

import json
import ssl
import time
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from loadlab.errors import TargetError
from loadlab.loadgen.transport import (
    ConnectionFailed,
    ProtocolError,
    SocketTransport,
    StreamClosed,
    TransportTimeout,
)
from loadlab.workload import RequestSpec, load_profile
from loadlab.workload.fit import ContextFit, Fitted, budget
from loadlab.workload.prompts import PromptSynth
from loadlab.workload.traces import read_trace

# What counting a prompt through /tokenize can raise: the transport's failures, and
# TargetError when the server stops answering with a count.
_TRANSPORT_ERRORS = (ConnectionFailed, TransportTimeout, StreamClosed, ProtocolError)
CALIBRATION_ERRORS = (*_TRANSPORT_ERRORS, TargetError)


def request_id(seed: int, seq: int) -> str:
    """Deterministic id of request ``seq`` in the run seeded ``seed``."""
    return f"ll-{seed}-{seq}"


@dataclass(frozen=True)
class Prepared:
    seq: int
    request_id: str
    spec: RequestSpec
    body: bytes
    fitted: str | None = None   # how the spec was made to fit the context, if it was


@dataclass
class Calibration:
    """How one process sized its prompts (JSON-safe; workers report it to the master)."""

    requested: bool
    available: bool = False          # /tokenize answered with a count at start
    reason: str | None = None        # why prompts are (partly) estimated, when they are
    uncalibrated: int = 0            # prompts estimated after /tokenize failed mid-run

    @property
    def calibrated(self) -> bool:
        return self.requested and self.available and self.uncalibrated == 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def merge_calibrations(reports: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The manifest's workload keys from every process's :class:`Calibration` (empty if none)."""
    parts = [Calibration(**r) for r in reports]
    if not parts:
        return {}
    reasons = [p.reason for p in parts if not p.calibrated and p.reason]
    return {"calibrated": all(p.calibrated for p in parts),
            "calibration_reason": reasons[0] if reasons else None,
            "uncalibrated_prompts": sum(p.uncalibrated for p in parts)}


class SocketTokenCounter:
    """A ``TokenCounter`` over the load generator's own transport.

    Same request shape as :mod:`loadlab.workload.tokenize` (vLLM's ``/tokenize``), but
    without httpx, which a Locust worker cannot import (the import-order rule:
    :mod:`loadlab.experiment.point`); one lean socket path is enough.
    """

    def __init__(self, base_url: str, model: str, chat: bool, headers: Mapping[str, str],
                 timeout_s: float = 30.0, tls: ssl.SSLContext | None = None) -> None:
        self.transport = SocketTransport(base_url, tls=tls)
        self.model = model
        self.chat = chat
        self.headers = {"Content-Type": "application/json", **headers}
        self.timeout_s = timeout_s
        self.problem: str | None = None  # why the last count() returned None

    def count(self, text: str) -> int | None:
        """Server count, or None (``problem`` says why) when the server has no usable /tokenize."""
        if self.chat:
            payload: dict[str, Any] = {
                "model": self.model,
                "messages": [{"role": "user", "content": text}],
            }
        else:
            payload = {"model": self.model, "prompt": text}
        deadline = time.monotonic() + self.timeout_s
        resp = self.transport.open(
            "POST", "/tokenize", self.headers, json.dumps(payload).encode(), deadline
        )
        body = resp.read_all()
        if resp.status != 200:
            self.problem = f"HTTP {resp.status}: {body[:200].decode(errors='replace')}"
            return None
        try:
            return int(json.loads(body)["count"])
        except (ValueError, KeyError, TypeError):
            self.problem = f"no count in the answer: {body[:200].decode(errors='replace')}"
            return None

    def __call__(self, text: str) -> int:
        n = self.count(text)
        if n is None:
            raise TargetError(
                f"the server's /tokenize stopped answering with a count ({self.problem})"
            )
        return n


class TraceSpecs:
    """Trace rows as RequestSpecs in time order, arrival offsets scaled by ``time_scale``."""

    def __init__(self, path: str, time_scale: float) -> None:
        trace = read_trace(path)
        times = trace.timestamps_s
        order = (
            range(len(trace))
            if times is None
            else sorted(range(len(trace)), key=lambda i: times[i])
        )
        self.specs = [
            RequestSpec(seq, int(trace.input_tokens[i]), int(trace.output_tokens[i]), None, 0,
                        None if times is None else float(times[i]) * time_scale)
            for seq, i in enumerate(order)
        ]

    def spec(self, seq: int) -> RequestSpec:
        return self.specs[seq]


class RequestFactory:
    """Builds the request for a sequence number, identically in every process."""

    def __init__(self, *, api: str, model: str, seed: int, base_url: str, profile: str | None,
                 trace: str | None = None, time_scale: float = 1.0, nonce: str = "",
                 calibrate: bool = True, headers: Mapping[str, str] | None = None,
                 max_model_len: int | None = None, tls: ssl.SSLContext | None = None) -> None:
        self.api = api
        self.model = model
        self.seed = seed
        common = 0
        prof = None
        if trace is not None:
            self.specs: Any = TraceSpecs(trace, time_scale)
        else:
            prof = load_profile(profile or "")
            self.specs = prof.sampler(seed)
            common = prof.common_prefix_tokens
        counter = None
        self.calibration = Calibration(requested=calibrate)
        if calibrate:
            counter = SocketTokenCounter(base_url, model, api == "chat", headers or {}, tls=tls)
            try:
                probe = counter.count("the")
            except _TRANSPORT_ERRORS as exc:
                raise TargetError(f"cannot reach {base_url}/tokenize to calibrate prompts: {exc}",
                                  ) from None
            if probe is None:  # no /tokenize: estimate, and say so in the manifest
                self.calibration.reason = (
                    f"{base_url}/tokenize unusable ({counter.problem}): prompts estimated"
                )
                counter = None
            else:
                self.calibration.available = True
        else:
            self.calibration.reason = "calibration off (--no-calibrate): prompts estimated"
        # Lengths fitted to the server's context window (loadlab.workload.fit), when known.
        self.fit = (
            ContextFit(self.specs, budget(max_model_len, self.calibration.available), prof, seed)
            if max_model_len
            else None
        )
        self.synth = PromptSynth(seed, common_prefix_tokens=common, counter=counter, nonce=nonce)
        # Same text generator without the counter: used when /tokenize fails mid-run
        # (server restarting, overloaded), so the run keeps sending; usage records the truth.
        self.plain = PromptSynth(seed, common_prefix_tokens=common, nonce=nonce)

    @property
    def total(self) -> int | None:
        """Number of requests in a trace; None for a profile (endless)."""
        return len(self.specs.specs) if isinstance(self.specs, TraceSpecs) else None

    def prepare(self, seq: int) -> Prepared:
        fitted = self.fit.fitted(seq) if self.fit is not None else Fitted(self.specs.spec(seq))
        spec = fitted.spec
        try:
            prompt = self.synth.prompt(spec)
        except CALIBRATION_ERRORS as exc:  # fall back for this prompt, never stop the run
            prompt = self.plain.prompt(spec)
            cal = self.calibration
            cal.uncalibrated += 1
            if cal.reason is None:
                cal.reason = (
                    f"/tokenize failed mid-run ({type(exc).__name__}: {exc}): "
                    "some prompts estimated"
                )
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": spec.output_tokens,
            "min_tokens": spec.output_tokens,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self.api == "chat":
            body["messages"] = prompt.messages()
        else:
            body["prompt"] = prompt.text
        return Prepared(
            seq, request_id(self.seed, seq), spec, json.dumps(body).encode(), fitted.how
        )


class Prefetcher:
    """Prepares this worker's requests in seq order, ``depth`` ahead of their use.

    ``seqs`` is the worker's ordered stride of the seq space (finite for a trace).
    ``take()`` blocks (cooperatively) only when the prefetch greenlet falls behind.
    """

    def __init__(self, factory: RequestFactory, seqs: Any, depth: int = 64) -> None:
        import gevent
        from gevent.event import Event

        self.factory = factory
        self._seqs = iter(seqs)
        self._ready: deque[Prepared] = deque()
        self._space = Event()
        self._filled = Event()
        self.depth = depth
        self.exhausted = False
        self._greenlet = gevent.spawn(self._fill)

    def _fill(self) -> None:
        for seq in self._seqs:
            while len(self._ready) >= self.depth:
                self._space.clear()
                self._space.wait()
            self._ready.append(self.factory.prepare(seq))
            self._filled.set()
        self.exhausted = True
        self._filled.set()

    def take(self) -> Prepared | None:
        """The next request, or None when the seq space (a trace) is used up."""
        while not self._ready:
            if self.exhausted:
                return None
            self._filled.clear()
            self._filled.wait()
        item = self._ready.popleft()
        self._space.set()
        return item

    def stop(self) -> None:
        self._greenlet.kill(block=False)
