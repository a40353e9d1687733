"""StepTimeModel against published timing anchors (loadlab/sim/engine/timing.py; within +-15 %)."""

from __future__ import annotations

import pytest

from loadlab.sim.engine.config import SimConfig
from loadlab.sim.engine.hardware import MODELS, resolve
from loadlab.sim.engine.timing import COMPUTE_EFF, StepTimeModel
from loadlab.sim.engine.types import BatchShape


def decode(batch: int, context_each: int) -> BatchShape:
    return BatchShape(0, batch, batch, 0, batch * context_each)


def prefill(tokens: int) -> BatchShape:
    return BatchShape(tokens, 0, 1, 1, tokens)


@pytest.fixture(scope="module")
def llama_h100() -> StepTimeModel:
    return StepTimeModel(resolve(SimConfig(model="llama-3.1-8b", gpu="h100")))


def test_decode_batch1_anchor(llama_h100: StepTimeModel) -> None:
    # InferenceBench: 6.48 ms p50 TPOT, Llama-3.1-8B, one H100, vLLM
    assert llama_h100.step_time(decode(1, 512)) == pytest.approx(6.48e-3, rel=0.15)


def test_prefill_throughput_anchor(llama_h100: StepTimeModel) -> None:
    # ~30k prompt tokens/s: 15 GFLOP per token at ~45 % of 989.5 TFLOP/s
    for n in (1024, 2048, 4096):
        assert n / llama_h100.step_time(prefill(n)) == pytest.approx(30_000, rel=0.15)


def test_a100_40g_decode_anchor() -> None:
    model = StepTimeModel(resolve(SimConfig(model="llama-3.1-8b", gpu="a100-40g",
                                            max_model_len=8192)))
    # the published decode anchor: about 13.3 ms per output token on an A100-40GB
    assert model.step_time(decode(1, 512)) == pytest.approx(13.3e-3, rel=0.15)


def test_roofline_regimes(llama_h100: StepTimeModel) -> None:
    compute, memory = llama_h100.gpu_time(decode(1, 512))
    assert memory > 10 * compute                      # decode is memory-bound
    compute, memory = llama_h100.gpu_time(prefill(4096))
    assert compute > 5 * memory                       # prefill is compute-bound
    # more context to read makes decode slower; more requests add per-request overhead
    assert llama_h100.step_time(decode(64, 4000)) > llama_h100.step_time(decode(64, 500))
    assert llama_h100.step_time(decode(64, 500)) > llama_h100.step_time(decode(1, 500 * 64))


def test_faster_hardware_and_tp_are_faster() -> None:
    base = StepTimeModel(resolve(SimConfig(model="llama-3.1-8b", gpu="h100")))
    h200 = StepTimeModel(resolve(SimConfig(model="llama-3.1-8b", gpu="h200")))
    tp2 = StepTimeModel(
        resolve(SimConfig(model="llama-3.1-8b", gpu="h100", tensor_parallel_size=2))
    )
    assert h200.step_time(decode(32, 1000)) < base.step_time(decode(32, 1000))
    assert tp2.step_time(prefill(4096)) < base.step_time(prefill(4096))


def test_jitter_is_seeded_and_bounded() -> None:
    cfg = resolve(SimConfig(step_jitter=0.1, seed=7))
    plain = StepTimeModel(resolve(SimConfig())).step_time(decode(8, 800))
    run1 = StepTimeModel(cfg)
    run2 = StepTimeModel(cfg)
    s1 = [run1.step_time(decode(8, 800)) for _ in range(200)]
    s2 = [run2.step_time(decode(8, 800)) for _ in range(200)]
    assert s1 == s2
    assert len(set(s1)) > 150
    mean = sum(s1) / len(s1)
    assert mean == pytest.approx(plain, rel=0.03)
    assert min(s1) >= 0.5 * plain
    other = StepTimeModel(cfg, seed=8)
    assert [other.step_time(decode(8, 800)) for _ in range(5)] != s1[:5]


def test_attention_of_a_first_chunk_beside_decodes_is_counted(llama_h100: StepTimeModel) -> None:
    # an 8k first chunk with 255 decodes at 1k context: ~33.5 M query-key pairs, not 8.7 M
    mixed = BatchShape(8192, 255, 256, 1, 8192 + 255 * 1024)
    compute, _ = llama_h100.gpu_time(mixed)
    flops = 989.5e12 * COMPUTE_EFF
    matmul = 2 * MODELS["llama-3.1-8b"].matmul_params * (8192 + 255) / flops
    pairs = 8192 * 8192 / 2 + 255 * 1024
    assert compute - matmul == pytest.approx(pairs * 4 * 32 * 32 * 128 / flops, rel=0.01)
