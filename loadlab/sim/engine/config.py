"""The simulator's configuration, in vLLM's own vocabulary.

Field names are vLLM's engine-argument names with dashes turned into underscores
(``--max-num-seqs`` -> ``max_num_seqs``), so a flag list written for ``vllm serve``
configures the simulator unchanged. ``None`` means "vLLM's default for this GPU",
resolved by :mod:`loadlab.sim.engine.hardware` (KV pool size from the memory formula,
batched-token budget and sequence cap from vLLM's rule by GPU memory size, in
vllm/engine/arg_utils.py).
This module is plain data: no I/O, no resolution logic.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SimConfig:
    # Scheduler (vllm/config/scheduler.py)
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0
    # Newer vLLM admits a request only if its whole prompt fits in free blocks.
    scheduler_reserve_full_isl: bool = True
    # Cache (vllm/config/cache.py)
    block_size: int = 16
    gpu_memory_utilization: float = 0.92
    num_gpu_blocks_override: int | None = None
    enable_prefix_caching: bool = True
    kv_cache_dtype: str = "auto"
    # Model / hardware profile
    model: str = "llama-3.1-8b"
    gpu: str = "h100"
    tensor_parallel_size: int = 1
    max_model_len: int | None = None
    served_model_name: str | None = None
    # Front end
    stream_interval: int = 1
    api_key: str | None = None
    metrics_names: str = "v1"          # "v1" or "v0" (V0-era metric names)
    # Workload defaults when a request does not pin its output length
    output_len_mean: float = 256.0
    output_len_sigma: float = 0.8      # log-normal sigma of drawn output lengths
    seed: int = 0
    # Timing model
    step_jitter: float = 0.0           # relative std-dev of seeded multiplicative jitter
    time_scale: float = 1.0            # live mode: >1 runs faster than modelled
    calibration: str | None = None     # YAML of `loadlab sim calibrate`: replaces the roofline
    extra: dict[str, str] = field(default_factory=dict)
