"""The knee's bracket rules on real replayed run folders: a noisy top step, a large cap."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
from groundtruth import SCENARIOS, Scenario, run_scenario

from loadlab.analyze.detectors import light_queue, votes
from loadlab.analyze.knee import STATES, bracket, find_knee, state_codes
from loadlab.analyze.steps import build_step_table, load_run


@pytest.fixture(scope="module")
def seq_cap(tmp_path_factory):
    out = tmp_path_factory.mktemp("seqcap")
    return out, run_scenario(SCENARIOS["seq_cap"], out, seed=2, metrics_interval_s=1.0)


def test_one_recovered_top_step_does_not_erase_the_stall():
    levels = [2.0, 4.0, 8.0, 16.0, 32.0]
    found, lower, upper, _ = bracket(levels, ["ok", "ok", "stalled", "stalled", "ok"])
    assert (found, lower, upper) == (True, 4.0, 8.0)
    # two ok steps above a stall are believed: no knee
    assert bracket(levels, ["ok", "stalled", "stalled", "ok", "ok"])[:3] == (False, 32.0, None)
    # an ok step in the middle is not the exception either
    assert bracket(levels, ["ok", "stalled", "ok", "stalled", "stalled"])[:3] == (True, 8.0, 16.0)


def test_a_noisy_top_step_is_a_knee_with_a_note_and_less_confidence(seq_cap):
    """The top step's window replaced by the first (idle) step's: ok, ok, ..., stalled, ok."""
    run_dir, truth = seq_cap
    run = load_run(run_dir)
    table = build_step_table(run)
    clean = find_knee(run, table.copy())
    assert (clean.found, clean.upper) == (True, truth.upper)
    top, first = table.index[-1], table.index[0]
    keep = {"step", "level", "concurrency"}
    for col in table.columns:
        if col not in keep:
            table.at[top, col] = table.at[first, col]
    knee = find_knee(run, table)
    assert knee.states[-1] == "ok" and knee.states[-2] == "stalled"
    assert (knee.found, knee.lower, knee.upper) == (True, truth.lower, truth.upper)
    assert any("top step (24) read ok" in r for r in knee.reasons), knee.reasons
    assert knee.confidence in ("medium", "low")


def test_a_one_deep_queue_above_a_cap_of_64_is_the_knee(tmp_path):
    """Dashboard caliber with 65 blocks of 256 tokens (~100-token requests): 66 users keep
    one request waiting all the time. A floor growing with in-flight (5% of 66 = 3.3)
    judged that step ok and put the knee one step late."""
    base = SCENARIOS["dashboard_caliber"]
    sc = Scenario("caliber64", replace(base.cfg, num_gpu_blocks_override=66),
                  (48, 56, 64, 66, 70, 80), base.profile, step_s=40.0, warmup_s=10.0)
    truth = run_scenario(sc, tmp_path, seed=0, metrics_interval_s=1.0)
    assert (truth.lower, truth.upper, truth.cause) == (64, 66, "dashboard_caliber")
    run = load_run(tmp_path)
    knee = find_knee(run, build_step_table(run))
    assert knee.detectors["little"]["per_step"][3] is True
    assert (knee.found, knee.lower, knee.upper) == (True, 64, 66)


def test_one_stalled_step_is_never_high_confidence(tmp_path):
    """Only the top step stalls: however stable under resampling, it is one piece of
    evidence (before, agreement alone made it high)."""
    base = SCENARIOS["seq_cap"]
    sc = Scenario("top_only", base.cfg, (2, 4, 6, 8, 12), base.profile)
    truth = run_scenario(sc, tmp_path, seed=0, metrics_interval_s=1.0)
    assert truth.upper == 12
    run = load_run(tmp_path)
    knee = find_knee(run, build_step_table(run))
    assert (knee.found, knee.upper) == (True, 12)
    assert knee.confidence != "high", knee.reasons


def test_occupancy_decides_where_it_was_read_often_enough_and_vetoes_elsewhere():
    """Queue share, Little's mean and the hinge say stalled, occupancy says not: a deep
    queue for a moment (a long head, a burst), not a persistent one, and the head was
    refused in under half the engine steps. Over 20+ scrapes occupancy decides alone; with
    a handful its "not" still stands against the rest (the queue was seen in fewer than
    half the scrapes), while its "stalled" needs a majority or a tie. With no occupancy
    vote the majority decides, a tie going to the counter-based detectors."""
    nan = np.nan
    votes = {"queue": np.array([1.0, 1.0, 0.0, 1.0, 1.0, 1.0]),
             "little": np.array([1.0, 1.0, 0.0, 1.0, 0.0, 0.0]),
             "occupancy": np.array([0.0, 0.0, 1.0, nan, nan, nan]),
             "hinge": np.array([1.0, 1.0, 1.0, 0.0, 0.0, 1.0])}
    decisive = np.array([True, False, False, False, False, False])
    codes = state_codes(votes, np.zeros(6, dtype=bool), decisive)
    assert [STATES[c] for c in codes] == ["ok", "ok", "stalled", "stalled", "ok", "stalled"]


def test_dense_scrapes_need_occupancy_above_half():
    """With 20 or more scrapes a step the time share of a non-empty queue needs 0.6: steps
    that leave requests waiting run longer, so the time share overstates the step share.
    With a handful of scrapes half still counts."""
    table = pd.DataFrame({"level": [8.0, 8.0, 8.0], "waiting_occupancy": [0.55, 0.55, 0.6],
                          "waiting_snapshots": [40.0, 4.0, 40.0]})
    found = votes(table, True, np.array([1.0, 1.0, 1.0]), None)
    assert found["occupancy"].tolist() == [0.0, 1.0, 1.0]


def test_a_light_queue_in_a_few_scrapes_is_no_stall():
    """Held-out seed 1800133 (spent validation12), 15 s scrapes: the top step's queue was
    seen in 3 of its 4 scrapes and held under half a request on average (Little's law),
    yet the detectors called it stalled, a knee and a cap were named; the scheduler
    refused the head in 26% of its engine steps (open-loop arrivals waiting for the step
    in progress). A light queue vetoes the stall where more than a fifth of fewer than 20
    scrapes saw none; a queue seen in 4 scrapes of 5 (one deep above a cap), a deeper
    one, or occupancy read densely keep theirs."""
    table = pd.DataFrame({"waiting_occupancy": [0.75, 0.8, 0.75, 0.75],
                          "waiting_snapshots": [4.0, 5.0, 4.0, 40.0]})
    light = light_queue(table, np.array([0.42, 1.3, 6.0, 0.42]), closed=False)
    assert light.tolist() == [True, False, False, False]
    ones = np.ones(4)
    stalled = {"queue": ones, "occupancy": ones, "little": ones}
    codes = state_codes(stalled, np.zeros(4, dtype=bool), np.zeros(4, dtype=bool), light)
    assert [STATES[c] for c in codes] == ["ok", "stalled", "stalled", "stalled"]


def test_a_queue_of_a_fifth_of_the_users_is_no_light_queue():
    """A real vLLM capped at 4 seats, 6 users, 5 s steps (tests/vllm/test_analyzer_vllm.py,
    7 scrapes a step): the queue can hold two requests at most, was seen in 5 scrapes of 7
    and held 1.66 on average (Little's law); every detector called the step stalled and the
    light-queue veto took it back, putting the knee a level late. In a closed loop a
    queue light in requests is light only where it is a small share of those in flight
    (under a fifth): a request or two waiting among dozens, not two of six. An open loop's
    arrivals waiting for the step in progress keep the veto at any in-flight count."""
    table = pd.DataFrame({"waiting_occupancy": [0.714, 0.75],
                          "waiting_snapshots": [7.0, 4.0],
                          "inflight": [6.0, 40.0]})
    waiting = np.array([1.66, 1.3])
    assert light_queue(table, waiting, closed=True).tolist() == [False, True]
    assert light_queue(table, waiting, closed=False).tolist() == [True, True]
