"""The term choice of `loadlab sim calibrate` (loadlab.calibrate.terms): a term one level
alone exercises is dropped, though it lowers the in-sample error (and the held-out error
of the other levels); a term the levels vary is kept at its true value.

Rows are what fit.py builds: per level, the mean prefill step and the mean decode step's
features (fixed, requests, prefill tokens, attention pairs, context tokens, carries a
prefill), two rows a level, against measured times from known constants.
"""

from __future__ import annotations

import numpy as np
import pytest

from loadlab.calibrate.terms import SUPPORT_RMS, in_sample_rms, least_squares
from loadlab.sim.engine.calibration import TERMS

TRUE = np.array([4e-3, 0.4e-3, 25e-6, 0.0, 1e-6, 0.0])
# (running requests, prompt tokens, context tokens a decode step reads)
LEVELS = [(1, 512, 520), (1, 64, 80), (4, 64, 320), (8, 64, 640), (16, 64, 1280),
          (4, 160, 736), (12, 160, 2200)]


def rows(context: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Two feature rows a level (a prefill step, a decode step) and their groups."""
    features, groups = [], []
    for index, (running, prompt, read) in enumerate(LEVELS):
        features.append([1.0, running, prompt, 0.0, read if context else 0.0, 1.0])
        features.append([1.0, running, 0.0, 0.0, read if context else 0.0, 0.0])
        groups += [index, index]
    return np.array(features), np.array(groups)


def test_a_term_only_one_level_exercises_is_dropped():
    features, groups = rows(context=False)
    features[1, 4] = 520.0                   # only level 0's decode step reads a context
    measured = features @ TRUE
    measured[1] *= 1.25                      # and that level's ITL is off by a quarter
    coef, dropped = least_squares(features, measured, TERMS, groups)
    # in-sample, the context term absorbs that quarter: a rule on the fit's own error keeps it
    weighted = features / measured[:, None]
    with_it, without = in_sample_rms(weighted, [0, 1, 2, 4], groups), \
        in_sample_rms(weighted, [0, 1, 2], groups)
    assert without - with_it >= SUPPORT_RMS
    # its value is level 0's alone (zero with level 0 left out): the rule drops it
    assert coef[4] == 0.0 and "per_context_token_s" in dropped
    assert "one level carries it" in dropped["per_context_token_s"]
    assert coef[0] > 0 and coef[2] == pytest.approx(TRUE[2], rel=0.1)


def test_a_term_the_levels_vary_is_kept_at_its_value():
    features, groups = rows()
    measured = features @ TRUE
    coef, dropped = least_squares(features, measured, TERMS, groups)
    assert set(dropped) == {"per_attention_pair_s", "per_prefill_step_s"}   # TRUE's zeros
    np.testing.assert_allclose(coef, TRUE, rtol=1e-6, atol=1e-12)


def test_too_few_levels_fall_back_to_the_in_sample_error():
    features, groups = rows()
    keep = groups < 2
    coef, dropped = least_squares(features[keep], (features @ TRUE)[keep], TERMS, groups[keep])
    assert coef[0] > 0
    assert all("left out" not in why for why in dropped.values())


def test_a_context_proportional_to_the_requests_is_not_separable():
    """Every request of the same length: the context read is 80 tokens a running request,
    so per-request and per-context fit equally; the earlier of the pair (per request)
    stays, and carries both costs, exact on these loads."""
    features, groups = rows()
    features[:, 4] = 80.0 * features[:, 1]
    measured = features @ TRUE
    coef, dropped = least_squares(features, measured, TERMS, groups)
    assert dropped["per_context_token_s"].startswith("not separable from per_request_s")
    assert coef[4] == 0.0
    assert coef[1] == pytest.approx(TRUE[1] + 80.0 * TRUE[4], rel=1e-6)
