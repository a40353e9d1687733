"""benchmarks/heldout/train_arbiter.py: the trees it writes are scikit-learn's, and it fits
on tuning data only."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import numpy as np
import pytest

from loadlab.analyze import arbiter

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "heldout"))
train = importlib.import_module("train_arbiter")


def _rows(n: int, seed: int = 0) -> list[dict]:
    """Scored rows whose measured cause follows two of the inputs, with NaNs among them."""
    rng = np.random.default_rng(seed)
    grid = np.linspace(0.05, 0.95, 10)   # every set sees the grid's ends: none out of range
    rows = []
    for i in range(n):
        x = dict.fromkeys(arbiter.FEATURES, 0.5)
        x.update({f: float(rng.choice(grid)) for f in ("score_seq_cap", "kv_mean",
                                                       "typical_per_free")})
        x["kv_queued"] = None if i % 3 == 0 else 0.5
        truth = ("seq_cap" if x["score_seq_cap"] > 0.5 else "token_budget") if x["kv_mean"] < 0.7 \
            else ("head_blocked" if x["typical_per_free"] < 0.35 else "kv_exhausted")
        rows.append({"set": f"tuning{1 + i % 3}", "truth_cause": truth, "confidence": "high",
                     "cause_right": False, "arbiter": {"rule": "seq_cap", "features": x}})
    return rows


def test_the_exported_trees_give_scikit_learns_probabilities() -> None:
    from sklearn.ensemble import HistGradientBoostingClassifier

    rows = _rows(300)
    x, y, _, _ = train.table(rows)
    model = HistGradientBoostingClassifier(**train.PARAMS).fit(x, y)
    ours = arbiter.model_from_json(train.export(model))
    assert ours.classes == tuple(arbiter.CLASSES)
    fresh = train.table(_rows(100, seed=1))[0]     # new runs, missing inputs among them
    theirs = model.predict_proba(fresh)
    mine = np.array([[ours.probabilities(dict(zip(arbiter.FEATURES, r)))[c]
                      for c in model.classes_] for r in fresh])
    assert np.abs(theirs - mine).max() < 1e-9


def test_the_estimate_judges_each_set_by_a_model_that_never_saw_it() -> None:
    rows = _rows(300)
    cv = train.cross_validate(rows)
    assert set(cv["per_set"]) == {"tuning1", "tuning2", "tuning3"}
    # the rules' seq_cap is right where the cause was the cap
    assert cv["n"] == 300 and cv["rules_right"] == sum(r["truth_cause"] == "seq_cap"
                                                        for r in rows)
    assert cv["right"] >= 270   # two clean splits, learnt from the other sets
    assert sum(c["n"] for c in cv["by_confidence"].values()) == 300


def test_a_held_out_set_not_yet_spent_is_refused(monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(train, "seed_sets", lambda: {
        "tuning2": [1], "validation8": [2], "validation99": [3], "spent": ["validation8"]})
    monkeypatch.setattr(sys, "argv", ["train_arbiter.py", "--sets", "tuning2", "validation8",
                                      "validation99"])
    with pytest.raises(SystemExit) as stop:
        train.main()
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "validation99 is a held-out set not yet spent" in err and "validation8 " not in err
