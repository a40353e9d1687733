"""The knee's vectorised bootstrap against the loop it replaced (:mod:`bootstrap_reference`).

The fast version draws its resamples in another order, so equal seeds give other
resamples: what must match is the distribution. Checked three ways, all on fixed seeds:
the median shortcut against the exact distribution of a resample's median (enumerated),
each resampled column's mean and spread per step against the loop's, and the agreement
share (the confidence's input) against the loop's over several seeds, on a run whose
agreement is far from 1. The hinge's candidate search must equal the full grid exactly.
"""

from __future__ import annotations

import itertools
import math
import shutil

import bootstrap_reference as ref
import numpy as np
import pytest
from groundtruth import SCENARIOS, run_scenario
from scipy.stats import chisquare

from loadlab.analyze import detectors as det
from loadlab.analyze import knee as kn
from loadlab.analyze.bootstrap import RESAMPLED, median_resamples, resample
from loadlab.analyze.steps import binned, build_step_table, load_run

N = 300


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """token_budget at 15 s scrapes (bootstrap agreement ~0.7) and the same run without metrics."""
    out = tmp_path_factory.mktemp("budget")
    run_scenario(SCENARIOS["token_budget"], out / "server", seed=1, metrics_interval_s=15.0)
    shutil.copytree(out / "server", out / "client")
    shutil.rmtree(out / "client" / "metrics.parquet")
    return out / "server", out / "client"


def knee_inputs(path):
    run = load_run(path)
    table = build_step_table(run)
    knee = kn.find_knee(run, table)
    limited = kn.client_limited(table, run.closed_loop)
    growth = None if run.closed_loop else det.inflight_slopes(binned(run.requests), table)
    return run, table, knee, limited, growth


def exact_median_distribution(x: np.ndarray) -> dict[float, float]:
    """P(median of a resample with replacement = v), over every count vector of the draws."""
    n = len(x)
    out: dict[float, float] = {}
    for cut in itertools.combinations(range(2 * n - 1), n - 1):       # stars and bars
        counts = np.diff([-1, *cut, 2 * n - 1]) - 1
        p = math.factorial(n) / math.prod(math.factorial(c) for c in counts) / n ** n
        v = float(np.median(np.repeat(x, counts)))
        out[v] = out.get(v, 0.0) + p
    return out


@pytest.mark.parametrize("x", [[0.1, 0.2, 0.2, 0.5, 0.9, 1.4, 3.0],          # odd, a tie
                               [0.1, 0.3, 0.4, 0.4, 0.8, 1.1, 2.0, 5.0]])    # even: two middles
def test_median_shortcut_has_the_exact_resample_distribution(x):
    x = np.sort(np.asarray(x))
    exact = exact_median_distribution(x)
    draws = median_resamples(np.random.default_rng(3), x, 40_000)
    values = sorted(exact)
    observed = np.array([np.isclose(draws, v, rtol=0, atol=1e-12).sum() for v in values])
    assert observed.sum() == len(draws)                 # never a value the exact law excludes
    expected = np.array([exact[v] for v in values]) * len(draws)
    big = expected >= 5                                  # chi-square needs 5+ per cell
    obs, exp = observed[big], expected[big]
    if not big.all():                                   # the rare values as one cell
        obs, exp = np.append(obs, observed[~big].sum()), np.append(exp, expected[~big].sum())
    assert chisquare(obs, exp).pvalue > 1e-3, dict(zip(values, observed))
    loop = [np.median(x[np.random.default_rng(s).integers(0, len(x), len(x))]) for s in range(2000)]
    assert np.mean(loop) == pytest.approx(sum(v * p for v, p in exact.items()), abs=0.05)


def test_hinge_candidates_equal_the_full_grid():
    rng = np.random.default_rng(7)
    for trial in range(400):
        m = int(rng.integers(2, 12))
        c = (np.sort(rng.choice(np.arange(1, 60), m, replace=False)).astype(float) if trial % 2
             else np.round(rng.uniform(0, 10, m), 2))
        w = np.maximum(0, c - rng.uniform(0, c.max()))[None, :] + rng.normal(
            0, rng.choice([0.01, 1, 5]), (4, m)
        )
        grid = np.arange(0.0, c.max() + det.HINGE_GRID, det.HINGE_GRID)
        sse = ((np.maximum(0.0, c[None, None, :] - grid[None, :, None]) - w[:, None, :]) ** 2).sum(
            axis=2
        )
        psi, err = det.hinge_psi(c, w)
        np.testing.assert_array_equal(psi, grid[np.argmin(sse, axis=1)])
        np.testing.assert_array_equal(err, sse.min(axis=1))


@pytest.mark.parametrize("which", [0, 1], ids=["server", "client-only"])
def test_resampled_columns_match_the_loop(runs, which):
    run, table, *_ = knee_inputs(runs[which])
    fast = resample(run, table, N, seed=11)
    pieces = ref.step_pieces(run, table)
    rng = np.random.default_rng(12)
    loop = [ref.resample(table, pieces, rng) for _ in range(N)]
    varied = 0
    for col in RESAMPLED:
        slow = np.array([det.column(t, col) for t in loop])              # (N, steps)
        for i in range(len(table)):
            a, b = fast[col][:, i], slow[:, i]
            assert np.isnan(a).mean() == pytest.approx(np.isnan(b).mean(), abs=0.05), (col, i)
            a, b = a[~np.isnan(a)], b[~np.isnan(b)]
            if len(b) == 0 or np.std(b) == 0:  # not resampled here: the table's value
                assert np.all(a == b[0]) if len(b) else len(a) == 0, (col, i)
                continue
            varied += 1
            sd = np.std(b)
            assert abs(a.mean() - b.mean()) <= 5 * sd * math.sqrt(2 / N), (
                col,
                i,
                a.mean(),
                b.mean(),
            )
            assert 0.75 <= np.std(a) / sd <= 1.33, (col, i, np.std(a), sd)
    assert varied >= len(table)        # the comparison saw real spread, step by step


def test_agreement_matches_the_loop_over_seeds(runs):
    run, table, knee, limited, growth = knee_inputs(runs[0])
    seeds = range(5)
    fast = np.array([kn._bootstrap(knee, run, table, limited, growth, s) for s in seeds])
    slow = np.array(
        [ref.agreement(knee, run, table, limited, growth, kn.BOOTSTRAP_N, 100 + s) for s in seeds]
    )
    assert 0.2 < slow.mean() < 0.98                     # a run the bootstrap is unsure of
    spread = math.sqrt(slow.mean() * (1 - slow.mean()) / kn.BOOTSTRAP_N / len(seeds))
    assert abs(fast.mean() - slow.mean()) <= 4 * math.sqrt(2) * spread + 1e-9, (fast, slow)
    assert fast[0] == kn._bootstrap(knee, run, table, limited, growth, 0)   # seeded


def test_client_only_confidence_equals_the_loops(runs):
    run, table, knee, limited, growth = knee_inputs(runs[1])
    fast = kn._bootstrap(knee, run, table, limited, growth, 0)
    slow = ref.agreement(knee, run, table, limited, growth, kn.BOOTSTRAP_N, 0)
    level = [kn.HIGH_AGREEMENT, kn.MEDIUM_AGREEMENT]
    assert [fast >= t for t in level] == [slow >= t for t in level], (fast, slow)
