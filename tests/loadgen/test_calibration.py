"""The manifest says whether prompts were sized through /tokenize, and why not when not."""

from __future__ import annotations

import pytest

from loadlab.loadgen.prepare import RequestFactory
from loadlab.loadgen.transport import StreamClosed


def _run(fault, cli, load, tiny_profile, out, tokenize: str, *extra: str) -> tuple:
    with fault("ok", tokenize=tokenize) as url:
        res = cli(
            "--target",
            url,
            "--model",
            "m",
            "--profile",
            str(tiny_profile),
            "--concurrency",
            "2",
            "--step-duration",
            "1.5",
            "--warmup",
            "0",
            "--workers",
            "1",
            "--out",
            str(out),
            *extra,
        )
    assert res.returncode == 0, res.stderr
    return load(out)


def test_missing_tokenize_is_recorded_as_uncalibrated_with_the_answer(
    fault, cli, load, tiny_profile, tmp_path
):
    df, manifest = _run(fault, cli, load, tiny_profile, tmp_path / "404", "404")
    workload = manifest["workload"]
    assert workload["calibrated"] is False
    assert "/tokenize unusable (HTTP 404" in workload["calibration_reason"]
    assert len(df) > 0 and set(df.status) == {"ok"}


def test_tokenize_failing_mid_run_falls_back_and_the_manifest_says_how_often(
    fault, cli, load, tiny_profile, tmp_path
):
    # the probe succeeds; then every second count is a 500 and every third a dropped connection
    df, manifest = _run(fault, cli, load, tiny_profile, tmp_path / "flaky", "ok,500,ok,drop")
    workload = manifest["workload"]
    assert workload["calibrated"] is False and workload["uncalibrated_prompts"] >= 1
    assert "/tokenize failed mid-run" in workload["calibration_reason"]
    assert manifest["status"] == "complete" and set(df.status) == {"ok"}


def test_only_tokenize_failures_fall_back_a_bug_is_not_swallowed(fault, tiny_profile):
    with fault("ok") as url:
        factory = RequestFactory(api="completions", model="m", seed=1, base_url=url,
                                 profile=str(tiny_profile), calibrate=True)

    def broken(_text: str) -> int:
        raise StreamClosed("server closed the connection mid-response")

    factory.synth.counter = broken
    assert factory.prepare(0).seq == 0 and factory.calibration.uncalibrated == 1

    def buggy(_text: str) -> int:
        raise KeyError("count")

    factory.synth.counter = buggy
    with pytest.raises(KeyError):
        factory.prepare(1)
