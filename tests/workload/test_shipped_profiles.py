"""Shipped profiles against their sources: the figures in profiles/ are recomputed here
from ../shared/traces with plain numpy/json (not with loadlab's derive code paths)."""

from __future__ import annotations

import ast
import csv
import json
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from loadlab.workload import PROFILES_DIR, list_profiles, load_profile

EXPECTED = {
    "azure-code",
    "azure-conv",
    "mooncake-conversation",
    "mooncake-synthetic",
    "sharegpt",
    "arxiv-summarization",
    "bwb",
    "deepseek-r1",
    "shared-system-prompt",
}
QS = (10, 25, 50, 75, 90, 99)


def _csv_columns(path: Path, a: str, b: str) -> tuple[np.ndarray, np.ndarray]:
    with path.open() as fh:
        rows = list(csv.DictReader(fh))
    return np.array([float(r[a]) for r in rows]), np.array([float(r[b]) for r in rows])


def _jsonl(path: Path) -> tuple[np.ndarray, np.ndarray]:
    rows = [json.loads(line) for line in path.open()]
    return np.array([r["input_length"] for r in rows], float), np.array(
        [r["output_length"] for r in rows], float
    )


def _rows(traces: Path, name: str) -> tuple[np.ndarray, np.ndarray]:
    et = traces / "etalon-processed-lengths"
    sources = {
        "azure-code": lambda: _csv_columns(
            traces / "azure-llm-2023/AzureLLMInferenceTrace_code.csv",
            "ContextTokens",
            "GeneratedTokens",
        ),
        "azure-conv": lambda: _csv_columns(
            traces / "azure-llm-2023/AzureLLMInferenceTrace_conv.csv",
            "ContextTokens",
            "GeneratedTokens",
        ),
        "mooncake-conversation": lambda: _jsonl(
            traces / "mooncake-fast25/conversation_trace.jsonl"
        ),
        "mooncake-synthetic": lambda: _jsonl(traces / "mooncake-fast25/synthetic_trace.jsonl"),
        "sharegpt": lambda: _csv_columns(
            et / "sharegpt_8k_filtered_stats_llama2_tokenizer.csv",
            "num_prefill_tokens",
            "num_decode_tokens",
        ),
        "arxiv-summarization": lambda: _csv_columns(
            et / "arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv",
            "num_prefill_tokens",
            "num_decode_tokens",
        ),
        "bwb": lambda: _csv_columns(
            et / "bwb_stats_llama2_tokenizer_filtered_v2.csv",
            "num_prefill_tokens",
            "num_decode_tokens",
        ),
    }
    return sources[name]()


def test_every_expected_profile_ships_and_names_its_source() -> None:
    assert set(list_profiles()) >= EXPECTED
    for name in EXPECTED:
        model = load_profile(name).model
        assert model.name == name
        text = (PROFILES_DIR / f"{name}.yaml").read_text()
        for field in (model.source.licence, model.source.citation, model.source.origin):
            assert len(field) > 5
        assert "Cite:" in text and "DERIVED" in text
        assert len(text) < 64_000, "profiles hold derived tables, not trace rows"


@pytest.mark.parametrize(
    "name",
    [
        "azure-code",
        "azure-conv",
        "mooncake-conversation",
        "mooncake-synthetic",
        "sharegpt",
        "arxiv-summarization",
        "bwb",
    ],
)
def test_length_quantiles_match_the_trace(traces_dir: Path, name: str) -> None:
    inp, out = _rows(traces_dir, name)
    lengths = load_profile(name).model.lengths
    for values, summary, table in (
        (inp, lengths.input_summary, lengths.input),
        (out, lengths.output_summary, lengths.output),
    ):
        assert summary.n == values.size
        assert summary.mean == pytest.approx(values.mean(), abs=0.01)
        assert summary.max == values.max()
        for q in QS:
            assert getattr(summary, f"p{q}") == pytest.approx(np.percentile(values, q), abs=0.01)
        for p, v in zip(table.p, table.v):
            assert v == pytest.approx(np.percentile(values, p * 100), abs=0.01)


def test_shared_system_prompt_is_azure_conv_behind_a_common_prefix(traces_dir: Path) -> None:
    inp, _ = _rows(traces_dir, "azure-conv")
    model = load_profile("shared-system-prompt").model
    assert model.prefix.kind == "shared"
    assert model.lengths.input_summary.p50 == pytest.approx(
        np.percentile(inp, 50) + model.prefix.common_tokens
    )


def test_arrival_figures_match_the_trace(traces_dir: Path) -> None:
    with (traces_dir / "azure-llm-2023/AzureLLMInferenceTrace_code.csv").open() as fh:
        stamps = np.array([np.datetime64(r["TIMESTAMP"].strip()[:26]) for r in csv.DictReader(fh)])
    t = (stamps - stamps[0]).astype("timedelta64[ns]").astype(float) / 1e9
    gaps = np.diff(t)
    arr = load_profile("azure-code").model.arrivals
    assert arr.process == "gamma"
    assert arr.rate_per_s == pytest.approx((t.size - 1) / t[-1], rel=1e-3)
    assert arr.cv == pytest.approx(gaps.std() / gaps.mean(), rel=1e-3)
    assert arr.gamma_shape == pytest.approx(1 / arr.cv**2, rel=1e-3)
    conv = load_profile("azure-conv").model.arrivals
    assert conv.process == "poisson"


@pytest.mark.parametrize("name", ["mooncake-conversation", "mooncake-synthetic"])
def test_mooncake_sessions_match_hash_ids(traces_dir: Path, name: str) -> None:
    """Recomputed with ids alone (Mooncake's ids are prefix-chained: an id stands for its
    whole prefix): a request's parent is the latest earlier one holding the last id of its
    leading run of seen ids, when that run goes beyond the common block(s)."""
    stem = name.split("-")[1]
    rows = [
        json.loads(line) for line in (traces_dir / f"mooncake-fast25/{stem}_trace.jsonl").open()
    ]
    rows.sort(key=lambda r: r["timestamp"])  # stable: ties keep file order
    pre = load_profile(name).model.prefix
    assert pre.kind == "sessions" and pre.block_tokens == 512 and pre.sessions is not None
    common = pre.common_tokens // 512
    if name == "mooncake-conversation":
        assert common == 1 and all(r["hash_ids"][0] == 0 for r in rows)  # block 0 opens all
    holder: dict[int, int] = {}
    seen: set[int] = set()
    root = list(range(len(rows)))
    reused = total = hit = 0
    gaps = []
    for k, r in enumerate(rows):
        ids = r["hash_ids"]
        lead = 0
        while lead < len(ids) and ids[lead] in holder:
            lead += 1
        if lead > common:
            parent = holder[ids[lead - 1]]
            root[k] = root[parent]
            gaps.append((r["timestamp"] - rows[parent]["timestamp"]) / 1000)
        hit += min(lead * 512, r["input_length"])
        reused += sum(b in seen for b in ids)
        total += len(ids)
        seen.update(ids)
        for b in ids:
            holder[b] = k
    sizes = np.bincount(root)
    stats = pre.stats
    assert stats["block_reuse_ratio"] == pytest.approx(reused / total, abs=1e-4)
    inputs = sum(r["input_length"] for r in rows)
    assert stats["token_prefix_hit_ratio"] == pytest.approx(hit / inputs, abs=1e-4)
    assert stats["sessions"] == (sizes > 0).sum()
    assert stats["later_turn_share"] == pytest.approx(len(gaps) / len(rows), abs=1e-4)
    assert pre.sessions.turns.v[-1] == sizes.max()
    assert pre.sessions.gap_s is not None
    assert pre.sessions.gap_s.p50 == pytest.approx(np.median(gaps), abs=0.01)
    assert sum(c.sessions for c in pre.sessions.classes) == (sizes > 0).sum()


def test_deepseek_r1_is_the_traffic_weighted_servegen_mixture(traces_dir: Path) -> None:
    model_dir = traces_dir / "servegen/data/reason/deepseek-r1"
    pooled: dict[float, float] = defaultdict(float)
    for trace in model_dir.glob("chunk-*-trace.csv"):
        rows = np.loadtxt(trace, delimiter=",", usecols=(0, 1), ndmin=2)
        data = json.loads(
            trace.with_name(trace.name.replace("trace.csv", "dataset.json")).read_text()
        )
        for window, fields in data.items():
            start = float(window)
            weight = rows[(rows[:, 0] >= start) & (rows[:, 0] < start + 21600), 1].sum() * 600
            pmf = ast.literal_eval(fields["output_tokens"])
            total = sum(pmf.values())
            for value, prob in pmf.items():
                if total > 0:
                    pooled[float(value)] += weight * prob / total
    values = np.array(sorted(pooled))
    weights = np.array([pooled[v] for v in values])
    cdf = np.cumsum(weights) / weights.sum()
    out = load_profile("deepseek-r1").model.lengths.output_summary
    assert out.mean == pytest.approx((values * weights).sum() / weights.sum(), rel=1e-4)
    for q in QS:
        assert getattr(out, f"p{q}") == values[np.searchsorted(cdf, q / 100 - 1e-12)]


def test_derivation_script_regenerates_the_committed_files(traces_dir: Path) -> None:
    """Row-based profiles only; deepseek-r1's numbers are recomputed independently above."""
    from loadlab.workload.shipped import RECIPES, from_recipe, render_file, shared_system_prompt

    for name in RECIPES:
        model, trace = from_recipe(traces_dir, name)
        fresh = {name: model}
        if name == "azure-conv":
            fresh["shared-system-prompt"] = shared_system_prompt(model, trace)
        for key, value in fresh.items():
            committed = (PROFILES_DIR / f"{key}.yaml").read_text()
            assert render_file(key, value) == committed, (
                f"{key}: rerun python -m loadlab.workload.shipped"
            )
