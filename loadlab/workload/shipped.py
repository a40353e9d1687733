"""Regenerate the shipped profiles in ``profiles/`` from the public traces.

Usage: ``python -m loadlab.workload.shipped [TRACES_DIR] [OUT_DIR]``; defaults are
``<repo>/../shared/traces`` and ``<repo>/profiles``. Only this script and the tests
read the traces; run-time code reads the derived YAML files.

ServeGen deepseek-r1 (per-client pmfs, not rows): each client's 6-hourly
``input_tokens`` / ``output_tokens`` pmf (a Python dict literal, parsed with
``ast.literal_eval``) is weighted by that client's expected requests in the window
(sum of rate x 600 s over its 10-minute rows) and the weighted pmfs are pooled. The
arrival model is gamma at the mean aggregate rate with the rate-weighted mean of the
per-client CVs (ServeGen publishes no aggregate CV).
"""

from __future__ import annotations

import ast
import csv
import json
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from loadlab.workload import PROFILES_DIR, SUFFIX
from loadlab.workload.derive import fit_profile, pmf_summary, pmf_table
from loadlab.workload.model import (
    Arrivals,
    ArrivalStats,
    Lengths,
    Prefix,
    ProfileModel,
    Source,
    dump_profile,
)
from loadlab.workload.traces import Columns, TraceData, TraceFormat, read_trace

DEFAULT_TRACES = PROFILES_DIR.parent.parent / "shared" / "traces"
SYSTEM_PROMPT_TOKENS = 1024
SERVEGEN_WINDOW_S = 21600
SERVEGEN_ROW_S = 600

AZURE_SRC = {
    "licence": "CC-BY-4.0",
    "citation": "Patel et al., Splitwise: Efficient generative LLM inference using phase "
    "splitting, ISCA 2024",
}
MOONCAKE_SRC = {
    "licence": "Apache-2.0 (repository licence; the trace files carry none of their own)",
    "citation": "Qin et al., Mooncake: Trading More Storage for Less Computation - "
    "A KVCache-centric Architecture for Serving LLM Chatbot, USENIX FAST 2025",
}
ETALON_SRC = {
    "licence": "Apache-2.0 (project-etalon/etalon); "
    "the underlying text datasets have their own terms",
    "citation": "Agrawal et al., Taming Throughput-Latency Tradeoff in LLM Inference with "
    "Sarathi-Serve, OSDI 2024 (processed traces shared by Sarathi-Serve / Vidur / Etalon)",
}
SERVEGEN_SRC = {
    "licence": "Apache-2.0",
    "citation": "Xiang et al., ServeGen: Workload Characterization and Generation of Large "
    "Language Model Serving in Production, arXiv:2505.09999, 2025",
}
DERIVED = (
    "inverse-CDF tables (numpy linear percentiles) of input/output tokens; arrival rate, "
    "gap CV and dispersion fitted from the timestamps; see loadlab/workload/derive.py"
)
ETALON_COLS = Columns("num_prefill_tokens", "num_decode_tokens")


@dataclass(frozen=True)
class Recipe:
    """Where one row-based shipped profile comes from and how it is described."""

    path: str  # relative to the traces folder
    fmt: TraceFormat
    columns: Columns | None
    dataset: str
    origin: str
    meta: dict[str, str]  # licence and citation
    description: str


_ETALON = "project-etalon/etalon@d5f18de1 data/processed_traces/"
RECIPES: dict[str, Recipe] = {
    "azure-code": Recipe(
        "azure-llm-2023/AzureLLMInferenceTrace_code.csv",
        "azure",
        None,
        "Azure LLM inference trace 2023, code service",
        "Azure/AzurePublicDataset@b469a113 data/AzureLLMInferenceTrace_code.csv",
        AZURE_SRC,
        "Code completion: prefill-heavy (median output 13 tokens, inputs up to 7.4k), "
        "extremely bursty arrivals.",
    ),
    "azure-conv": Recipe(
        "azure-llm-2023/AzureLLMInferenceTrace_conv.csv",
        "azure",
        None,
        "Azure LLM inference trace 2023, conversation service",
        "Azure/AzurePublicDataset@b469a113 data/AzureLLMInferenceTrace_conv.csv",
        AZURE_SRC,
        "Chat service: ~1k-token prompts, bimodal outputs capped at 1,000, near-Poisson arrivals.",
    ),
    "mooncake-conversation": Recipe(
        "mooncake-fast25/conversation_trace.jsonl",
        "mooncake",
        None,
        "Mooncake (Kimi) FAST'25 conversation trace",
        "kvcache-ai/Mooncake@3b5a5941 FAST25-release/traces/conversation_trace.jsonl",
        MOONCAKE_SRC,
        "Production chat with long prompts (p99 85k) and shared prefixes: one common system "
        "block plus multi-turn history (512-token hash blocks).",
    ),
    "mooncake-synthetic": Recipe(
        "mooncake-fast25/synthetic_trace.jsonl",
        "mooncake",
        None,
        "Mooncake FAST'25 synthetic trace (public datasets, Poisson arrivals)",
        "kvcache-ai/Mooncake@3b5a5941 FAST25-release/traces/synthetic_trace.jsonl",
        MOONCAKE_SRC,
        "Bimodal chat turns and long documents (max 191k) with all-or-nothing prefix reuse; "
        "input/output negatively correlated, so lengths are paired.",
    ),
    "sharegpt": Recipe(
        "etalon-processed-lengths/sharegpt_8k_filtered_stats_llama2_tokenizer.csv",
        "csv",
        ETALON_COLS,
        "ShareGPT conversations (<= 8k tokens), Llama-2 tokenizer counts",
        _ETALON + "sharegpt_8k_filtered_stats_llama2_tokenizer.csv",
        ETALON_SRC,
        "Chat mix: median prompt 1.7k, outputs up to 1,024. No timestamps.",
    ),
    "arxiv-summarization": Recipe(
        "etalon-processed-lengths/arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv",
        "csv",
        ETALON_COLS,
        "arXiv summarization (<= 4k total tokens), Llama-2 tokenizer counts",
        _ETALON + "arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv",
        ETALON_SRC,
        "Long-document summarisation: prompts 1.2k-3.9k; lengths paired (the 4k filter makes "
        "long inputs get short outputs). No timestamps.",
    ),
    "bwb": Recipe(
        "etalon-processed-lengths/bwb_stats_llama2_tokenizer_filtered_v2.csv",
        "csv",
        ETALON_COLS,
        "BWB document translation (<= 4k total tokens), Llama-2 tokenizer counts",
        _ETALON + "bwb_stats_llama2_tokenizer_filtered_v2.csv",
        ETALON_SRC,
        "Translation: outputs (~1.6k) longer than inputs (~1k), strongly correlated, so lengths "
        "are paired. No timestamps.",
    ),
}


def _source(dataset: str, origin: str, meta: dict[str, str], derivation: str = DERIVED) -> Source:
    return Source(dataset=dataset, origin=origin, derivation=derivation, **meta)


def from_recipe(traces: Path, name: str) -> tuple[ProfileModel, TraceData]:
    recipe = RECIPES[name]
    trace = read_trace(traces / recipe.path, recipe.fmt, recipe.columns)
    source = _source(recipe.dataset, recipe.origin, recipe.meta)
    return fit_profile(trace, name, recipe.description, source), trace


def shared_system_prompt(conv: ProfileModel, conv_trace: TraceData) -> ProfileModel:
    """azure-conv lengths behind one shared system prompt of SYSTEM_PROMPT_TOKENS."""
    shifted = TraceData(
        conv_trace.path,
        conv_trace.input_tokens + SYSTEM_PROMPT_TOKENS,
        conv_trace.output_tokens,
        conv_trace.timestamps_s,
    )
    base = fit_profile(
        shifted,
        "shared-system-prompt",
        f"Every request starts with the same {SYSTEM_PROMPT_TOKENS}-token system prompt, "
        "followed by an Azure-conv user turn; exercises prefix caching and blocks held by a "
        "hot prefix.",
        conv.source.model_copy(
            update={
                "derivation": f"azure-conv tables with {SYSTEM_PROMPT_TOKENS} tokens added to "
                "every input (the shared prefix is a synthetic assumption, not in the trace); "
                + DERIVED
            }
        ),
    )
    return base.model_copy(
        update={"prefix": Prefix(kind="shared", common_tokens=SYSTEM_PROMPT_TOKENS)}
    )


def servegen_mixture(
    model_dir: Path,
) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], dict[str, float]]:
    """Traffic-weighted pooled pmfs (input/output tokens, reasoning share of the output) and
    arrival figures of one ServeGen model."""
    pooled: dict[str, dict[float, float]] = {
        "input_tokens": defaultdict(float),
        "output_tokens": defaultdict(float),
        "reason_ratio": defaultdict(float),
    }
    aggregate: dict[int, float] = defaultdict(float)
    cv_num = cv_den = 0.0
    for trace_file in sorted(model_dir.glob("chunk-*-trace.csv")):
        expected: dict[int, float] = defaultdict(float)
        with trace_file.open(newline="") as fh:
            for row in csv.reader(fh):
                start, rate, cv = int(float(row[0])), float(row[1]), float(row[2])
                expected[start // SERVEGEN_WINDOW_S * SERVEGEN_WINDOW_S] += rate * SERVEGEN_ROW_S
                aggregate[start] += rate
                if rate > 0 and cv > 0:
                    cv_num += rate * cv
                    cv_den += rate
        dataset = json.loads(
            trace_file.with_name(trace_file.name.replace("-trace.csv", "-dataset.json")).read_text()
        )
        for window, fields in dataset.items():
            weight = expected.get(int(float(window)), 0.0)
            for field, acc in pooled.items():
                pmf = ast.literal_eval(fields.get(field, "{}"))
                total = sum(pmf.values())
                if weight <= 0 or total <= 0:
                    continue
                for value, prob in pmf.items():
                    acc[float(value)] += weight * prob / total
    arrays = {f: (np.array(list(d.keys())), np.array(list(d.values()))) for f, d in pooled.items()}
    rates = np.array([aggregate[k] for k in sorted(aggregate)])
    figures = {
        "rate": float(rates.mean()),
        "cv": cv_num / cv_den,
        "peak": float(rates.max() / rates.mean()),
        "quiet": float(rates.min() / rates.mean()),
        "span": float(len(rates) * SERVEGEN_ROW_S),
    }
    return arrays, figures


def deepseek_r1(traces: Path) -> ProfileModel:
    arrays, fig = servegen_mixture(traces / "servegen/data/reason/deepseek-r1")
    daily = fig["rate"] * fig["span"]
    lengths = Lengths(
        input=pmf_table(*arrays["input_tokens"]),
        output=pmf_table(*arrays["output_tokens"]),
        input_summary=pmf_summary(*arrays["input_tokens"], daily),
        output_summary=pmf_summary(*arrays["output_tokens"], daily),
    )
    arrivals = Arrivals(
        process="gamma",
        rate_per_s=round(fig["rate"], 4),
        cv=round(fig["cv"], 4),
        gamma_shape=round(1 / fig["cv"] ** 2, 6),
        stats=ArrivalStats(
            span_s=fig["span"],
            peak_minute_over_mean=None,
            note=f"busiest 10-min aggregate rate / mean {fig['peak']:.2f}, quietest "
            f"{fig['quiet']:.2f}; cv is the rate-weighted mean per-client CV",
        ),
    )
    derivation = (
        "traffic-weighted pooling of per-client 6-hourly pmfs (weights: expected requests, "
        "rate x 600 s per 10-min row), step inverse-CDF tables; rate = mean aggregate; "
        "see loadlab/workload/shipped.py"
    )
    ratio_values, ratio_weights = arrays["reason_ratio"]
    reasoning = float((ratio_values * ratio_weights).sum() / ratio_weights.sum())
    out = lengths.output_summary
    return ProfileModel(
        name="deepseek-r1",
        description="Reasoning model (DeepSeek-R1) traffic on Alibaba Bailian: short-to-medium "
        f"prompts, long outputs (median {out.p50:,.0f}, p99 {out.p99:,.0f}, max {out.max:,.0f}); "
        f"on average {reasoning:.0%} of each output is reasoning; bursty clients.",
        source=_source(
            "ServeGen deepseek-r1 (73 clients, 1 day)",
            "alibaba/ServeGen@f891d118 data/reason/deepseek-r1/",
            SERVEGEN_SRC,
            derivation,
        ),
        lengths=lengths,
        arrivals=arrivals,
    )


def build_all(traces: Path) -> dict[str, ProfileModel]:
    profiles: dict[str, ProfileModel] = {}
    for name in RECIPES:
        profiles[name], trace = from_recipe(traces, name)
        if name == "azure-conv":
            profiles["shared-system-prompt"] = shared_system_prompt(profiles[name], trace)
    profiles["deepseek-r1"] = deepseek_r1(traces)
    return profiles


def render_file(name: str, model: ProfileModel) -> str:
    """Text of a shipped profile file: an attribution header, then the YAML."""
    header = (
        f"# Workload profile '{name}': DERIVED figures only (no raw trace rows).\n"
        f"# Source: {model.source.origin} ({model.source.licence}).\n"
        f"# Cite: {model.source.citation}.\n"
        "# Regenerate: python -m loadlab.workload.shipped ../shared/traces profiles\n"
    )
    return header + dump_profile(model)


def main(argv: list[str]) -> None:
    traces = Path(argv[0]) if argv else DEFAULT_TRACES
    out = Path(argv[1]) if len(argv) > 1 else PROFILES_DIR
    out.mkdir(parents=True, exist_ok=True)
    for name, model in build_all(traces).items():
        (out / f"{name}{SUFFIX}").write_text(render_file(name, model), encoding="utf-8")
        print(f"wrote {out / (name + SUFFIX)}")


if __name__ == "__main__":
    main(sys.argv[1:])
