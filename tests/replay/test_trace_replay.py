"""Trace replay: a recorded run's own requests re-sent through the simulator in virtual time."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner, Result

from loadlab.cli.sim import sim
from loadlab.errors import InputError
from loadlab.replay.driver import ReplayOptions, run_replay
from loadlab.replay.trace import run_trace
from loadlab.runstore import REQUESTS, read_manifest, read_table
from loadlab.runstore.compaction import live_parts
from loadlab.sim.engine.config import SimConfig
from loadlab.spec.plan import LoadPlan
from loadlab.spec.scenario import Workload
from loadlab.workload.recorded import read_recorded

EPOCH = 1_800_000_000.0
FLAGS = {"model": "qwen2.5-7b", "gpu": "h100", "max_model_len": 4096, "max_num_seqs": 8,
         "num_gpu_blocks_override": 3000}


def cfg(**kw: object) -> SimConfig:
    return SimConfig(**{**FLAGS, **kw})


def record(out: Path, **plan: object) -> Path:
    run_replay(cfg(), LoadPlan(step_duration_s=15.0, warmup_s=3.0, **plan),
               Workload(profile="azure-conv", seed=4), out, ReplayOptions(start_epoch=EPOCH))
    return out


@pytest.fixture(scope="module")
def closed_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return record(tmp_path_factory.mktemp("closed") / "run", concurrency=[4, 12])


@pytest.fixture(scope="module")
def open_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return record(tmp_path_factory.mktemp("open") / "run", rate=[2, 6])


def rows(run: Path) -> pd.DataFrame:
    return read_table(run / "requests.parquet", REQUESTS).sort_values("seq").reset_index(drop=True)


def step_offsets(run: Path) -> pd.Series:
    """Each request's send time after its step's start, in seq order."""
    starts = {w["step"]: w["t_start"] for w in read_manifest(run)["steps"]}
    frame = rows(run)
    return frame.t_sent - frame.step.map(starts)


def trace(run: Path, out: Path, loop: str | None = None, **flags: object) -> pd.DataFrame:
    run_trace(cfg(**flags), read_recorded(run), out, loop,  # type: ignore[arg-type]
              ReplayOptions(start_epoch=EPOCH + 1000))
    return rows(out)


def sim_replay(*args: str) -> Result:
    """``loadlab sim replay`` with the fixtures' engine flags, in this process."""
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in FLAGS.items()]
    return CliRunner().invoke(sim, ["replay", *flags, *args])


def refusal(result: Result) -> str:
    """The InputError (exit 2) the command raised, as the CLI prints it."""
    assert isinstance(result.exception, InputError), result.output
    assert result.exception.exit_code == 2
    return str(result.exception)


def test_closed_loop_self_replay_reproduces_the_run(closed_run: Path, tmp_path: Path) -> None:
    before, after = rows(closed_run), trace(closed_run, tmp_path / "again")
    assert before.groupby("step").size().tolist() == after.groupby("step").size().tolist()
    for column in ("step", "user", "prompt_tokens", "target_output_tokens", "status"):
        assert before[column].tolist() == after[column].tolist(), column
    ok = before.status == "ok"
    assert before.output_tokens[ok].tolist() == after.output_tokens[ok].tolist()
    for column in ("ttft_s", "e2e_s"):
        assert after[column].to_numpy() == pytest.approx(before[column].to_numpy(), abs=1e-6,
                                                         nan_ok=True)
    assert step_offsets(tmp_path / "again").to_numpy() == pytest.approx(
        step_offsets(closed_run).to_numpy(), abs=1e-6)
    manifest = read_manifest(tmp_path / "again")
    assert [w["concurrency"] for w in manifest["steps"]] == [4, 12]
    assert manifest["sim"]["trace"]["loop"] == "closed"
    assert manifest["sim"]["trace"]["source"] == str(closed_run / "requests.parquet")


def test_open_loop_sends_at_the_recorded_offsets(open_run: Path, tmp_path: Path) -> None:
    before = rows(open_run)
    after = trace(open_run, tmp_path / "again", max_num_seqs=2)  # a slower server
    assert after.user.isna().all()
    assert before.groupby("step").size().tolist() == after.groupby("step").size().tolist()
    assert before.prompt_tokens.tolist() == after.prompt_tokens.tolist()
    assert step_offsets(tmp_path / "again").to_numpy() == pytest.approx(
        step_offsets(open_run).to_numpy(), abs=1e-6)
    # the arrivals ignore the server: fewer slots queue them, TTFT grows
    assert after.ttft_s.median() > 2 * before.ttft_s.median()


def test_closed_run_replayed_in_open_loop(closed_run: Path, tmp_path: Path) -> None:
    before, after = rows(closed_run), trace(closed_run, tmp_path / "open", "open")
    assert after.user.isna().all() and after.concurrency.isna().all()
    assert step_offsets(tmp_path / "open").to_numpy() == pytest.approx(
        step_offsets(closed_run).to_numpy(), abs=1e-6)
    rates = [w["target_rate"] for w in read_manifest(tmp_path / "open")["steps"]]
    assert rates == pytest.approx((before.groupby("step").size() / 15.0).tolist())


def test_closed_loop_users_resend_their_own_requests(closed_run: Path, tmp_path: Path) -> None:
    """More slots make 12 users faster (4 never met the cap of 8): each user runs through
    its step's requests and starts them over, so it sends more, but only requests it sent
    in that step."""
    before, after = rows(closed_run), trace(closed_run, tmp_path / "wide", max_num_seqs=64)
    sent, resent = before.groupby("step").size(), after.groupby("step").size()
    assert resent[0] == sent[0] and resent[1] > sent[1]
    own = set(zip(before.step, before.user, before.prompt_tokens, before.target_output_tokens,
                  strict=True))
    assert set(zip(after.step, after.user, after.prompt_tokens, after.target_output_tokens,
                   strict=True)) <= own
    assert after.groupby("step").user.nunique().tolist() == [4, 12]
    assert after.ttft_s.median() < before.ttft_s.median()


def test_cli_replays_a_trace_with_other_flags(closed_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "one-slot"
    proc = sim_replay("--trace", str(closed_run / "requests.parquet"), "--max-num-seqs", "1",
                      "--out", str(out))
    assert proc.exit_code == 0, proc.output
    before, after = rows(closed_run), rows(out)
    # one running slot: every other user's request waits, so TTFT grows
    assert after.ttft_s.median() > 3 * before.ttft_s.median()
    assert read_manifest(out)["server"]["max_num_seqs"] == 1


def test_a_folder_without_requests_exits_2_naming_it(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = sim_replay("--trace", str(empty), "--out", str(tmp_path / "out"))
    assert f"{empty}: --trace: no requests.parquet" in refusal(proc)
    assert not (tmp_path / "out").exists()
    assert not (tmp_path / "out").exists()


def test_a_missing_column_exits_2_naming_file_and_column(closed_run: Path,
                                                         tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(closed_run, run)
    part = live_parts(run / "requests.parquet")[0]
    pq.write_table(pq.read_table(part).drop_columns(["t_sent"]), part)
    proc = sim_replay("--trace", str(run), "--out", str(tmp_path / "out"))
    assert f"{part}: t_sent: the column 't_sent' is missing" in refusal(proc)


def test_closed_loop_of_an_open_run_exits_2_naming_loop(open_run: Path, tmp_path: Path) -> None:
    proc = sim_replay("--trace", str(open_run), "--loop", "closed", "--out", str(tmp_path / "o"))
    message = refusal(proc)
    assert message.startswith("--loop:") and "replay it in open loop" in message
