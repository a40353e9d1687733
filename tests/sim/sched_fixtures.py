"""Shared helpers for the scheduler/engine/block tests: a small config and request maker.

``Cfg`` builds the engine's SchedulerSettings (what hardware.ResolvedConfig extends)
with small defaults, so a test names only what it varies.
"""

from __future__ import annotations

import itertools

from loadlab.sim.engine.core import Engine
from loadlab.sim.engine.types import BatchShape, EngineRequest, SchedulerSettings, StepOutput

SMALL = dict(max_num_seqs=8, max_num_batched_tokens=256, block_size=16, num_gpu_blocks=1000,
             max_model_len=2048, enable_prefix_caching=True, enable_chunked_prefill=True,
             long_prefill_token_threshold=0, scheduler_reserve_full_isl=True)


def Cfg(**overrides: object) -> SchedulerSettings:
    return SchedulerSettings(**{**SMALL, **overrides})  # type: ignore[arg-type]


_token_source = itertools.count(1000)


def unique_tokens(n: int) -> list[int]:
    """Token ids never used before in this process: no accidental prefix sharing."""
    return [next(_token_source) for _ in range(n)]


def req(rid: str, prompt: int | list[int], out: int = 4, max_tokens: int | None = None,
        t: float = 0.0) -> EngineRequest:
    toks = unique_tokens(prompt) if isinstance(prompt, int) else list(prompt)
    return EngineRequest(rid, toks, out, max_tokens if max_tokens is not None else out, t)


def unit_step(batch: BatchShape) -> float:
    """Every step lasts 1 s of engine clock: step counts read as times."""
    return 1.0


def make_engine(**kw: object) -> tuple[Engine, list[StepOutput]]:
    outs: list[StepOutput] = []
    return Engine(Cfg(**kw), unit_step, outs.append), outs


def run_until_idle(engine: Engine, now: float = 0.0, max_steps: int = 100_000) -> float:
    """Step until nothing is runnable; returns the clock."""
    for _ in range(max_steps):
        out = engine.step(now)
        if out is None:
            return now
        now = out.t_end
    raise AssertionError("engine did not go idle")
