"""Failures become records and the run goes on; bad input exits 2; Ctrl-C keeps what was
measured."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import httpx
import pytest

from loadlab.cli import main


def test_every_failure_is_a_record_and_the_run_goes_on(
    fault, cli, load, tiny_profile, tmp_path
) -> None:
    out = tmp_path / "faults"
    with fault("ok,400,429,500,midstream,drop,hang") as url:
        res = cli(
            "--target",
            url,
            "--model",
            "m",
            "--profile",
            str(tiny_profile),
            "--concurrency",
            "3",
            "--step-duration",
            "2.5",
            "--warmup",
            "0",
            "--timeout",
            "0.5",
            "--workers",
            "0",
            "--drain",
            "2",
            "--out",
            str(out),
        )
        success = float(httpx.get(f"{url}/metrics").text.split()[-1])
        server_first = httpx.get(f"{url}/debug/first_token").json()
    # 3 (complete, client limited) is a fair verdict too: replies that take a millisecond
    # leave each user's turnaround between requests a visible share of its time.
    assert res.returncode in (0, 3), res.stderr
    df, manifest = load(out)
    assert manifest["status"] == "complete"
    counts = df.status.value_counts().to_dict()
    assert set(counts) == {"ok", "http_error", "aborted", "timeout"}, counts
    assert set(df[df.status == "http_error"].http_status) == {400, 429, 500, 200}
    assert (df[df.http_status == 429].error == "injected 429").all()
    assert counts["ok"] == success
    # Every one of the 3 users kept going after a failure: it sent again after its first one.
    for user, rows in df.groupby("user"):
        first_failure = rows[rows.status != "ok"].t_done.min()
        assert (rows.t_sent > first_failure).any(), (user, rows[["t_sent", "status"]])
    # Client first-token times against the server's own, request by request: always after
    # it (by how little is the client's speed: benchmarks/bench_loadgen.py).
    ok = df[df.status == "ok"]
    delay = ok.t_first_token - ok.request_id.map(server_first).astype(float)
    assert delay.notna().all() and (delay > 0).all(), delay.describe()


@pytest.mark.parametrize(
    "content,needle",
    [
        (
            "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6,10,5\n"
            "2023-11-16 18:15:47.0,abc,5\n",
            ["line 3", "ContextTokens"],
        ),
        ("TIMESTAMP,Context,GeneratedTokens\n2023-11-16 18:15:46.6,10,5\n", ["column"]),
    ],
)
def test_bad_trace_exits_2_naming_file_line_field(tmp_path, capsys, content, needle) -> None:
    trace = tmp_path / "azure_bad.csv"
    trace.write_text(content)
    code, err = _main(
        capsys, "--target", "http://127.0.0.1:9", "--model", "m", "--trace-replay", str(trace)
    )
    assert code == 2, err
    assert str(trace) in err and all(n in err for n in needle), err


def test_bad_profile_exits_2(tmp_path, capsys) -> None:
    code, err = _main(
        capsys,
        "--target",
        "http://127.0.0.1:9",
        "--model",
        "m",
        "--profile",
        "no-such-profile",
        "--concurrency",
        "1",
    )
    assert code == 2 and "no-such-profile" in err
    bad = tmp_path / "bad.yaml"
    bad.write_text("format_version: 1\nname: bad\ndescription: x\n")
    code, err = _main(
        capsys,
        "--target",
        "http://127.0.0.1:9",
        "--model",
        "m",
        "--profile",
        str(bad),
        "--concurrency",
        "1",
    )
    assert code == 2 and str(bad) in err and "source" in err, err


def test_bad_plan_flags_exit_2(capsys) -> None:
    code, err = _main(
        capsys, "--target", "http://127.0.0.1:9", "--model", "m", "--geometric", "1:1:8"
    )
    assert code == 2 and "--geometric" in err
    code, err = _main(
        capsys,
        "--target",
        "http://127.0.0.1:9",
        "--model",
        "m",
        "--concurrency",
        "1",
        "--rate",
        "3",
    )
    assert code == 2 and "exactly one" in err


def _main(capsys, *args: str) -> tuple[int, str]:
    """``loadlab run ARGS`` in this process: bad input is refused before anything starts."""
    with pytest.raises(SystemExit) as exc:
        main(["run", *args])
    return exc.value.code, capsys.readouterr().err


def test_ctrl_c_keeps_measurements_and_exits_130(fault, load, tiny_profile, tmp_path) -> None:
    out = tmp_path / "int"
    with fault("ok", ttft_ms=5, itl_ms=20) as url:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "loadlab",
                "run",
                "--target",
                url,
                "--model",
                "m",
                "--profile",
                str(tiny_profile),
                "--concurrency",
                "4",
                "--step-duration",
                "60",
                "--warmup",
                "0",
                "--workers",
                "1",
                "--out",
                str(out),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 60
        parts = out / "requests.parquet"
        while not (parts.is_dir() and any(parts.glob("part-*.parquet"))):
            assert proc.poll() is None and time.monotonic() < deadline, (
                proc.stderr.read() if proc.poll() else "timeout"
            )
            time.sleep(0.05)  # polling the folder, not synchronising on a sleep
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    df, manifest = load(out)
    assert manifest["status"] == "interrupted"
    assert len(df) > 0 and "ok" in set(df.status)
    assert manifest["records"]["missing_by_worker"] == {}


def test_trace_replay_sends_at_scaled_recorded_times(fault, cli, load, tmp_path) -> None:
    trace = tmp_path / "azure_small.csv"
    times = [0.0, 0.2, 0.3, 0.9, 1.0, 1.6]
    rows = [f"2023-11-16 18:15:{40 + t:09.6f},{10 + i},{3 + i}" for i, t in enumerate(times)]
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")
    out = tmp_path / "replay"
    with fault("ok") as url:
        res = cli(
            "--target",
            url,
            "--model",
            "m",
            "--trace-replay",
            str(trace),
            "--time-scale",
            "0.5",
            "--warmup",
            "0",
            "--workers",
            "0",
            "--out",
            str(out),
        )
    assert res.returncode == 0, res.stderr
    df, _ = load(out)
    df = df.sort_values("seq")
    assert list(df.target_prompt_tokens) == [10 + i for i in range(6)]
    assert list(df.prompt_tokens) == list(df.target_prompt_tokens)
    offsets = (df.t_scheduled - df.t_scheduled.min()).to_list()
    assert offsets == pytest.approx([t * 0.5 for t in times], abs=1e-6)
    assert (df.send_lag_s >= 0).all()  # how small: benchmarks/bench_open_loop.py
