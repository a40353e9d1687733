"""The one table of metric names loadlab samples (vLLM's, and its own), and their meaning.

Every family vLLM has exposed since the V0 engine is listed once with its
Prometheus type, a canonical *role* (what the analyzer asks for: "kv_usage",
"running", "ttft", ...) and the *era* it belongs to:

- ``v1``: the V1 engine's names (current; 0.32 newcomers included)
- ``both``: exposed by V0 and V1 alike
- ``v0``: V0-engine only (swap to CPU, V0 throughput gauges)
- ``renamed``: an older name of a V1 metric (``gpu_cache_usage_perc`` ->
  ``kv_cache_usage_perc``, ``gpu_prefix_cache_*`` -> ``prefix_cache_*``,
  ``time_per_output_token_seconds`` -> ``inter_token_latency_seconds``)
- ``loadlab``: not vLLM's own: the scheduler's refusals (``loadlab:scheduler_*``),
  served by loadlab's simulator and by its probe inside a real vLLM; sampled like
  vLLM's families, but no sign of an engine generation

Names are *family* names as ``prometheus_client``'s parser reports them: a
counter's family has no ``_total`` (its samples do, or did not in some old
servers), a histogram's samples add ``_bucket``/``_sum``/``_count``. Note that
``vllm:iteration_tokens_total`` is a histogram whose family name really ends in
``_total``. Servers differ between releases, so the harness reads what a server
exposes (:func:`names_found`, :func:`engine_generation`) rather than assume one.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class MetricDef:
    """One vLLM metric family: its type, canonical role and era."""

    family: str
    type: str  # counter | gauge | histogram
    role: str
    era: str  # v1 | both | v0 | renamed | loadlab


def _defs(type_: str, era: str, pairs: Iterable[tuple[str, str]]) -> list[MetricDef]:
    return [MetricDef(f"vllm:{name}", type_, role, era) for name, role in pairs]


CATALOG: tuple[MetricDef, ...] = tuple(
    _defs("gauge", "both", [
        ("num_requests_running", "running"),
        ("num_requests_waiting", "waiting"),
    ])
    + _defs("gauge", "v1", [
        ("kv_cache_usage_perc", "kv_usage"),
        ("num_requests_waiting_by_reason", "waiting_by_reason"),
        ("cache_config_info", "cache_config"),
        ("engine_sleep_state", "sleep_state"),
        ("lora_requests_info", "lora_info"),
    ])
    + _defs("counter", "both", [
        ("num_preemptions", "preemptions"),
        ("prompt_tokens", "prompt_tokens"),
        ("generation_tokens", "generation_tokens"),
        ("request_success", "request_success"),
    ])
    + _defs("counter", "v1", [
        ("prefix_cache_queries", "prefix_queries"),
        ("prefix_cache_hits", "prefix_hits"),
        ("external_prefix_cache_queries", "external_prefix_queries"),
        ("external_prefix_cache_hits", "external_prefix_hits"),
        ("mm_cache_queries", "mm_cache_queries"),
        ("mm_cache_hits", "mm_cache_hits"),
        ("prompt_tokens_by_source", "prompt_tokens_by_source"),
        ("prompt_tokens_cached", "prompt_tokens_cached"),
        ("prompt_tokens_cached_by_source", "prompt_tokens_cached_by_source"),
        ("admission_rejections", "admission_rejections"),
        ("estimated_flops_per_gpu", "estimated_flops"),
        ("estimated_read_bytes_per_gpu", "estimated_read_bytes"),
        ("estimated_write_bytes_per_gpu", "estimated_write_bytes"),
        ("corrupted_requests", "corrupted_requests"),
        ("spec_decode_num_drafts", "spec_drafts"),
        ("spec_decode_num_draft_tokens", "spec_draft_tokens"),
        ("spec_decode_num_accepted_tokens", "spec_accepted_tokens"),
        ("spec_decode_num_accepted_tokens_per_pos", "spec_accepted_tokens_per_pos"),
    ])
    + _defs("histogram", "both", [
        ("time_to_first_token_seconds", "ttft"),
        ("e2e_request_latency_seconds", "e2e"),
        ("request_queue_time_seconds", "queue_time"),
        ("request_inference_time_seconds", "inference_time"),
        ("request_prefill_time_seconds", "prefill_time"),
        ("request_decode_time_seconds", "decode_time"),
        ("request_prompt_tokens", "request_prompt_tokens"),
        ("request_generation_tokens", "request_generation_tokens"),
        ("request_params_max_tokens", "request_max_tokens"),
        ("request_params_n", "request_n"),
        ("request_max_num_generation_tokens", "request_max_generation_tokens"),
        ("iteration_tokens_total", "iteration_tokens"),
    ])
    + _defs("histogram", "v1", [
        ("inter_token_latency_seconds", "itl"),
        ("request_time_per_output_token_seconds", "tpot"),
        ("request_num_preemptions", "request_preemptions"),
        ("request_prefill_kv_computed_tokens", "request_prefill_kv_computed"),
    ])
    + _defs("gauge", "renamed", [("gpu_cache_usage_perc", "kv_usage")])
    + _defs("counter", "renamed", [
        ("gpu_prefix_cache_queries", "prefix_queries"),
        ("gpu_prefix_cache_hits", "prefix_hits"),
    ])
    + _defs("histogram", "renamed", [("time_per_output_token_seconds", "itl")])
    + [MetricDef(f"loadlab:{name}", type_, role, "loadlab") for name, type_, role in (
        ("scheduler_steps", "counter", "scheduler_steps"),
        ("scheduler_refused_steps", "counter", "refused_steps"),
        ("scheduler_head_blocks_needed", "gauge", "head_blocks_needed"),
        ("scheduler_head_free_blocks", "gauge", "head_free_blocks"),
        ("scheduler_head_running", "gauge", "head_running"),
    )]
    + _defs("gauge", "v0", [
        ("cpu_cache_usage_perc", "cpu_kv_usage"),
        ("num_requests_swapped", "swapped"),
        ("gpu_prefix_cache_hit_rate", "prefix_hit_rate"),
        ("cpu_prefix_cache_hit_rate", "cpu_prefix_hit_rate"),
        ("avg_prompt_throughput_toks_per_s", "prompt_throughput"),
        ("avg_generation_throughput_toks_per_s", "generation_throughput"),
        ("spec_decode_draft_acceptance_rate", "spec_acceptance_rate"),
    ])
)

BY_FAMILY: dict[str, MetricDef] = {d.family: d for d in CATALOG}
ROLES: frozenset[str] = frozenset(d.role for d in CATALOG)

# Families whose presence alone says which engine generation serves.
_V0_MARKERS = frozenset(d.family for d in CATALOG if d.era == "v0")
_V1_MARKERS = frozenset(d.family for d in CATALOG if d.era == "v1")

_HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def family_of(sample_name: str) -> MetricDef | None:
    """The catalog entry a sample name belongs to, or None for an unknown name.

    Accepts family names and sample names alike: ``vllm:num_preemptions_total``,
    ``vllm:num_preemptions``, ``vllm:iteration_tokens_total_bucket``.
    """
    found = BY_FAMILY.get(sample_name)
    if found is not None:
        return found
    for suffix in _HISTOGRAM_SUFFIXES:
        if sample_name.endswith(suffix):
            found = BY_FAMILY.get(sample_name[: -len(suffix)])
            if found is not None and found.type == "histogram":
                return found
    if sample_name.endswith("_total"):
        found = BY_FAMILY.get(sample_name[: -len("_total")])
        if found is not None and found.type == "counter":
            return found
    return None


def families_for_role(role: str) -> list[str]:
    """Every family name that carries ``role``, current name first."""
    order = {"v1": 0, "both": 0, "loadlab": 0, "renamed": 1, "v0": 2}
    defs = sorted((d for d in CATALOG if d.role == role), key=lambda d: order[d.era])
    return [d.family for d in defs]


def names_found(families: Iterable[str]) -> dict[str, str]:
    """Map each role to the family a server exposes for it.

    When a server exposes both a current and a renamed family for one role
    (vLLM 0.9-0.11 did during deprecation), the current name wins.
    """
    present = set(families)
    found: dict[str, str] = {}
    for role in sorted(ROLES):
        for family in families_for_role(role):
            if family in present:
                found[role] = family
                break
    return found


def engine_generation(families: Iterable[str]) -> str:
    """"v0", "v1" or "unknown", from which families a server exposes.

    A V0-only family (swap, V0 throughput gauges) means V0; otherwise a V1-only
    family means V1; a lone ``gpu_cache_usage_perc`` is V0-era (early V1
    releases exposed it too, but also V1-only families such as prefix counters).
    """
    present = set(families)
    if present & _V0_MARKERS:
        return "v0"
    if present & _V1_MARKERS:
        return "v1"
    if "vllm:gpu_cache_usage_perc" in present:
        return "v0"
    return "unknown"
