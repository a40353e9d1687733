"""Separability in `loadlab sim calibrate` (rule 0 of loadlab.calibrate.terms), on runs the
simulator made with known constants (`sim replay --calibration KNOWN`).

A server whose step costs a fixed time per request and nothing per context token, run on
loads where every request has the same lengths: the context a decode step reads is then
a near-constant multiple of the requests it runs, so the fit cannot split their costs; the
context term is named not separable and left out, and the per-request cost is found. Add
a load with five times the outputs (so another context per request) on a server that pays
both, and both are found.

A server that pays a cost once per step carrying prefill tokens (the fixed cost alone
cannot be both its decode and its prefill steps): with other prompts at one level only,
left out that level leaves every prompt one length, the step cost cannot be told from
the per-token one and is left out; with a third prompt length at two more levels it is
found, and a server that pays none on the same loads gets none.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from loadlab.calibrate import fit_runs
from loadlab.cli.sim import sim
from loadlab.sim.engine.calibration import Calibration, StepTerms

PROFILES = Path(__file__).resolve().parents[1] / "vllm" / "profiles"
SERVER = {"max_num_seqs": 8, "max_num_batched_tokens": 256, "block_size": 32,
          "num_gpu_blocks_override": 512, "max_model_len": 1024}
PER_REQUEST = StepTerms(fixed_s=4e-3, per_request_s=1e-3, per_prefill_token_s=25e-6)
BOTH = StepTerms(fixed_s=4e-3, per_request_s=0.5e-3, per_prefill_token_s=25e-6,
                 per_context_token_s=5e-6)
PREFILL_STEP = StepTerms(fixed_s=5e-3, per_prefill_step_s=4e-3, per_request_s=0.1e-3,
                         per_prefill_token_s=20e-6)
ONE_LENGTH = {"tiny-prefill": "1", "tiny-short": "1,2,4,8"}
TWO_LENGTHS = {**ONE_LENGTH, "tiny-decode": "1,2,4,8"}
THREE_PROMPTS = {**TWO_LENGTHS, "tiny-long": "4,8"}


def replay(root: Path, step: StepTerms, loads: dict[str, str]) -> list[Path]:
    """One replayed step load per profile of ``loads`` on a server with ``step``."""
    root.mkdir()
    Calibration(step=step, front_s=5e-3, server=SERVER).save(root / "known.yaml")
    for profile, levels in loads.items():
        result = CliRunner().invoke(sim, [
            "replay", "--calibration", str(root / "known.yaml"),
            "--profile", str(PROFILES / f"{profile}.yaml"), "--concurrency", levels,
            "--step-duration", "15", "--warmup", "2", "--interval", "0.5",
            "--out", str(root / profile)])
        assert result.exit_code == 0, result.output
    return [root / profile for profile in loads]


def test_one_length_cannot_split_per_request_from_per_context(tmp_path):
    cal = fit_runs(replay(tmp_path / "one", PER_REQUEST, ONE_LENGTH))
    reason = cal.dropped["per_context_token_s"]
    assert reason.startswith("not separable from per_request_s"), cal.dropped
    assert "other prompt or output lengths" in reason
    assert cal.step.per_context_token_s == 0.0
    assert cal.step.per_request_s == pytest.approx(PER_REQUEST.per_request_s, rel=0.15)
    assert cal.step.fixed_s == pytest.approx(PER_REQUEST.fixed_s, rel=0.1)


def test_two_lengths_recover_both(tmp_path):
    cal = fit_runs(replay(tmp_path / "two", BOTH, TWO_LENGTHS))
    assert "per_context_token_s" not in cal.dropped and "per_request_s" not in cal.dropped
    assert cal.step.per_context_token_s == pytest.approx(BOTH.per_context_token_s, rel=0.1)
    assert cal.step.per_request_s == pytest.approx(BOTH.per_request_s, rel=0.25)
    assert cal.step.fixed_s == pytest.approx(BOTH.fixed_s, rel=0.1)
    assert cal.step.per_prefill_step_s == 0.0 and "per_prefill_step_s" in cal.dropped


def test_one_prefill_level_cannot_split_per_prefill_step(tmp_path):
    cal = fit_runs(replay(tmp_path / "one", PREFILL_STEP, TWO_LENGTHS))
    assert cal.dropped["per_prefill_step_s"].startswith(
        "not separable from per_prefill_token_s"), cal.dropped


def test_a_cost_per_prefill_step_is_found(tmp_path):
    cal = fit_runs(replay(tmp_path / "three", PREFILL_STEP, THREE_PROMPTS))
    assert "per_prefill_step_s" not in cal.dropped, cal.dropped
    assert cal.step.per_prefill_step_s == pytest.approx(PREFILL_STEP.per_prefill_step_s,
                                                        rel=0.15)
    assert cal.step.fixed_s == pytest.approx(PREFILL_STEP.fixed_s, rel=0.1)
    none = fit_runs(replay(tmp_path / "none", PREFILL_STEP.model_copy(
        update={"per_prefill_step_s": 0.0}), THREE_PROMPTS))
    assert none.step.per_prefill_step_s == 0.0, none.step
    assert none.step.fixed_s == pytest.approx(PREFILL_STEP.fixed_s, rel=0.1)
