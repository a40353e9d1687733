"""Sample /metrics of one or more servers beside a load, into a run folder.

Algorithm (one background thread per endpoint, all on one shared clock):

1. Tick ``k`` is due at ``t0 + k * interval_s`` (monotonic clock): ticks are
   scheduled by absolute time, so scrape durations never accumulate into drift.
2. At a tick: GET the page (:mod:`loadlab.collect.fetch`, total deadline
   ``timeout_s`` < ``interval_s``), parse it (:mod:`loadlab.collect.parse`),
   queue its samples (METRICS, via :class:`~loadlab.collect.sink.MetricsSink`)
   and one SCRAPES row: ok, duration, HTTP status, n_samples, error cause.
3. If the scrape ran past later ticks, those ticks are skipped, each recorded as
   a SCRAPES row with error ``missed tick``: coverage stays honest.
4. Failures (timeout, refused, closed connection, ``http 500``, ``parse error``,
   ``no vllm metrics``, ``collector error: <class>``) are rows, never exceptions: the
   thread goes on, other endpoints are not affected, and a server that vanishes
   mid-run only leaves a gap. A full disk is not a gap: the writers keep the rows
   in memory and retry (:class:`~loadlab.runstore.PartWriter`).
5. Whenever an endpoint's set of families grows (first good scrape, late
   families), the manifest's ``metrics`` key is rewritten: per endpoint the
   families found, the role -> family map, V1 or V0, and the typed
   ``cache_config_info`` labels.
6. :meth:`Scraper.stop` (or leaving the ``with`` block) stops the threads and
   flushes everything; parts are also flushed every ``flush_interval_s`` (5 s:
   a crash loses seconds, and an hour at 1 Hz makes ~720 part files per endpoint,
   not thousands). :meth:`Scraper.sync` waits for every endpoint's next scrape and
   flushes, for a reader that must see the server up to now (a knee search judging
   the step that just ended).

Ticks and timestamps come from ``clock`` (:class:`SystemClock`; tests pass a manual
clock so tick accounting is checked without depending on the machine's speed).
Defaults: ``interval_s`` 1.0 (0.1 at the finest), ``timeout_s`` 0.8 x interval,
API key read from ``$LOADLAB_API_KEY`` (name configurable) and sent as
``Authorization: Bearer``; the key is never written anywhere.
"""

from __future__ import annotations

import math
import os
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from loadlab.collect.fetch import MetricsFetcher, endpoint_urls
from loadlab.collect.parse import ExpositionError, ExpositionParser, describe_endpoint
from loadlab.collect.sink import MetricsSink
from loadlab.errors import InputError, StoreError
from loadlab.runstore import SCRAPES, PartWriter, update_manifest
from loadlab.runstore.layout import METRICS_TABLE, SCRAPES_TABLE
from loadlab.spec.scenario import SCRAPE_INTERVAL_MIN_S
from loadlab.spec.tls import TlsSettings

MIN_INTERVAL_S = SCRAPE_INTERVAL_MIN_S
DEFAULT_API_KEY_ENV = "LOADLAB_API_KEY"


class Clock(Protocol):
    """Where the scrape loops read the time and wait for a tick (tests drive a manual one)."""

    def monotonic(self) -> float: ...

    def time(self) -> float: ...

    def wait(self, stop: threading.Event, seconds: float) -> bool:
        """Wait ``seconds`` or until ``stop`` is set; True when it is."""
        ...


class SystemClock:
    """The real clocks: ``time.monotonic`` for ticks, ``time.time`` for timestamps."""

    monotonic = staticmethod(time.monotonic)
    time = staticmethod(time.time)

    @staticmethod
    def wait(stop: threading.Event, seconds: float) -> bool:
        return stop.wait(seconds)


@dataclass
class EndpointStats:
    """Live counters of one endpoint's scrapes (for progress and for tests)."""

    attempts: int = 0
    ok: int = 0
    missed: int = 0
    last_error: str | None = None
    last_t: float | None = None      # wall time of the latest row (a scrape's start, a missed tick)


class _EndpointLoop:
    """The scrape loop of one endpoint; runs in its own thread."""

    def __init__(self, owner: Scraper, label: str, url: str, index: int) -> None:
        self.owner = owner
        self.label = label
        self.stats = EndpointStats()
        self.parser = ExpositionParser()
        self.fetcher = MetricsFetcher(url, timeout_s=owner.timeout_s, headers=owner._headers,
                                      tls=owner._tls)
        self.sink = MetricsSink(
            owner.out_dir / METRICS_TABLE, self.parser, endpoint=label, source=owner.source,
            writer_id=f"{owner.writer_id}-{index}", flush_interval_s=owner.flush_interval_s,
        )
        self._n_families = 0
        self.thread = threading.Thread(
            target=self._run, name=f"loadlab-scrape-{index}", daemon=True
        )

    def _run(self) -> None:
        owner, interval, clock = self.owner, self.owner.interval_s, self.owner.clock
        k = 0
        while True:
            wait = owner._t0 + k * interval - clock.monotonic()
            if wait > 0 and clock.wait(owner._stop, wait):
                break
            if owner._stop.is_set():
                break
            try:
                self._scrape_once()
            except Exception as exc:
                self._record(clock.time(), None, None, 0, f"collector error: {type(exc).__name__}")
            next_k = max(k + 1, math.floor((clock.monotonic() - owner._t0) / interval) + 1)
            for skipped in range(k + 1, next_k):
                self._record(owner._wall0 + skipped * interval, None, None, 0, "missed tick")
            k = next_k
        self.fetcher.close()

    def _scrape_once(self) -> None:
        clock = self.owner.clock
        t = clock.time()
        start = clock.monotonic()
        result = self.fetcher.fetch()
        n, error = 0, result.error
        if error is None:
            assert result.body is not None  # a FetchResult has exactly one of body and error
            try:
                scrape = self.parser.parse(result.body.decode("utf-8", errors="replace"))
            except ExpositionError:
                error = "parse error"
            else:
                n = len(scrape.ids)
                if n == 0:
                    error = "no vllm metrics"
                else:
                    self.sink.add_scrape(t, clock.monotonic() - start, scrape)
                    if len(self.parser.families) != self._n_families:
                        self._n_families = len(self.parser.families)
                        self.owner._describe(self.label, self.parser, scrape.ids)
        self._record(t, clock.monotonic() - start, result.status, n, error)

    def _record(
        self, t: float, duration: float | None, status: int | None, n: int, error: str | None
    ) -> None:
        self.owner._scrapes.add(
            {"t": t, "endpoint": self.label, "duration_s": duration, "ok": error is None,
                 "http_status": status, "n_samples": n, "error": error}
        )
        with self.owner._changed:
            st = self.stats
            if error == "missed tick":
                st.missed += 1
            else:
                st.attempts += 1
                st.ok += error is None
            st.last_error = error if error is not None else st.last_error
            st.last_t = max(t, st.last_t or t)
            self.owner._changed.notify_all()


class Scraper:
    """Samples endpoints' /metrics into ``out_dir`` until stopped.

    Use as a context manager, or call :meth:`start` and :meth:`stop`.
    """

    def __init__(
        self,
        endpoints: Sequence[str],
        out_dir: str | Path,
        *,
        interval_s: float = 1.0,
        timeout_s: float | None = None,
        api_key_env: str = DEFAULT_API_KEY_ENV,
        source: str = "direct",
        flush_interval_s: float = 5.0,
        write_manifest: bool = True,
        clock: Clock | None = None,
        tls: TlsSettings | None = None,
    ) -> None:
        if not endpoints:
            raise InputError(
                "no endpoint to scrape", field="ENDPOINT", fix="give at least one server URL"
            )
        if not interval_s >= MIN_INTERVAL_S:
            raise InputError(
                f"interval {interval_s} s is below {MIN_INTERVAL_S} s",
                field="--interval",
                fix=f"use an interval of at least {MIN_INTERVAL_S} s",
            )
        timeout_s = 0.8 * interval_s if timeout_s is None else timeout_s
        if not 0 < timeout_s < interval_s:
            raise InputError(f"scrape timeout {timeout_s} s must be above 0 and below the interval "
                             f"{interval_s} s", field="--timeout",
                             fix="leave it unset (0.8 x interval) or lower it")
        self.clock: Clock = clock or SystemClock()
        self.interval_s = float(interval_s)
        self.timeout_s = float(timeout_s)
        self.out_dir = Path(out_dir)
        self.source = source
        self.flush_interval_s = flush_interval_s
        self.write_manifest = write_manifest
        self.api_key_env = api_key_env
        key = os.environ.get(api_key_env)
        self._headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.writer_id = f"{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self._scrapes = PartWriter(self.out_dir / SCRAPES_TABLE, SCRAPES,
                                   writer_id=self.writer_id, flush_interval_s=flush_interval_s)
        self._stop = threading.Event()
        self._changed = threading.Condition()
        self._manifest_lock = threading.Lock()
        self._info: dict[str, dict[str, Any]] = {}
        labels = list(dict.fromkeys(endpoint_urls(e) for e in endpoints))  # same server once
        # https endpoints: one context for all (building one reads the CA store)
        https = any(url.startswith("https://") for _, url in labels)
        self._tls = (tls or TlsSettings()).context() if https else None
        self._loops = [_EndpointLoop(self, label, url, i) for i, (label, url) in enumerate(labels)]
        self._t0 = 0.0
        self._wall0 = 0.0
        self._started = False
        self.write_errors: list[str] = []

    @property
    def endpoints(self) -> list[str]:
        return [loop.label for loop in self._loops]

    def stats(self) -> dict[str, EndpointStats]:
        """A snapshot of every endpoint's counters."""
        with self._changed:
            return {loop.label: EndpointStats(**vars(loop.stats)) for loop in self._loops}

    def wait_until(
        self, predicate: Callable[[dict[str, EndpointStats]], bool], timeout_s: float
    ) -> bool:
        """Block until ``predicate(stats())`` holds or ``timeout_s`` passes."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while True:
                snapshot = {loop.label: EndpointStats(**vars(loop.stats)) for loop in self._loops}
                if predicate(snapshot):
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(left)

    def start(self) -> Scraper:
        if self._started:
            return self
        self._started = True
        if self.write_manifest:
            update_manifest(self.out_dir, metrics={
                "interval_s": self.interval_s, "timeout_s": self.timeout_s,
                "endpoints": {}, "api_key_env": self.api_key_env,
            })
        self._t0 = self.clock.monotonic()
        self._wall0 = self.clock.time()
        for loop in self._loops:
            loop.thread.start()
        return self

    def stop(self) -> None:
        """Stop sampling and write every buffered row; safe to call twice.

        Never raises for a table that cannot be written (a load run beside the collector
        must still close its own): its rows stay in memory and ``write_errors`` says why.
        """
        self._stop.set()
        for loop in self._loops:
            if loop.thread.is_alive():
                loop.thread.join(self.interval_s + self.timeout_s + 5.0)
        self.write_errors = []
        for writer in [*(loop.sink for loop in self._loops), self._scrapes]:
            try:
                writer.close()
            except StoreError as exc:
                self.write_errors.append(str(exc))

    def sync(self) -> bool:
        """Wait until every endpoint has a row begun from now on (a scrape, or a failed or
        missed one: a dead server does not hold this up), then write every buffered row.
        False when that took longer than two intervals and a timeout (then what came is
        written all the same)."""
        now = self.clock.time()
        came = self.wait_until(lambda stats: all((s.last_t or 0.0) >= now for s in stats.values()),
                               2 * self.interval_s + self.timeout_s)
        for writer in [*(loop.sink for loop in self._loops), self._scrapes]:
            try:
                writer.flush()
            except StoreError as exc:
                self.write_errors.append(str(exc))
        return came

    def __enter__(self) -> Scraper:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _describe(self, label: str, parser: ExpositionParser, ids: list[int]) -> None:
        """Record what one endpoint exposes in the manifest."""
        info = describe_endpoint(parser, ids)
        with self._manifest_lock:  # endpoints report in any order; the last write has all
            with self._changed:
                self._info[label] = info
                endpoints = dict(self._info)
            if not self.write_manifest:
                return
            first = endpoints[min(endpoints, key=self.endpoints.index)]
            update_manifest(self.out_dir, metrics={
                "endpoints": endpoints,
                "names_found": first["names_found"],
                "vllm_engine": first["vllm_engine"],
                "cache_config_info": first["cache_config_info"],
            })

    def endpoint_info(self) -> dict[str, dict[str, Any]]:
        """What each endpoint exposed (families, roles, V1/V0, cache config)."""
        with self._changed:
            return dict(self._info)
