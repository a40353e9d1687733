"""A server that refuses its flags: exit 2 naming the flag, and the same --out works next time.

On main the bogus flag exited 1 with the server's usage text, and the folder it left (only
the server's log) refused the retry: "already holds a run".
"""

from __future__ import annotations

import json


def test_a_bogus_server_flag_is_exit_2_and_the_fixed_rerun_takes_the_same_folder(
        tiny_profile, cli, tmp_path) -> None:
    out = tmp_path / "run"
    args = ("--launch", "sim", "--profile", str(tiny_profile), "--concurrency", "1",
            "--step-duration", "2", "--warmup", "0.2", "--workers", "0", "--no-calibrate",
            "--out", str(out))
    bad = cli(*args, "--", "--no-such-flag")
    assert bad.returncode == 2, bad.stderr[-3000:]
    assert bad.stderr.strip() == (
        f"loadlab: error: {out / 'sim-server.log'}: SERVER_ARGS: the server refused its flags: "
        "Error: No such option '--no-such-flag'. (fix: correct or drop that flag after '--' "
        "(the server's --help lists them))")
    assert "No such option" in (out / "sim-server.log").read_text()   # the log is kept

    good = cli(*args)
    assert good.returncode == 0, good.stderr[-3000:]
    assert json.loads((out / "manifest.json").read_text())["status"] == "complete"
    assert "No such option" not in (out / "sim-server.log").read_text()   # a fresh log
