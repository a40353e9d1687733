"""A synthetic hour-long run folder, laid out part by part as loadlab's writers lay it out.

For ``bench_analyze.py``: the analyzer's cost depends on row counts, part counts and
the shape of the columns, not on a server having really run, so the folder is built
from numbers, once, and cached. What makes it realistic:

- requests.parquet: ``n`` rows over ``steps`` closed-loop steps (40, 80, ... 1,200 users
  over 4 endpoints of 256 sequences each: throughput rises to a knee and flattens),
  written as the Recorder writes them: rows in order of completion, one part per
  ``request_flush_s`` of completions (the Recorder's ``REQUESTS_FLUSH_S``, 5 s, was 1 s;
  at ~280 requests/s its 2,000-row limit is never reached first), dictionary-encoded as
  ``PartWriter.add`` writes. Output lengths follow the shipped azure-conv profile (mean
  ~210 tokens), one content chunk per token, so ``chunk_offsets_s`` holds ~2e8 floats
  for 1M requests, as a streaming client stores them.
- metrics.parquet: every series of the real vLLM 0.32 page
  (``tests/fixtures/vllm-0.32-cpu/metrics_idle_fresh.txt`` through
  :class:`~loadlab.collect.parse.ExpositionParser`: 39 families, 330 series, histogram
  buckets included) scraped at 1 Hz on each endpoint, written by
  :class:`~loadlab.collect.sink.MetricsSink` one part per endpoint per 5 s (the
  Scraper's flush interval). Gauges follow the load (running capped per endpoint,
  waiting above the cap), counters and histogram buckets accumulate at the step's
  throughput with the bucket shares of the fixture page.
- scrapes.parquet and client.parquet: one row per scrape, one per worker-second, flushed
  every 5 s and 2 s as the Scraper and the Recorder flush them.

The folder is written under ``<dir>.tmp`` and renamed when complete, so an interrupted
generation is never mistaken for a cached one.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import asdict, dataclass
from itertools import pairwise
from pathlib import Path

import numpy as np
import pyarrow as pa

from loadlab.collect.parse import ExpositionParser, Scrape
from loadlab.collect.sink import MetricsSink
from loadlab.loadgen.records import REQUESTS_FLUSH_S
from loadlab.runstore import CLIENT, REQUESTS, SCRAPES, PartWriter, write_manifest
from loadlab.workload import load_profile

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "tests" / "fixtures" / "vllm-0.32-cpu" / "metrics_idle_fresh.txt"
T0 = 1_750_000_000.0
BASE_URL = "http://router:8000"


@dataclass(frozen=True)
class HourRun:
    """What to generate; also the cache key."""

    requests: int = 1_000_000
    steps: int = 30
    duration_s: float = 3600.0
    endpoints: int = 4
    scrape_interval_s: float = 1.0
    step_users: int = 40       # closed loop: step k runs step_users * (k + 1) users
    seq_cap: int = 256         # per endpoint: running saturates here, waiting grows above
    seed: int = 1
    request_flush_s: float = REQUESTS_FLUSH_S  # the Recorder's: one requests part per interval

    def key(self) -> str:
        return "-".join(f"{v}" for v in asdict(self).values())

    @property
    def step_s(self) -> float:
        return self.duration_s / self.steps

    def concurrency(self) -> np.ndarray:
        return self.step_users * np.arange(1, self.steps + 1)


def ensure(spec: HourRun, cache: Path, progress=print) -> Path:
    """The run folder for ``spec`` under ``cache``, generated if absent."""
    out = cache / f"hour-run-{spec.key()}"
    if (out / "manifest.json").exists():
        return out
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    t0 = time.perf_counter()
    rng = np.random.default_rng(spec.seed)
    _requests(spec, tmp, rng, progress)
    _metrics(spec, tmp, rng, progress)
    _scrapes_and_client(spec, tmp)
    _manifest(spec, tmp)
    tmp.rename(out)
    progress(f"generated {out} in {time.perf_counter() - t0:.0f} s")
    return out


def _step_rates(spec: HourRun) -> np.ndarray:
    """Relative throughput per step: rises with concurrency up to the cap, then flat."""
    knee = spec.seq_cap * spec.endpoints
    return np.minimum(spec.concurrency(), knee).astype(float)


def _requests(spec: HourRun, out: Path, rng: np.random.Generator, progress) -> None:
    n = spec.requests
    rates = _step_rates(spec)
    per_step = np.floor(n * rates / rates.sum()).astype(int)
    per_step[-1] += n - per_step.sum()
    step = np.repeat(np.arange(spec.steps), per_step).astype(np.int32)
    conc = spec.concurrency()[step].astype(np.int32)
    t_sent = T0 + step * spec.step_s + rng.uniform(0, spec.step_s, n)
    over = np.maximum(0.0, conc / (spec.seq_cap * spec.endpoints) - 1.0)
    ttft = rng.lognormal(np.log(0.05), 0.4, n) * (1.0 + 20.0 * over)
    output = load_profile("azure-conv").model.lengths.output
    n_out = np.maximum(1, np.round(np.interp(rng.uniform(0, 1, n), output.p, output.v))).astype(
        np.int32
    )
    itl = rng.lognormal(np.log(0.01), 0.2, n)
    status = np.where(rng.uniform(0, 1, n) < 0.995, "ok", "http_error")
    # Recorder order: by completion; the end is only known once the offsets are drawn,
    # so completion is approximated by first token + n * mean gap.
    t_done_approx = t_sent + ttft + n_out * itl
    order = np.argsort(t_done_approx, kind="stable")
    interval = np.floor((t_done_approx[order] - T0) / spec.request_flush_s).astype(np.int64)
    cuts = np.flatnonzero(np.diff(interval)) + 1
    writer = PartWriter(out / "requests.parquet", REQUESTS, writer_id="master")
    bounds = np.concatenate([[0], cuts, [n]])
    for k, (a, b) in enumerate(pairwise(bounds)):
        idx = order[a:b]
        writer.write_table(_request_part(idx, step, conc, t_sent, ttft, n_out, itl, status, rng))
        if k % 500 == 0:
            progress(f"  requests: part {k} of {len(bounds) - 1}")
    writer.close()


def _request_part(idx: np.ndarray, step, conc, t_sent, ttft, n_out, itl, status,
                  rng: np.random.Generator) -> pa.Table:
    m = len(idx)
    chunks = np.where(status[idx] == "ok", n_out[idx], 0).astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(chunks)])
    # offsets: first token at ttft, then gamma gaps around the request's ITL
    gaps = rng.gamma(4.0, 0.25, offsets[-1]) * np.repeat(itl[idx], chunks)
    csum = np.cumsum(gaps)
    starts = np.minimum(offsets[:-1], max(len(csum) - 1, 0))
    values = (np.repeat(ttft[idx] - csum[starts], chunks) + csum) if len(csum) else np.zeros(0)
    last = np.where(
        chunks > 0, values[np.maximum(offsets[1:] - 1, 0)] if len(values) else 0.0, np.nan
    )
    ok = status[idx] == "ok"
    e2e = np.where(ok, last + 0.001, 0.5)
    span = np.where(chunks > 1, (last - ttft[idx]) / np.maximum(chunks - 1, 1), np.nan)
    cols = {
        "point": pa.array([""] * m),
        "step": pa.array(step[idx]),
        "concurrency": pa.array(conc[idx]),
        "worker": pa.array([f"worker-{i % 2}" for i in idx]),
        "user": pa.array((idx % 64).astype(np.int32)),
        "request_id": pa.array([f"1-{i}" for i in idx]),
        "seq": pa.array(idx.astype(np.int64)),
        "endpoint": pa.array([BASE_URL] * m),
        "api": pa.array(["completions"] * m),
        "t_sent": pa.array(t_sent[idx]),
        "t_first_token": pa.array(np.where(ok, t_sent[idx] + ttft[idx], np.nan), from_pandas=True),
        "t_done": pa.array(t_sent[idx] + e2e),
        "ttft_s": pa.array(np.where(ok, ttft[idx], np.nan), from_pandas=True),
        "e2e_s": pa.array(e2e),
        "itl_mean_s": pa.array(span, from_pandas=True),
        "itl_p50_s": pa.array(span * 0.95, from_pandas=True),
        "itl_p99_s": pa.array(span * 2.2, from_pandas=True),
        "itl_max_s": pa.array(span * 3.0, from_pandas=True),
        "n_chunks": pa.array(chunks.astype(np.int32)),
        "chunk_offsets_s": pa.ListArray.from_arrays(
            pa.array(offsets.astype(np.int32)), pa.array(values)
        ),
        "prompt_tokens": pa.array(rng.integers(20, 4000, m).astype(np.int32)),
        "output_tokens": pa.array(np.where(ok, n_out[idx], 0).astype(np.int32)),
        "target_output_tokens": pa.array(n_out[idx]),
        "status": pa.array(status[idx].tolist()),
        "http_status": pa.array(np.where(ok, 200, 500).astype(np.int32)),
        "error": pa.array([None if s == "ok" else "http 500" for s in status[idx]], pa.string()),
    }
    cols["target_prompt_tokens"] = cols["prompt_tokens"]
    arrays = [
        cols[f.name].cast(f.type) if f.name in cols else pa.nulls(m, f.type) for f in REQUESTS
    ]
    return pa.Table.from_arrays(arrays, schema=REQUESTS)


def _metrics(spec: HourRun, out: Path, rng: np.random.Generator, progress) -> None:
    parser = ExpositionParser()
    page = parser.parse(PAGE.read_text())
    n_scrapes = int(spec.duration_s / spec.scrape_interval_s)
    t = np.arange(n_scrapes) * spec.scrape_interval_s
    step = np.minimum((t // spec.step_s).astype(int), spec.steps - 1)
    per_ep = spec.concurrency()[step] / spec.endpoints
    load = _step_rates(spec)[step] / (spec.seq_cap * spec.endpoints)  # 0..1 of peak throughput
    for e in range(spec.endpoints):
        values = _series_values(parser, page, per_ep, load, spec, rng)
        sink = MetricsSink(out / "metrics.parquet", parser, endpoint=f"http://vllm-{e}:8000",
                           writer_id=f"master-{e}", flush_interval_s=float("inf"),
                           flush_rows=10**9)
        jitter = rng.uniform(0.001, 0.02, n_scrapes)
        per_part = max(1, round(5.0 / spec.scrape_interval_s))
        for i in range(n_scrapes):
            sink.add_scrape(T0 + t[i] + 0.01 * e + jitter[i], 0.004,
                            Scrape(ids=list(page.ids), values=values[i].tolist()))
            if (i + 1) % per_part == 0:
                sink.flush()
        sink.close()
        progress(f"  metrics: endpoint {e + 1} of {spec.endpoints}")


def _series_values(parser: ExpositionParser, page: Scrape, per_ep: np.ndarray, load: np.ndarray,
                   spec: HourRun, rng: np.random.Generator) -> np.ndarray:
    """(scrapes, series) values of one endpoint, in the page's series order."""
    n = len(per_ep)
    base = np.asarray(page.values, dtype=float)
    out = np.tile(base, (n, 1))
    running = np.minimum(per_ep, spec.seq_cap)
    gauges = {
        "vllm:num_requests_running": running,
        "vllm:num_requests_waiting": np.maximum(0.0, per_ep - spec.seq_cap),
        "vllm:kv_cache_usage_perc": 0.6 * running / spec.seq_cap,
    }
    finished = rng.poisson(70.0 * load)  # requests finished per scrape interval
    tokens = rng.poisson(14_000.0 * load)
    cum_req, cum_tok = np.cumsum(finished), np.cumsum(tokens)
    counters = {"vllm:generation_tokens": cum_tok, "vllm:prompt_tokens": 5 * cum_tok,
                "vllm:request_success": cum_req, "vllm:prefix_cache_queries": 5 * cum_tok,
                "vllm:prefix_cache_hits": np.floor(1.5 * cum_tok)}
    series = [parser.series[i] for i in page.ids]
    shares = _bucket_shares(series, base)
    for j, s in enumerate(series):
        if s.type == "gauge":
            if s.family in gauges:
                out[:, j] = np.round(gauges[s.family] + rng.normal(0, 0.3, n).clip(-0.3, 0.3)
                                     * (gauges[s.family] > 0), 3)
        elif s.type == "counter":
            out[:, j] = base[j] + counters.get(s.family, 0.0)
        elif s.type == "histogram":
            fam_obs = cum_tok if s.family in ("vllm:inter_token_latency_seconds",
                                              "vllm:iteration_tokens_total") else cum_req
            if s.metric.endswith("_bucket"):
                out[:, j] = base[j] + np.floor(fam_obs * shares[j])
            elif s.metric.endswith("_count"):
                out[:, j] = base[j] + fam_obs
            else:
                out[:, j] = base[j] + fam_obs * (0.01 if fam_obs is cum_tok else 0.5)
    return out


def _bucket_shares(series: list, base: np.ndarray) -> np.ndarray:
    """Per bucket series: its cumulative share of its histogram (fixture's if it has counts)."""
    shares = np.ones(len(series))
    groups: dict[tuple[str, str], list[int]] = {}
    for j, s in enumerate(series):
        if s.metric.endswith("_bucket"):
            labels = s.labels.split('"le":')[0]
            groups.setdefault((s.family, labels), []).append(j)
    for idx in groups.values():
        counts = base[idx]
        if counts[-1] > 0:
            shares[idx] = counts / counts[-1]
        else:  # an idle page: spread evenly over the buckets, the last one holds all
            shares[idx] = np.minimum(1.0, (np.arange(len(idx)) + 1) / max(len(idx) - 2, 1))
    return shares


def _scrapes_and_client(spec: HourRun, out: Path) -> None:
    n_scrapes = int(spec.duration_s / spec.scrape_interval_s)
    per_part = max(1, round(5.0 / spec.scrape_interval_s))
    scrapes = PartWriter(out / "scrapes.parquet", SCRAPES, writer_id="master")
    for a in range(0, n_scrapes, per_part):
        ts = np.arange(a, min(a + per_part, n_scrapes)) * spec.scrape_interval_s
        m = len(ts) * spec.endpoints
        scrapes.write_table(pa.Table.from_arrays([
            pa.array(np.repeat(T0 + ts, spec.endpoints)),
            pa.array([f"http://vllm-{e}:8000" for e in range(spec.endpoints)] * len(ts)),
            pa.array(np.full(m, 0.004)), pa.array(np.ones(m, bool)),
            pa.array(np.full(m, 200, np.int32)), pa.array(np.full(m, 330, np.int32)),
            pa.nulls(m, pa.string())], schema=SCRAPES))
    client = PartWriter(out / "client.parquet", CLIENT, writer_id="master")
    workers = ["worker-0", "worker-1"]
    for a in range(0, int(spec.duration_s), 2):
        ts = np.repeat(T0 + np.arange(a, a + 2) + 1.0, len(workers))
        m = len(ts)
        client.write_table(
            pa.Table.from_arrays(
                [
                    pa.array(ts),
                    pa.array(workers * 2),
                    pa.array(np.ones(m)),
                    pa.array(np.full(m, 0.4)),
                    pa.array(np.full(m, 0.4)),
                    pa.array(np.full(m, 2e-4)),
                    pa.array(np.full(m, 2e-3)),
                    pa.array(np.full(m, 32, np.int32)),
                    pa.array(np.full(m, 140, np.int32)),
                    pa.array(np.full(m, 140.0)),            # 140 in flight for 1 s
                    pa.array(np.zeros(m)),
                    pa.array(np.full(m, round(spec.requests / spec.duration_s / len(workers)),
                                     np.int32)),
                    pa.array([[]] * m, pa.list_(pa.float64())),   # closed loop: no schedule
                ],
                schema=CLIENT,
            )
        )


def _manifest(spec: HourRun, out: Path) -> None:
    steps = [{"step": k, "concurrency": int(c), "target_rate": None,
              "t_start": T0 + k * spec.step_s, "t_end": T0 + (k + 1) * spec.step_s,
              "warmup_s": 10.0, "client_cpu_cores": 0.8, "client_cpu_max_worker": 0.4}
             for k, c in enumerate(spec.concurrency())]
    write_manifest(
        out,
        {
            "kind": "run",
            "point": "",
            "created": T0,
            "finished": T0 + spec.duration_s,
            "status": "complete",
            "target": {"base_url": BASE_URL, "model": "bench", "api": "completions"},
            "metrics": {
                "interval_s": spec.scrape_interval_s,
                "endpoints": {f"http://vllm-{e}:8000": {} for e in range(spec.endpoints)},
            },
            "workload": {"profile": "azure-conv", "seed": spec.seed},
            "generated_by": "benchmarks/hour_run.py",
            "spec": asdict(spec),
            "steps": steps,
        },
    )
