"""The measured verdict: knee and cause read from the scheduler's own refusal series of
real ``sim replay`` folders, beside the inferred verdict in analysis.json and the console."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
from groundtruth import SCENARIOS, Scenario, _profile, run_scenario

from loadlab.analyze.analysis import analyze_run
from loadlab.analyze.display import format_details, measured_line
from loadlab.analyze.measured import MATERIAL_REFUSED_SHARE, kv_cause
from loadlab.runstore.analysis_model import read_analysis, write_analysis_file
from loadlab.runstore.layout import ANALYSIS
from loadlab.sim.engine.config import SimConfig

# Mostly short chat with 4% of 40k-token documents on a 3,000-block pool: a document's whole
# sequence (reserve-full-ISL) does not fit beside the short requests running, which would
# have fitted: the head waits while the pool is far from full.
HEAD_BLOCKED = Scenario(
    "head_blocked",
    SimConfig(model="llama-3.1-8b", gpu="h100", max_num_seqs=256, num_gpu_blocks_override=3000,
              max_model_len=45056),
    (4, 12, 24), "long-document-tail", step_s=60.0, warmup_s=5.0,
)
# Every request ~3k tokens on a 500-block pool: two fill 60-70% of it and a third's whole
# sequence does not fit. Not head-of-line blocking: no request behind would fit either.
UNIFORM_LONG = Scenario(
    "uniform_long",
    SimConfig(model="llama-3.1-8b", gpu="h100", max_num_seqs=64, num_gpu_blocks_override=500,
              max_model_len=4096),
    (1, 2, 4, 8), _profile("long-prompt"), step_s=30.0, warmup_s=5.0,
)


def _short(sc: Scenario) -> Scenario:
    """The scenario in 30 s steps: the same knee, a third of the virtual time."""
    return replace(sc, step_s=30.0, warmup_s=5.0)


@pytest.mark.parametrize("name,lower,upper,reason", [
    ("seq_cap", 8, 12, "seq_cap"),
    ("kv_exhausted", 8, 12, "kv_blocks"),
    ("token_budget", 6, 8, "token_budget"),
])
def test_measured_knee_and_cause_follow_the_refusal_counters(tmp_path: Path, name: str,
                                                             lower: int, upper: int,
                                                             reason: str) -> None:
    sc = SCENARIOS[name]
    run_scenario(sc, tmp_path)
    a = analyze_run(tmp_path).as_json()
    knee, cause = a["knee"]["measured"], a["cause"]["measured"]
    assert (knee["found"], knee["lower"], knee["upper"]) == (True, lower, upper), knee
    shares = {row["level"]: row["share"] for row in knee["refused_share"]}
    assert shares[lower] < MATERIAL_REFUSED_SHARE <= min(
        s for lv, s in shares.items() if lv >= upper), shares
    assert cause["name"] == name and cause["reason"] == reason, cause
    assert cause["reason_share"][reason] > 0.9
    assert 0 < cause["refused_steps"] <= cause["engine_steps"]


@pytest.mark.parametrize("scenario", [SCENARIOS["kv_exhausted"], UNIFORM_LONG],
                         ids=["full-pool", "uniform-long-requests"])
def test_kv_blocks_refusals_with_no_room_for_a_typical_request_are_kv_exhausted(
        tmp_path: Path, scenario: Scenario) -> None:
    run_scenario(scenario, tmp_path)
    cause = analyze_run(tmp_path).as_json()["cause"]["measured"]
    assert cause["name"] == "kv_exhausted", cause
    assert cause["head_blocks_needed"] > cause["head_free_blocks"]
    assert cause["typical_fits_share"] < 0.5


def test_a_head_that_does_not_fit_a_half_empty_pool_is_head_blocked(tmp_path: Path) -> None:
    run_scenario(HEAD_BLOCKED, tmp_path)
    cause = analyze_run(tmp_path).as_json()["cause"]["measured"]
    assert cause["name"] == "head_blocked", cause
    assert cause["kv_usage"] < 0.5
    assert cause["head_blocks_needed"] > cause["head_free_blocks"] >= cause[
        "typical_request_blocks"] > 0
    assert cause["typical_fits_share"] >= 0.5


def test_kv_cause_asks_whether_a_typical_request_would_have_fitted() -> None:
    assert kv_cause(0.8) == "head_blocked"
    assert kv_cause(0.5) == "head_blocked"
    assert kv_cause(0.2) == "kv_exhausted"    # mostly no room for an ordinary request either
    assert kv_cause(None) == "kv_exhausted"   # block size or lengths unknown


def test_no_stall_measures_no_knee_and_cause_none(tmp_path: Path) -> None:
    sc = _short(SCENARIOS["none"])
    run_scenario(sc, tmp_path)
    a = analyze_run(tmp_path).as_json()
    knee, cause = a["knee"]["measured"], a["cause"]["measured"]
    assert (knee["found"], knee["lower"], knee["upper"]) == (False, sc.levels[-1], None)
    assert cause["name"] == "none" and cause["refused_steps"] == 0


def test_console_says_plainly_when_measured_and_inferred_disagree(tmp_path: Path) -> None:
    run_scenario(_short(SCENARIOS["seq_cap"]), tmp_path)
    a = analyze_run(tmp_path).as_json()
    line = measured_line(a)
    assert line is not None and format_details(a).splitlines()[0] == line
    assert "knee between 8 and 12 concurrent, cause seq_cap" in line
    assert line.endswith("agrees with the inferred verdict")
    a["cause"]["name"] = "kv_exhausted"   # an inferred verdict the refusals contradict
    assert "DISAGREES with the inferred verdict: cause inferred kv_exhausted, measured seq_cap" \
        in measured_line(a)


def test_analysis_json_keeps_measured_and_old_files_still_load(tmp_path: Path) -> None:
    run_scenario(_short(SCENARIOS["seq_cap"]), tmp_path)
    write_analysis_file(tmp_path, analyze_run(tmp_path))
    back = read_analysis(tmp_path)
    assert back.knee.measured is not None and back.knee.measured.upper == 12
    assert back.cause.measured is not None and back.cause.measured.name == "seq_cap"
    old = json.loads((tmp_path / ANALYSIS).read_text())
    del old["knee"]["measured"], old["cause"]["measured"]
    (tmp_path / ANALYSIS).write_text(json.dumps(old))
    before = read_analysis(tmp_path)
    assert before.knee.measured is None and before.cause.measured is None
    assert measured_line(before.as_json()) is None


def test_the_inferred_verdict_never_reads_the_probe(tmp_path: Path) -> None:
    """Relabel every refusal seq_cap -> token_budget: the measured cause follows, the
    inferred one (vllm: series and client records only) does not move."""
    run_scenario(_short(SCENARIOS["seq_cap"]), tmp_path)
    before = analyze_run(tmp_path).as_json()
    parts = sorted((tmp_path / "metrics.parquet").glob("*.parquet"))
    for part in parts:
        frame = pd.read_parquet(part)
        frame["labels"] = frame["labels"].str.replace('"reason":"seq_cap"',
                                                      '"reason":"token_budget"', regex=False)
        frame.to_parquet(part, index=False)
    after = analyze_run(tmp_path).as_json()
    assert before["cause"]["measured"]["name"] == "seq_cap"
    assert after["cause"]["measured"]["name"] == "token_budget"
    for block in ("cause", "knee"):
        keep = {k: v for k, v in before[block].items() if k != "measured"}
        assert keep == {k: v for k, v in after[block].items() if k != "measured"}


def test_a_measured_cause_among_the_candidates_settles_undetermined(tmp_path: Path) -> None:
    run_scenario(_short(SCENARIOS["seq_cap"]), tmp_path)
    a = analyze_run(tmp_path).as_json()
    a["cause"].update(name="undetermined", candidates=["seq_cap", "token_budget"])
    line = measured_line(a)
    assert line is not None and "DISAGREES" not in line, line
    assert line.endswith("— it settles the inferred seq_cap or token_budget"), line
    a["cause"]["candidates"] = ["kv_exhausted", "token_budget"]
    assert "cause inferred undetermined, measured seq_cap" in measured_line(a)
