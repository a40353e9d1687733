"""``loadlab tune`` on a simulator-made run with a deliberately poor configuration.

The run: the simulator (Llama-3.1-8B on an H100, its KV pool fitting hundreds of requests)
capped at ``--max-num-seqs 2``, 2-8 users, replayed in virtual time. Tune must rank a
larger cap first with a higher predicted knee, refuse what the limits forbid, and write a
scenario that ``loadlab sweep --what-if`` runs to the same knees.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from loadlab.analyze.analysis import analyze_run
from loadlab.cli import main
from loadlab.experiment.runner import run_sweep
from loadlab.experiment.scenarios import load_scenario
from loadlab.experiment.tune import TUNE_JSON, TUNE_YAML, TuneRequest, TuneResult, tune
from loadlab.experiment.tune_space import candidates, parse_search, scaled_pool
from loadlab.replay.driver import run_replay
from loadlab.runstore import read_manifest
from loadlab.sim.engine.calibration import Calibration, StepTerms
from loadlab.sim.engine.config import SimConfig
from loadlab.spec.plan import LoadPlan
from loadlab.spec.scenario import Workload

PROFILES = Path(__file__).resolve().parents[1] / "vllm" / "profiles"


@pytest.fixture(scope="module")
def poor_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tune") / "run"
    run_replay(SimConfig(max_num_seqs=2, model="llama-3.1-8b", gpu="h100"),
               LoadPlan(concurrency=[2, 4, 8], step_duration_s=10.0, warmup_s=2.0),
               Workload(profile="azure-conv", seed=1), out)
    return out


@pytest.fixture(scope="module")
def tuned(poor_run, tmp_path_factory) -> TuneResult:
    grid = parse_search(["max-num-seqs=8,32", "gpu-memory-utilization=0.92,0.95"])
    request = TuneRequest(grid, memory=0.92, slo="ttft_p99_ms=2000", max_level=32)
    return tune(poor_run, request, tmp_path_factory.mktemp("tune") / "out")


def test_a_larger_seq_cap_ranks_first_with_a_higher_predicted_knee(tuned) -> None:
    ran = [o for o in tuned.outcomes if not o.refused]
    assert [o.name for o in ran] == ["max-num-seqs-32", "max-num-seqs-8", "current"]
    current = ran[-1]
    assert (current.knee_lower, current.knee_upper) == (2, 4) and current.cause == "seq_cap"
    assert ran[0].capacity is not None and current.capacity is not None
    assert ran[0].capacity >= 16 > ran[1].capacity >= 8 > current.capacity
    assert ran[0].figures["ttft_p99_ms"] < current.figures["ttft_p99_ms"]   # at the top load, 8
    assert tuned.levels == [2, 4, 8, 16, 32]                               # extended past 8
    written = json.loads((tuned.out / TUNE_JSON).read_text())
    assert [c["name"] for c in written["candidates"]][:3] == [o.name for o in ran]
    assert written["slo"] == {"ttft_p99_s": 2.0}


def test_the_memory_ceiling_refuses_a_larger_fraction(tuned) -> None:
    refused = {o.name: o.refused for o in tuned.outcomes if o.refused}
    assert set(refused) == {"max-num-seqs-8_gpu-memory-utilization-0.95",
                            "max-num-seqs-32_gpu-memory-utilization-0.95"}
    assert all("above the --memory ceiling 0.92" in why for why in refused.values())
    assert [o.refused is not None for o in tuned.outcomes][-2:] == [True] * 2   # ranked last


def test_the_written_scenario_sweeps_to_the_predicted_knees(tuned, tmp_path) -> None:
    scenario = load_scenario(tuned.out / TUNE_YAML)
    assert scenario.baseline == "current"
    assert list(scenario.sweep.arms) == ["current", "max-num-seqs-32", "max-num-seqs-8"]
    result = run_sweep(scenario, tmp_path / "sweep", what_if=True, progress=lambda _: None)
    predicted = {o.name: (o.knee_lower, o.knee_upper) for o in tuned.outcomes}
    for point in result.manifest.points:
        assert point.status == "complete"
        knee = analyze_run(tmp_path / "sweep" / str(point.dir)).knee
        assert (knee.lower, knee.upper) == predicted[point.name], point.name


def test_a_prompt_longer_than_max_model_len_is_refused(poor_run, tmp_path) -> None:
    request = TuneRequest(parse_search(["max-model-len=4096,65536"]), longest_prompt=8000)
    result = tune(poor_run, request, tmp_path)
    refused = {o.name: o.refused for o in result.outcomes if o.refused}
    assert list(refused) == ["max-model-len-4096"]
    assert "cannot hold the longest prompt (8000 tokens)" in refused["max-model-len-4096"]


@pytest.mark.parametrize(("args", "said"), [
    (["--search", "max-num-sequences=8"], "--search: 'max-num-sequences=8' is not a searchable"),
    (["--search", "max-num-seqs=eight"], "--search max-num-seqs: cannot read the values"),
    (["--search", "enable-prefix-caching=maybe"], "give true/false separated by commas"),
    ([], "--search: nothing to search"),
])
def test_bad_search_exits_2_naming_the_field_and_fix(poor_run, tmp_path, capsys, args, said):
    with pytest.raises(SystemExit) as exc:
        main(["tune", str(poor_run), *args, "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and said in err and "fix:" in err


def test_a_second_tune_into_the_same_out_exits_2(tuned, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["tune", str(tuned.run_dir), "--search", "max-num-seqs=8", "--out", str(tuned.out)])
    assert exc.value.code == 2 and "--out: already holds a tune" in capsys.readouterr().err


def test_a_missing_run_folder_exits_2(tmp_path, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["tune", str(tmp_path / "nope"), "--search", "max-num-seqs=8"])
    assert exc.value.code == 2 and "RUN: not a run folder" in capsys.readouterr().err


def test_the_grid_is_capped_and_the_current_values_dropped() -> None:
    grid = parse_search(["max-num-seqs=2,4,8", "block-size=16,32"])
    cands, cut = candidates(grid, {"max_num_seqs": 2, "block_size": 16}, cap=3)
    assert [c.name for c in cands] == ["current", "block-size-32", "max-num-seqs-4",
                                       "max-num-seqs-4_block-size-32"]
    assert cut == 2


def test_a_reported_pool_scales_with_memory_and_holds_its_tokens_at_another_block_size():
    current = {"gpu_memory_utilization": 0.5, "block_size": 16}
    assert scaled_pool(1000, current, {"gpu_memory_utilization": 0.75}) == 1500
    assert scaled_pool(1000, current, {"block_size": 32}) == 500


def test_a_vllm_runs_reported_pool_scales_with_memory(poor_run, tmp_path) -> None:
    """A server the simulator has no profile of: the pool it reported (vLLM's
    cache_config_info) is the what-if's, scaled by the fraction."""
    run = tmp_path / "vllm-run"
    shutil.copytree(poor_run, run)
    manifest = read_manifest(run)
    blocks = manifest["server"]["num_gpu_blocks"]          # also in cache_config_info
    flags = {"max_num_seqs": 2, "gpu_memory_utilization": 0.46, "served_model_name": "m"}
    manifest.update(kind="run", server=flags, target={
        "base_url": "http://127.0.0.1:8000", "model": "m", "launch": {
            "kind": "vllm", "flags": flags, "argv": ["vllm", "serve", "org/my-model"]}})
    (run / "manifest.json").write_text(json.dumps(manifest))
    result = tune(run, TuneRequest(parse_search(["gpu-memory-utilization=0.92"]), max_level=8),
                  tmp_path / "out")
    pools = {o.name: o.flags["num_gpu_blocks"] for o in result.outcomes}
    assert pools == {"current": blocks, "gpu-memory-utilization-0.92": 2 * blocks}
    assert any("step times: the simulator's llama-3.1-8b on h100" in n for n in result.notes)
    scenario = load_scenario(tmp_path / "out" / TUNE_YAML)
    assert scenario.target.launch == "vllm" and scenario.target.model == "org/my-model"
    assert scenario.what_if.flags["num_gpu_blocks_override"] == blocks


def test_confirm_refuses_when_the_current_configuration_ranks_first(poor_run, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["tune", str(poor_run), "--search", "max-num-seqs=1", "--max-level", "8",
              "--confirm", "--out", str(tmp_path)])
    captured = capsys.readouterr()
    assert exc.value.code == 2
    assert "--confirm: the current configuration ranks first" in captured.err
    assert captured.out.splitlines()[1].split()[:2] == ["1", "current"]   # the table came first
    assert not (tmp_path / "confirm").exists()


SLOW_SERVER = Calibration(   # a server whose steps are ~3x the H100 profile's at 2 running
    step=StepTerms(fixed_s=20e-3, per_request_s=2e-3, per_prefill_token_s=25e-6,
                   per_context_token_s=1e-6),
    front_s=6e-3, front_per_in_flight_s=1e-3, turnaround_s=3e-3,
    server={"max_num_seqs": 2, "max_num_batched_tokens": 256, "block_size": 32,
            "num_gpu_blocks_override": 512, "max_model_len": 1024})


def test_tune_with_a_calibration_of_the_run_predicts_with_its_step_times(tmp_path) -> None:
    """The issue's recipe on a simulator-made run of SLOW_SERVER (a calibration's replay
    records it in the manifest's server block): calibrate the run, tune with the fit, and
    the predicted ITL is the server's, not the H100 profile's, and a cap past the calibrated
    one is said to be extrapolated; with the run's calibration file gone the profile stands
    in, and the notes say so."""
    SLOW_SERVER.save(tmp_path / "slow.yaml")
    run, fit = tmp_path / "run", tmp_path / "fit.yaml"
    main(["sim", "replay", "--calibration", str(tmp_path / "slow.yaml"), "--profile",
          str(PROFILES / "tiny-short.yaml"), "--concurrency", "1,2", "--step-duration", "10",
          "--warmup", "2", "--interval", "0.5", "--out", str(run)])
    main(["sim", "calibrate", str(run), "--out", str(fit)])
    grid = parse_search(["max-num-seqs=4"])
    result = tune(run, TuneRequest(grid, max_level=4, calibration=fit), tmp_path / "cal")
    current = next(o for o in result.outcomes if o.name == "current")
    step_at_2 = SLOW_SERVER.step.fixed_s + 2 * SLOW_SERVER.step.per_request_s
    assert current.figures["itl_p50_ms"] == pytest.approx(step_at_2 * 1e3, rel=0.1)
    assert f"step times: the calibration {fit}" in result.notes
    assert any("ran at most 2 requests at once" in n and "max-num-seqs-4 are extrapolated" in n
               for n in result.notes)                   # the fit saw at most 2 running
    replayed = read_manifest(tmp_path / "cal" / "whatif" / "current")
    assert replayed["server"]["calibration"]["path"] == str(fit.resolve())

    (tmp_path / "slow.yaml").unlink()
    profiled = tune(run, TuneRequest(grid, max_level=4), tmp_path / "profile")
    assert any("calibration" in n and "is gone" in n for n in profiled.notes)
    itl = next(o for o in profiled.outcomes if o.name == "current").figures["itl_p50_ms"]
    assert itl < step_at_2 * 1e3 / 2
