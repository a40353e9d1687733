"""How long one engine step takes: a roofline per step plus fitted CPU overheads.

Model, per GPU of a tensor-parallel group of size TP (all work divides by TP):

1. tokens = prefill tokens + decode tokens of the batch.
2. compute_s = (2 x matmul_params x tokens + attention_flops) / TP / (peak_bf16 x COMPUTE_EFF)
   with attention_flops = 4 x layers x q_heads x head_dim x sum_i(new_i x context_i).
   The batch shape has only totals, so the sum is the larger of two estimates:
   tokens x context_tokens / num_requests (every request at the mean context: right for
   a late chunk of a long prompt) and P^2 / (2 x prefill requests) + (context_tokens - P)
   (prefill chunks starting from zero, decodes reading the rest: right for first chunks
   beside decodes), with P the prefill tokens. Both are exact for pure decode.
3. memory_s = (weight_bytes / TP + kv_bytes_per_token_per_gpu x context_tokens)
   / (peak_bandwidth x MEMORY_EFF): every step streams the weights and the KV of every
   scheduled request's context once.
4. gpu_s = max(compute_s, memory_s) (prefill is compute-bound, decode memory-bound).
5. comm_s (TP > 1 only) = 2 all-reduces per layer, each ALLREDUCE_LATENCY_S +
   2 (TP-1)/TP x tokens x hidden x 2 bytes / NVLINK_BANDWIDTH.
6. step_s = gpu_s + comm_s + STEP_OVERHEAD_S + layers x LAYER_OVERHEAD_S
   + num_requests x REQUEST_OVERHEAD_S, times a seeded jitter factor
   max(JITTER_FLOOR, 1 + step_jitter x N(0, 1)) when ``step_jitter`` > 0.

Constants and their sources:

- STEP/LAYER/REQUEST overheads 126 us / 32 us / 4 us: the per-step, per-layer and
  per-request terms the BLIS simulator (inference-sim) fits to H100 vLLM runs.
- MEMORY_EFF 0.87: with those overheads, Llama-3.1-8B at batch 1 on one H100 then takes
  16.06 GB / (3.35 TB/s x 0.87) + 1.15 ms = 6.7 ms per step, against 6.48 ms measured
  (InferenceBench p50 TPOT, vLLM 0.21); HBM streaming kernels reach 85-90 % of peak.
- COMPUTE_EFF 0.48: prefill reaches about 45 % of peak (about 30k prompt tokens/s for an
  8B model on an H100) counting matmuls only; with attention counted separately a
  2k-token prefill then runs at ~29k tokens/s.
- NVLINK_BANDWIDTH 450 GB/s (H100 NVLink 4, one direction) and ALLREDUCE_LATENCY_S 8 us
  (NCCL small-message latency within a node): order-of-magnitude estimates, used only
  with tensor parallelism.
"""

from __future__ import annotations

import random

from loadlab.sim.engine.hardware import ResolvedConfig
from loadlab.sim.engine.types import BatchShape

STEP_OVERHEAD_S = 126e-6
LAYER_OVERHEAD_S = 32e-6
REQUEST_OVERHEAD_S = 4e-6
MEMORY_EFF = 0.87
COMPUTE_EFF = 0.48
NVLINK_BANDWIDTH = 450e9
ALLREDUCE_LATENCY_S = 8e-6
JITTER_FLOOR = 0.5


def attention_pairs(batch: BatchShape) -> float:
    """Estimated sum over requests of new x context tokens (step 2 of the module docstring)."""
    prefill = batch.num_prefill_tokens
    tokens = prefill + batch.num_decode_tokens
    pairs = tokens * batch.context_tokens / batch.num_requests if batch.num_requests else 0.0
    if batch.num_prefill_requests:
        fresh = prefill * prefill / (2 * batch.num_prefill_requests) + batch.context_tokens
        pairs = max(pairs, fresh - prefill)
    return pairs


class StepTimeModel:
    """Seconds per engine step for one resolved configuration.

    Construction folds every constant into a few per-token and per-step coefficients,
    so :meth:`step_time` is a handful of float operations (replay calls it per step).
    """

    def __init__(self, resolved: ResolvedConfig, seed: int | None = None) -> None:
        model, gpu, tp = resolved.model, resolved.gpu, resolved.tensor_parallel_size
        flops = gpu.bf16_flops * COMPUTE_EFF * tp
        bandwidth = gpu.mem_bandwidth * MEMORY_EFF
        self._matmul_s_per_token = 2.0 * model.matmul_params / flops
        self._attn_s_per_pair = 4.0 * model.num_layers * model.num_heads * model.head_dim / flops
        self._weights_s = resolved.weight_bytes_per_gpu / bandwidth
        self._kv_s_per_token = resolved.kv_bytes_per_token / bandwidth
        self._fixed_s = STEP_OVERHEAD_S + model.num_layers * LAYER_OVERHEAD_S
        if tp > 1:
            self._fixed_s += 2 * model.num_layers * ALLREDUCE_LATENCY_S
            self._comm_s_per_token = (2 * model.num_layers * 2 * (tp - 1) / tp
                                      * model.hidden_size * 2 / NVLINK_BANDWIDTH)
        else:
            self._comm_s_per_token = 0.0
        self._jitter = resolved.step_jitter
        self._rng = random.Random(resolved.seed if seed is None else seed)

    def gpu_time(self, batch: BatchShape) -> tuple[float, float]:
        """(compute_s, memory_s) of the roofline, before overheads and jitter."""
        tokens = batch.num_prefill_tokens + batch.num_decode_tokens
        compute = tokens * self._matmul_s_per_token + attention_pairs(batch) * self._attn_s_per_pair
        memory = self._weights_s + batch.context_tokens * self._kv_s_per_token
        return compute, memory

    def step_time(self, batch: BatchShape) -> float:
        compute, memory = self.gpu_time(batch)
        tokens = batch.num_prefill_tokens + batch.num_decode_tokens
        seconds = (max(compute, memory) + self._fixed_s + tokens * self._comm_s_per_token
                   + batch.num_requests * REQUEST_OVERHEAD_S)
        if self._jitter > 0:
            seconds *= max(JITTER_FLOOR, 1.0 + self._jitter * self._rng.gauss(0.0, 1.0))
        return seconds
