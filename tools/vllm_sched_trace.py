"""Drive vLLM's real V1 Scheduler + KVCacheManager in-process, with no model, and trace it.

Runs INSIDE the vLLM venv (``.vllm-venv/bin/python tools/vllm_sched_trace.py CASE.json``);
prints one JSON object per engine step on stdout (JSON lines). The file holds one case, or
``{"cases": {name: case, ...}}`` to pay vLLM's ~10 s import once; each line carries "case".
It is the reference that tests/vllm/test_scheduler_conformance.py holds loadlab's simulator
against, step by step.

Case (JSON):
  {"scheduler": {"max_num_seqs", "max_num_batched_tokens", "enable_chunked_prefill",
                 "long_prefill_token_threshold", "scheduler_reserve_full_isl"},
   "cache": {"block_size", "num_gpu_blocks", "enable_prefix_caching"},
   "max_model_len": int, "max_steps": int (default 10000),
   "requests": [{"id", "arrival_step", "prompt_token_ids", "output_len"}]}

Algorithm, per step k = 0, 1, ...:
  1. add (in list order) every request whose arrival_step == k;
  2. ``schedule()``; the fake model runner returns one sampled token for each scheduled
     request whose computed tokens reach its known length (a finished prefill chunk or a
     decode), nothing for a partial prefill chunk. Output token i of a request is
     ``output_token(prompt_len + i)`` (deterministic, like greedy decoding: equal prompts
     give equal outputs, so output blocks hash alike);
  3. ``update_from_output()``; read ``SchedulerStats`` (running, waiting, KV usage,
     prefix-cache queries/hits of this step).
  Stop when every request has arrived and finished, or after max_steps.

Emitted per step: step, scheduled {id: tokens}, new (first admission), resumed
(re-admitted after preemption), preempted, finished, running/waiting (ids, in queue
order), num_running, num_waiting, kv_usage, prefix_queries, prefix_hits.
Uses the synchronous ``Scheduler`` (async scheduling off), the cache hash algorithm
vLLM is configured with, and a single full-attention KV group of num_gpu_blocks blocks.

``--probe`` schedules with loadlab's probe (loadlab/probe/loadlab_probe.py, the class a
server loads with ``--scheduler-cls loadlab_probe.ProbeScheduler``) instead, and adds the
step's "refusal": None, or {"reason", "blocks_needed", "free_blocks", "running"}.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("PYTHONHASHSEED", "0")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_MODEL = ROOT / ".cache" / "tiny-llama"
PROBE_DIR = ROOT / "loadlab" / "probe"


def output_token(position: int) -> int:
    """The token a fake greedy model emits at a sequence position (never a stop token)."""
    return 10 + (position * 7) % 4000


def scheduler_class(probe: bool):
    """vLLM's own Scheduler, or the probe, imported from its folder as a server would."""
    if not probe:
        from vllm.v1.core.sched.scheduler import Scheduler

        return Scheduler
    sys.path.insert(0, str(PROBE_DIR))
    from loadlab_probe import ProbeScheduler

    return ProbeScheduler


def build_scheduler(case: dict[str, Any], model_dir: Path, probe: bool = False):
    import torch
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    sched, cache = case["scheduler"], case["cache"]
    max_model_len = int(case["max_model_len"])
    model_config = ModelConfig(model=str(model_dir), max_model_len=max_model_len, seed=0,
                               skip_tokenizer_init=True)
    scheduler_config = SchedulerConfig(
        max_num_seqs=int(sched["max_num_seqs"]),
        max_num_batched_tokens=int(sched["max_num_batched_tokens"]),
        max_model_len=max_model_len,
        enable_chunked_prefill=bool(sched.get("enable_chunked_prefill", True)),
        long_prefill_token_threshold=int(sched.get("long_prefill_token_threshold", 0)),
        scheduler_reserve_full_isl=bool(sched.get("scheduler_reserve_full_isl", True)),
        async_scheduling=False,
        is_encoder_decoder=False,
    )
    block_size = int(cache["block_size"])
    cache_config = CacheConfig(block_size=block_size,
                               enable_prefix_caching=bool(cache.get("enable_prefix_caching", True)))
    vllm_config = VllmConfig(model_config=model_config, scheduler_config=scheduler_config,
                             cache_config=cache_config)
    num_blocks = int(cache["num_gpu_blocks"])
    vllm_config.cache_config.num_gpu_blocks = num_blocks
    spec = FullAttentionSpec(block_size=block_size, num_kv_heads=2, head_size=32,
                             dtype=torch.float32)
    kv_cache_config = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                                    kv_cache_groups=[KVCacheGroupSpec(["layers.0"], spec)])
    scheduler = scheduler_class(probe)(vllm_config=vllm_config, kv_cache_config=kv_cache_config,
                          structured_output_manager=StructuredOutputManager(vllm_config),
                          block_size=block_size, log_stats=True)
    return scheduler, vllm_config


def make_hasher(vllm_config, block_size: int):
    if not vllm_config.cache_config.enable_prefix_caching:
        return None
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

    fn = get_hash_fn_by_name(vllm_config.cache_config.prefix_caching_hash_algo)
    init_none_hash(fn)
    return get_request_block_hasher(block_size, fn)


def new_request(spec: dict[str, Any], hasher, step: int):
    """A case's request as the engine core hands it to ``add_request``, arriving at ``step``."""
    from vllm import SamplingParams
    from vllm.v1.request import Request

    params = SamplingParams(max_tokens=int(spec["output_len"]), ignore_eos=True)
    return Request(request_id=str(spec["id"]), prompt_token_ids=list(spec["prompt_token_ids"]),
                   sampling_params=params, pooling_params=None, arrival_time=float(step),
                   block_hasher=hasher)


def model_output(scheduler, out):
    """The fake model runner's answer to one ``schedule()`` (module docstring, step 2)."""
    from vllm.v1.outputs import ModelRunnerOutput

    ids = list(out.num_scheduled_tokens)
    sampled = []
    for rid in ids:
        req = scheduler.requests[rid]
        done_prefill = req.num_computed_tokens >= req.num_tokens
        sampled.append([output_token(req.num_tokens)] if done_prefill else [])
    return ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                             sampled_token_ids=sampled)


def run_case(case: dict[str, Any], model_dir: Path, probe: bool = False):
    scheduler, vllm_config = build_scheduler(case, model_dir, probe)
    hasher = make_hasher(vllm_config, int(case["cache"]["block_size"]))
    pending = sorted(case["requests"], key=lambda r: int(r["arrival_step"]))
    unfinished: set[str] = set()
    max_steps = int(case.get("max_steps", 10000))
    for step in range(max_steps):
        while pending and int(pending[0]["arrival_step"]) <= step:
            spec = pending.pop(0)
            scheduler.add_request(new_request(spec, hasher, step))
            unfinished.add(str(spec["id"]))
        if not pending and not unfinished:
            return
        out = scheduler.schedule()
        engine_outputs = scheduler.update_from_output(out, model_output(scheduler, out))
        finished: list[str] = []
        stats = None
        for eco in engine_outputs.values():
            finished += [o.request_id for o in eco.outputs if o.finish_reason is not None]
            stats = eco.scheduler_stats or stats
        unfinished -= set(finished)
        record = {
            "step": step,
            "scheduled": dict(out.num_scheduled_tokens),
            "new": [r.req_id for r in out.scheduled_new_reqs],
            "resumed": sorted(set(out.scheduled_cached_reqs.req_ids)
                              & set(out.scheduled_cached_reqs.resumed_req_ids)),
            "preempted": sorted(out.preempted_req_ids or []),
            "finished": finished,
            "running": [r.request_id for r in scheduler.running],
            "waiting": [r.request_id for r in scheduler.waiting],
            "num_running": stats.num_running_reqs if stats else len(scheduler.running),
            "num_waiting": (stats.num_waiting_reqs + stats.num_skipped_waiting_reqs) if stats
            else len(scheduler.waiting),
            "kv_usage": stats.kv_cache_usage if stats else scheduler.get_kv_cache_usage(),
            "prefix_queries": stats.prefix_cache_stats.queries if stats else 0,
            "prefix_hits": stats.prefix_cache_stats.hits if stats else 0,
        }
        if probe:
            refusal = scheduler.last_refusal
            record["refusal"] = refusal.as_dict() if refusal else None
        yield record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("case", help="case JSON file, or - for stdin")
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL,
                        help="HF model folder whose config.json vLLM reads (default: tiny model)")
    parser.add_argument("--probe", action="store_true",
                        help="schedule with loadlab_probe.ProbeScheduler; add each step's refusal")
    args = parser.parse_args()
    text = sys.stdin.read() if args.case == "-" else Path(args.case).read_text()
    data = json.loads(text)
    cases = data.get("cases", {"case": data})
    for name, case in cases.items():
        for record in run_case(case, args.model, args.probe):
            sys.stdout.write(json.dumps({"case": name, **record}) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
