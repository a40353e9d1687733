"""Every request begun gets exactly one row, also when the run ends with it in flight."""

from __future__ import annotations

from loadlab.loadgen.records import Recorder
from loadlab.sim.serve.testing import running_sim


def test_open_loop_backlog_at_the_end_is_recorded_as_aborted(
    cli, load, tiny_profile, tmp_path
) -> None:
    # 40 req/s against one slow running slot: a deep backlog is still in flight when the drain ends.
    out = tmp_path / "backlog"
    with running_sim(served_model_name="m", max_num_seqs=1, time_scale=0.2) as url:
        res = cli("--target", url, "--model", "m", "--profile", str(tiny_profile), "--rate", "40",
                  "--step-duration", "2", "--warmup", "0", "--drain", "0.5", "--workers", "1",
                  "--out", str(out))
    assert res.returncode == 0, res.stderr
    df, manifest = load(out)
    records = manifest["records"]
    issued = sum(records["issued_by_worker"].values())
    assert records["missing_by_worker"] == {} and len(df) == issued == records["rows"]
    # One worker sends seq 0, 1, 2, ... in order: no gap, no duplicate.
    assert sorted(df.seq) == list(range(len(df)))
    aborted = df[df.status == "aborted"]
    assert len(aborted) > 10, df.status.value_counts()
    assert (
        df.t_issued.notna().all() and (df.t_sent.dropna() >= df.t_issued[df.t_sent.notna()]).all()
    )
    # How far each got: sent (the connection was made), chunks so far. One may have read every
    # token and be cut before its stream's end (the finish chunk, usage, [DONE]): still aborted.
    assert aborted.t_sent.notna().all()
    assert (aborted.error.str.contains("cancelled by the run")).all()
    assert (aborted.n_chunks <= aborted.target_output_tokens).all()
    assert (aborted.n_chunks < aborted.target_output_tokens).sum() >= len(aborted) - 1


def test_record_check_sees_a_missing_row(tmp_path) -> None:
    rec = Recorder(tmp_path)
    rec.add_rows([{"step": 0, "worker": "w1", "status": "ok", "ttft_s": 0.1}] * 3)
    rec.mark_done("w1", rows_sent=3, issued=5)
    rec.close()
    assert rec.records_entry()["missing_by_worker"] == {"w1": 2}
