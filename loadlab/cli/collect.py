"""``loadlab collect``: sample servers' /metrics into a run folder, or read them from Prometheus.

Two forms:

- ``loadlab collect --target URL [--target URL2 ...] --out DIR [--interval 1] [--duration S]``:
  samples until the duration is over, or until Ctrl-C / SIGTERM when no duration is
  given (so a run orchestrator can start it as a process and stop it), then
  flushes everything, compacts the metrics and scrapes it wrote into one part each
  (:func:`loadlab.runstore.compact_run`) and prints what was collected. When not one
  scrape of any endpoint succeeded the folder is still written, and the command exits 4
  (:class:`~loadlab.errors.NoSuccess`) saying so: it collected nothing.
- ``loadlab collect --prometheus-url URL --start T --end T --out DIR``: copies the
  window's vLLM series out of a Prometheus server in the same format.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from pathlib import Path

import click

from loadlab.cli.options import (
    api_key_env_option,
    deprecated,
    interval_option,
    out_option,
    replica_metrics_option,
    target_option,
    tls_options,
)
from loadlab.errors import InputError, NoSuccess, StoreError
from loadlab.spec.tls import INSECURE_WARNING, TlsSettings, tls_from_flags


def _seconds(text: str | None, name: str) -> float | None:
    """Unix seconds, or an ISO 8601 time (UTC if no zone)."""
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        pass
    from datetime import datetime, timezone

    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise InputError(f"cannot read {text!r} as a time", field=name,
                         fix="give unix seconds (1764460800) or ISO 8601 (2026-11-29T23:00:00Z)"
                         ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.timestamp()


@click.command(name="collect", context_settings={"allow_extra_args": True})
@target_option("Base URL of a server to sample, e.g. http://127.0.0.1:8000 (repeat for several).",
               multiple=True)
@out_option("Run folder to write metrics.parquet/, scrapes.parquet/ and manifest.json into.",
            required=True)
@replica_metrics_option("The replicas behind a gateway (base URLs): sampled like --target "
                        "and listed in the manifest, so the analysis judges each replica.")
@interval_option("Seconds between scrapes of each endpoint (0.1 at the finest).")
@click.option("--timeout", "timeout_s", type=float, default=None,
              help="Per-scrape deadline in seconds, below the interval [default: 0.8 x interval].")
@click.option("--duration", "duration_s", type=float, default=None,
              help="Stop after this many seconds [default: until Ctrl-C or SIGTERM].")
@api_key_env_option()
@tls_options()
@click.option("--prometheus-url", default=None,
              help="Read the series from this Prometheus server instead of scraping.")
@click.option("--start", "start", default=None,
              help="Window start (unix seconds or ISO 8601); with --prometheus-url.")
@click.option("--end", "end", default=None,
              help="Window end (unix seconds or ISO 8601); with --prometheus-url.")
@click.option("--prometheus-match", "match", default=None, help="With --prometheus-url: extra "
              "label matchers, e.g. 'job=\"vllm\",instance=\"10.0.0.5:8000\"'.")
@click.option("--step", "step_s", type=float, default=None,
              help="With --prometheus-url: evaluate at this step instead of taking raw samples.")
@click.pass_context
def collect(ctx: click.Context, target: tuple[str, ...], replica_metrics: tuple[str, ...],
            out: Path, interval_s: float,
            timeout_s: float | None, duration_s: float | None, api_key_env: str,
            ca_bundle: str | None, insecure: bool, prometheus_url: str | None, start: str | None,
            end: str | None, match: str | None, step_s: float | None) -> None:
    """Sample vLLM /metrics of each --target (base URLs) into a run folder, beside a load.

    Or, with --prometheus-url, copy a time window of the same series out of Prometheus.
    """
    endpoints = (*target, *replica_metrics, *_positional(ctx.args))
    if prometheus_url:
        if replica_metrics:
            raise InputError("--replica-metrics names servers to scrape", field="--replica-metrics",
                             fix="drop it when reading from Prometheus")
        _from_prometheus(prometheus_url, endpoints, out, start, end, step_s, match)
        return
    replicas = _replica_labels(replica_metrics)
    tls = tls_from_flags(ca_bundle, insecure)
    _scrape(endpoints, out, interval_s, timeout_s, duration_s, api_key_env, tls,
            lambda: _list_replicas(out, replicas))


def _replica_labels(urls: tuple[str, ...]) -> list[str]:
    """The labels the scraper gives the replicas' series; InputError for fewer than two."""
    from loadlab.collect.fetch import endpoint_urls

    labels = list(dict.fromkeys(endpoint_urls(u)[0] for u in urls))
    if urls and len(labels) < 2:
        raise InputError(f"--replica-metrics names {len(labels)} distinct replica(s)",
                         field="--replica-metrics",
                         fix="list two or more replicas' base URLs, comma-separated")
    return labels


def _list_replicas(out_dir: Path, labels: list[str]) -> None:
    """The manifest's ``replicas`` (read by the analysis of a fleet), once it exists."""
    from loadlab.runstore import update_manifest

    if labels:
        update_manifest(out_dir, replicas=labels)


def _positional(args: list[str]) -> list[str]:
    """Endpoints given the old way, as arguments (one deprecation line for all of them)."""
    if args:
        deprecated("an endpoint given as an argument", "--target URL")
    return args


def _from_prometheus(url: str, endpoints: tuple[str, ...], out_dir: Path, start: str | None,
                     end: str | None, step_s: float | None, match: str | None) -> None:
    from loadlab.collect.prometheus import collect_from_prometheus

    if endpoints:
        raise InputError("give either --target servers to scrape or --prometheus-url, not both",
                         field="--target", fix="drop --target when reading from Prometheus")
    t0, t1 = _seconds(start, "--start"), _seconds(end, "--end")
    if t0 is None or t1 is None:
        raise InputError("--prometheus-url needs --start and --end", field="--start/--end",
                         fix="give the run's window, e.g. --start 1764460800 --end 1764461400")
    n_metrics, n_scrapes = collect_from_prometheus(url, t0, t1, out_dir, step_s=step_s, match=match)
    click.echo(f"collected {n_metrics} samples and {n_scrapes} scrape records from {url} "
               f"into {out_dir}")


def _scrape(endpoints: tuple[str, ...], out_dir: Path, interval_s: float, timeout_s: float | None,
            duration_s: float | None, api_key_env: str, tls: TlsSettings,
            after: Callable[[], None] = lambda: None) -> None:
    from loadlab.collect.scraper import Scraper
    from loadlab.runstore import compact_run
    from loadlab.runstore.layout import SCRAPER_TABLES

    if not endpoints:
        raise InputError("no server given", field="--target",
                         fix="loadlab collect --target http://127.0.0.1:8000 --out DIR, "
                         "or use --prometheus-url")
    if duration_s is not None and duration_s <= 0:
        raise InputError(f"duration {duration_s} s is not positive", field="--duration",
                         fix="give a positive number of seconds, or leave it out")
    scraper = Scraper(endpoints, out_dir, interval_s=interval_s, timeout_s=timeout_s,
                      api_key_env=api_key_env, tls=tls)
    if tls.insecure:
        click.echo(f"loadlab: warning: {INSECURE_WARNING}", err=True)
    done = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: done.set())
    try:
        with scraper:
            click.echo(f"sampling {', '.join(scraper.endpoints)} every {interval_s:g} s "
                       f"into {out_dir}", err=True)
            try:
                done.wait(duration_s)
            except KeyboardInterrupt:
                pass
    finally:
        signal.signal(signal.SIGTERM, previous)
    after()
    compact_run(out_dir, tables=SCRAPER_TABLES,
                progress=lambda line: click.echo(line, err=True))
    for endpoint, st in scraper.stats().items():
        info = scraper.endpoint_info().get(endpoint, {})
        click.echo(f"{endpoint}: {st.ok}/{st.attempts} scrapes ok, {st.missed} missed ticks, "
                   f"engine {info.get('vllm_engine', 'unknown')}, "
                   f"{len(info.get('families', []))} vllm families"
                   + (f", last error: {st.last_error}" if st.last_error else ""))
    if scraper.write_errors:
        raise StoreError("; ".join(scraper.write_errors))
    stats = scraper.stats().values()
    if not any(st.ok for st in stats):
        errors = [st.last_error for st in stats if st.last_error]
        raise NoSuccess(f"no scrape succeeded: 0 of {sum(st.attempts for st in stats)} scrapes ok"
                        + (f" (last error: {errors[-1]})" if errors else ""))
