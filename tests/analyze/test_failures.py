"""A step in which nothing succeeded is never "ok"; old folders without the failure column
still say which side failed (issue #17, items 5 and 8)."""

from __future__ import annotations

from loadlab.analyze.analysis import analyze_run
from loadlab.runstore import REQUESTS, PartWriter, write_manifest


def _row(step: int, seq: int, t: float, status: str, error: str | None = None) -> dict:
    ok = status == "ok"
    return {"step": step, "concurrency": 2 * (step + 1), "worker": "w", "seq": seq,
            "request_id": f"r{seq}", "t_issued": t, "t_sent": t, "t_first_token": t + 0.05,
            "t_done": t + 0.2, "status": status, "error": error, "http_status": 200,
            "ttft_s": 0.05 if ok else None, "e2e_s": 0.2, "itl_mean_s": 0.01 if ok else None,
            "n_chunks": 4, "output_tokens": 4 if ok else None}


def _folder(tmp_path, statuses: list[tuple[str, str | None]]) -> None:
    steps = [{"step": k, "concurrency": 2 * (k + 1), "t_start": 100.0 + 10 * k,
              "t_end": 110.0 + 10 * k, "warmup_s": 0.0} for k in range(3)]
    write_manifest(tmp_path, {"kind": "run", "status": "complete", "steps": steps})
    rows = [_row(k, 100 * k + i, 101.0 + 10 * k + i * 0.2, *statuses[k]) for k in range(3)
            for i in range(20)]
    with PartWriter(tmp_path / "requests.parquet", REQUESTS) as writer:
        writer.extend(rows)


def test_a_step_without_a_success_is_failed_not_ok(tmp_path) -> None:
    """Rows as an older loadlab wrote them (no failure column): 'stream ended without
    [DONE]' is a truncated stream, the server's."""
    _folder(tmp_path, [("ok", None), ("aborted", "stream ended without [DONE]"), ("ok", None)])
    data = analyze_run(tmp_path).as_json()
    states = [s["state"] for s in data["steps"]]
    assert states[1] == "failed" and "ok" not in states[1:2], states
    assert data["steps"][1]["server_errors"] == {"truncated": 20}
    assert data["steps"][1]["n_cancelled"] == 0
    assert data["knee"]["lower"] != 4   # the failed level is no "fine" side of a knee
    assert data["cause"]["name"] == "server_errors"
    assert any("step 1: 20 of 20 requests failed server-side" in w for w in data["warnings"])


def test_cancelled_requests_are_no_failure(tmp_path) -> None:
    cancelled = ("aborted", "cancelled by the run (GreenletExit)")
    _folder(tmp_path, [("ok", None), ("ok", None), cancelled])
    data = analyze_run(tmp_path).as_json()
    last = data["steps"][2]
    assert (last["n_cancelled"], last["n_server_err"]) == (20, 0) and last["state"] != "ok"
    assert data["cause"]["name"] != "server_errors"
    assert not any("failed server-side" in w for w in data["warnings"])
