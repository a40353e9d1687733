"""Drive a closed-loop step load at a live server and read back per-step figures.

The load runs as ``loadlab run`` (a subprocess, in-process Locust: ``--workers 0``) into
``<run>/load``, on the client CPUs of :data:`realvllm.ISOLATION` (the server has the
others); beside it, in this process, the collector's Scraper samples /metrics into
``<run>/server`` (a separate folder, so neither rewrites the other's manifest) from a
thread started on the client CPUs too. Per-step windows come from the load's manifest,
with each step's warm-up cut. A load the client could not apply (``loadlab run`` exit 3)
fails here with its reasons, unless the caller expects that (a benchmark of placements).
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from realvllm import ISOLATION

from loadlab.analyze.windows import counter_windows, gauge_windows, histogram_windows
from loadlab.collect.scraper import Scraper
from loadlab.experiment.cpus import CpuSet, format_cpu_list, inherited_affinity
from loadlab.experiment.launcher import LaunchedTarget
from loadlab.runstore import read_table
from loadlab.runstore.schema import METRICS, REQUESTS

PROFILES = Path(__file__).parent / "profiles"


@dataclass
class LoadResult:
    run: Path
    steps: pd.DataFrame          # step, concurrency, t_start (after warm-up), t_end
    requests: pd.DataFrame
    metrics: pd.DataFrame
    server_manifest: dict

    def gauge(self, family: str) -> pd.DataFrame:
        return gauge_windows(self.metrics, family, self._windows()).set_index("concurrency")

    def histogram(self, family: str) -> pd.DataFrame:
        return histogram_windows(self.metrics, family, self._windows()).set_index("concurrency")

    def counter(self, family: str) -> pd.DataFrame:
        return counter_windows(self.metrics, family, self._windows()).set_index("concurrency")

    def total(self, family: str) -> float:
        """Increase of a counter over the whole run (first to last sample)."""
        t0, t1 = self.metrics.t.min(), self.metrics.t.max()
        return float(counter_windows(self.metrics, family, [(t0, t1)])["delta"].sum())

    def client_ttft(self) -> pd.Series:
        """Mean client TTFT per step over :meth:`counted_requests`."""
        return pd.Series({c: rows.ttft_s.mean() for c, rows in self.counted_requests().items()})

    def counted_requests(self) -> dict[int, pd.DataFrame]:
        """Per step, the ok requests vLLM's TTFT histogram counted there: first tokens
        between the two scrapes whose difference is the window's histogram delta (the last
        scrape at or before each edge, as ``histogram_windows`` takes them). Over the window
        itself client and server means would cover different requests, and at 16 users on
        the seq cap TTFTs range 0.3-1.8 s: their means differed by up to 50 ms that way."""
        ok = self.requests[self.requests.status == "ok"]
        family = self.metrics[self.metrics.family == "vllm:time_to_first_token_seconds"]
        scrapes = np.sort(family.t.unique())
        out = {}
        for s in self.steps.itertuples():
            first, last = np.searchsorted(scrapes, [s.t_start, s.t_end], side="right") - 1
            t0, t1 = scrapes[max(first, 0)], scrapes[last]
            out[s.concurrency] = ok[(ok.t_first_token >= t0) & (ok.t_first_token < t1)]
        return out

    def _windows(self) -> pd.DataFrame:
        return self.steps[["t_start", "t_end", "concurrency"]]


def run_steps(target: LaunchedTarget, run: Path, profile: str, levels: list[int],
              step_s: float, warmup_s: float, interval_s: float = 0.5,
              client_cpus: CpuSet | None = ISOLATION.client_cpus,
              client_limited_ok: bool = False) -> LoadResult:
    """One closed-loop step load with metrics sampled beside it."""
    load_dir, server_dir = run / "load", run / "server"
    argv = [sys.executable, "-m", "loadlab", "run", "--target", target.base_url, "--model",
            target.model, "--profile", str(PROFILES / f"{profile}.yaml"), "--concurrency",
            ",".join(map(str, levels)), "--step-duration", str(step_s), "--warmup", str(warmup_s),
            "--workers", "0", "--drain", "20", "--out", str(load_dir)]
    if client_cpus is not None:
        argv += ["--client-cpus", format_cpu_list(client_cpus)]
    scraper = Scraper([target.base_url], server_dir, interval_s=interval_s)
    with inherited_affinity(client_cpus):
        scraper.start()
    try:
        proc = subprocess.run(
            argv, capture_output=True, text=True, timeout=step_s * len(levels) + 120, check=False
        )
    finally:
        scraper.stop()
    ok = (0, 3) if client_limited_ok else (0,)
    assert proc.returncode in ok, (
        f"loadlab run failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    )
    manifest = json.loads((load_dir / "manifest.json").read_text())
    steps = pd.DataFrame(manifest["steps"])
    steps["t_start"] = steps["t_start"] + steps["warmup_s"]
    return LoadResult(
        run=run, steps=steps,
        requests=read_table(load_dir / "requests.parquet", REQUESTS),
        metrics=read_table(server_dir / "metrics.parquet", METRICS),
        server_manifest=json.loads((server_dir / "manifest.json").read_text()),
    )
