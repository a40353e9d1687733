"""vLLM's Prometheus metrics, computed from the simulated engine's steps.

Names, types, labels and buckets follow vLLM's V1 metrics (vllm/v1/metrics/loggers.py);
``names="v0"`` exposes the V0-era names instead so a
collector can be tested on both:

========================================  =========================================
V1 (``names="v1"``)                       V0 era (``names="v0"``)
========================================  =========================================
vllm:kv_cache_usage_perc (1-free/(N-1))   vllm:gpu_cache_usage_perc (1-free/N)
vllm:prefix_cache_queries/hits_total      vllm:gpu_prefix_cache_queries/hits_total
vllm:inter_token_latency_seconds          vllm:time_per_output_token_seconds
vllm:num_requests_waiting_by_reason,      (absent)
prompt_tokens_by_source_total,
request_time_per_output_token_seconds,
request_num_preemptions
(absent)                                  vllm:cpu_cache_usage_perc = 0,
                                          vllm:num_requests_swapped = 0
label engine="0"                          no engine label
========================================  =========================================

What is observed when (vLLM's semantics):

- gauges (running, waiting, KV usage) are the scheduler's figures after the last step;
- prompt_tokens_total counts a request's whole prompt when its first token comes out;
  TTFT = first token - arrival; ITL = each later token - the request's previous token;
- prompt_tokens_by_source splits those prompts when the first token comes out:
  local_compute = prompt - cached tokens, local_cache_hit = prefix-cache hit tokens;
- at finish: e2e = finished - arrival, queue = first scheduled - arrival, prefill = first
  token - first scheduled, decode = finished - first token, inference = finished - first
  scheduled, time per output token = decode / (output tokens - 1), token-count histograms,
  request_success_total{finished_reason}.

Accumulators are plain Python numbers and bucket lists (prometheus_client's metric
objects take a lock per observation, too slow per token in replay); :meth:`render`
writes the text exposition from them (prometheus_client's format, checked by its
parser in the tests; all state is on the instance, no global registry),
:meth:`samples` gives the same samples as rows (what parsing the text gives) and
:meth:`values` just their values, in exposition order (the series set is fixed at
construction, so a writer can learn the series once from one rendered page).
No _created samples: vLLM omits them in multiprocess mode too.
The ``loadlab:scheduler_*`` series (:mod:`loadlab.sim.engine.refusal_metrics`) follow
vLLM's, in both namings.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections.abc import Collection, Iterator
from collections.abc import Set as AbstractSet
from itertools import accumulate
from typing import NamedTuple

from prometheus_client.utils import floatToGoString

from loadlab.errors import InputError
from loadlab.runstore.schema import canonical_labels
from loadlab.sim.engine.hardware import ResolvedConfig
from loadlab.sim.engine.refusal_metrics import RefusalMetrics
from loadlab.sim.engine.types import EngineRequest, FinishedRequest, StepOutput

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
               10.0, 20.0, 40.0, 80.0)
REQUEST_TIME_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                        50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")
PROMPT_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")
HISTOGRAMS = (  # (family, EngineMetrics.hists key, help), exposition order; None: the ITL family
    ("vllm:request_prompt_tokens", "prompt_len", "Prompt tokens per request."),
    ("vllm:request_generation_tokens", "output_len", "Generated tokens per request."),
    ("vllm:iteration_tokens_total", "iteration", "Tokens per engine step."),
    ("vllm:request_params_max_tokens", "max_tokens", "The max_tokens request parameter."),
    ("vllm:time_to_first_token_seconds", "ttft", "Time to first token."),
    (None, "itl", "Inter-token latency."),
    ("vllm:request_time_per_output_token_seconds", "tpot", "Mean time per output token."),
    ("vllm:e2e_request_latency_seconds", "e2e", "End-to-end request latency."),
    ("vllm:request_queue_time_seconds", "queue", "Time spent waiting before first scheduling."),
    ("vllm:request_inference_time_seconds", "inference", "Time from first scheduling to finish."),
    ("vllm:request_prefill_time_seconds", "prefill", "Time in the prefill phase."),
    ("vllm:request_decode_time_seconds", "decode", "Time in the decode phase."),
    ("vllm:request_num_preemptions", "preempted", "Times a request was preempted."),
)
V1_ONLY_HISTOGRAMS = ("tpot", "preempted")


def buckets_1_2_5(limit: int) -> tuple[int, ...]:
    """1, 2, 5, 10, 20, 50, ... up to and including ``limit`` (vLLM's token buckets)."""
    out: list[int]
    out, mantissa, exponent = [], (1, 2, 5), 1
    while True:
        for m in mantissa:
            value = m * exponent
            if value > limit:
                return tuple(out)
            out.append(value)
        exponent *= 10


class Sample(NamedTuple):
    family: str        # as prometheus_client's parser names it (counters without _total)
    type: str
    metric: str        # sample name (…_total, …_bucket, …_sum, …_count)
    labels: str        # canonical JSON (loadlab.runstore.schema.canonical_labels)
    value: float


class _Hist:
    """Bucket counts (non-cumulative, +Inf last), sum and count."""

    __slots__ = ("bounds", "count", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float, n: int = 1) -> None:
        self.counts[bisect_left(self.bounds, value)] += n
        self.sum += value * n
        self.count += n


class EngineMetrics:
    """Counters, gauges and histograms of one simulated engine, fed step by step.

    Every request must be announced with :meth:`observe_arrival` before the step that
    emits its first token (TTFT and prompt_tokens_total need its arrival and length).
    """

    def __init__(self, resolved: ResolvedConfig, names: str = "v1") -> None:
        if names not in ("v1", "v0"):
            raise InputError(f"unknown metric naming {names!r}", field="--metrics-names",
                             fix="choose v1 (current vLLM) or v0 (names before vLLM 0.12)")
        self.resolved = resolved
        self.names = names
        self._base = {"model_name": resolved.served_model_name}
        if names == "v1":
            self._base["engine"] = "0"
        self._json_cache: dict[tuple, str] = {}
        self._bucket_labels: dict[str, list[dict[str, str]]] = {}
        self.running = 0
        self.waiting = 0
        self.kv_usage = 0.0
        self.counters = dict.fromkeys(
            ("preemptions", "prompt_tokens", "generation_tokens", "prefix_queries", "prefix_hits"),
            0.0,
        )
        self.success = dict.fromkeys(FINISH_REASONS, 0.0)
        self.refusals = RefusalMetrics()
        self.by_source = dict.fromkeys(PROMPT_SOURCES, 0.0)
        tokens = buckets_1_2_5(resolved.max_model_len)
        self.hists = {
            "ttft": _Hist(TTFT_BUCKETS), "itl": _Hist(ITL_BUCKETS), "tpot": _Hist(ITL_BUCKETS),
            "e2e": _Hist(REQUEST_TIME_BUCKETS), "queue": _Hist(REQUEST_TIME_BUCKETS),
            "inference": _Hist(REQUEST_TIME_BUCKETS), "prefill": _Hist(REQUEST_TIME_BUCKETS),
            "decode": _Hist(REQUEST_TIME_BUCKETS), "prompt_len": _Hist(tokens),
            "output_len": _Hist(tokens), "max_tokens": _Hist(tokens),
            "iteration": _Hist(ITERATION_TOKEN_BUCKETS),
            "preempted": _Hist(tuple(range(11))),
        }
        self._pending: dict[
            str, tuple[float, int]
        ] = {}  # id -> (arrival, prompt_len) until first token
        self._last_emit: dict[str, float] = {}  # id -> last token time, off the fast path
        self._prev_emit: AbstractSet[str] = set()         # ids that emitted at _prev_t_end
        self._gone: set[str] = set()                      # finished or aborted since the last step
        # The ids alive that emitted at the previous step end and not at the last one
        # (preempted, or a chunk without a token): worked out here for the ITL, and read
        # by a replay's token times (loadlab.replay.records.TokenTimes) rather than worked
        # out again. Empty at nearly every step.
        self.stopped: Collection[str] = ()
        self._prev_t_end = 0.0
        self._headers: dict[str, str] = {}                # family -> HELP and TYPE lines
        self._prefixes: dict[tuple, str] = {}             # series -> 'name{labels} '

    # ---- feeding -------------------------------------------------------------------------
    def observe_arrival(self, req: EngineRequest, now: float) -> None:
        self._pending[req.request_id] = (req.arrival_time, len(req.prompt_token_ids))

    def observe_step(self, out: StepOutput) -> None:
        t_end = out.t_end
        self.running, self.waiting, self.kv_usage = out.num_running, out.num_waiting, out.kv_usage
        c = self.counters
        self.refusals.observe(out.refusal)
        c["preemptions"] += len(out.preempted)
        c["prefix_queries"] += out.prefix_queries_tokens
        c["prefix_hits"] += out.prefix_hits_tokens
        self.by_source["local_compute"] += out.prompt_tokens_computed
        self.by_source["local_cache_hit"] += out.prompt_tokens_cached
        self.hists["iteration"].observe(out.iteration_tokens)
        emit = out.emitted
        c["generation_tokens"] += len(emit)
        first = out.first_token
        for rid in first:
            arrival, prompt_len = self._pending.pop(rid)
            self.hists["ttft"].observe(t_end - arrival)
            c["prompt_tokens"] += prompt_len
        self._observe_itl(out.new_tokens, emit, first, t_end)
        for fin in out.finished:
            self._observe_finished(fin)

    def observe_abort(self, fin: FinishedRequest) -> None:
        self._observe_finished(fin)

    def _observe_itl(self, new_tokens: dict[str, int], emit: AbstractSet[str], first: list[str],
                     t_end: float) -> None:
        """ITL per emitted token; requests that also emitted last step share one observation."""
        itl = self.hists["itl"]
        prev = self._prev_emit
        gone = self._gone
        last_emit = self._last_emit
        reused = bool(gone) and any(
            rid in emit for rid in gone
        )  # an id used again after it finished
        if not reused and not (last_emit and any(rid in emit for rid in last_emit)):
            # Nobody resumes after a gap (ids in one are never in prev): emit = steady +
            # first, and len(prev) - n_steady ids stopped; when those are all finished or
            # aborted ones, skip the set difference (it reads every id's string object).
            n_steady = len(emit) - len(first)
            if len(prev) - n_steady == (sum(1 for rid in gone if rid in prev) if gone else 0):
                if n_steady:
                    itl.observe(t_end - self._prev_t_end, n_steady)
                gone.clear()
                self.stopped = ()
                self._prev_emit = emit
                self._prev_t_end = t_end
                return
        if reused:
            prev = prev - gone
        # Only the few that stopped are materialised: a set of the hundreds that emitted
        # at both step ends would cost a cache miss per id every step.
        stopped = prev - emit
        n_steady = len(prev) - len(stopped)
        if n_steady:
            itl.observe(t_end - self._prev_t_end, n_steady)
        if n_steady + len(first) < len(emit):  # resumed after a gap: their own ITL
            fresh = set(first)
            for rid, n in new_tokens.items():  # step order, not set order: the _sum is
                if n and rid not in prev and rid not in fresh:  # the same in every process
                    itl.observe(t_end - last_emit.pop(rid))
        if gone:
            stopped -= gone
            gone.clear()
        if stopped:
            self._last_emit.update(dict.fromkeys(stopped, self._prev_t_end))
        self.stopped = stopped
        self._prev_emit = emit  # the step's own dict (view) or set, never changed after
        self._prev_t_end = t_end

    def _observe_finished(self, fin: FinishedRequest) -> None:
        rid = fin.request_id
        self._pending.pop(rid, None)
        self._last_emit.pop(rid, None)
        self._gone.add(rid)  # may sit in _prev_emit: _observe_itl leaves it out of "stopped"
        h = self.hists
        self.success[fin.finish_reason] += 1
        h["e2e"].observe(fin.finished_time - fin.arrival_time)
        h["prompt_len"].observe(fin.prompt_len)
        h["output_len"].observe(fin.output_len)
        h["max_tokens"].observe(fin.max_tokens)
        h["preempted"].observe(fin.num_preemptions)
        if fin.first_scheduled_time is not None:
            h["queue"].observe(fin.first_scheduled_time - fin.arrival_time)
            h["inference"].observe(fin.finished_time - fin.first_scheduled_time)
            if fin.first_token_time is not None:
                h["prefill"].observe(fin.first_token_time - fin.first_scheduled_time)
        if fin.first_token_time is not None:
            decode = fin.finished_time - fin.first_token_time
            h["decode"].observe(decode)
            if fin.output_len > 1:
                h["tpot"].observe(decode / (fin.output_len - 1))

    # ---- exposition ----------------------------------------------------------------------
    def _families(self) -> Iterator[tuple[str, str, str, list[tuple[str, dict, float]]]]:
        """(family, type, help, [(sample name, labels, value)]) in exposition order."""
        v1 = self.names == "v1"
        c = self.counters
        base = self._base
        yield ("vllm:num_requests_running", "gauge", "Requests in model execution batches.",
               [("vllm:num_requests_running", base, self.running)])
        yield ("vllm:num_requests_waiting", "gauge", "Requests waiting to be scheduled.",
               [("vllm:num_requests_waiting", base, self.waiting)])
        if v1:
            yield (
                "vllm:num_requests_waiting_by_reason",
                "gauge",
                "Waiting requests by reason.",
                [
                    (
                        "vllm:num_requests_waiting_by_reason",
                        {**base, "reason": "capacity"},
                        self.waiting,
                    ),
                    ("vllm:num_requests_waiting_by_reason", {**base, "reason": "deferred"}, 0.0),
                ],
            )
            yield (
                "vllm:kv_cache_usage_perc",
                "gauge",
                "KV-cache usage. 1 means 100 percent usage.",
                [("vllm:kv_cache_usage_perc", base, self.kv_usage)],
            )
        else:
            yield ("vllm:num_requests_swapped", "gauge", "Requests swapped to CPU.",
                   [("vllm:num_requests_swapped", base, 0.0)])
            yield ("vllm:gpu_cache_usage_perc", "gauge", "GPU KV-cache usage. 1 means 100 percent.",
                   [("vllm:gpu_cache_usage_perc", base, self._v0_usage())])
            yield ("vllm:cpu_cache_usage_perc", "gauge", "CPU KV-cache usage. 1 means 100 percent.",
                   [("vllm:cpu_cache_usage_perc", base, 0.0)])
        prefix = "vllm:prefix_cache" if v1 else "vllm:gpu_prefix_cache"
        for name, key, text in (
            (f"{prefix}_queries", "prefix_queries", "Prefix cache queries, in tokens."),
            (f"{prefix}_hits", "prefix_hits", "Prefix cache hits, in tokens."),
            ("vllm:num_preemptions", "preemptions", "Cumulative number of preemptions."),
            ("vllm:prompt_tokens", "prompt_tokens", "Prefill tokens processed."),
            ("vllm:generation_tokens", "generation_tokens", "Generation tokens processed."),
        ):
            yield name, "counter", text, [(f"{name}_total", base, c[key])]
        if v1:
            yield ("vllm:prompt_tokens_by_source", "counter", "Prompt tokens by source.",
                   [("vllm:prompt_tokens_by_source_total", {**base, "source": s}, v)
                    for s, v in self.by_source.items()])
        yield ("vllm:request_success", "counter", "Successfully processed requests.",
               [("vllm:request_success_total", {**base, "finished_reason": r}, v)
                for r, v in self.success.items()])
        h = self.hists
        itl_name = (
            "vllm:inter_token_latency_seconds" if v1 else "vllm:time_per_output_token_seconds"
        )
        for family, key, text in HISTOGRAMS:
            if not v1 and key in V1_ONLY_HISTOGRAMS:
                continue
            name = family or itl_name
            yield name, "histogram", text, self._histogram_samples(name, h[key])
        yield ("vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig.",
               [("vllm:cache_config_info", self._cache_config_labels(), 1.0)])
        yield from self.refusals.families(base)

    def _cache_config_labels(self) -> dict[str, str]:
        """vLLM's CacheConfig labels (engine, but no model_name, as the real server)."""
        r = self.resolved
        engine = {"engine": "0"} if self.names == "v1" else {}
        return {
            **engine,
            "block_size": str(r.block_size),
            "cache_dtype": r.kv_cache_dtype,
            "enable_prefix_caching": str(r.enable_prefix_caching),
            "gpu_memory_utilization": str(r.gpu_memory_utilization),
            "is_attention_free": "False",
            "kv_cache_max_concurrency": str(round(r.max_concurrency, 2)),
            "kv_cache_memory_bytes": str(r.num_gpu_blocks * r.block_size * r.kv_bytes_per_token),
            "kv_cache_size_tokens": str(r.kv_cache_tokens),
            "num_cpu_blocks": "None",
            "num_gpu_blocks": str(r.num_gpu_blocks),
            "num_gpu_blocks_override": str(r.num_gpu_blocks_override),
            "prefix_caching_hash_algo": "sha256",
            "sliding_window": "None",
        }

    def render(self) -> str:
        """Prometheus text exposition (format 0.0.4), as vLLM's /metrics serves it.

        Byte-identical to prometheus_client's generate_latest over the same families
        (a test checks it) and 5-8x cheaper (benchmarks/bench_sim_replay.py: ~1.3-1.9 ms
        against ~9.6 ms a page on the shared 2-core box), since every line but its
        value is built once and kept; the HTTP front serves it at up to 10 Hz.
        """
        parts: list[str] = []
        headers, prefixes = self._headers, self._prefixes
        for family, kind, text, samples in self._families():
            header = headers.get(family)
            if header is None:
                exposed = f"{family}_total" if kind == "counter" else family
                header = headers[family] = f"# HELP {exposed} {text}\n# TYPE {exposed} {kind}\n"
            parts.append(header)
            for name, labels, value in samples:
                key = (name, *labels.values())
                prefix = prefixes.get(key)
                if prefix is None:
                    prefix = prefixes[key] = _line_prefix(name, labels)
                parts.append(prefix)
                parts.append(floatToGoString(value))
                parts.append("\n")
        return "".join(parts)

    def render_with_prometheus_client(self) -> str:
        """The same families rendered by prometheus_client's generate_latest.

        The yardstick for :meth:`render` (tests hold them byte-identical; the replay
        benchmark times both); never used to serve.
        """
        from prometheus_client import CollectorRegistry, generate_latest
        from prometheus_client.core import Metric

        families = self._families

        class Families:
            def collect(self) -> Iterator[Metric]:
                for family, kind, text, samples in families():
                    metric = Metric(family, text, kind)
                    for name, labels, value in samples:
                        metric.add_sample(name, labels, float(value))
                    yield metric

        registry = CollectorRegistry(auto_describe=False)
        registry.register(Families())
        return generate_latest(registry).decode()

    def _histogram_samples(self, name: str, hist: _Hist) -> list[tuple[str, dict, float]]:
        labels = self._bucket_labels.get(name)
        if labels is None:
            les = [_le(b) for b in hist.bounds] + ["+Inf"]
            labels = self._bucket_labels[name] = [{**self._base, "le": le} for le in les]
        bucket = f"{name}_bucket"
        out: list[tuple[str, dict, float]]
        out, running = [], 0
        for label, count in zip(labels, hist.counts):
            running += count
            out.append((bucket, label, running))
        out.append((f"{name}_count", self._base, hist.count))
        out.append((f"{name}_sum", self._base, hist.sum))
        return out

    def _v0_usage(self) -> float:
        n = self.resolved.num_gpu_blocks
        return 1.0 - (1.0 - self.kv_usage) * (n - 1) / n

    def values(self) -> array[float]:
        """Sample values in exposition order; the series never change, only their values.

        The order of :meth:`_families` written out without building any labels (tests
        check the two agree, V1 and V0): the replay samples it every virtual second and
        buffers a part's worth of samples, as 8 bytes a value rather than a float object
        and a pointer (32), which also joins them into the part's column in one copy.
        """
        v1 = self.names == "v1"
        c = self.counters
        if v1:
            out = [self.running, self.waiting, self.waiting, 0.0, self.kv_usage]
        else:
            out = [self.running, self.waiting, 0.0, self._v0_usage(), 0.0]
        out += (c["prefix_queries"], c["prefix_hits"], c["preemptions"], c["prompt_tokens"],
                c["generation_tokens"])
        if v1:
            out += self.by_source.values()
        out += self.success.values()
        for _, key, _ in HISTOGRAMS:
            if v1 or key not in V1_ONLY_HISTOGRAMS:
                hist = self.hists[key]
                out += accumulate(hist.counts)
                out.append(hist.count)
                out.append(hist.sum)
        out.append(1.0)  # cache_config_info
        out += self.refusals.values()
        return array("d", out)

    def samples(self) -> list[Sample]:
        """The rendered samples as rows, without rendering or parsing text."""
        rows = []
        cache = self._json_cache
        for family, kind, _, samples in self._families():
            for name, labels, value in samples:
                key = (name, *labels.values())
                text = cache.get(key)
                if text is None:
                    text = cache[key] = canonical_labels(labels)
                rows.append(Sample(family, kind, name, text, float(value)))
        return rows


def _line_prefix(name: str, labels: dict[str, str]) -> str:
    """'name{a="x",b="y"} ' with sorted, escaped labels, as prometheus_client writes them."""
    if not labels:
        return f"{name} "
    body = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))
    return f"{name}{{{body}}} "


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _le(bound: float) -> str:
    """Bucket bound as prometheus_client writes it (1 -> "1.0", 0.005 -> "0.005")."""
    return floatToGoString(bound)
