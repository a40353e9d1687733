"""Count why vLLM's V1 scheduler keeps the head of its waiting queue waiting, step by step.

Loaded INTO a vLLM server, not into loadlab: put this file's folder on the server's
PYTHONPATH (``loadlab probe path`` prints it) and start ``vllm serve ... --scheduler-cls
loadlab_probe.ProbeScheduler``. It imports only vLLM and the standard library for that
reason. With ``LOADLAB_PROBE_PORT`` set, the engine-core process serves the ``loadlab:``
series in Prometheus text format on that port (``/metrics``); without it the counters are
still kept (tools/vllm_sched_trace.py reads them in-process). With data parallelism every
engine core runs its own scheduler and inherits the same variable, so each serves on the
port plus its data-parallel rank (engine 0 on the port itself); a port it cannot bind is
logged and the engine runs on, counting, rather than failing the server for a probe.

It only counts: ``schedule()`` and ``KVCacheManager.allocate_slots`` are wrapped, their
arguments and results passed through untouched, so the steps scheduled are the ones vLLM's
own class would schedule.

Which base class: vLLM's ``SchedulerConfig.get_scheduler_cls`` (vllm/config/scheduler.py)
returns ``AsyncScheduler`` when async scheduling is on and no class is named, but a named
class is used as is while the engine core keeps scheduling asynchronously; a subclass of
the plain ``Scheduler`` would then run without ``AsyncScheduler``'s output placeholders.
So ``ProbeScheduler`` picks, when it is instantiated, the class vLLM would have used
itself: :class:`AsyncProbeScheduler` when ``scheduler_config.async_scheduling`` is true.

A refused step is one at whose end the waiting queue is not empty. Its reason is the limit
that ended the waiting loop of ``Scheduler.schedule`` (vllm/v1/core/sched/scheduler.py),
in the order that loop checks them: ``preempted`` (a running request was preempted, so the
loop never ran), ``token_budget`` (the budget is spent, or chunked prefill is off and the
head's prompt is bigger than what is left), ``seq_cap`` (``max_num_seqs`` running),
``kv_blocks`` (``allocate_slots`` returned None for the head), ``other`` (paused, LoRA,
remote KV, skipped heads...).
"""

from __future__ import annotations

import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from vllm.logger import init_logger
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import RequestStatus

REASONS = ("preempted", "token_budget", "seq_cap", "kv_blocks", "other")
PORT_ENV = "LOADLAB_PROBE_PORT"
_WAITING = (RequestStatus.WAITING, RequestStatus.PREEMPTED)
logger = init_logger(__name__)


class Refusal:
    """What held the head back in one step: the reason and the gauges' values."""

    __slots__ = ("reason", "blocks_needed", "free_blocks", "running")

    def __init__(self, reason: str, blocks_needed: int, free_blocks: int, running: int):
        self.reason = reason
        self.blocks_needed = blocks_needed
        self.free_blocks = free_blocks
        self.running = running

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}


class Counters:
    """The probe's series; written by the scheduler thread, read by the HTTP thread (plain
    int stores, so a scrape sees each value whole; a step may land between two values)."""

    def __init__(self, labels: dict[str, str]) -> None:
        self.labels = labels
        self.steps = 0
        self.refused = dict.fromkeys(REASONS, 0)
        self.last: Refusal | None = None

    def record(self, refusal: Refusal | None) -> None:
        self.steps += 1
        if refusal is not None:
            self.refused[refusal.reason] += 1
            self.last = refusal

    def exposition(self) -> str:
        """Prometheus text format 0.0.4 as prometheus_client writes vLLM's (a counter's
        HELP, TYPE and samples named with ``_total``), with the labels vLLM's series carry."""
        base = ",".join(f'{k}="{v}"' for k, v in self.labels.items())
        last = self.last or Refusal("other", 0, 0, 0)
        families = [
            ("scheduler_steps", "counter", "Engine steps (schedule() calls).",
             [("_total", "", self.steps)]),
            ("scheduler_refused_steps", "counter",
             "Engine steps that left the head of waiting, by reason.",
             [("_total", f',reason="{r}"', n) for r, n in self.refused.items()]),
            ("scheduler_head_blocks_needed", "gauge",
             "Blocks the head of waiting needed at the last refused step (0 unless kv_blocks).",
             [("", "", last.blocks_needed)]),
            ("scheduler_head_free_blocks", "gauge",
             "Free KV blocks (evictable cached ones included) at the last refused step.",
             [("", "", last.free_blocks)]),
            ("scheduler_head_running", "gauge", "Running requests at the last refused step.",
             [("", "", last.running)]),
        ]
        lines = []
        for name, kind, text, samples in families:
            name += samples[0][0]
            lines += [f"# HELP loadlab:{name} {text}", f"# TYPE loadlab:{name} {kind}"]
            lines += [f"loadlab:{name}{{{base}{extra}}} {value}" for _, extra, value in samples]
        return "\n".join(lines) + "\n"


def serve(counters: Counters, port: int) -> ThreadingHTTPServer:
    """``/metrics`` on ``port`` (all interfaces, like vLLM's own), from a daemon thread."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?")[0] != "/metrics":
                self.send_error(404)
                return
            body = counters.exposition().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            """Scrapes every second would flood the server's log."""

    server = ThreadingHTTPServer(("0.0.0.0", port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="loadlab-probe", daemon=True).start()
    return server


def serve_engine(counters: Counters, base_port: int, rank: int) -> ThreadingHTTPServer | None:
    """:func:`serve` on ``base_port + rank`` (one port per data-parallel engine core), or
    None, logged, when that port is taken."""
    port = base_port + rank
    try:
        server = serve(counters, port)
    except OSError as exc:
        logger.warning("loadlab probe: engine %d cannot serve /metrics on port %d (%s); "
                       "counting without it", rank, port, exc)
        return None
    logger.info("loadlab probe: engine %d serves /metrics on port %d", rank, port)
    return server


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class _AllocRecorder:
    """Stands in for ``allocate_slots`` on the scheduler's KV manager: passes every call
    through and, when it returns None for a waiting head (the kv_blocks case), keeps the
    head and the blocks the failed check asked for."""

    def __init__(self, allocate: Any, block_size: int, max_model_len: int) -> None:
        self.allocate = allocate
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.refused: tuple[Any, int] | None = None

    def __call__(self, request: Any, num_new_tokens: int, *args: Any, **kwargs: Any) -> Any:
        blocks = self.allocate(request, num_new_tokens, *args, **kwargs)
        if blocks is None and request.status in _WAITING:
            self.refused = (request, self.blocks_needed(request, num_new_tokens, **kwargs))
        return blocks

    def blocks_needed(self, request: Any, num_new_tokens: int,
                      num_new_computed_tokens: int = 0, new_computed_blocks: Any = None,
                      num_lookahead_tokens: int = 0, num_external_computed_tokens: int = 0,
                      full_sequence_must_fit: bool = False, **_: Any) -> int:
        """``num_blocks_to_allocate`` of the check that failed, for one full-attention
        group (``KVCacheManager.allocate_slots`` and ``SingleTypeKVCacheManager.
        get_num_blocks_to_allocate``): blocks past those held and hit, plus the hit blocks
        that sit evictable in the free queue (taking them uses up free blocks too)."""
        hit = new_computed_blocks.blocks[0] if new_computed_blocks is not None else ()
        if full_sequence_must_fit:
            tokens = request.num_tokens
        else:
            tokens = (request.num_computed_tokens + num_new_computed_tokens
                      + num_external_computed_tokens + num_new_tokens + num_lookahead_tokens)
        held = _cdiv(request.num_computed_tokens, self.block_size)
        evictable = sum(1 for block in hit if block.ref_cnt == 0)
        total = _cdiv(min(tokens, self.max_model_len), self.block_size)
        return max(0, total - held - len(hit)) + evictable


class ProbeScheduler(Scheduler):
    """vLLM's scheduler, counting refused steps by reason (see the module docstring)."""

    def __new__(cls, *args: Any, **kwargs: Any) -> ProbeScheduler:
        config = kwargs.get("vllm_config", args[0] if args else None)
        if cls is ProbeScheduler and config is not None \
                and config.scheduler_config.async_scheduling:
            cls = AsyncProbeScheduler
        return super().__new__(cls)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        config = self.vllm_config
        rank = config.parallel_config.data_parallel_rank
        self.probe = Counters({"model_name": str(config.model_config.served_model_name),
                               "engine": str(rank)})
        self.last_refusal: Refusal | None = None
        manager = self.kv_cache_manager
        self._probe_alloc = _AllocRecorder(manager.allocate_slots, self.block_size,
                                           self.max_model_len)
        self._probe_candidate: Any = None
        port = os.environ.get(PORT_ENV)
        self._probe_server = serve_engine(self.probe, int(port), rank) if port else None

    def _handle_blocked_waiting_request(self, request: Any) -> bool:
        """Every head the waiting loop looks at passes here first: remember the last, and
        from here on watch the allocations. The running requests' decodes, one call each
        per step, went to the KV manager unwrapped: the recorder costs ~1 us a call."""
        self._probe_candidate = request
        self.kv_cache_manager.allocate_slots = self._probe_alloc
        return super()._handle_blocked_waiting_request(request)

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        self._probe_alloc.refused = None
        self._probe_candidate = None
        self.kv_cache_manager.allocate_slots = self._probe_alloc.allocate   # unwrapped
        output = super().schedule(*args, **kwargs)
        self.last_refusal = self._classify(output) if self.get_request_counts()[1] else None
        self.probe.record(self.last_refusal)
        return output

    def _classify(self, output: Any) -> Refusal:
        running = len(self.running)
        free = self.kv_cache_manager.block_pool.get_num_free_blocks()
        head = self._probe_candidate
        if output.preempted_req_ids:
            reason = "preempted"
        elif getattr(self, "_pause_state", None) and self._pause_state.name != "UNPAUSED":
            reason = "other"
        elif output.total_num_scheduled_tokens >= self.max_num_scheduled_tokens:
            reason = "token_budget"
        elif running + self.num_waiting_for_streaming_input >= self.max_num_active_reqs:
            reason = "seq_cap"
        elif self._probe_alloc.refused is not None:
            return Refusal("kv_blocks", self._probe_alloc.refused[1], free, running)
        elif (head is not None and head.status in _WAITING
              and head not in self.deferred_waiting
              and not self.scheduler_config.enable_chunked_prefill):
            reason = "token_budget"  # the loop stopped at the head before allocating for it
        else:
            reason = "other"
        return Refusal(reason, 0, free, running)


class AsyncProbeScheduler(ProbeScheduler, AsyncScheduler):
    """The probe on vLLM's ``AsyncScheduler``, used when async scheduling is on."""
