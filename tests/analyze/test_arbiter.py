"""The learned cause arbiter: its numpy evaluator, the committed model and how its
probabilities become a name and a confidence."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from test_cause_rules import sig

from loadlab.analyze import arbiter


def _tree(feature: int, threshold: float, missing_left: bool, low: float,
          high: float) -> dict[str, list[Any]]:
    """One split: ``feature <= threshold`` scores ``low``, else ``high``."""
    return {"feature": [feature, 0, 0], "threshold": [threshold, 0.0, 0.0],
            "missing_left": [int(missing_left), 0, 0], "left": [1, -1, -1],
            "right": [2, -1, -1], "value": [0.0, low, high]}


def _model(baseline: list[float], trees: list[list[dict[str, list[Any]]]],
           classes: tuple[str, ...] = ("seq_cap", "token_budget")) -> arbiter.Model:
    return arbiter.model_from_json({"classes": list(classes), "features": ["a", "b"],
                                    "baseline": baseline, "trees": trees})


def test_the_evaluator_sums_each_class_trees_and_takes_the_softmax() -> None:
    m = _model([0.0, 1.0], [[_tree(0, 0.5, True, 2.0, -2.0), _tree(1, 3.0, False, 0.0, 1.0)]])
    p = m.probabilities({"a": 0.5, "b": 4.0})   # a <= 0.5 goes left: raw (2, 2)
    assert p["seq_cap"] == pytest.approx(0.5)
    p = m.probabilities({"a": 0.6, "b": 3.0})   # raw (-2, 1)
    assert p["token_budget"] == pytest.approx(np.exp(1) / (np.exp(-2) + np.exp(1)))
    # a missing input follows the branch fitted for it: a left, b right
    assert m.probabilities({"a": np.nan}) == m.probabilities({"a": 0.0, "b": 9.0})


def test_the_committed_model_reproduces_scikit_learns_probabilities() -> None:
    data = json.loads(arbiter.MODEL.read_text())
    fitted = arbiter.model()
    assert fitted is not None
    assert fitted.classes == arbiter.CLASSES and fitted.features == arbiter.FEATURES
    assert data["meta"]["sets"] and all(s.startswith(("tuning", "validation"))
                                        for s in data["meta"]["sets"])
    assert len(data["checks"]) >= 4
    for check in data["checks"]:
        x = {k: np.nan if v is None else v for k, v in check["features"].items()}
        got = fitted.probabilities(x)
        assert got == pytest.approx(check["probabilities"], abs=1e-9)


def _weigh(monkeypatch: pytest.MonkeyPatch, p: dict[str, float], rule: str = "seq_cap",
           knee_confidence: str | None = "high") -> dict[str, Any] | None:
    raw = np.log([p[c] for c in arbiter.CLASSES])
    fake = arbiter.Model(arbiter.CLASSES, arbiter.FEATURES, raw, [])
    monkeypatch.setattr(arbiter, "model", lambda: fake)
    s = sig([12, 12, 12], kv_max=0.7, kv_mean=0.6)
    n = len(s.steps)
    return arbiter.arbitrate(rule, s, {rule: 0.9}, np.full(n, 400.0), np.full(n, 30.0),
                             np.zeros(n, dtype=bool), knee_confidence, True)


def _p(**shares: float) -> dict[str, float]:
    rest = (1.0 - sum(shares.values())) / (len(arbiter.CLASSES) - len(shares))
    return {c: shares.get(c, rest) for c in arbiter.CLASSES}


def test_a_sure_pick_is_named_high_unless_the_knee_is_unsure(
        monkeypatch: pytest.MonkeyPatch) -> None:
    out = _weigh(monkeypatch, _p(token_budget=0.995))
    assert out is not None
    assert (out["name"], out["confidence"]) == ("token_budget", "high")
    assert out["arbiter"]["rule"] == "seq_cap"
    assert out["arbiter"]["probabilities"]["token_budget"] == pytest.approx(0.995)
    assert set(out["arbiter"]["features"]) == set(arbiter.FEATURES)
    out = _weigh(monkeypatch, _p(token_budget=0.995), knee_confidence="low")
    assert out is not None and out["confidence"] == "medium"
    out = _weigh(monkeypatch, _p(seq_cap=0.85))
    assert out is not None and (out["name"], out["confidence"]) == ("seq_cap", "medium")
    out = _weigh(monkeypatch, _p(seq_cap=0.6))
    assert out is not None and out["confidence"] == "low"


def test_no_cause_more_likely_than_not_is_undetermined_with_the_two_likeliest(
        monkeypatch: pytest.MonkeyPatch) -> None:
    out = _weigh(monkeypatch, {"head_blocked": 0.1, "kv_exhausted": 0.05, "seq_cap": 0.4,
                               "token_budget": 0.45})
    assert out is not None
    assert out["name"] == "undetermined" and out["candidates"] == ["token_budget", "seq_cap"]


def test_a_full_pool_the_rules_read_as_a_dashboard_caliber_keeps_that_reading(
        monkeypatch: pytest.MonkeyPatch) -> None:
    out = _weigh(monkeypatch, _p(kv_exhausted=0.97), rule="dashboard_caliber")
    assert out is not None and out["name"] == "dashboard_caliber"
    out = _weigh(monkeypatch, _p(seq_cap=0.97), rule="dashboard_caliber")
    assert out is not None and out["name"] == "seq_cap"


def test_without_a_model_the_rules_name_stands_and_the_inputs_are_reported(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(arbiter, "model", lambda: None)
    s = sig([12, 12, 12], kv_max=0.7, kv_mean=0.6, cap=12)
    n = len(s.steps)
    out = arbiter.arbitrate("seq_cap", s, {"seq_cap": 1.0}, np.full(n, 400.0),
                            np.full(n, 30.0), np.zeros(n, dtype=bool), "high", True)
    assert out is not None
    assert (out["name"], out["confidence"], out["arbiter"]["probabilities"]) == (
        "seq_cap", None, None)
    assert out["arbiter"]["features"]["cap_known"] == 1.0
    assert out["arbiter"]["features"]["running_top_per_level"] == pytest.approx(12 / 30)
    # not where the rules did not decide (no knee, a client, failures)
    assert arbiter.arbitrate("seq_cap", s, {}, np.zeros(n), np.zeros(n),
                             np.zeros(n, dtype=bool), "high", False) is None


def test_beyond_the_range_it_was_fitted_on_the_arbiter_stands_aside(
        monkeypatch: pytest.MonkeyPatch) -> None:
    sure = _p(token_budget=0.999)
    raw = np.log([sure[c] for c in arbiter.CLASSES])
    fitted = arbiter.Model(arbiter.CLASSES, arbiter.FEATURES, raw, [],
                           {"running_top_per_level": (0.0, 0.5), "kv_mean": (0.0, 1.0)})
    monkeypatch.setattr(arbiter, "model", lambda: fitted)
    s = sig([12, 12, 12], kv_max=0.7, kv_mean=0.6)   # running 12 of 30 users: 0.4, inside
    n = len(s.steps)
    args = (s, {"seq_cap": 0.9}, np.full(n, 400.0), np.full(n, 30.0), np.zeros(n, dtype=bool),
            "high", True)
    out = arbiter.arbitrate("seq_cap", *args)
    assert out is not None and out["name"] == "token_budget" and "outside" not in out["arbiter"]
    s.levels = [10.0, 15.0, 20.0]                     # 12 of 20: 0.6, beyond what it saw
    out = arbiter.arbitrate("seq_cap", *args)
    assert out is not None
    assert (out["name"], out["confidence"]) == ("seq_cap", None)   # the rules decide
    assert out["arbiter"]["outside"] == ["running_top_per_level"]
    assert out["arbiter"]["probabilities"]["token_budget"] == pytest.approx(0.999)


def test_the_committed_model_knows_the_range_of_each_input() -> None:
    fitted = arbiter.model()
    assert fitted is not None and set(fitted.ranges) <= set(arbiter.FEATURES)
    assert len(fitted.ranges) >= len(arbiter.FEATURES) - 2
    assert all(lo <= hi for lo, hi in fitted.ranges.values())


def test_the_note_says_what_the_arbiter_found() -> None:
    p = {"seq_cap": 0.45, "token_budget": 0.4, "head_blocked": 0.1, "kv_exhausted": 0.05}
    assert arbiter.weighing("undetermined", p) == (
        "weighed together, the figures make no limit more likely than not "
        "(seq_cap 45%, token_budget 40%)")
    assert arbiter.weighing("seq_cap", p).startswith("weighed together, the figures favour "
                                                     "seq_cap (seq_cap 45%")
