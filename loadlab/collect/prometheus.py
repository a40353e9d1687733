"""Read a run's vLLM series back from a Prometheus server, as METRICS rows.

When the servers under test are already scraped by Prometheus, loadlab can take
their metrics from there instead of sampling them itself. The rows are the same
METRICS rows the direct scraper writes (``source`` = "prometheus"), so the
analyzer cannot tell the difference:

1. Raw samples (default): the range selector ``{__name__=~"(vllm|loadlab):.+"}[chunk]``
   (plus any ``match`` label matchers, to pick this run's servers out of a shared
   Prometheus)
   evaluated at the end of each chunk of ``[start, end]`` (default chunks of 10
   minutes) returns every stored sample at its scrape timestamp: counters and
   histogram buckets as raw cumulative series, gauges as scraped. Chunks are
   joined and duplicates at chunk borders dropped. With ``step_s`` given,
   ``query_range`` is used instead (values at evaluation steps).
2. Family and type of each name come from the catalog, then from Prometheus'
   metadata API (``# TYPE`` lines it saw), else ``unknown``; a counter's family
   has no ``_total`` and ``*_created`` series are dropped, as in the parser.
3. Labels: ``__name__``, ``job`` and ``instance`` are removed; ``instance``
   (host:port) becomes the endpoint column, ``http://host:port`` by default.
4. SCRAPES rows come from Prometheus' own ``up``, ``scrape_duration_seconds``
   and ``scrape_samples_scraped`` series of the same instances.

:func:`rate_query` and :func:`histogram_quantile_query` build the usual PromQL
for quick looks (:func:`query_range_frame` runs one); loadlab's own statistics
are computed from the raw rows (:mod:`loadlab.analyze.windows`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd

from loadlab.collect import catalog
from loadlab.collect.parse import KEEP_NAME_REGEX, KEEP_PREFIXES
from loadlab.errors import InputError, TargetError
from loadlab.runstore import METRICS, SCRAPES, PartWriter, update_manifest
from loadlab.runstore.schema import canonical_labels

SOURCE = "prometheus"
DEFAULT_CHUNK_S = 600.0
_DROPPED_LABELS = ("__name__", "job", "instance")


def _client(url: str, headers: dict[str, str] | None = None) -> Any:
    from prometheus_api_client import PrometheusConnect  # heavy import, only when used

    return PrometheusConnect(url=url, headers=headers, disable_ssl=True)


def _chunks(start: float, end: float, chunk_s: float) -> list[tuple[float, float]]:
    n = max(1, math.ceil((end - start) / chunk_s))
    edges = [start + (end - start) * i / n for i in range(n + 1)]
    return list(itertools.pairwise(edges))


def _raw_series(pc: Any, selector: str, start: float, end: float, chunk_s: float) -> list[dict]:
    """Every stored sample of ``selector`` in [start, end], one dict per series."""
    series: dict[tuple, dict] = {}
    for lo, hi in _chunks(start, end, chunk_s):
        window = max(1, math.ceil(hi - lo))
        for item in pc.custom_query(f"{selector}[{window}s]", params={"time": hi}):
            key = tuple(sorted(item["metric"].items()))
            entry = series.setdefault(key, {"metric": item["metric"], "values": {}})
            for t, v in item.get("values", []):
                if start <= float(t) <= end:
                    entry["values"][float(t)] = float(v)
    return [{"metric": s["metric"], "values": sorted(s["values"].items())} for s in series.values()]


def _stepped_series(pc: Any, selector: str, start: float, end: float, step_s: float) -> list[dict]:
    series: dict[tuple, dict] = {}
    for lo, hi in _chunks(start, end, step_s * 10_000):
        result = pc.custom_query_range(
            selector, start_time=_dt(lo), end_time=_dt(hi), step=f"{step_s:g}"
        )
        for item in result:
            key = tuple(sorted(item["metric"].items()))
            entry = series.setdefault(key, {"metric": item["metric"], "values": {}})
            entry["values"].update({float(t): float(v) for t, v in item.get("values", [])})
    return [{"metric": s["metric"], "values": sorted(s["values"].items())} for s in series.values()]


def _dt(t: float) -> datetime:
    return datetime.fromtimestamp(t, tz=timezone.utc)


def endpoint_of(instance: str, scheme: str = "http") -> str:
    """Prometheus' ``instance`` label as loadlab's endpoint column."""
    return instance if "://" in instance else f"{scheme}://{instance}"


class _Types:
    """Family and type of a sample name: catalog first, then Prometheus' metadata."""

    def __init__(self, metadata: Iterable[dict]) -> None:
        self.meta = {m["metric_name"]: m.get("type", "unknown") for m in metadata}

    def resolve(self, name: str) -> tuple[str, str]:
        known = catalog.family_of(name)
        if known is not None:
            return known.family, known.type
        mtype = self.meta.get(name)
        if mtype == "counter":
            return (name.removesuffix("_total")), "counter"
        if mtype is not None:
            return name, mtype
        for suffix in ("_bucket", "_sum", "_count"):
            base = name[: -len(suffix)]
            if name.endswith(suffix) and self.meta.get(base) in ("histogram", "summary"):
                return base, self.meta[base]
        return name, "unknown"


def metrics_rows(series: Iterable[dict], types: _Types, scheme: str = "http") -> list[dict]:
    """METRICS rows of Prometheus API series (``{"metric": labels, "values": [(t, v)]}``)."""
    rows: list[dict] = []
    for item in series:
        labels = dict(item["metric"])
        name = labels.get("__name__", "")
        if not name.startswith(KEEP_PREFIXES) or name.endswith("_created"):
            continue
        endpoint = endpoint_of(labels.get("instance", ""), scheme)
        for drop in _DROPPED_LABELS:
            labels.pop(drop, None)
        family, mtype = types.resolve(name)
        canon = canonical_labels(labels)
        rows.extend(
            {
                "t": t,
                "scrape_s": None,
                "endpoint": endpoint,
                "family": family,
                "type": mtype,
                "metric": name,
                "labels": canon,
                "value": v,
                "source": SOURCE,
            }
            for t, v in item["values"]
        )
    return rows


def _scrape_rows(pc: Any, instances: Sequence[str], start: float, end: float,
                chunk_s: float, scheme: str = "http") -> list[dict]:
    """SCRAPES rows from Prometheus' own per-target series."""
    if not instances:
        return []
    match = "|".join(i.replace(".", "\\\\.") for i in sorted(instances))
    per_name: dict[str, dict[tuple[str, float], float]] = {}
    for name in ("up", "scrape_duration_seconds", "scrape_samples_scraped"):
        found: dict[tuple[str, float], float] = {}
        for item in _raw_series(pc, f'{name}{{instance=~"{match}"}}', start, end, chunk_s):
            inst = item["metric"].get("instance", "")
            found.update({(inst, t): v for t, v in item["values"]})
        per_name[name] = found
    rows = []
    for (inst, t), up in sorted(per_name["up"].items()):
        samples = per_name["scrape_samples_scraped"].get((inst, t))
        rows.append({"t": t, "endpoint": endpoint_of(inst, scheme),
                         "duration_s": per_name["scrape_duration_seconds"].get((inst, t)),
                         "ok": up == 1.0, "http_status": None,
                         "n_samples": None if samples is None else int(samples),
                         "error": None if up == 1.0 else "down (prometheus up=0)"})
    return rows


def read_prometheus(url: str, start: float, end: float, *, step_s: float | None = None,
                    match: str | None = None, chunk_s: float = DEFAULT_CHUNK_S,
                    scheme: str = "http", headers: dict[str, str] | None = None,
                    ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(METRICS, SCRAPES) frames of every vLLM series Prometheus holds for [start, end].

    ``match`` adds label matchers to the selector (``job="vllm",instance=~"10.0.0.5:.*"``)
    so that a shared Prometheus gives only the servers of this run.
    """
    if not end > start:
        raise InputError(f"end {end} is not after start {start}", field="--end",
                         fix="give --start and --end as unix seconds, start first")
    pc = _client(url, headers)
    try:
        extra = f",{match}" if match else ""
        selector = f'{{__name__=~"{KEEP_NAME_REGEX}"{extra}}}'
        if step_s is None:
            series = _raw_series(pc, selector, start, end, chunk_s)
        else:
            series = _stepped_series(pc, selector, start, end, step_s)
        types = _Types(pc.get_metric_metadata(metric=""))
        instances = sorted({s["metric"].get("instance", "") for s in series} - {""})
        scrapes = _scrape_rows(pc, instances, start, end, chunk_s, scheme)
    except InputError:
        raise
    except Exception as exc:  # requests' and the client's errors, unrelated hierarchies
        raise TargetError(f"cannot read from Prometheus at {url}: {exc}") from exc
    metrics = pd.DataFrame(metrics_rows(series, types, scheme), columns=METRICS.names)
    return metrics, pd.DataFrame(scrapes, columns=SCRAPES.names)


def collect_from_prometheus(url: str, start: float, end: float, out_dir: str | Path,
                            **options: Any) -> tuple[int, int]:
    """Write the window's series into ``out_dir`` like the direct scraper;
    (metrics, scrapes) rows."""
    metrics, scrapes = read_prometheus(url, start, end, **options)
    out = Path(out_dir)
    for table, frame, schema in (("metrics", metrics, METRICS), ("scrapes", scrapes, SCRAPES)):
        with PartWriter(out / f"{table}.parquet", schema, flush_rows=len(frame) + 1,
                        flush_interval_s=math.inf) as writer:
            writer.extend(frame.astype(object).where(frame.notna(), None).to_dict("records"))
    families = sorted(metrics["family"].unique())
    update_manifest(out, metrics={
        "source": SOURCE, "prometheus_url": url, "window": [start, end],
        "names_found": catalog.names_found(families),
        "vllm_engine": catalog.engine_generation(families),
        "endpoints": {ep: {"families": sorted(g["family"].unique())}
                      for ep, g in metrics.groupby("endpoint")},
    })
    return len(metrics), len(scrapes)


def rate_query(family: str, window_s: float, by: Sequence[str] = ()) -> str:
    """PromQL: per-second rate of a counter family, summed ``by`` labels."""
    name = family if family.endswith("_total") else f"{family}_total"
    return f"sum by ({', '.join(by)}) (rate({name}[{window_s:g}s]))"


def histogram_quantile_query(q: float, family: str, window_s: float, by: Sequence[str] = ()) -> str:
    """PromQL: ``histogram_quantile`` of a histogram family over a sliding window."""
    keep = ", ".join(["le", *by])
    return f"histogram_quantile({q:g}, sum by ({keep}) (rate({family}_bucket[{window_s:g}s])))"


def query_range_frame(
    url: str, promql: str, start: float, end: float, step_s: float
) -> pd.DataFrame:
    """Run one PromQL expression over a range: columns t, labels (canonical JSON), value."""
    pc = _client(url)
    series = _stepped_series(pc, promql, start, end, step_s)
    return pd.DataFrame(
        [
            {"t": t, "labels": canonical_labels(s["metric"]), "value": v}
            for s in series
            for t, v in s["values"]
        ],
        columns=["t", "labels", "value"],
    )
