"""Fit the simulator's step-time constants to the tiny model on a REAL vLLM, then check them.

Needs ``bash tools/install_vllm.sh``. About 6 minutes on 2 cores (two server starts).

Model fitted (one engine step, seconds):  step_s = A + B x num_requests + D x tokens
  - decode at batch c: ITL_c = A + (B + D) c       -> A and S = B + D from vLLM's own
    ``vllm:inter_token_latency_seconds`` mean at closed-loop concurrency 1, 2, 4, 8, 16
    (max_num_seqs 16, 64-token prompts, 32-token outputs; least squares);
  - prefill of L tokens alone: TTFT(L) = F + A + B + D L, from the server's TTFT mean at
    concurrency 1 with 64- and 512-token prompts -> D (slope), then B = S - D, and F, the
    front-end time outside engine steps (API server, IPC, detokenising).
Check: a second server (max_num_seqs 4, the seq-cap step load of tests/vllm) measured
against loadlab's Engine driven in virtual time with that step time: per step, server
TTFT mean (sim TTFT + F) and output tokens/s, and their relative error.
Means come from histogram _sum/_count deltas, exact whatever the buckets.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "vllm"))  # reuse the e2e tests' load helper

from loadrun import run_steps
from realvllm import BASE_FLAGS, VLLM_ENV, flag_list, missing_reason, tiny_model_dir

from loadlab.sim.engine import Engine
from loadlab.sim.types import BatchShape, EngineRequest, SchedulerSettings
from loadlab.sweep import launch_target

LEVELS = [1, 2, 4, 8, 16]
STEP_S, WARMUP_S = 8.0, 2.0


def tiny_settings(max_num_seqs: int) -> SchedulerSettings:
    """The second server's scheduler and cache flags (BASE_FLAGS), for the engine."""
    return SchedulerSettings(max_num_seqs=max_num_seqs, max_num_batched_tokens=256, block_size=32,
                             num_gpu_blocks=512, max_model_len=1024, enable_prefix_caching=True,
                             enable_chunked_prefill=True, long_prefill_token_threshold=0,
                             scheduler_reserve_full_isl=True)


def measure(flags: dict, work: Path, runs: list[tuple[str, list[int]]]) -> dict:
    out = {}
    argv = [str(tiny_model_dir()), *flag_list({**BASE_FLAGS, **flags})]
    with launch_target("vllm", argv, work / "server", env=VLLM_ENV) as target:
        for profile, levels in runs:
            res = run_steps(target, work / profile, profile, levels, STEP_S, WARMUP_S)
            ttft = res.histogram("vllm:time_to_first_token_seconds")["mean"]
            itl = res.histogram("vllm:inter_token_latency_seconds")["mean"]
            gen = res.counter("vllm:generation_tokens")["rate_per_s"]
            out[profile] = {int(c): {"ttft_s": float(ttft[c]), "itl_s": float(itl[c]),
                                     "tokens_per_s": float(gen[c])} for c in levels}
    return out


def sim_step_load(cfg: SchedulerSettings, step_time, prompt: int, output: int) -> dict:
    """Closed loop in virtual time: each user resends the moment its request finishes."""
    engine = Engine(cfg, step_time)  # type: ignore[arg-type]
    now, seq, result = 0.0, 0, {}
    arrivals: dict[str, float] = {}
    users = 0
    for c in LEVELS:
        t_end, t_meas = now + STEP_S, now + WARMUP_S
        for _ in range(c - users):
            engine.add_request(EngineRequest(f"q{seq}", [1000 + seq] + [7] * (prompt - 1), output,
                                             output, now))
            arrivals[f"q{seq}"], seq = now, seq + 1
        users = c
        ttfts, tokens = [], 0
        while now < t_end:
            out = engine.step(now)
            assert out is not None
            now = out.t_end
            if now >= t_meas:
                tokens += sum(out.new_tokens.values())
                ttfts += [now - arrivals[r] for r in out.first_token]
            for fin in out.finished:
                engine.add_request(EngineRequest(f"q{seq}", [1000 + seq] + [7] * (prompt - 1),
                                                 output, output, now))
                arrivals[f"q{seq}"], seq = now, seq + 1
        result[c] = {"ttft_s": float(np.mean(ttfts)), "tokens_per_s": tokens / (now - t_meas)}
    return result


def main() -> None:
    reason = missing_reason()
    if reason:
        sys.exit(reason)
    work = Path(tempfile.mkdtemp(prefix="calibrate-"))
    fit_data = measure({"max_num_seqs": 16, "num_gpu_blocks_override": 512}, work / "fit",
                       [("tiny-short", LEVELS), ("tiny-prefill", [1])])
    short = fit_data["tiny-short"]
    c = np.array(LEVELS, float)
    itl = np.array([short[int(x)]["itl_s"] for x in LEVELS])
    S, A = np.polyfit(c, itl, 1)
    D = (fit_data["tiny-prefill"][1]["ttft_s"] - short[1]["ttft_s"]) / (512 - 64)
    B = S - D
    F = short[1]["ttft_s"] - (A + B + D * 64)
    fit = {"A_step_s": float(A), "B_per_request_s": float(B), "D_per_token_s": float(D),
           "F_front_s": float(F)}
    print("fit:", {k: f"{v * 1e3:.3f} ms" for k, v in fit.items()})

    def step_time(batch: BatchShape) -> float:
        return A + B * batch.num_requests + D * (batch.num_prefill_tokens + batch.num_decode_tokens)

    real = measure({"max_num_seqs": 4, "num_gpu_blocks_override": 512}, work / "check",
                   [("tiny-short", LEVELS)])["tiny-short"]
    sim = sim_step_load(tiny_settings(4), step_time, 64, 32)
    rows = []
    for lvl in LEVELS:
        r, s = real[lvl], sim[lvl]
        sim_ttft = float(s["ttft_s"] + F)
        rows.append({"concurrency": lvl, "real_ttft_ms": round(r["ttft_s"] * 1e3, 1),
                     "sim_ttft_ms": round(sim_ttft * 1e3, 1),
                     "ttft_err": round(sim_ttft / r["ttft_s"] - 1, 3),
                     "real_tok_s": round(r["tokens_per_s"], 1), "sim_tok_s": round(float(s["tokens_per_s"]), 1),
                     "tok_s_err": round(float(s["tokens_per_s"] / r["tokens_per_s"]) - 1, 3)})
    for row in rows:
        print(row)
    (work / "calibration.json").write_text(json.dumps({"fit": fit, "fit_data": fit_data,
                                                       "check": rows}, indent=2))
    print(f"written {work / 'calibration.json'}")


if __name__ == "__main__":
    main()
