"""GPU and model profiles, and vLLM's start-up arithmetic that turns flags into a KV pool.

:func:`resolve` does what ``vllm serve`` does before it accepts a request:

1. Look up the GPU and model profiles (``--gpu``, ``--model``); unknown names list the choices.
2. Fill scheduler defaults by GPU class (vllm/engine/arg_utils.py): a GPU with >= 70 GiB
   that is not an A100 gets ``max_num_batched_tokens`` 8192 and ``max_num_seqs`` 1024,
   any other GPU 2048 and 256. ``max_model_len`` defaults to the model's max positions.
3. Split the model over ``tensor_parallel_size`` GPUs: weights / TP per GPU, KV heads
   / TP per GPU (replicated, never below one head, when TP exceeds the KV heads).
4. KV bytes per token per GPU = 2 (K and V) x layers x kv_heads_per_gpu x head_dim x
   dtype bytes (2 for ``auto``/BF16, 1 for any ``fp8*`` dtype).
5. available = total_memory x gpu_memory_utilization - weights_per_gpu - activation reserve;
   num_gpu_blocks = available // (block_size x kv_bytes_per_token); or
   ``num_gpu_blocks_override`` exactly.
6. Refuse what vLLM refuses, naming the flag and the fix: weights that do not fit,
   a pool smaller than one ``max_model_len`` request (block 0 is vLLM's null block, so
   ``num_gpu_blocks - 1`` blocks are usable), chunked prefill off with a token budget
   below ``max_model_len``.

Activation reserve (vLLM measures it by profiling a dummy forward pass; we estimate it):

- 1 GiB fixed for CUDA graphs and non-torch allocations (NCCL, cuBLAS workspaces);
  vLLM start-up logs show a few hundred MiB of each.
- a forward pass of ``max_num_batched_tokens`` tokens: per token, 2 bytes x (4 x hidden
  [residual, norm, attention out, MLP out] + (q_heads + 2 kv_heads) x head_dim / TP [QKV]
  + 3 x intermediate / TP [gate, up, activation]).
- the sampler's FP32 logits for ``max_num_seqs`` rows: max_num_seqs x vocab x 4 bytes.

Total memory is what ``torch.cuda.mem_get_info`` reports (GiB), not the marketing GB.
Peak FLOP/s are dense BF16; bandwidths are HBM/GDDR peaks (the GPUs from the vendors'
data sheets, the model shapes from the models' config.json).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from loadlab.errors import InputError
from loadlab.sim.engine.calibration import Calibration
from loadlab.sim.engine.calibration import load as load_calibration
from loadlab.sim.engine.config import SimConfig
from loadlab.sim.engine.types import SchedulerSettings

GIB = 1024**3

# Activation reserve constants (see the module docstring).
FIXED_RESERVE_BYTES = 1 * GIB
ACT_DTYPE_BYTES = 2
LOGIT_BYTES = 4


@dataclass(frozen=True)
class GpuSpec:
    name: str
    memory_bytes: int            # as torch reports it
    bf16_flops: float            # dense BF16 peak, FLOP/s
    mem_bandwidth: float         # bytes/s
    is_a100: bool = False        # vLLM's default rule treats A100s as "small" GPUs


@dataclass(frozen=True)
class ModelSpec:
    name: str
    hf_name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    num_params: float
    weight_bytes: float          # BF16 checkpoint size
    max_position_embeddings: int

    @property
    def matmul_params(self) -> float:
        """Parameters that take part in a matmul per token: all but the input embedding."""
        return self.num_params - self.vocab_size * self.hidden_size


GPUS: dict[str, GpuSpec] = {
    g.name: g
    for g in (
        GpuSpec("h100", int(79.19 * GIB), 989.5e12, 3.35e12),
        GpuSpec("h200", int(139.8 * GIB), 989.5e12, 4.8e12),
        GpuSpec("a100-80g", int(79.15 * GIB), 312e12, 2.0e12, is_a100=True),
        GpuSpec("a100-40g", int(39.39 * GIB), 312e12, 1.555e12, is_a100=True),
        GpuSpec("l40s", int(44.39 * GIB), 362e12, 0.864e12),
    )
}

MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        ModelSpec("llama-3.1-8b", "meta-llama/Llama-3.1-8B-Instruct", 32, 4096, 32, 8, 128,
                  14336, 128256, 8.03e9, 16.06e9, 131072),
        ModelSpec("qwen2.5-7b", "Qwen/Qwen2.5-7B-Instruct", 28, 3584, 28, 4, 128,
                  18944, 152064, 7.62e9, 15.23e9, 32768),
        ModelSpec("qwen2.5-72b", "Qwen/Qwen2.5-72B-Instruct", 80, 8192, 64, 8, 128,
                  29568, 152064, 72.7e9, 145.4e9, 32768),
    )
}

KV_DTYPE_BYTES = {"auto": 2, "bfloat16": 2, "float16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}


@dataclass(frozen=True)
class ResolvedConfig(SchedulerSettings):
    """Every number the engine, timing model and metrics need, after vLLM's defaults."""

    served_model_name: str
    model: ModelSpec
    gpu: GpuSpec
    tensor_parallel_size: int
    kv_cache_dtype: str
    gpu_memory_utilization: float
    num_gpu_blocks_override: int | None
    kv_bytes_per_token: int          # per GPU (KV heads divided by TP)
    weight_bytes_per_gpu: float
    activation_reserve_bytes: float
    kv_pool_bytes: float             # bytes the pool could use (before the override)
    seed: int
    step_jitter: float
    calibration: Calibration | None = None   # a fitted step time replaces the roofline
    calibration_path: str | None = None

    @property
    def kv_cache_tokens(self) -> int:
        return self.num_gpu_blocks * self.block_size

    @property
    def max_concurrency(self) -> float:
        """vLLM's "Maximum concurrency" figure: whole-length requests the pool holds."""
        return self.num_gpu_blocks / math.ceil(self.max_model_len / self.block_size)

    def startup_lines(self) -> list[str]:
        """The KV-pool lines vLLM logs at start, same wording and number format."""
        lines = []
        if self.num_gpu_blocks_override is not None:
            computed = int(self.kv_pool_bytes // (self.block_size * self.kv_bytes_per_token))
            lines.append(f"Overriding num_gpu_blocks={computed} with "
                         f"num_gpu_blocks_override={self.num_gpu_blocks_override}")
        lines.append(f"GPU KV cache size: {self.kv_cache_tokens:,} tokens")
        lines.append(f"Maximum concurrency for {self.max_model_len:,} tokens per request: "
                     f"{self.max_concurrency:.2f}x")
        return lines

    def server_flags(self) -> dict[str, object]:
        """The effective flags, for manifest.json ``server`` and /v1/models."""
        return {
            "model": self.model.hf_name,
            "served_model_name": self.served_model_name,
            "gpu": self.gpu.name,
            "tensor_parallel_size": self.tensor_parallel_size,
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "block_size": self.block_size,
            "num_gpu_blocks": self.num_gpu_blocks,
            "num_gpu_blocks_override": self.num_gpu_blocks_override,
            "max_model_len": self.max_model_len,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "kv_cache_dtype": self.kv_cache_dtype,
            "enable_prefix_caching": self.enable_prefix_caching,
            "enable_chunked_prefill": self.enable_chunked_prefill,
            "long_prefill_token_threshold": self.long_prefill_token_threshold,
            "scheduler_reserve_full_isl": self.scheduler_reserve_full_isl,
            "kv_cache_size_tokens": self.kv_cache_tokens,
            "kv_cache_max_concurrency": round(self.max_concurrency, 2),
            **({"calibration": {"path": self.calibration_path,
                                "fit_errors": self.calibration.fit_errors}}
               if self.calibration is not None else {}),
        }


def kv_bytes_per_token(model: ModelSpec, tp: int, kv_cache_dtype: str) -> int:
    kv_heads = max(1, model.num_kv_heads // tp)
    return 2 * model.num_layers * kv_heads * model.head_dim * KV_DTYPE_BYTES[kv_cache_dtype]


def activation_reserve(model: ModelSpec, tp: int, max_num_batched_tokens: int,
                       max_num_seqs: int) -> float:
    """Peak non-KV, non-weight memory per GPU (model in the module docstring)."""
    qkv = (model.num_heads + 2 * model.num_kv_heads) * model.head_dim / tp
    per_token = ACT_DTYPE_BYTES * (4 * model.hidden_size + qkv + 3 * model.intermediate_size / tp)
    sampler = max_num_seqs * model.vocab_size * LOGIT_BYTES
    return FIXED_RESERVE_BYTES + max_num_batched_tokens * per_token + sampler


def _choice(table: dict, name: str, flag: str) -> object:
    key = name.lower()
    if key not in table:
        raise InputError(f"unknown {flag.lstrip('-')} {name!r}", field=flag,
                         fix=f"choose one of: {', '.join(sorted(table))}")
    return table[key]


def _positive(value: float | None, flag: str) -> None:
    if value is not None and value <= 0:
        raise InputError(f"must be positive, got {value}", field=flag,
                         fix=f"pass a value > 0 to {flag}")


def _tp_fix(cfg: SimConfig, gpu: GpuSpec, model: ModelSpec, max_model_len: int,
            max_num_batched_tokens: int, max_num_seqs: int) -> str:
    """Name the smallest tensor-parallel size that holds weights, activations and one request."""
    budget = gpu.memory_bytes * cfg.gpu_memory_utilization
    for tp in (2, 4, 8):
        if tp <= cfg.tensor_parallel_size or model.num_heads % tp:
            continue
        need = (
            model.weight_bytes / tp
            + activation_reserve(model, tp, max_num_batched_tokens, max_num_seqs)
            + (max_model_len + cfg.block_size) * kv_bytes_per_token(model, tp, cfg.kv_cache_dtype)
        )
        if need <= budget:
            return f"pass --tensor-parallel-size {tp}"
    return "choose a GPU with more memory (--gpu) or a smaller --model"


def resolve(cfg: SimConfig) -> ResolvedConfig:
    """Apply vLLM's defaults and memory formula; raise InputError for what vLLM refuses."""
    gpu = _choice(GPUS, cfg.gpu, "--gpu")
    model = _choice(MODELS, cfg.model, "--model")
    assert isinstance(gpu, GpuSpec) and isinstance(model, ModelSpec)
    for value, flag in ((cfg.block_size, "--block-size"), (cfg.max_num_seqs, "--max-num-seqs"),
                        (cfg.max_num_batched_tokens, "--max-num-batched-tokens"),
                        (cfg.max_model_len, "--max-model-len"),
                        (cfg.tensor_parallel_size, "--tensor-parallel-size"),
                        (cfg.num_gpu_blocks_override, "--num-gpu-blocks-override")):
        _positive(value, flag)
    if not 0 < cfg.gpu_memory_utilization <= 1:
        raise InputError(f"must be in (0, 1], got {cfg.gpu_memory_utilization}",
                         field="--gpu-memory-utilization", fix="pass a fraction such as 0.92")
    if not 0 <= cfg.step_jitter < 1:
        raise InputError(f"must be in [0, 1), got {cfg.step_jitter}", field="--step-jitter",
                         fix="pass a relative spread such as 0.05 (0 turns jitter off)")
    if cfg.kv_cache_dtype not in KV_DTYPE_BYTES:
        raise InputError(f"unknown kv cache dtype {cfg.kv_cache_dtype!r}", field="--kv-cache-dtype",
                         fix=f"choose one of: {', '.join(KV_DTYPE_BYTES)}")
    tp = cfg.tensor_parallel_size
    if model.num_heads % tp:
        raise InputError(f"{model.num_heads} attention heads of {model.name} are not divisible "
                         f"by tensor parallel size {tp}", field="--tensor-parallel-size",
                         fix="use a divisor of the head count, e.g. 1, 2, 4 or 8")

    big = gpu.memory_bytes >= 70 * GIB and not gpu.is_a100
    max_num_seqs = cfg.max_num_seqs or (1024 if big else 256)
    max_num_batched_tokens = cfg.max_num_batched_tokens or (8192 if big else 2048)
    max_model_len = cfg.max_model_len or model.max_position_embeddings
    if max_model_len > model.max_position_embeddings:
        raise InputError(f"{max_model_len} exceeds {model.name}'s {model.max_position_embeddings} "
                         "positions", field="--max-model-len",
                         fix=f"use --max-model-len {model.max_position_embeddings} or less")
    if not cfg.enable_chunked_prefill and max_num_batched_tokens < max_model_len:
        raise InputError(f"with chunked prefill off, max_num_batched_tokens "
                         f"({max_num_batched_tokens}) must be >= max_model_len ({max_model_len})",
                         field="--max-num-batched-tokens",
                         fix=f"pass --max-num-batched-tokens {max_model_len}, lower "
                             "--max-model-len, or --enable-chunked-prefill")

    weights = model.weight_bytes / tp
    budget = gpu.memory_bytes * cfg.gpu_memory_utilization
    reserve = activation_reserve(model, tp, max_num_batched_tokens, max_num_seqs)
    # a calibrated server brings its own pool: the profiles' memory arithmetic is moot
    if weights + reserve >= budget and not (cfg.calibration and cfg.num_gpu_blocks_override):
        raise InputError(f"{model.name} weights ({weights / GIB:.1f} GiB per GPU) plus activations "
                         f"({reserve / GIB:.1f} GiB) do not fit in {cfg.gpu_memory_utilization} x "
                         f"{gpu.memory_bytes / GIB:.1f} GiB of {gpu.name}",
                         field="--tensor-parallel-size", fix=_tp_fix(cfg, gpu, model, max_model_len,
                                                                     max_num_batched_tokens,
                                                                     max_num_seqs))
    per_token = kv_bytes_per_token(model, tp, cfg.kv_cache_dtype)
    available = max(0.0, budget - weights - reserve)
    computed_blocks = int(available // (cfg.block_size * per_token))
    num_blocks = cfg.num_gpu_blocks_override or computed_blocks

    if (num_blocks - 1) * cfg.block_size < max_model_len:
        flag = "--num-gpu-blocks-override" if cfg.num_gpu_blocks_override else "--max-model-len"
        fits = max(0, (num_blocks - 1) * cfg.block_size)
        need_blocks = math.ceil(max_model_len / cfg.block_size) + 1
        raise InputError(
            f"the KV pool ({num_blocks} blocks of {cfg.block_size} tokens, one reserved) "
            f"cannot hold one request of max_model_len {max_model_len} tokens; it holds {fits}",
            field=flag,
            fix=f"lower --max-model-len to {fits} or less, "
            f"or give the pool >= {need_blocks} blocks "
            "(--num-gpu-blocks-override, higher --gpu-memory-utilization, "
            "--kv-cache-dtype fp8, or more --tensor-parallel-size)",
        )

    return ResolvedConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        block_size=cfg.block_size,
        num_gpu_blocks=num_blocks,
        max_model_len=max_model_len,
        enable_prefix_caching=cfg.enable_prefix_caching,
        enable_chunked_prefill=cfg.enable_chunked_prefill,
        long_prefill_token_threshold=cfg.long_prefill_token_threshold,
        scheduler_reserve_full_isl=cfg.scheduler_reserve_full_isl,
        served_model_name=cfg.served_model_name or model.hf_name,
        model=model,
        gpu=gpu,
        tensor_parallel_size=tp,
        kv_cache_dtype=cfg.kv_cache_dtype,
        gpu_memory_utilization=cfg.gpu_memory_utilization,
        num_gpu_blocks_override=cfg.num_gpu_blocks_override,
        kv_bytes_per_token=per_token,
        weight_bytes_per_gpu=weights,
        activation_reserve_bytes=reserve,
        kv_pool_bytes=available,
        seed=cfg.seed,
        step_jitter=cfg.step_jitter,
        calibration=load_calibration(cfg.calibration) if cfg.calibration else None,
        calibration_path=cfg.calibration,
    )
