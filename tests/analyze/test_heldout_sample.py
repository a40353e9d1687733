"""A few tuning seeds through the held-out harness (benchmarks/heldout): generate, replay,
measure the truth from the ``loadlab:`` series alone, strip them, analyse, score."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest

from loadlab.analyze.analysis import analyze_run
from loadlab.analyze.tables import read_metrics
from loadlab.runstore import read_manifest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "heldout"))
heldout = importlib.import_module("score")   # the harness, as `python score.py` runs it
generate = heldout.generate

SAMPLE = [3, 5, 8]            # quick tuning seeds: closed loop, a knee and none
STRIPPED_FLAGS_SEED = 8        # a seed whose scenario strips the server flags
CAUSES = {"seq_cap", "kv_exhausted", "head_blocked", "token_budget", "unknown", "none"}


@pytest.fixture(scope="module")
def kept(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One seed's replayed folder and its analysed copy, kept for the checks below."""
    keep = tmp_path_factory.mktemp("heldout")
    heldout.score_seed(STRIPPED_FLAGS_SEED, keep=keep)
    return keep / str(STRIPPED_FLAGS_SEED)


def test_seed_sets_are_disjoint_and_the_generator_deterministic() -> None:
    tuning, validation = set(heldout.seeds_of("tuning")), set(heldout.seeds_of("validation"))
    assert len(validation) >= 240 and tuning and not tuning & validation
    assert generate(41) == generate(41) != generate(42)
    assert generate(STRIPPED_FLAGS_SEED)["strip_flags"] is True


def test_a_few_tuning_seeds_are_scored_end_to_end() -> None:
    result = heldout.score(SAMPLE, jobs=1)
    rows, summary = result["rows"], result["summary"]
    assert [r["seed"] for r in rows] == SAMPLE and summary["n"] == len(SAMPLE)
    for r in rows:
        assert r["truth_cause"] in CAUSES, r
        assert r["cause_right"] == (r["truth_cause"] == r["inferred_cause"])
    assert sum(c["n"] for c in summary["confusion"]) == len(SAMPLE)
    assert sum(c["n"] for c in summary["calibration"].values()) == len(SAMPLE)
    text = heldout.render(summary)
    assert "confusion" in text and "calibration" in text
    json.dumps(result)   # the result file is plain JSON


def test_truth_comes_from_the_loadlab_series_alone(kept: Path, tmp_path: Path) -> None:
    truth = heldout.truth_of(kept / "run")
    assert truth["knee"]["refused_share"], truth
    # the same truth once every vLLM series but the KV gauge is gone from the folder
    only = heldout.stripped_copy(kept / "run", tmp_path / "only", strip_flags=True)
    only_metrics = only / "metrics.parquet"
    for part in only_metrics.glob("*.parquet"):
        part.unlink()
    full = read_metrics(kept / "run")
    kept_rows = full[full["family"].astype(str).str.startswith("loadlab:")
                     | (full["family"].astype(str) == "vllm:kv_cache_usage_perc")]
    kept_rows.to_parquet(only_metrics / "part-only.parquet", index=False)
    assert heldout.truth_of(only) == truth
    with pytest.raises(RuntimeError, match="no loadlab: series"):
        heldout.truth_of(kept / "analysed")


def test_the_analysed_copy_has_no_loadlab_series_nor_flags(kept: Path) -> None:
    original = read_metrics(kept / "run")["family"].astype(str)
    copy = read_metrics(kept / "analysed")["family"].astype(str)
    assert original.str.startswith("loadlab:").any()
    assert not copy.str.startswith("loadlab:").any()
    assert set(copy) == {f for f in set(original) if not f.startswith("loadlab:")}
    manifest = read_manifest(kept / "analysed")
    assert "loadlab:" not in json.dumps(manifest["metrics"])
    assert "server" not in manifest and "flags" not in manifest["target"]["launch"]
    assert read_manifest(kept / "run")["server"]["max_num_seqs"] == generate(
        STRIPPED_FLAGS_SEED)["server"]["max_num_seqs"]
    a = analyze_run(kept / "analysed").as_json()
    assert "measured" not in a["knee"] and "measured" not in a["cause"]


def test_an_abstention_is_never_right_and_has_its_own_column() -> None:
    row = {"truth_cause": "seq_cap", "knee_right": True, "confidence": "medium",
           "cause_confidence": "low"}
    rows = [{**row, "inferred_cause": "seq_cap", "cause_right": True},
            {**row, "inferred_cause": "undetermined", "cause_right": False},
            {**row, "inferred_cause": "kv_exhausted", "cause_right": False}]
    summary = heldout.summarise(rows)
    assert summary["abstained"] == round(1 / 3, 4) and summary["cause_right"] == round(1 / 3, 4)
    assert summary["cause_right_answered"] == 0.5
    assert summary["cause_calibration"]["low"]["n"] == 3
    text = heldout.render(summary)
    assert "undetermined" in text.splitlines()[1] and "abstained (undetermined) 33%" in text
