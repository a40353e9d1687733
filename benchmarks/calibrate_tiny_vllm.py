"""Fit the simulator's step-time constants to the tiny model on a REAL vLLM, then check them.

Needs ``bash tools/install_vllm.sh``. About 4 minutes on 2 cores. Run it on a quiet
machine: on 2 shared cores a neighbour's load moves the server's step times by tens of
percent.

One server, ``--max-num-seqs 4`` (the seq-cap step load of tests/vllm), three loads on it:
a 512-token prompt alone (``tiny-prefill``); the FIT load, closed-loop concurrency 1, 2, 4
with 64-token prompts and 32-token outputs (``tiny-short``); the CHECK load, concurrency 3,
6, 12 with 160-token prompts and 48-token outputs (``tiny-check``). The constants come
from the fit load only; the check load (other levels, two of them past the cap, other
prompt and output lengths) is held out, so its errors say how well the model predicts
what it was not fitted on, and the fit load's own errors are reported beside them. One
server for both: two servers started minutes apart here differed by 25-35% in step time
(ITL with 4 running: 7.6 vs 5.6 ms), more than the tolerance, so a fit on one and a check
on the other measured the machine.

Model fitted (one engine step, seconds):  step_s = A + B x num_requests + D x tokens.
Every figure comes from vLLM's own histograms (means from _sum/_count deltas, exact
whatever the buckets), their durations stamped in the engine core:
  - decode with n running: ITL = A + (B + D) n      -> A and S = B + D, least squares over
    ``vllm:inter_token_latency_seconds`` at each fit level, n = c;
  - prefill alone at concurrency 1, ``vllm:request_prefill_time_seconds`` (scheduled ->
    first token): a 64-token prompt is one step, A + B + 64 D; a 512-token prompt is two
    256-token chunks (the server's max_num_batched_tokens), 2A + 2B + 512 D -> D from the
    difference P512 - 2 P64 = 384 D, then B = S - D;
  - the front end F = TTFT - queue - prefill (API server to the engine's queue and the
    first token back) and the closed loop's turnaround R = per-user cycle (c x 32 tokens /
    tokens per s) - (queue + prefill + decode), the time a user's next request takes to
    reach the engine after its previous one ended (API server both ways, the client), at
    the fit levels (all at or below the cap). Neither is a constant here: the API server
    shares the server's CPU with the engine core, which busy-polls the worker, so both grow
    with the token rate it streams (F 5.9 -> 13.9 ms, R 13 -> 48 ms from 170 to 510 tokens/s,
    measured with the client on the same cores). Each is fitted as a line in that rate.
Server and client run on CPUs of their own (``tiny_vllm`` and ``run_steps``: on 2 cores
vLLM on core 0, the load generator and the scraper on core 1), so the client's own
starvation stays out of F and R; a load the client could not apply stops the calibration.
Check, per level of each load: server TTFT mean (engine TTFT + F at the simulated rate)
and output tokens/s, real against loadlab's Engine in virtual time with that step time,
two ways:
  - closed loop: each user's next request reaches the engine R(rate) after its previous
    one ended, the rate found as a fixed point (TTFT at 6 and 12 is the queue the cap
    builds);
  - the real run's arrivals: its requests fed to the Engine at their send times, so the
    client's and API server's delays leave the comparison. An open loop: at the levels
    that queue, a step-rate error of a few percent grows the queue over the step, so
    read it below the cap.
"""

from __future__ import annotations

import json
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "vllm"))  # reuse the e2e tests' load helper

from loadrun import LoadResult, run_steps
from realvllm import missing_reason, tiny_vllm

from loadlab.sim.engine.core import Engine
from loadlab.sim.engine.types import BatchShape, EngineRequest, SchedulerSettings

CAP = 4  # --max-num-seqs: check levels 6 and 12 queue
STEP_S, WARMUP_S = 15.0, 2.0


@dataclass(frozen=True)
class Load:
    """A closed-loop step load: profile (tests/vllm/profiles), its fixed lengths, levels."""

    profile: str
    prompt: int
    output: int
    levels: tuple[int, ...]


PREFILL = Load("tiny-prefill", 512, 4, (1,))
FIT = Load("tiny-short", 64, 32, (1, 2, 4))
CHECK = Load("tiny-check", 160, 48, (3, 6, 12))


def tiny_settings(max_num_seqs: int) -> SchedulerSettings:
    """The server's scheduler and cache flags (BASE_FLAGS), for the engine."""
    return SchedulerSettings(max_num_seqs=max_num_seqs, max_num_batched_tokens=256, block_size=32,
                             num_gpu_blocks=512, max_model_len=1024, enable_prefix_caching=True,
                             enable_chunked_prefill=True, long_prefill_token_threshold=0,
                             scheduler_reserve_full_isl=True)


FAMILIES = {"ttft_s": "time_to_first_token_seconds", "itl_s": "inter_token_latency_seconds",
            "queue_s": "request_queue_time_seconds", "prefill_s": "request_prefill_time_seconds",
            "decode_s": "request_decode_time_seconds"}


def measure(flags: dict, work: Path, runs: list[Load]) -> tuple[dict, dict]:
    """Per profile and concurrency: histogram means of FAMILIES and output tokens/s; and
    per profile the run itself (requests, windows)."""
    out, loads = {}, {}
    with tiny_vllm(work / "server", **flags) as target:
        for load in runs:
            profile, levels = load.profile, list(load.levels)
            res = run_steps(target, work / profile, profile, levels, STEP_S, WARMUP_S)
            means = {
                key: res.histogram(f"vllm:{family}")["mean"] for key, family in FAMILIES.items()
            }
            gen = res.counter("vllm:generation_tokens")["rate_per_s"]
            out[profile] = {int(c): {**{k: float(m[c]) for k, m in means.items()},
                                     "tokens_per_s": float(gen[c])} for c in levels}
            loads[profile] = res
    return out, loads


def sim_step_load(
    cfg: SchedulerSettings, step_time, load: Load, turnaround_s: dict[int, float]
) -> dict:
    """Closed loop in virtual time: at level c each user's next request reaches the engine
    ``turnaround_s[c]`` after its previous one ended."""
    prompt, output = load.prompt, load.output
    engine = Engine(cfg, step_time)  # type: ignore[arg-type]
    now, seq, result, users = 0.0, 0, {}, 0
    arrivals: dict[str, float] = {}
    pending: list[float] = []           # engine arrival times of the next requests

    def admit_due() -> None:
        nonlocal seq
        due = [t for t in pending if t <= now]
        for t in due:
            pending.remove(t)
            engine.add_request(EngineRequest(f"q{seq}", [1000 + seq] + [7] * (prompt - 1), output,
                                             output, t))
            arrivals[f"q{seq}"], seq = t, seq + 1

    for c in load.levels:
        t_end, t_meas = now + STEP_S, now + WARMUP_S
        pending += [now] * max(0, c - users)
        users = c
        ttfts, tokens = [], 0
        while now < t_end:
            admit_due()
            out = engine.step(now)
            if out is None:                 # idle until the next user's request arrives
                now = min(pending)
                continue
            now = out.t_end
            if now >= t_meas:
                tokens += sum(out.new_tokens.values())
                ttfts += [now - arrivals[r] for r in out.first_token]
            pending += [now + turnaround_s[c]] * len(out.finished)
        result[c] = {"ttft_s": float(np.mean(ttfts)), "tokens_per_s": tokens / (now - t_meas)}
    return result


def sim_same_arrivals(cfg: SchedulerSettings, step_time, res: LoadResult) -> dict:
    """The real run's requests (send time, prompt and output lengths as vLLM counted them)
    fed to the Engine at the same times: per step window, engine TTFT mean of the first
    tokens inside it and output tokens/s. Client and API-server delays leave the comparison."""
    engine = Engine(cfg, step_time)  # type: ignore[arg-type]
    reqs = res.requests.dropna(subset=["prompt_tokens", "output_tokens"]).sort_values("t_sent")
    arrivals = list(
        zip(reqs.t_sent, reqs.prompt_tokens.astype(int), reqs.output_tokens.astype(int))
    )
    sent: dict[str, float] = {}
    firsts: list[tuple[float, float]] = []
    steps: list[tuple[float, int]] = []
    now, i = arrivals[0][0], 0
    while i < len(arrivals) or engine.has_unfinished_requests():
        while i < len(arrivals) and arrivals[i][0] <= now:
            t, prompt, output = arrivals[i]
            engine.add_request(
                EngineRequest(f"r{i}", [1000 + i] + [7] * (prompt - 1), output, output, t)
            )
            sent[f"r{i}"], i = t, i + 1
        out = engine.step(now)
        if out is None:
            now = arrivals[i][0]
            continue
        now = out.t_end
        firsts += [(now, now - sent[r]) for r in out.first_token]
        steps.append((now, sum(out.new_tokens.values())))
    first_t, first_v = np.array(firsts).T
    step_t, step_n = np.array(steps).T
    result = {}
    for w in res.steps.itertuples():
        inside = (first_t >= w.t_start) & (first_t < w.t_end)
        done = (step_t >= w.t_start) & (step_t < w.t_end)
        result[int(w.concurrency)] = {
            "ttft_s": float(first_v[inside].mean()),
            "tokens_per_s": float(step_n[done].sum() / (w.t_end - w.t_start)),
        }
    return result


def compare(real: dict, sim: dict, front_s: Callable[[float], float]) -> list[dict]:
    """Per level: server TTFT mean and output tokens/s, real against simulated (engine TTFT
    plus the front end at the simulated token rate)."""
    rows = []
    for lvl in sorted(real):
        r, s = real[lvl], sim[lvl]
        sim_ttft = float(s["ttft_s"] + front_s(s["tokens_per_s"]))
        rows.append(
            {
                "concurrency": lvl,
                "real_ttft_ms": round(r["ttft_s"] * 1e3, 1),
                "sim_ttft_ms": round(sim_ttft * 1e3, 1),
                "ttft_err": round(sim_ttft / r["ttft_s"] - 1, 3),
                "real_tok_s": round(r["tokens_per_s"], 1),
                "sim_tok_s": round(float(s["tokens_per_s"]), 1),
                "tok_s_err": round(float(s["tokens_per_s"] / r["tokens_per_s"]) - 1, 3),
            }
        )
    return rows


@dataclass
class Fit:
    """The fitted constants (seconds; per-rate terms in seconds per output token/s)."""

    A_step_s: float
    B_per_request_s: float
    D_per_token_s: float
    F0_front_s: float
    f_front_per_rate: float
    R0_turnaround_s: float
    r_turnaround_per_rate: float

    def step_time(self, batch: BatchShape) -> float:
        return (self.A_step_s + self.B_per_request_s * batch.num_requests
                + self.D_per_token_s * (batch.num_prefill_tokens + batch.num_decode_tokens))

    def front_s(self, tokens_per_s: float) -> float:
        return self.F0_front_s + self.f_front_per_rate * tokens_per_s

    def turnaround_s(self, tokens_per_s: float) -> float:
        return self.R0_turnaround_s + self.r_turnaround_per_rate * tokens_per_s


def fit(data: dict) -> Fit:
    """The constants from one server's measurements (see the module docstring)."""
    short, long = data[FIT.profile], data[PREFILL.profile][1]
    levels = list(FIT.levels)
    running = np.minimum(np.array(levels, float), CAP)
    S, A = np.polyfit(running, [short[c]["itl_s"] for c in levels], 1)
    # a PREFILL prompt is two max_num_batched_tokens chunks, a FIT prompt one step
    D = (long["prefill_s"] - 2 * short[1]["prefill_s"]) / (PREFILL.prompt - 2 * FIT.prompt)
    # Front end and turnaround as lines in the token rate the API server streams: it shares
    # the server's CPU with the engine core's busy-polling.
    free = [c for c in levels if c <= CAP]
    rate = [short[c]["tokens_per_s"] for c in free]
    front = [short[c]["ttft_s"] - short[c]["queue_s"] - short[c]["prefill_s"] for c in free]
    turn = [c * FIT.output / short[c]["tokens_per_s"]
            - (short[c]["queue_s"] + short[c]["prefill_s"] + short[c]["decode_s"]) for c in free]
    f, F0 = np.polyfit(rate, front, 1)
    r, R0 = np.polyfit(rate, turn, 1)
    return Fit(float(A), float(S - D), float(D), float(F0), float(f), float(R0), float(r))


def check(model: Fit, load: Load, real: dict, run: LoadResult) -> dict[str, list[dict]]:
    """Simulated against measured for one load, as a closed loop and with the real run's
    arrivals."""
    sim: dict = {c: {"tokens_per_s": 0.0} for c in load.levels}
    for _ in range(4):  # the turnaround depends on the rate it helps set: a fixed point
        turnaround = {c: model.turnaround_s(sim[c]["tokens_per_s"]) for c in load.levels}
        sim = sim_step_load(tiny_settings(CAP), model.step_time, load, turnaround)
    same = sim_same_arrivals(tiny_settings(CAP), model.step_time, run)
    return {"closed loop, turnaround R(rate)": compare(real, sim, model.front_s),
            "the real run's arrivals": compare(real, same, model.front_s)}


def main() -> None:
    reason = missing_reason()
    if reason:
        sys.exit(reason)
    work = Path(tempfile.mkdtemp(prefix="calibrate-"))
    data, loads = measure(
        {"max_num_seqs": CAP, "num_gpu_blocks_override": 512}, work, [PREFILL, FIT, CHECK]
    )
    model = fit(data)
    print("fit:", {k: f"{v * 1e3:.4f} ms" for k, v in asdict(model).items()})
    checks = {}
    for name, load in (("fit load (in sample)", FIT), ("check load (held out)", CHECK)):
        checks[name] = check(model, load, data[load.profile], loads[load.profile])
        for title, rows in checks[name].items():
            print(
                f"simulator vs vLLM, {name}: {load.profile} "
                f"({load.prompt} in, {load.output} out), {title}:"
            )
            for row in rows:
                print("  ", row)
    (work / "calibration.json").write_text(json.dumps({"fit": asdict(model), "measured": data,
                                                       "check": checks}, indent=2))
    print(f"written {work / 'calibration.json'}")


if __name__ == "__main__":
    main()
