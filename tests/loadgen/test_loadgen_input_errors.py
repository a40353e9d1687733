"""Bad input to `loadlab run`: one line naming the flag, exit 2, nothing started or written."""

from __future__ import annotations

import pytest

from loadlab.cli import main
from loadlab.sim.serve.testing import running_sim

TARGET = ["--target", "http://127.0.0.1:9", "--model", "m", "--concurrency", "1"]


def _main(capsys, *args: str) -> tuple[int, str]:
    """``loadlab run ARGS`` in this process: refused before Locust is imported."""
    with pytest.raises(SystemExit) as exc:
        main(["run", *args])
    return exc.value.code, capsys.readouterr().err


@pytest.mark.parametrize(
    "args,needles",
    [
        (
            ["--target", "notaurl", "--model", "m", "--concurrency", "1"],
            ["--target", "'notaurl' is not an http(s)://"],
        ),
        (
            ["--target", "ftp://example.com", "--model", "m", "--concurrency", "1"],
            ["--target", "'ftp://example.com' is not an http(s)://"],
        ),
        (["--join", "nohost"], ["--join", "'nohost' is not HOST:PORT"]),
        (["--join", "nohost.invalid:5557"], ["--join", "'nohost.invalid' does not resolve"]),
        ([*TARGET, "--master-bind", "garbage"], ["--master-bind", "'garbage' does not resolve"]),
        ([*TARGET, "--master-bind", "127.0.0.1:http"], ["--master-bind", "is not HOST:PORT"]),
        ([*TARGET, "--collect", "--interval", "0"], ["--interval", "at least 0.1 s"]),
        (
            ["--target", "http://127.0.0.1:9", "--launch", "sim", "--concurrency", "1"],
            ["--target and --launch both name the server"],
        ),
    ],
)
def test_flag_errors_are_one_line_and_exit_2(capsys, tmp_path, args, needles) -> None:
    out = tmp_path / "run"
    code, err = _main(capsys, *args, "--out", str(out))
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("loadlab: error:"), err
    assert all(n in err for n in needles), err
    assert not out.exists()


@pytest.mark.parametrize("flag,value", [("--timeout", "0"), ("--drain", "0"), ("--drain", "-1")])
def test_non_positive_durations_are_usage_errors(capsys, flag, value) -> None:
    code, err = _main(capsys, *TARGET, flag, value)
    assert code == 2 and f"Invalid value for '{flag}'" in err and "Traceback" not in err


def test_api_key_with_a_line_break_is_refused_without_echoing_it(capsys, monkeypatch) -> None:
    monkeypatch.setenv("LOADLAB_API_KEY", "abc\r\nX-Injected: 1")
    code, err = _main(capsys, *TARGET)
    assert code == 2 and "LOADLAB_API_KEY" in err and "control" in err
    assert "X-Injected" not in err and "abc" not in err


@pytest.mark.parametrize("where", ["file", "proc"])
def test_unwritable_out_is_refused(capsys, tmp_path, where) -> None:
    if where == "file":
        (tmp_path / "a-file").write_text("x")
        out = tmp_path / "a-file" / "run"
    else:
        out = "/proc/loadlab-run"
    code, err = _main(capsys, *TARGET, "--out", str(out))
    assert code == 2 and "--out: cannot write here" in err, err


def test_reused_out_is_refused_unless_overwrite_and_warmup_follows_the_step(cli, load, tiny_profile,
                                                                          tmp_path) -> None:
    out = tmp_path / "run"
    args = [
        "--model",
        "m",
        "--profile",
        str(tiny_profile),
        "--concurrency",
        "2",
        "--step-duration",
        "2",
        "--workers",
        "0",
        "--out",
        str(out),
    ]
    with running_sim(served_model_name="m", time_scale=5) as url:
        first = cli("--target", url, *args)
        assert first.returncode == 0, first.stderr
        m1 = load(out)[1]
        assert m1["steps"][0]["warmup_s"] == pytest.approx(0.4)  # a fifth of a 2 s step
        again = cli("--target", url, *args)
        assert (
            again.returncode == 2
            and f"already holds a run ({out / 'manifest.json'})" in again.stderr
        )
        assert load(out)[1] == m1  # untouched
        over = cli("--target", url, *args, "--overwrite")
    assert over.returncode == 0, over.stderr
    df2, m2 = load(out)
    assert m2["created"] > m1["finished"] and m2["status"] == "complete"
    # Only the second run's rows: none issued before it began.
    assert len(df2) > 0 and (df2.t_issued >= m2["created"]).all()


def test_old_collect_interval_spelling_still_reaches_the_check(capsys) -> None:
    """``--collect-interval`` is a hidden alias of ``--interval``: same check, one line more."""
    code, err = _main(capsys, *TARGET, "--collect", "--collect-interval", "0")
    assert code == 2
    assert err.splitlines() == [
        "loadlab: --collect-interval is deprecated, use --interval (the old spelling goes in the "
        "next release)",
        "loadlab: error: --interval: must be at least 0.1 s, got 0 (fix: e.g. 1 (seconds between "
        "scrapes))"]
