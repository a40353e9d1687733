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
LONG_HEAD_SEED = 300000        # a tuning2 seed of the long-head family (a quick replay)
CAUSES = {"seq_cap", "kv_exhausted", "head_blocked", "token_budget", "unknown", "none"}


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A replay cache of this module's own."""
    return tmp_path_factory.mktemp("heldout-cache")


@pytest.fixture(scope="module")
def kept(tmp_path_factory: pytest.TempPathFactory, cache: Path) -> Path:
    """One seed's replayed folder and its analysed copy, kept for the checks below."""
    keep = tmp_path_factory.mktemp("heldout")
    heldout.score_seed(STRIPPED_FLAGS_SEED, keep=keep, cache=cache)
    return keep / str(STRIPPED_FLAGS_SEED)


def test_seed_sets_are_disjoint_and_the_generator_deterministic() -> None:
    sets = {k: set(v) for k, v in heldout.seed_sets().items() if k != "spent"}
    assert set(sets) >= {"tuning", "validation", "tuning2", "validation2"}
    assert len(sets["validation2"]) >= 200
    assert {"validation", "validation2"} <= set(heldout.seed_sets()["spent"])
    names = sorted(sets)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            assert not sets[a] & sets[b], (a, b)
    assert generate(41) == generate(41) != generate(42)
    assert generate(STRIPPED_FLAGS_SEED)["strip_flags"] is True


def test_the_second_sets_draw_the_long_head_and_budget_families() -> None:
    families = [generate(s).get("family", "base") for s in heldout.seeds_of("tuning2")]
    assert {"base", "long_head", "token_budget"} <= set(families)
    assert all("family" not in generate(s) for s in SAMPLE)   # the first sets unchanged
    spec = generate(LONG_HEAD_SEED)
    assert spec["family"] == "long_head"
    assert [p["class"] for p in spec["workload"]["mix"]] == ["short", "document"]


def test_a_long_head_seed_measures_head_blocked(cache: Path) -> None:
    spec, run_dir, _ = heldout.replayed(LONG_HEAD_SEED, cache)
    cause = heldout.truth_of(run_dir, spec["server"]["block_size"])["cause"]
    # the head needs more blocks than are free while the median request would have fitted
    assert cause["name"] == "head_blocked", cause
    assert cause["head_blocks_needed"] > cause["head_free_blocks"] >= cause[
        "typical_request_blocks"]


def test_a_replay_is_cached_per_seed_and_spec(cache: Path) -> None:
    first = heldout.score_seed(SAMPLE[0], cache=cache)
    again = heldout.score_seed(SAMPLE[0], cache=cache)
    assert first["replay_s"] > 0 and again["replay_s"] == 0
    drop = {"replay_s", "analyse_s"}
    assert {k: v for k, v in again.items() if k not in drop} == {
        k: v for k, v in first.items() if k not in drop}
    stamp = cache / str(SAMPLE[0]) / "spec.json"
    stamp.write_text(json.dumps({**generate(SAMPLE[0]), "seed": -1}))   # another spec
    assert heldout.score_seed(SAMPLE[0], cache=cache)["replay_s"] > 0


def test_a_few_tuning_seeds_are_scored_end_to_end(cache: Path) -> None:
    result = heldout.score(SAMPLE, jobs=1, cache=cache)
    rows, summary = result["rows"], result["summary"]
    assert [r["seed"] for r in rows] == SAMPLE and summary["n"] == len(SAMPLE)
    for r in rows:
        assert r["truth_cause"] in CAUSES, r
        assert r["cause_right"] == (r["truth_cause"] == r["inferred_cause"])
        assert r["truth_kind"] in heldout.TRUTH_KINDS, r
        assert (r["truth_kind"] == "no stall") == (r["truth_cause"] == "none"), r
    assert sum(c["n"] for c in summary["confusion"]) == len(SAMPLE)
    assert sum(c["n"] for c in summary["calibration"].values()) == len(SAMPLE)
    assert sum(c["n"] for c in summary["by_truth_kind"].values()) == len(SAMPLE)
    text = heldout.render(summary)
    assert "confusion" in text and "calibration" in text
    json.dumps(result)   # the result file is plain JSON


def test_truth_comes_from_the_loadlab_series_alone(kept: Path, tmp_path: Path) -> None:
    block_size = generate(STRIPPED_FLAGS_SEED)["server"]["block_size"]
    truth = heldout.truth_of(kept / "run", block_size)
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
    assert heldout.truth_of(only, block_size) == truth
    with pytest.raises(RuntimeError, match="no loadlab: series"):
        heldout.truth_of(kept / "analysed", block_size)


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


def _truth(shares: dict[str, float], upper: int | None = 4, fits: float | None = None,
           name: str = "token_budget") -> dict:
    reason = max(shares, key=lambda r: shares[r]) if shares else None
    return {"knee": {"found": upper is not None, "upper": upper},
            "cause": {"name": name, "reason": reason, "reason_share": shares,
                      "typical_fits_share": fits}}


def test_truth_kind_tells_a_split_scheduler_from_a_plain_one() -> None:
    levels = [1.0, 2.0, 4.0, 8.0]
    kind = heldout.truth_kind
    assert kind(_truth({"token_budget": 0.9, "kv_blocks": 0.1}), levels) == "clear"
    assert kind(_truth({"token_budget": 0.52, "kv_blocks": 0.48}), levels) == "split"
    assert kind(_truth({"kv_blocks": 1.0}, fits=0.45, name="kv_exhausted"), levels) == "kv line"
    assert kind(_truth({"kv_blocks": 1.0}, fits=0.3, name="kv_exhausted"), levels) == "clear"
    assert kind(_truth({"seq_cap": 1.0}, upper=8), levels) == "top level only"
    assert kind(_truth({}, upper=None, name="none"), levels) == "no stall"
    row = {"truth_cause": "seq_cap", "knee_right": True, "confidence": "medium",
           "cause_confidence": "low", "inferred_cause": "seq_cap"}
    rows = [{**row, "cause_right": True, "truth_kind": "clear"},
            {**row, "cause_right": False, "truth_kind": "split"},
            {**row, "cause_right": True, "truth_kind": "split"}]
    summary = heldout.summarise(rows)
    assert summary["by_truth_kind"] == {"clear": {"n": 1, "cause_right": 1},
                                        "split": {"n": 2, "cause_right": 1}}
    assert "split                2      50%" in heldout.render(summary)


def test_the_client_streams_see_the_long_head_the_scheduler_refused(cache: Path) -> None:
    # the token streams alone (no loadlab: series, no flags) tell the same story as the
    # scheduler's refusals: in most steps with a queue the head lacked blocks, seats free,
    # and the free blocks would have held a median request
    row = heldout.score_seed(LONG_HEAD_SEED, cache=cache)
    assert row["truth_cause"] == "head_blocked"
    stream = {k: v for k, v in row["arbiter"]["features"].items() if k.startswith("stream_")}
    assert stream["stream_queued_mean"] > 0.5, stream
    assert stream["stream_head_short"] > 0.5 and stream["stream_head_short_seats"] > 0.5, stream
    assert stream["stream_head_short_room"] > 0.5 and stream["stream_full_batch"] < 0.2, stream
