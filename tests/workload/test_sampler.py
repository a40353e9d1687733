"""The sampler reproduces each profile's quantiles, is deterministic per (seed, seq),
independent of which process asks for which seq, and keeps BWB's input/output pairing."""

from __future__ import annotations

import warnings
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import pytest

from loadlab.workload import list_profiles, load_profile
from loadlab.workload.derive import correlations

N = 12_000


def _draw(name: str, seed: int, n: int = N) -> tuple[np.ndarray, np.ndarray]:
    sampler = load_profile(name).sampler(seed)
    specs = [sampler.spec(i) for i in range(n)]
    return (
        np.array([s.prompt_tokens for s in specs], float),
        np.array([s.output_tokens for s in specs], float),
    )


@pytest.mark.parametrize("name", list_profiles())
def test_sampled_quantiles_match_the_profile(name: str) -> None:
    model = load_profile(name).model
    lengths = model.lengths
    inp, out = _draw(name, seed=7)
    # with sessions a later turn's prompt grows from the turn before it, which reproduces
    # the input marginal only approximately (documented in model.py)
    loose = model.prefix.kind == "sessions"
    for values, summary, approx in (
        (inp, lengths.input_summary, loose),
        (out, lengths.output_summary, False),
    ):
        for q in (10, 25, 50, 75, 90, 99):
            want = getattr(summary, f"p{q}")
            # compared in probability space: steep parts of a bimodal CDF (Mooncake synthetic)
            # turn tiny sampling noise into large token differences
            below = np.mean(values < np.floor(want))
            at_most = np.mean(values <= np.ceil(want))
            tol = (0.04 if approx else 0.02) if q < 99 else (0.01 if approx else 0.005)
            assert below <= q / 100 + tol and at_most >= q / 100 - tol, (name, q, below, at_most)
        assert values.mean() == pytest.approx(summary.mean, rel=0.08), name
        if not approx:
            assert values.max() <= summary.max and values.min() >= 1


def test_bwb_pairs_keep_the_correlation_and_independent_profiles_do_not_invent_one() -> None:
    joint = load_profile("bwb").model.lengths.joint
    assert joint is not None and joint.spearman > 0.75
    spearman, _ = correlations(*_draw("bwb", seed=3))
    assert spearman == pytest.approx(joint.spearman, abs=0.05)
    spearman_sharegpt, _ = correlations(*_draw("sharegpt", seed=3))
    assert abs(spearman_sharegpt) < 0.05


def test_arxiv_pairs_keep_the_negative_log_correlation() -> None:
    _, log_pearson = correlations(*_draw("arxiv-summarization", seed=5))
    assert log_pearson < -0.35  # the source's Pearson of ln-lengths is -0.48


def test_same_seed_same_sequence_other_seed_differs() -> None:
    a = load_profile("mooncake-conversation").sampler(11)
    b = load_profile("mooncake-conversation").sampler(11)
    c = load_profile("mooncake-conversation").sampler(12)
    seqs = list(range(0, 3000, 7))
    assert [a.spec(i) for i in seqs] == [b.spec(i) for i in reversed(seqs)][::-1]
    assert [a.spec(i) for i in seqs] != [c.spec(i) for i in seqs]


def _specs_in_worker(args: tuple[str, int, list[int]]) -> list[str]:
    name, seed, seqs = args
    sampler = load_profile(name).sampler(seed)
    return [repr(sampler.spec(i)) for i in seqs]


@pytest.mark.parametrize("name", ["azure-code", "mooncake-conversation", "mooncake-synthetic"])
def test_specs_do_not_depend_on_which_worker_asks(name: str) -> None:
    """Three workers take strides of the seq space (one of them backwards), as the load
    generator's do; sessions span all three."""
    seqs = list(range(2500))
    whole = _specs_in_worker((name, 42, seqs))
    strides = [seqs[w::3] for w in range(3)]
    strides[1] = strides[1][::-1]
    with ProcessPoolExecutor(max_workers=2) as pool:
        parts = list(pool.map(_specs_in_worker, [(name, 42, part) for part in strides]))
    split = {seq: spec for part, specs in zip(strides, parts) for seq, spec in zip(part, specs)}
    assert [split[i] for i in seqs] == whole  # repr of floats is exact: byte-for-byte equal


def test_shared_and_unshared_profiles() -> None:
    sys_sampler = load_profile("shared-system-prompt").sampler(1)
    shared = [sys_sampler.spec(i) for i in range(200)]
    assert {s.prefix_group for s in shared} == {0} and {s.prefix_tokens for s in shared} == {1024}
    assert [s.reused_tokens for s in shared[:2]] == [0, 1024] and shared[5].turn is None
    assert sys_sampler.reuse_ratio(2000) == pytest.approx(
        1024 / load_profile("shared-system-prompt").model.lengths.input_summary.mean, rel=0.03
    )
    bwb = load_profile("bwb").sampler(1)
    assert all(
        s.prefix_group is None and s.prefix_tokens == 0 == s.reused_tokens
        for s in (bwb.spec(i) for i in range(200))
    )


def test_arrival_offsets_follow_the_profile_rate() -> None:
    sampler = load_profile("azure-conv").sampler(9)
    offsets = np.array([sampler.spec(i).arrival_s for i in range(N)])
    assert offsets[0] == 0.0 and np.all(np.diff(offsets) >= 0)
    assert (N - 1) / offsets[-1] == pytest.approx(
        load_profile("azure-conv").model.arrivals.rate_per_s, rel=0.05
    )
    assert load_profile("bwb").sampler(9).spec(5).arrival_s is None


def test_a_fixed_length_side_has_no_correlation_rather_than_nan() -> None:
    """A benchmark load of one prompt length (tune refits a run's lengths) is no NaN pair."""
    lengths = np.array([64.0] * 50)
    outputs = np.linspace(10.0, 200.0, 50)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert correlations(lengths, outputs) == (0.0, 0.0)
        spearman, log_pearson = correlations(outputs, outputs[::-1])
    assert spearman == pytest.approx(-1.0) and log_pearson < -0.5
