"""Requests that never got a connection still count: the step table bins them by t_issued."""

from __future__ import annotations

from loadlab.analyze.steps import step_table
from loadlab.runstore import REQUESTS, PartWriter, write_manifest


def _row(seq: int, t: float, status: str, sent: bool) -> dict:
    return {"step": 0, "worker": "w", "seq": seq, "request_id": f"r{seq}", "t_issued": t,
            "t_sent": t + 0.001 if sent else None, "t_done": t + 0.5, "status": status,
            "ttft_s": 0.1 if status == "ok" else None, "e2e_s": 0.5, "output_tokens": 4}


def test_refused_and_pre_header_failures_count_as_errors(tmp_path) -> None:
    write_manifest(
        tmp_path,
        {
            "kind": "run",
            "status": "complete",
            "steps": [
                {"step": 0, "concurrency": 2, "t_start": 100.0, "t_end": 110.0, "warmup_s": 0.0}
            ],
        },
    )
    rows = [_row(i, 101.0 + i * 0.1, "ok", True) for i in range(3)]
    rows += [_row(3 + i, 103.0 + i * 0.1, "client_error", False) for i in range(4)]  # refused
    rows += [_row(7 + i, 104.0 + i * 0.1, "timeout", False) for i in range(2)]  # connect timeout
    rows += [_row(9, 120.0, "client_error", False)]                                 # after the step
    with PartWriter(tmp_path / "requests.parquet", REQUESTS) as writer:
        writer.extend(rows)
    row = step_table(tmp_path).iloc[0]
    assert (row.n_ok, row.n_err, row.n_aborted) == (3, 6, 0)
