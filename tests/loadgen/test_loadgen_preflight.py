"""Before the load: the key, the model and the URL are checked (exit 2, nothing started);
during it, lengths fit the server's context window."""

from __future__ import annotations

import os
import socket

import pytest

from loadlab.sim.serve.testing import running_sim

KEY = "k3y-s3cret"


@pytest.fixture(scope="module")
def keyed_sim():
    with running_sim(served_model_name="m", api_key=KEY, time_scale=5) as url:
        yield url


def _env(key: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "LOADLAB_API_KEY"}
    return env if key is None else {**env, "LOADLAB_API_KEY": key}


def _refused(res, out, *needles: str) -> None:
    assert res.returncode == 2, res.stderr
    line = res.stderr.strip()
    assert "\n" not in line and line.startswith("loadlab: error:"), res.stderr
    assert all(n in line for n in needles), line
    assert not out.exists()  # nothing started, nothing written


@pytest.mark.parametrize("key,needle", [("wrong", "refuses the key in $LOADLAB_API_KEY"),
                                        (None, "$LOADLAB_API_KEY is not set")])
def test_missing_or_wrong_key_is_refused_up_front(
    keyed_sim, cli, tiny_profile, tmp_path, key, needle
) -> None:
    out = tmp_path / "run"
    res = cli(
        "--target",
        keyed_sim,
        "--model",
        "m",
        "--profile",
        str(tiny_profile),
        "--concurrency",
        "1",
        "--step-duration",
        "1",
        "--out",
        str(out),
        env=_env(key),
    )
    _refused(res, out, needle)
    assert KEY not in res.stderr and (key is None or key not in res.stderr)


def test_right_key_runs_and_stays_out_of_the_folder(
    keyed_sim, cli, load, tiny_profile, tmp_path
) -> None:
    out = tmp_path / "run"
    res = cli(
        "--target",
        keyed_sim,
        "--model",
        "m",
        "--profile",
        str(tiny_profile),
        "--concurrency",
        "2",
        "--step-duration",
        "1",
        "--out",
        str(out),
        env=_env(KEY),
    )
    assert res.returncode == 0, res.stderr
    df, manifest = load(out)
    assert manifest["status"] == "complete" and len(df) > 0 and set(df.status) == {"ok"}
    assert not any(KEY.encode() in p.read_bytes() for p in out.rglob("*") if p.is_file())


def test_unknown_model_is_refused_naming_the_served_ones(
    keyed_sim, cli, tiny_profile, tmp_path
) -> None:
    out = tmp_path / "run"
    res = cli(
        "--target",
        keyed_sim,
        "--model",
        "llama",
        "--profile",
        str(tiny_profile),
        "--concurrency",
        "1",
        "--out",
        str(out),
        env=_env(KEY),
    )
    _refused(res, out, "--model", "'llama' is not served", "it serves: m")


def test_closed_port_is_refused_before_anything_starts(cli, tiny_profile, tmp_path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "run"
    res = cli(
        "--target",
        f"http://127.0.0.1:{port}",
        "--model",
        "m",
        "--profile",
        str(tiny_profile),
        "--concurrency",
        "1",
        "--out",
        str(out),
    )
    _refused(res, out, "--target", f"cannot reach http://127.0.0.1:{port}")


def test_sharegpt_against_a_1024_token_context_sends_nothing_it_must_reject(
    cli, load, tmp_path
) -> None:
    out = tmp_path / "fit"
    with running_sim(served_model_name="m", max_model_len=1024, time_scale=5) as url:
        res = cli("--target", url, "--model", "m", "--profile", "sharegpt", "--concurrency", "8",
                  "--step-duration", "4", "--out", str(out))
    assert res.returncode == 0, res.stderr
    df, manifest = load(out)
    assert len(df) >= 20 and set(df.status) == {"ok"}, df.error.value_counts().head()
    assert manifest["target"]["max_model_len"] == 1024
    fit = manifest["workload"]["fit"]
    # Most ShareGPT prompts alone exceed 1,024 tokens: drawn again from the profile.
    assert fit["policy"] == "resample" and fit["resampled"] > len(df) / 4 and fit["clipped"] == 0
    assert fit["resampled"] <= len(df)
    assert ((df.prompt_tokens + df.output_tokens) <= 1024).all()
