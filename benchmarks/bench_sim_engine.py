"""Speed of the simulated engine alone (scheduler + block pool + timing model).

Closed loop at concurrency C (default 256) on Qwen2.5-7B / H100 defaults for SIM_S
simulated seconds (default 600): every finished request is replaced at once by a new
one (prompt 200-1200 tokens, output 32-480 tokens, seeded; 1 in 4 shares a 256-token
system prompt). Prints simulated seconds per wall second ("x real time") and microseconds
per step, for the reference scheduler and the decode fast path side by side. No observer:
metrics and records cost extra and are measured by bench_sim_replay.py.

    python benchmarks/bench_sim_engine.py [--concurrency 256] [--sim-seconds 600]
"""

from __future__ import annotations

import argparse
import random
import time

from loadlab.sim.engine.config import SimConfig
from loadlab.sim.engine.core import Engine
from loadlab.sim.engine.hardware import resolve
from loadlab.sim.engine.timing import StepTimeModel
from loadlab.sim.engine.types import EngineRequest


def run(concurrency: int, sim_seconds: float, seed: int = 0,
        reference: bool = False) -> dict[str, float]:
    resolved = resolve(SimConfig(model="qwen2.5-7b", gpu="h100"))
    engine = Engine(resolved, StepTimeModel(resolved).step_time, reference=reference)
    rng = random.Random(seed)
    pool = [rng.randrange(150_000) for _ in range(1 << 16)]  # prompts are slices of it
    system = pool[:256]
    sent = 0

    def send(now: float) -> None:
        nonlocal sent
        n = rng.randrange(200, 1200)
        start = rng.randrange(256, len(pool) - n)
        toks = pool[start:start + n]
        if sent % 4 == 0:
            toks[:256] = system
        out = rng.randrange(32, 480)
        engine.add_request(EngineRequest(f"r{sent}", toks, out, 512, now))
        sent += 1

    for _ in range(concurrency):
        send(0.0)
    now, steps, tokens = 0.0, 0, 0
    t0 = time.process_time()  # CPU time: the machine is shared, wall time is noisy
    while now < sim_seconds:
        out = engine.step(now)
        assert out is not None
        now = out.t_end
        steps += 1
        tokens += out.batch.num_decode_tokens
        for _ in out.finished:
            send(now)
    wall = time.process_time() - t0
    return {"sim_s": now, "cpu_s": wall, "x_real_time": now / wall, "steps": steps,
            "us_per_step": wall / steps * 1e6, "finished": sent - concurrency,
            "decode_tokens": tokens}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--sim-seconds", type=float, default=600.0)
    args = ap.parse_args()
    for reference in (True, False):
        r = run(args.concurrency, args.sim_seconds, reference=reference)
        name = "reference" if reference else "fastpath "
        print(name, " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                             for k, v in r.items()))


if __name__ == "__main__":
    main()
