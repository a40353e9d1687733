"""Lengths fitted to a context window: resampled from the profile, clipped for traces."""

from __future__ import annotations

from loadlab.loadgen.prepare import TraceSpecs
from loadlab.workload import RequestSpec, load_profile
from loadlab.workload.fit import ContextFit, FitCounts, budget, clip, fits


def test_resampled_requests_all_fit_and_are_the_profile_given_that_they_fit() -> None:
    prof = load_profile("sharegpt")
    sampler = prof.sampler(7)
    fit = ContextFit(sampler, 1024, prof, seed=7)
    counts = FitCounts()
    for seq in range(400):
        out = fit.fitted(seq)
        counts.add(out.how)
        assert fits(out.spec, 1024) and out.spec.seq == seq
        drawn = sampler.spec(seq)
        if fits(drawn, 1024):
            assert out.how is None and out.spec == drawn  # a request that fits is left alone
        else:
            assert out.how == "resampled" and out.spec.prefix_tokens < out.spec.prompt_tokens
    assert counts.resampled > 200 and counts.clipped == 0
    # Pure in (profile, seed, seq): another instance (another worker) draws the same.
    again = ContextFit(prof.sampler(7), 1024, prof, seed=7)
    assert [again.fitted(s).spec for s in range(50)] == [fit.fitted(s).spec for s in range(50)]


def test_profile_with_arrivals_resamples_without_walking_its_schedule() -> None:
    prof = load_profile("azure-conv")
    fit = ContextFit(prof.sampler(1), 64, prof, seed=1)
    out = fit.fitted(10**7)
    assert fits(out.spec, 64) and out.spec.arrival_s == prof.sampler(1).spec(10**7).arrival_s


def test_trace_rows_are_clipped(tmp_path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.0,100,50\n2023-11-16 18:15:47.0,2000,50\n"
        "2023-11-16 18:15:48.0,900,300\n"
    )
    fit = ContextFit(TraceSpecs(str(trace), 1.0), 1000)
    got = [fit.fitted(i) for i in range(3)]
    assert [(g.spec.prompt_tokens, g.spec.output_tokens, g.how) for g in got] == [
        (100, 50, None), (999, 1, "clipped"), (900, 100, "clipped")]


def test_clip_keeps_a_unique_token_after_the_prefix_and_budget_spares_uncalibrated() -> None:
    cut = clip(RequestSpec(0, 5000, 10, 3, 4990, None), 1000)
    assert (cut.prompt_tokens, cut.output_tokens, cut.prefix_tokens) == (999, 1, 998)
    assert budget(1000, calibrated=True) == 1000 and budget(1000, calibrated=False) == 900


def test_session_turns_that_do_not_fit_become_lone_requests() -> None:
    prof = load_profile("mooncake-conversation")
    fit = ContextFit(prof.sampler(3), 4096, prof, seed=3)
    outs = [fit.fitted(seq) for seq in range(300)]
    assert all(fits(o.spec, 4096) for o in outs)
    resampled = [o.spec for o in outs if o.how == "resampled"]
    assert resampled and all(s.turn is None and s.prefix_group in (0, None) for s in resampled)
    assert all(s.reused_tokens == (s.prefix_tokens if s.seq else 0) for s in resampled)
    kept = [o.spec for o in outs if o.how is None]
    assert any(s.turn for s in kept)  # turns that fit keep their session
