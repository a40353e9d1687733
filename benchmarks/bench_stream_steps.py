"""What reading the engine steps from the client's token streams costs the analyzer.

:func:`loadlab.analyze.stream_steps.step_figures` sorts every streamed token of the stalled
span, so its cost grows with the tokens read; :data:`~loadlab.analyze.stream_steps.MAX_TOKENS`
bounds them. Each size runs in a fresh process, so its peak RSS is its own: synthetic
streams of N requests of 200 tokens each (20 ms steps over an hour, 30 stalled windows), the
columns the analyzer reads, then the figures.

    python benchmarks/bench_stream_steps.py [--requests 10000 100000]
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import time

import numpy as np
import pandas as pd

TOKENS = 200
STEP_S = 0.02


def streams(n: int) -> pd.DataFrame:
    """``n`` requests sent over an hour, each streaming TOKENS tokens one per step."""
    rng = np.random.default_rng(0)
    sent = np.sort(rng.uniform(0, 3600, n))
    first = np.ceil((sent + rng.uniform(0, 0.5, n)) / STEP_S) * STEP_S
    return pd.DataFrame({
        "t_sent": sent, "t_first_token": first, "t_done": first + (TOKENS - 1) * STEP_S,
        "prompt_tokens": rng.integers(50, 2000, n), "output_tokens": TOKENS,
        "itl_p50_s": STEP_S,
        "chunk_offsets_s": [np.arange(TOKENS) * STEP_S + (f - s) for s, f in zip(sent, first)]})


def measure(n: int) -> None:
    from loadlab.analyze.stream_steps import step_figures

    frame = streams(n)
    windows = pd.DataFrame({"t_start": np.arange(0, 3600, 120.0),
                            "t_end": np.arange(120, 3720, 120.0)})
    floor = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    wall, cpu = time.perf_counter(), time.process_time()
    step_figures(frame, windows, pool=50_000, block_size=16, typical_blocks=30)
    print(f"{n * TOKENS:>12,} tokens  wall {time.perf_counter() - wall:6.2f} s  "
          f"CPU {time.process_time() - cpu:6.2f} s  peak RSS {floor:,} MB with the streams "
          f"-> {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024:,} MB", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, nargs="+", default=[10_000, 100_000])
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        measure(args.one)
        return
    for n in args.requests:
        subprocess.run([sys.executable, __file__, "--one", str(n)], check=True)


if __name__ == "__main__":
    main()
