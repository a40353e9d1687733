"""Ground truth for the analyzer: simulated scenarios whose knee and cause come from the
engine's own state, never from the run folder the analyzer reads.

A :class:`Scenario` is a simulator configuration and a closed-loop step plan built so that
one limit binds. :func:`run_scenario` replays it in virtual time with an observer on every
engine step and returns the run folder with its :class:`Truth`:

- a load step is *stalled* when, over its measured window (after the warm-up cut), the
  engine's waiting queue was non-empty for at least half the time (each engine step
  weighted by its duration, the queue read after the step);
- the true knee is the lowest level from which every higher level is stalled
  (``upper``; ``lower`` the level before it; ``upper`` None when nothing stalled);
- the true cause is why admission stopped, read per engine step that ended with a queue
  in the stalled load steps, by majority: ``seq_cap`` when running reached
  max_num_seqs, ``token_budget`` when the step's scheduled tokens filled
  max_num_batched_tokens, else ``kv_exhausted`` (the head's blocks did not fit);
  ``kv_exhausted`` becomes ``dashboard_caliber`` when the finished requests' tokens fill
  under half of the blocks they held (block rounding); ``none`` when nothing stalled.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from loadlab.replay.driver import ReplayOptions, run_replay
from loadlab.sim.engine.config import SimConfig
from loadlab.sim.engine.hardware import resolve
from loadlab.sim.engine.types import StepOutput
from loadlab.spec.plan import LoadPlan
from loadlab.spec.scenario import Workload

PROFILES = Path(__file__).parent / "profiles"
STALLED_SHARE = 0.5
CALIBER_FILL = 0.5


@dataclass(frozen=True)
class Scenario:
    name: str
    cfg: SimConfig
    levels: tuple[float, ...]       # users per step, or requests/s with open_loop
    profile: str
    step_s: float = 60.0
    warmup_s: float = 15.0
    open_loop: bool = False


@dataclass
class Truth:
    upper: int | None
    lower: int | None
    cause: str
    stalled_share: dict[int, float]
    reasons: dict[str, int]


@dataclass
class EngineLog:
    """Per engine step: duration, queue and running after it, tokens scheduled, preemptions."""

    t_start: list[float] = field(default_factory=list)
    t_end: list[float] = field(default_factory=list)
    waiting: list[int] = field(default_factory=list)
    running: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    fill: list[float] = field(default_factory=list)

    def __call__(self, out: StepOutput) -> None:
        self.t_start.append(out.t_start)
        self.t_end.append(out.t_end)
        self.waiting.append(out.num_waiting)
        self.running.append(out.num_running)
        self.tokens.append(sum(out.scheduled.values()))

    def block_fill(self, out: StepOutput, block_size: int) -> None:
        for f in out.finished:
            total = f.prompt_len + f.output_len
            self.fill.append(total / (math.ceil(total / block_size) * block_size))


def _profile(name: str) -> str:
    return str(PROFILES / f"{name}.yaml")


# One scenario per cause the simulator can produce; each names the limit built to bind.
SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    # a roomy pool, 8 sequences: the cap binds from 12 users
    Scenario("seq_cap", SimConfig(model="qwen2.5-7b", gpu="h100", max_num_seqs=8),
             (2, 4, 6, 8, 12, 16, 24), "azure-conv"),
    # ~2.7k-token translations in a 1,200-block pool: KV runs out near 8-12 users
    Scenario("kv_exhausted", SimConfig(model="llama-3.1-8b", gpu="h100", max_num_seqs=256,
                                       num_gpu_blocks_override=1200, max_model_len=4096),
             (1, 2, 4, 6, 8, 12, 16, 24), "bwb"),
    # 3k-token prompts through a 512-token budget: prefill chunks fill every step
    Scenario("token_budget", SimConfig(model="llama-3.1-8b", gpu="h100", max_num_seqs=256,
                                       max_num_batched_tokens=512, max_model_len=4096),
             (1, 2, 4, 6, 8, 12, 16), _profile("long-prompt")),
    # ~100-token requests in 256-token blocks, 23 usable: the pool is full of air
    Scenario("dashboard_caliber", SimConfig(model="llama-3.1-8b", gpu="h100", max_num_seqs=256,
                                            block_size=256, num_gpu_blocks_override=24,
                                            max_model_len=1024),
             (8, 12, 16, 24, 32, 48), _profile("short-chat"), step_s=40.0, warmup_s=10.0),
    # open loop: Poisson arrivals past what 8 sequences serve (~5 requests/s)
    Scenario("seq_cap_open", SimConfig(model="qwen2.5-7b", gpu="h100", max_num_seqs=8),
             (1.0, 2.0, 3.0, 4.0, 6.0, 8.0), "azure-conv", open_loop=True),
    # nothing binds up to 16 users
    Scenario("none", SimConfig(model="qwen2.5-7b", gpu="h100", max_num_seqs=64),
             (1, 2, 4, 8, 16), "azure-conv"),
)}


def run_scenario(sc: Scenario, out: Path, seed: int = 0, metrics_interval_s: float = 1.0,
                 jitter: float = 0.1) -> Truth:
    cfg = replace(sc.cfg, seed=seed, step_jitter=jitter)
    resolved = resolve(cfg)
    log = EngineLog()

    def observe(o: StepOutput) -> None:
        log(o)
        log.block_fill(o, resolved.block_size)

    levels = {"rate": list(sc.levels)} if sc.open_loop else {"concurrency": list(sc.levels)}
    plan = LoadPlan(**levels, step_duration_s=sc.step_s, warmup_s=sc.warmup_s)
    run_replay(
        cfg,
        plan,
        Workload(profile=sc.profile, seed=seed),
        out,
        ReplayOptions(metrics_interval_s=metrics_interval_s, start_epoch=1.7e9),
        observer=observe,
    )
    return truth(log, sc, resolved.max_num_seqs, resolved.max_num_batched_tokens)


def truth(log: EngineLog, sc: Scenario, max_num_seqs: int, budget: int) -> Truth:
    t0, t1 = np.asarray(log.t_start), np.asarray(log.t_end)
    waiting, running = np.asarray(log.waiting), np.asarray(log.running)
    tokens = np.asarray(log.tokens)
    shares: dict[int, float] = {}
    reasons: Counter[str] = Counter()
    for k, level in enumerate(sc.levels):
        lo, hi = k * sc.step_s + sc.warmup_s, (k + 1) * sc.step_s
        dur = np.clip(np.minimum(t1, hi) - np.maximum(t0, lo), 0, None)
        shares[level] = float((dur * (waiting >= 1)).sum() / (hi - lo))
    stalled = [shares[lv] >= STALLED_SHARE for lv in sc.levels]
    upper_i = next((i for i in range(len(stalled)) if all(stalled[i:])), None)
    for k in range(len(sc.levels)):
        if upper_i is None or k < upper_i:
            continue
        lo, hi = k * sc.step_s + sc.warmup_s, (k + 1) * sc.step_s
        inside = (t0 >= lo) & (t0 < hi) & (waiting >= 1)
        reasons["seq_cap"] += int((inside & (running >= max_num_seqs)).sum())
        reasons["token_budget"] += int(
            (inside & (running < max_num_seqs) & (tokens >= budget)).sum()
        )
        reasons["kv_exhausted"] += int(
            (inside & (running < max_num_seqs) & (tokens < budget)).sum()
        )
    if upper_i is None:
        return Truth(None, sc.levels[-1], "none", shares, dict(reasons))
    cause = reasons.most_common(1)[0][0]
    if cause == "kv_exhausted" and np.mean(log.fill) < CALIBER_FILL:
        cause = "dashboard_caliber"
    lower = sc.levels[upper_i - 1] if upper_i > 0 else None
    return Truth(sc.levels[upper_i], lower, cause, shares, dict(reasons))
