"""Parsing real vLLM 0.32 /metrics text and the simulator's V1 and V0 pages."""

from __future__ import annotations

import json

import pytest
from collect_pages import IDLE_PAGE, LOAD_PAGE
from prometheus_client.parser import text_string_to_metric_families

from loadlab.collect import catalog
from loadlab.collect.parse import ExpositionError, ExpositionParser, cache_config, parse_text


def reference_samples(text: str) -> dict[tuple[str, str], float]:
    """Every vllm: sample by (name, canonical labels), straight from prometheus_client."""
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.startswith("vllm:") and not s.name.endswith("_created"):
                out[(s.name, json.dumps(s.labels, sort_keys=True, separators=(",", ":")))] = s.value
    return out


@pytest.mark.parametrize("page", [LOAD_PAGE, IDLE_PAGE], ids=["load", "idle"])
def test_real_page_gives_every_vllm_sample_with_prometheus_client_values(page):
    text = page.read_text()
    rows = parse_text(text, t=1.0, endpoint="http://x:1")
    got = {(r["metric"], r["labels"]): r["value"] for r in rows}
    assert got == reference_samples(text)
    families = {line.split()[2] for line in text.splitlines()
                if line.startswith("# TYPE vllm:") and not line.split()[2].endswith("_created")}
    fams_got = {r["family"] for r in rows}
    # the parser strips _total from counter families, not from their samples
    assert {f[:-6] if f.endswith("_total") and f != "vllm:iteration_tokens_total" else f
            for f in families} == fams_got
    assert "vllm:num_preemptions" in fams_got
    assert {r["metric"] for r in rows if r["family"] == "vllm:num_preemptions"} == {
        "vllm:num_preemptions_total"
    }
    assert {r["type"] for r in rows if r["family"] == "vllm:iteration_tokens_total"} == {
        "histogram"
    }
    assert not any(r["metric"].startswith(("python_", "process_", "http_")) for r in rows)


def test_every_family_of_vllm_032_is_in_the_catalog_and_says_v1():
    rows = parse_text(LOAD_PAGE.read_text(), t=0, endpoint="e")
    families = {r["family"] for r in rows}
    assert families <= set(catalog.BY_FAMILY)
    assert catalog.engine_generation(families) == "v1"
    found = catalog.names_found(families)
    assert found["kv_usage"] == "vllm:kv_cache_usage_perc"
    assert found["preemptions"] == "vllm:num_preemptions"
    assert found["ttft"] == "vllm:time_to_first_token_seconds"


def test_cache_config_info_is_extracted_typed():
    rows = parse_text(LOAD_PAGE.read_text(), t=0, endpoint="e")
    config = cache_config(r["labels"] for r in rows if r["family"] == "vllm:cache_config_info")
    assert config["block_size"] == 32
    assert config["num_gpu_blocks"] == 64
    assert config["enable_prefix_caching"] is True
    assert config["num_gpu_blocks_override"] is None
    assert config["gpu_memory_utilization"] == 0.92
    assert config["engines"] == ["0"]


def test_memoised_parse_follows_value_changes():
    text = LOAD_PAGE.read_text()
    parser = ExpositionParser()
    first = parser.parse(text)
    key = 'vllm:num_requests_waiting{engine="0",model_name="tiny"}'
    changed = text.replace(f"{key} 42.0", f"{key} 7.0")
    assert changed != text
    second = parser.parse(changed)
    assert first.ids == second.ids
    waiting = [
        v
        for i, v in zip(second.ids, second.values)
        if parser.series[i].family == "vllm:num_requests_waiting"
    ]
    assert waiting == [7.0]


@pytest.mark.parametrize("bad", ["<html><body>oops</body></html>\n",
                                 'vllm:num_requests_running{engine="0"} notanumber\n'])
def test_garbage_raises_exposition_error(bad):
    parser = ExpositionParser()
    with pytest.raises(ExpositionError):
        parser.parse(bad)


def test_garbage_value_on_a_known_line_raises():
    parser = ExpositionParser()
    parser.parse(
        '# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine="0"} 1\n'
    )
    with pytest.raises(ExpositionError):
        parser.parse('vllm:num_requests_running{engine="0"} x\n')


def test_old_counter_without_total_keeps_its_exposed_name():
    text = "# TYPE vllm:num_preemptions counter\nvllm:num_preemptions 3.0\n"
    (row,) = parse_text(text, t=0, endpoint="e")
    assert (row["family"], row["metric"], row["value"]) == (
        "vllm:num_preemptions",
        "vllm:num_preemptions",
        3.0,
    )
    assert catalog.family_of(row["metric"]).role == "preemptions"


@pytest.mark.parametrize("names,generation,kv", [("v1", "v1", "vllm:kv_cache_usage_perc"),
                                                 ("v0", "v0", "vllm:gpu_cache_usage_perc")])
def test_simulator_pages_parse_and_are_recognised(names, generation, kv):
    sim_testing = pytest.importorskip("loadlab.sim.serve.testing")
    from loadlab.collect.fetch import MetricsFetcher
    from loadlab.sim.engine.config import SimConfig

    with sim_testing.running_sim_in_thread(SimConfig(metrics_names=names)) as url:
        result = MetricsFetcher(f"{url}/metrics", timeout_s=5).fetch()
    assert result.error is None
    rows = parse_text(result.body.decode(), t=0, endpoint=url)
    families = {r["family"] for r in rows}
    assert catalog.engine_generation(families) == generation
    assert catalog.names_found(families)["kv_usage"] == kv
    for role in ("running", "waiting", "preemptions", "ttft", "itl", "prefix_queries"):
        assert role in catalog.names_found(families), role
