"""Seed -> a randomized scenario for the held-out validation of the analyzer (issue #18).

:func:`generate` draws, from one integer seed and nothing else, everything a replay of one
load sweep on the simulator needs: the workload (one length class, or a long/short
mixture, with or without a shared prefix), the server flags (max_num_seqs,
max_num_batched_tokens, block_size, a KV pool given by num_gpu_blocks_override or sized by
vLLM's memory formula, chunked prefill on or off, prefix caching), closed or open loop,
a 1 s or a 15 s scrape, whether the analyzer sees the server flags (``strip_flags``: they
are removed from the manifest it reads) and the top step: ``plain``, ``repeat`` (the top
level run twice) or ``dip`` (a last level below the one before: non-monotone), with a
noisy step time (``step_jitter``) in about a third of the draws.

The same seed gives the same spec on every machine (``random.Random(seed)``, no global
state, no clock). The spec is plain JSON data; :func:`sim_config`, :func:`load_plan` and
:func:`write_profile` turn it into what :func:`loadlab.replay.driver.run_replay` takes.
The ranges are chosen from vLLM's defaults and the shipped profiles' lengths, before any
analyzer result was seen; they are not to be tuned on the validation seeds
(``seeds.json``).

    PYTHONPATH=. python benchmarks/heldout/generate.py 7     # print seed 7's spec
"""

from __future__ import annotations

import json
import math
import random
import sys
from pathlib import Path
from typing import Any

import yaml

from loadlab.sim.engine.config import SimConfig
from loadlab.spec.plan import LoadPlan

# Length classes (prompt tokens, output tokens), uniform within each range.
CLASSES: dict[str, tuple[tuple[int, int], tuple[int, int]]] = {
    "short": ((32, 400), (16, 300)),
    "medium": ((400, 1500), (50, 500)),
    "long": ((1800, 3500), (16, 200)),
    "document": ((12000, 30000), (16, 200)),   # only in the long-head family
}
TOP_STEPS = ("plain", "repeat", "dip")

SECOND_SET_FROM = 200_000
"""Seeds from here on (the ``validation2`` and ``tuning2`` sets) also draw the long-head
and token-budget families, from a second random stream, so that the truth classes are less
lopsided (the first sets had almost no ``head_blocked`` and few ``token_budget`` truths).
Seeds below it give exactly the scenarios they gave when they were scored."""
FAMILY_SHARES = {"long_head": 0.3, "token_budget": 0.15}


def _mixture(rng: random.Random) -> list[dict[str, Any]]:
    """One length class, or two (a long/short mixture), with their weights."""
    kind = rng.choice(["single", "single", "mix", "mix"])
    if kind == "single":
        return [{"class": rng.choice(list(CLASSES)), "weight": 1.0}]
    first, second = sorted(rng.sample(list(CLASSES), 2), key=list(CLASSES).index)
    heavy = round(rng.uniform(0.1, 0.5), 2)   # the share of the longer class
    return [{"class": first, "weight": round(1 - heavy, 2)}, {"class": second, "weight": heavy}]


def _mean_tokens(mix: list[dict[str, Any]], common: int) -> float:
    """Mean prompt + output tokens of a request of the mixture."""
    total = 0.0
    for part in mix:
        (i0, i1), (o0, o1) = CLASSES[part["class"]]
        total += part["weight"] * ((i0 + i1) / 2 + (o0 + o1) / 2)
    return total + common


def _server(rng: random.Random, mix: list[dict[str, Any]], common: int) -> dict[str, Any]:
    """Server flags by vLLM's names (None: vLLM's default), always ones vLLM accepts."""
    max_model_len = rng.choice([4096, 8192])
    chunked = rng.random() < 0.75
    if chunked:
        budget = rng.choice([None, None, 256, 512, 1024, 2048, 8192])
    else:   # vLLM refuses a budget under max_model_len without chunking
        budget = max_model_len * rng.choice([1, 2])
    block_size = rng.choice([16, 16, 16, 32])
    pool: int | None = None
    if rng.random() < 0.6:   # a small pool: room for a few to a few dozen mean requests
        room = rng.choice([2, 4, 6, 8, 12, 16, 24, 32, 48])
        pool = math.ceil(room * _mean_tokens(mix, common) / block_size)
        pool = max(pool, math.ceil(max_model_len / block_size) + 2)
    return {
        "model": rng.choice(["llama-3.1-8b", "qwen2.5-7b"]),
        "gpu": rng.choice(["h100", "h100", "h200"]),
        "max_model_len": max_model_len,
        "max_num_seqs": rng.choice([4, 8, 12, 16, 24, 32, 48, 64, 128, 256]),
        "max_num_batched_tokens": budget,
        "enable_chunked_prefill": chunked,
        "block_size": block_size,
        "num_gpu_blocks_override": pool,
        "enable_prefix_caching": rng.random() < 0.8,
        "step_jitter": round(rng.uniform(0.2, 0.35) if rng.random() < 0.33
                             else rng.uniform(0.0, 0.1), 3),
    }


def _geometric(top: float, count: int, integer: bool) -> list[float]:
    """``count`` levels from a 16th of ``top`` up to it by a constant factor (whole and
    rising if ``integer``)."""
    start = top / 16
    levels = [start * 16 ** (k / (count - 1)) for k in range(count)]
    if not integer:
        return [round(v, 2) for v in levels]
    out: list[float] = []
    for v in levels:
        out.append(max(round(v), int(out[-1]) + 1 if out else 1))
    return out


def _plan(rng: random.Random, server: dict[str, Any], mix: list[dict[str, Any]],
          common: int, interval: float) -> dict[str, Any]:
    """Closed or open loop, levels spread around where the seq cap would bind."""
    seqs = server["max_num_seqs"]
    span = rng.choice([0.5, 1.0, 1.5, 2.0, 3.0, 4.0])   # top level / the cap's level
    count = rng.choice([5, 6, 7, 8])
    step_s = rng.choice([30, 40, 60]) if interval == 1 else rng.choice([75, 90, 105])
    plan: dict[str, Any] = {"step_duration_s": step_s,
                            "warmup_s": min(20, step_s // 5)}
    if rng.random() < 0.7:
        top = min(256, max(count + 1, round(seqs * span)))
        plan["concurrency"] = [int(v) for v in _geometric(top, count, integer=True)]
    else:
        # requests/s the cap serves at about 15 ms a decode step: users / turnaround
        out_mean = sum(p["weight"] * sum(CLASSES[p["class"]][1]) / 2 for p in mix)
        in_mean = sum(p["weight"] * sum(CLASSES[p["class"]][0]) / 2 for p in mix) + common
        turnaround = out_mean * 0.015 + in_mean / 8000
        top = min(200.0, max(0.5, seqs / turnaround * span))
        plan["rate"] = _geometric(top, count, integer=False)
        plan["burstiness"] = rng.choice([1.0, 1.0, 0.5])
    return plan


def _top_step(rng: random.Random, plan: dict[str, Any]) -> str:
    """Run the top level twice, or end on a level below it (non-monotone), or neither."""
    kind = rng.choices(TOP_STEPS, weights=[3, 1, 1])[0]
    key = "concurrency" if "concurrency" in plan else "rate"
    levels = plan[key]
    if kind == "repeat":
        levels.append(levels[-1])
    elif kind == "dip":
        lower = levels[-1] * 0.75
        levels.append(int(round(lower)) if key == "concurrency" else round(lower, 2))
    return kind


def _long_head(rng: random.Random, server: dict[str, Any]) -> tuple[list[dict[str, Any]], int]:
    """Mostly short requests with an occasional document of 12k-30k prompt tokens, against
    a pool that holds one document and not much more, under reserve-full-ISL (vLLM admits a
    request only when its whole prompt fits in free blocks: ``allocate_slots`` with
    ``full_sequence_must_fit`` in vllm/v1/core/kv_cache_manager.py). A document at the head
    of the FCFS queue then waits for the short requests to drain while KV usage stays low:
    the shape of scenarios/kv-26-percent-long-head.yaml. Sets the server's model length and
    pool in place; returns the mixture and the shared prefix (none)."""
    share = round(rng.uniform(0.01, 0.08), 3)
    mix = [{"class": "short", "weight": round(1 - share, 3)},
           {"class": "document", "weight": share}]
    server["max_model_len"] = 32768   # both models' positions
    if not server["enable_chunked_prefill"]:
        server["max_num_batched_tokens"] = 32768
    per_doc = math.ceil(32768 / server["block_size"])   # vLLM needs room for one of these
    server["num_gpu_blocks_override"] = math.ceil(per_doc * rng.uniform(1.05, 1.8)) + 2
    return mix, 0


def _token_budget(rng: random.Random, server: dict[str, Any]) -> None:
    """A small step token budget with chunked prefill beside a large cap and pool, so that
    the budget can bind before the seats or the blocks do (vLLM's scheduler stops admitting
    when ``token_budget`` reaches 0: vllm/v1/core/sched/scheduler.py)."""
    server["enable_chunked_prefill"] = True
    server["max_num_batched_tokens"] = rng.choice([128, 256, 512, 1024])
    server["max_num_seqs"] = rng.choice([64, 128, 256])
    server["num_gpu_blocks_override"] = None


def _family(seed: int) -> str:
    """The family of a seed: ``base`` below :data:`SECOND_SET_FROM`, else drawn from a
    stream of its own (the base draws of the seed stay as they are)."""
    if seed < SECOND_SET_FROM:
        return "base"
    u = random.Random(f"family-{seed}").random()
    for name, share in FAMILY_SHARES.items():
        if u < share:
            return name
        u -= share
    return "base"


def generate(seed: int) -> dict[str, Any]:
    """The scenario of ``seed``: plain data, the same on every call and machine."""
    rng = random.Random(seed)
    family = _family(seed)
    mix = _mixture(rng)
    common = rng.choice([256, 512, 1024, 2048]) if rng.random() < 0.3 else 0
    server = _server(rng, mix, common)
    if family == "long_head":
        mix, common = _long_head(rng, server)
    elif family == "token_budget":
        _token_budget(rng, server)
    interval = rng.choice([1.0, 15.0])
    plan = _plan(rng, server, mix, common, interval)
    top = _top_step(rng, plan)
    spec = {
        "seed": seed,
        "workload": {"mix": mix, "common_tokens": common},
        "server": server,
        "plan": plan,
        "metrics_interval_s": interval,
        "strip_flags": rng.random() < 0.5,
        "top_step": top,
    }
    if family != "base":
        spec["family"] = family
    return spec


def sim_config(spec: dict[str, Any]) -> SimConfig:
    """The simulator's configuration of a spec (its seed also seeds the engine's jitter)."""
    return SimConfig(seed=spec["seed"], **spec["server"])


def load_plan(spec: dict[str, Any]) -> LoadPlan:
    return LoadPlan(**spec["plan"])


def _table(mix: list[dict[str, Any]], side: int, add: int) -> tuple[list[float], list[float]]:
    """The inverse CDF of a mixture of uniforms on one side (0 prompt, 1 output).

    Classes overlap on the output side, so the quantile is computed numerically on a grid
    from the mixture's CDF (piecewise linear, exact at the grid points).
    """
    ranges = [(CLASSES[p["class"]][side], p["weight"]) for p in mix]
    lo = min(r[0] for r, _ in ranges)
    hi = max(r[1] for r, _ in ranges)
    total = sum(w for _, w in ranges)

    def cdf(x: float) -> float:
        return sum(w * min(1.0, max(0.0, (x - a) / (b - a))) for (a, b), w in ranges) / total

    grid = [lo + (hi - lo) * k / 400 for k in range(401)]
    if any(p["class"] == "document" for p in mix):   # each class its own grid: not 4 points
        grid = sorted({a + (b - a) * k / 400 for (a, b), _ in ranges for k in range(401)})
    ps, vs = [0.0], [float(lo + add)]
    for x in grid[1:]:
        p = cdf(x)
        if p > ps[-1] + 1e-9:
            ps.append(p)
            vs.append(float(round(x) + add))
    ps[-1] = 1.0
    return [round(p, 6) for p in ps], vs


def _summary(p: list[float], v: list[float]) -> dict[str, float]:
    def q(x: float) -> float:
        for k in range(1, len(p)):
            if p[k] >= x:
                return v[k - 1] + (v[k] - v[k - 1]) * (x - p[k - 1]) / (p[k] - p[k - 1])
        return v[-1]
    mean = sum((p[k] - p[k - 1]) * (v[k] + v[k - 1]) / 2 for k in range(1, len(p)))
    return {"n": 1.0, "mean": round(mean, 2), "p10": q(0.1), "p25": q(0.25), "p50": q(0.5),
            "p75": q(0.75), "p90": q(0.9), "p99": q(0.99), "max": v[-1]}


def profile_document(spec: dict[str, Any]) -> dict[str, Any]:
    """The workload profile of a spec, in the shipped profiles' format."""
    mix, common = spec["workload"]["mix"], spec["workload"]["common_tokens"]
    ip, iv = _table(mix, 0, common)
    op, ov = _table(mix, 1, 0)
    name = f"heldout-{spec['seed']}"
    prefix: dict[str, Any] = ({"kind": "shared", "common_tokens": common} if common
                              else {"kind": "none"})
    return {
        "format_version": 1,
        "name": name,
        "description": "held-out validation: " + " + ".join(
            f"{p['weight']:g} {p['class']}" for p in mix) + (f", {common}-token shared prefix"
                                                            if common else ""),
        "source": {"dataset": "synthetic (loadlab held-out validation)",
                   "origin": "benchmarks/heldout/generate.py", "licence": "Apache-2.0",
                   "citation": "none", "derivation": f"generate({spec['seed']})"},
        "lengths": {"input": {"p": ip, "v": iv}, "output": {"p": op, "v": ov},
                    "input_summary": _summary(ip, iv), "output_summary": _summary(op, ov)},
        "arrivals": {"process": "none"},
        "prefix": prefix,
    }


def write_profile(spec: dict[str, Any], folder: Path) -> Path:
    """Write the spec's profile into ``folder``; returns the file (a Workload's profile)."""
    path = folder / f"heldout-{spec['seed']}.yaml"
    path.write_text(yaml.safe_dump(profile_document(spec), sort_keys=False))
    return path


if __name__ == "__main__":
    for arg in sys.argv[1:] or ["0"]:
        print(json.dumps(generate(int(arg)), indent=1))
