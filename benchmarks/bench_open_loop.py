"""How late the open-loop dispatcher sends: send lag at rising request rates.

The tests check that every arrival of a seeded schedule goes out, due at its absolute
offset, with its lateness recorded (``send_lag_s``); how small that lateness stays is
the client's speed, measured here and never asserted.

Per rate: ``loadlab run --rate R --burstiness 1000`` (near-even gaps), one worker,
against the simulator in fast mode (``--time-scale``: the server is not the bottleneck),
``sharegpt`` lengths. Reported after the warm-up: requests sent (and how many were not
answered ok), send lag median / p99 / max (t_sent - t_scheduled) and the achieved rate
over the actual send times.

Usage: ``python benchmarks/bench_open_loop.py [--rates 50,100,200,400] [--duration 6]``
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from loadlab.runstore import REQUESTS, read_manifest, read_table
from loadlab.sim.serve.testing import running_sim

MODEL = "bench-model"


def measure(url: str, rate: float, duration: float, warmup: float, out: Path) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "loadlab",
        "run",
        "--target",
        url,
        "--model",
        MODEL,
        "--profile",
        "sharegpt",
        "--rate",
        str(rate),
        "--burstiness",
        "1000",
        "--step-duration",
        str(duration),
        "--warmup",
        str(warmup),
        "--workers",
        "1",
        "--no-calibrate",
        "--out",
        str(out),
    ]
    subprocess.run(cmd, check=True, capture_output=True)
    step = read_manifest(out)["steps"][0]
    df = read_table(out / "requests.parquet", REQUESTS)
    df = df[df.t_scheduled >= step["t_start"] + step["warmup_s"]]
    lag_ms = df.send_lag_s.to_numpy() * 1e3
    sent = np.sort(df.t_sent.to_numpy())
    return {
        "rate": rate,
        "n": len(df),
        "not_ok": int((df.status != "ok").sum()),
        "p50": np.median(lag_ms),
        "p99": np.percentile(lag_ms, 99),
        "max": lag_ms.max(),
        "achieved": (len(sent) - 1) / (sent[-1] - sent[0]),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", default="50,100,200,400")
    ap.add_argument("--duration", type=float, default=6.0)
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--time-scale", type=float, default=20.0)
    args = ap.parse_args()
    print(f"{'rate/s':>7} {'sent':>6} {'not ok':>6} {'lag p50 ms':>11} {'p99 ms':>8} {'max ms':>8} "
          f"{'achieved/s':>11}")
    with (running_sim(served_model_name=MODEL, time_scale=args.time_scale, max_num_seqs=512) as url,
          tempfile.TemporaryDirectory() as tmp):
        for rate in (float(r) for r in args.rates.split(",")):
            r = measure(url, rate, args.duration, args.warmup, Path(tmp) / f"rate-{rate:g}")
            print(
                f"{r['rate']:7g} {r['n']:6d} {r['not_ok']:6d} {r['p50']:11.2f} {r['p99']:8.2f} "
                f"{r['max']:8.2f} "
                f"{r['achieved']:11.1f}"
            )


if __name__ == "__main__":
    main()
