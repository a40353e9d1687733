"""Request streams for the scheduler conformance suite (identical input to vLLM and the sim).

Each case is plain JSON data: scheduler/cache config, and requests with an arrival step,
prompt token ids and an output length. Token ids come from a seeded generator; prompts
that share a prefix share it token for token, everything else is unique, so prefix hits
happen only where a case means them to.
"""

from __future__ import annotations

import random
from typing import Any


class Tokens:
    """Fresh token ids (never repeated within one case) from a seeded generator."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)
        self._used: set[int] = set()

    def take(self, n: int) -> list[int]:
        out: list[int] = []
        while len(out) < n:
            t = self._rng.randrange(100, 4000)
            if t not in self._used:
                self._used.add(t)
                out.append(t)
            if len(self._used) > 3800:
                self._used.clear()
        return out


def _case(sched: dict[str, Any], cache: dict[str, Any], max_model_len: int,
          requests: list[tuple[int, list[int], int]]) -> dict[str, Any]:
    return {
        "scheduler": {"enable_chunked_prefill": True, "long_prefill_token_threshold": 0,
                      "scheduler_reserve_full_isl": True, **sched},
        "cache": {"enable_prefix_caching": True, **cache},
        "max_model_len": max_model_len,
        "requests": [{"id": f"r{i}", "arrival_step": step, "prompt_token_ids": prompt,
                      "output_len": out} for i, (step, prompt, out) in enumerate(requests)],
    }


def seq_cap() -> dict[str, Any]:
    """More requests than max_num_seqs, roomy pool: the cap alone holds them back."""
    t = Tokens(1)
    reqs = [(0 if i < 4 else 3, t.take(40 + 7 * i), 6 + i % 3) for i in range(8)]
    return _case({"max_num_seqs": 3, "max_num_batched_tokens": 256},
                 {"block_size": 16, "num_gpu_blocks": 200}, 512, reqs)


def kv_preemption() -> dict[str, Any]:
    """A pool too small for the running set: allocation fails, the newest is preempted."""
    t = Tokens(2)
    reqs = [(i // 2, t.take(50 + 5 * i), 40) for i in range(6)]
    return _case({"max_num_seqs": 8, "max_num_batched_tokens": 128},
                 {"block_size": 16, "num_gpu_blocks": 24}, 320, reqs)


def reserve_full_isl(reserve: bool = True) -> dict[str, Any]:
    """A second long prompt that fits only chunk by chunk: admitted at once only without
    scheduler_reserve_full_isl (older vLLM), which then costs preemptions."""
    t = Tokens(7)
    reqs = [(0, t.take(200), 30), (1, t.take(200), 20), (2, t.take(40), 10)]
    return _case({"max_num_seqs": 4, "max_num_batched_tokens": 64,
                  "scheduler_reserve_full_isl": reserve},
                 {"block_size": 16, "num_gpu_blocks": 24}, 320, reqs)


def no_reserve_full_isl() -> dict[str, Any]:
    return reserve_full_isl(reserve=False)


def chunked_on_long() -> dict[str, Any]:
    """Long prompts split into chunks under a small token budget, decodes interleaved."""
    t = Tokens(3)
    reqs = [(0, t.take(300), 4), (0, t.take(20), 8), (1, t.take(180), 3), (2, t.take(12), 5)]
    return _case({"max_num_seqs": 4, "max_num_batched_tokens": 64},
                 {"block_size": 16, "num_gpu_blocks": 100}, 512, reqs)


def chunked_off_long() -> dict[str, Any]:
    """Chunked prefill off: a prompt bigger than the remaining budget blocks the queue."""
    t = Tokens(4)
    reqs = [(0, t.take(200), 4), (0, t.take(150), 4), (0, t.take(30), 6), (1, t.take(100), 3),
            (2, t.take(250), 2)]
    return _case({"max_num_seqs": 4, "max_num_batched_tokens": 256,
                  "enable_chunked_prefill": False},
                 {"block_size": 16, "num_gpu_blocks": 100}, 256, reqs)


def long_prefill_threshold() -> dict[str, Any]:
    """long_prefill_token_threshold caps each long prompt's chunk; lone request uncapped."""
    t = Tokens(5)
    reqs = [(0, t.take(200), 3), (0, t.take(100), 3), (0, t.take(10), 4), (6, t.take(150), 2),
            (30, t.take(120), 2)]
    return _case({"max_num_seqs": 4, "max_num_batched_tokens": 128,
                  "long_prefill_token_threshold": 32},
                 {"block_size": 16, "num_gpu_blocks": 100}, 512, reqs)


def prefix_eviction() -> dict[str, Any]:
    """Shared system prompt under a small pool: hits while its blocks stay cached, then two
    long unique prompts evict them (LRU, tails first) and the next sharer misses."""
    t = Tokens(6)
    shared = t.take(64)
    reqs = [(0, shared + t.take(20), 8), (12, shared + t.take(24), 8),
            (24, t.take(200), 4), (24, t.take(200), 4), (60, shared + t.take(16), 6),
            (61, shared + t.take(30), 6)]
    return _case({"max_num_seqs": 3, "max_num_batched_tokens": 128},
                 {"block_size": 16, "num_gpu_blocks": 18}, 256, reqs)


def stress(seed: int = 8, chunked: bool = True, caching: bool = True) -> dict[str, Any]:
    """Everything at once: 40 seeded requests (3 shared prefixes, lengths 5-300, outputs
    1-60, bursty arrivals) through a 40-block pool with a small budget."""
    rng = random.Random(seed)
    t = Tokens(seed)
    prefixes = [t.take(rng.randrange(16, 100)) for _ in range(3)]
    reqs, step = [], 0
    for _ in range(40):
        step += rng.choice([0, 0, 1, 3])
        head = rng.choice(prefixes + [[]])
        prompt = head + t.take(rng.randrange(5, 300 - len(head)))
        reqs.append((step, prompt, rng.randrange(1, 60)))
    return _case({"max_num_seqs": 6, "max_num_batched_tokens": 320 if not chunked else 96,
                  "enable_chunked_prefill": chunked},
                 {"block_size": 16, "num_gpu_blocks": 40, "enable_prefix_caching": caching},
                 320, reqs)


def stress_no_chunking() -> dict[str, Any]:
    return stress(seed=9, chunked=False)


def stress_no_caching() -> dict[str, Any]:
    return stress(seed=10, caching=False)


def stress_small_pool() -> dict[str, Any]:
    """Chunked prefill off, two sequences, 40 blocks: finished requests' generated-token
    blocks decide which cached prompt blocks the next admission evicts."""
    case = stress(seed=20, chunked=False)
    case["scheduler"]["max_num_seqs"] = 2
    return case


def refuse_kv_blocks() -> dict[str, Any]:
    """reserve-full-ISL: a long prompt that fits only whole waits at the head, free blocks
    short of its length, a short prompt stuck behind it; budget and seats to spare."""
    t = Tokens(11)
    reqs = [(0, t.take(150), 24), (1, t.take(180), 4), (2, t.take(10), 4)]
    return _case({"max_num_seqs": 8, "max_num_batched_tokens": 512},
                 {"block_size": 16, "num_gpu_blocks": 22}, 320, reqs)


def refuse_token_budget() -> dict[str, Any]:
    """Chunked prefill off: each prompt needs most of the budget, so the next one waits for
    a step whose budget is whole; seats and blocks to spare."""
    t = Tokens(12)
    reqs = [(i // 3, t.take(90 + 3 * i), 3) for i in range(9)]
    return _case({"max_num_seqs": 16, "max_num_batched_tokens": 128,
                  "enable_chunked_prefill": False},
                 {"block_size": 16, "num_gpu_blocks": 200}, 128, reqs)


def refuse_preempted() -> dict[str, Any]:
    """Decodes outgrow a pool that admitted their prompts: the newest is preempted while
    others wait."""
    t = Tokens(13)
    reqs = [(0, t.take(60), 70), (0, t.take(60), 70), (1, t.take(20), 10), (2, t.take(20), 10)]
    return _case({"max_num_seqs": 8, "max_num_batched_tokens": 256},
                 {"block_size": 16, "num_gpu_blocks": 14}, 192, reqs)


def refuse_seq_cap() -> dict[str, Any]:
    """Short prompts, long outputs, two seats: the queue waits on seats, never on blocks or
    budget."""
    t = Tokens(14)
    reqs = [(i, t.take(20), 12) for i in range(8)]
    return _case({"max_num_seqs": 2, "max_num_batched_tokens": 256},
                 {"block_size": 16, "num_gpu_blocks": 200}, 256, reqs)


def _first_chunks(trace: list[dict[str, Any]]) -> dict[str, int]:
    first: dict[str, int] = {}
    for rec in trace:
        for rid, n in rec["scheduled"].items():
            first.setdefault(rid, n)
    return first


def _first_step(trace: list[dict[str, Any]], rid: str) -> int:
    return next(r["step"] for r in trace if rid in r["scheduled"])


def _finish_step(trace: list[dict[str, Any]], rid: str) -> int:
    return next(r["step"] for r in trace if rid in r["finished"])


def _prompt_lens(case: dict[str, Any]) -> dict[str, int]:
    return {r["id"]: len(r["prompt_token_ids"]) for r in case["requests"]}


def _sum(trace: list[dict[str, Any]], key: str) -> int:
    return sum(len(r[key]) if isinstance(r[key], list) else r[key] for r in trace)


# What each case must show in vLLM's own trace, so a case cannot silently stop testing
# what its name says: name -> (what, predicate(trace, case)).
EXERCISES = {
    "seq_cap": (
        "running pinned at 3 with a queue and the pool mostly free",
        lambda tr, c: (
            max(r["num_running"] for r in tr) == 3
            and max(r["num_waiting"] for r in tr) >= 3
            and max(r["kv_usage"] for r in tr) < 0.5
        ),
    ),
    "kv_preemption": (
        "KV usage reaches 1 and requests are preempted",
        lambda tr, c: _sum(tr, "preempted") > 0 and max(r["kv_usage"] for r in tr) > 0.95,
    ),
    "reserve_full_isl": (
        "the second long prompt waits until it fits whole; no preemption",
        lambda tr, c: _sum(tr, "preempted") == 0 and _first_step(tr, "r1") > _finish_step(tr, "r0"),
    ),
    "no_reserve_full_isl": (
        "the second long prompt is admitted chunk-first and preempted",
        lambda tr, c: _sum(tr, "preempted") > 0 and _first_step(tr, "r1") < _finish_step(tr, "r0"),
    ),
    "chunked_on_long": (
        "long prompts split into budget-sized chunks",
        lambda tr, c: (
            max(sum(r["scheduled"].values()) for r in tr) == 64
            and _first_chunks(tr)["r0"] < _prompt_lens(c)["r0"]
        ),
    ),
    "chunked_off_long": (
        "every prompt scheduled whole; the head blocks the queue",
        lambda tr, c: (
            _first_chunks(tr) == _prompt_lens(c)
            and any(r["num_waiting"] > 0 and sum(r["scheduled"].values()) < 200 for r in tr)
        ),
    ),
    "long_prefill_threshold": (
        "prompts capped at 32-token chunks while others compete",
        lambda tr, c: _first_chunks(tr)["r0"] == 32,
    ),
    "stress": (
        "preemptions, prefix hits and a queue, all in one run",
        lambda tr, c: (
            _sum(tr, "preempted") > 0
            and _sum(tr, "prefix_hits") > 0
            and max(r["num_waiting"] for r in tr) > 0
        ),
    ),
    "stress_no_chunking": (
        "as stress, every prompt scheduled whole (less whole cached blocks)",
        lambda tr, c: (
            _sum(tr, "prefix_hits") > 0
            and all((n - _first_chunks(tr)[r]) % 16 == 0 for r, n in _prompt_lens(c).items())
        ),
    ),
    "stress_small_pool": (
        "prefix hits under a small pool, chunked prefill off",
        lambda tr, c: _sum(tr, "prefix_hits") > 0 and max(r["kv_usage"] for r in tr) > 0.9,
    ),
    "stress_no_caching": (
        "as stress without prefix caching: no hits at all",
        lambda tr, c: _sum(tr, "prefix_hits") == 0 and _sum(tr, "preempted") > 0,
    ),
    "refuse_kv_blocks": (
        "the long prompt waits until the first finishes; no preemption",
        lambda tr, c: _sum(tr, "preempted") == 0 and _first_step(tr, "r1") > _finish_step(tr, "r0"),
    ),
    "refuse_token_budget": (
        "prompts scheduled whole, a queue while seats and blocks are free",
        lambda tr, c: (
            _first_chunks(tr) == _prompt_lens(c)
            and any(r["num_waiting"] and r["num_running"] < 16 and r["kv_usage"] < 0.5
                    for r in tr)
        ),
    ),
    "refuse_preempted": (
        "a running request is preempted while the pool is full",
        lambda tr, c: _sum(tr, "preempted") > 0 and max(r["kv_usage"] for r in tr) > 0.9,
    ),
    "refuse_seq_cap": (
        "two running, a queue, the pool mostly free",
        lambda tr, c: (
            max(r["num_running"] for r in tr) == 2
            and max(r["num_waiting"] for r in tr) >= 3
            and max(r["kv_usage"] for r in tr) < 0.2
        ),
    ),
    "prefix_eviction": (
        "the shared prefix hits, is evicted, then misses",
        lambda tr, c: (
            _sum(tr, "prefix_hits") >= 64
            and any(r["prefix_queries"] and not r["prefix_hits"] for r in tr[55:])
        ),
    ),
}


CASES = {
    "seq_cap": seq_cap,
    "kv_preemption": kv_preemption,
    "reserve_full_isl": reserve_full_isl,
    "no_reserve_full_isl": no_reserve_full_isl,
    "chunked_on_long": chunked_on_long,
    "chunked_off_long": chunked_off_long,
    "long_prefill_threshold": long_prefill_threshold,
    "prefix_eviction": prefix_eviction,
    "stress": stress,
    "stress_no_chunking": stress_no_chunking,
    "stress_no_caching": stress_no_caching,
    "stress_small_pool": stress_small_pool,
    "refuse_kv_blocks": refuse_kv_blocks,
    "refuse_token_budget": refuse_token_budget,
    "refuse_preempted": refuse_preempted,
    "refuse_seq_cap": refuse_seq_cap,
}

# The refusal reasons each refuse_* case shows in vLLM's trace under loadlab_probe, all of
# them and no other (tests/vllm/test_probe_conformance.py): a preempted request then waits
# for blocks, so refuse_preempted shows kv_blocks too.
REFUSALS = {"refuse_kv_blocks": {"kv_blocks"}, "refuse_token_budget": {"token_budget"},
            "refuse_preempted": {"preempted", "kv_blocks"}, "refuse_seq_cap": {"seq_cap"}}
