"""``loadlab run`` against the simulator served over https (``--ssl-certfile/--ssl-keyfile``):
verified with ``--ca-bundle`` (rows, /metrics scraped over https), refused without it (exit 2,
one line: URL, reason, fix), ``--insecure`` warned and recorded; bad TLS flags exit 2."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from loadlab.sim.serve.testing import running_sim


@pytest.fixture(scope="module")
def https_sim(tls_cert: tuple[Path, Path]):
    with running_sim(served_model_name="m", time_scale=5, ssl_certfile=str(tls_cert[0]),
                     ssl_keyfile=str(tls_cert[1])) as url:
        assert url.startswith("https://")
        yield url


def _args(url: str, profile: Path, out: Path, *extra: str) -> list[str]:
    return ["--target", url, "--model", "m", "--profile", str(profile), "--concurrency", "2",
            "--step-duration", "2", "--warmup", "0.5", "--workers", "0", "--out", str(out),
            *extra]


def test_verified_with_the_ca_bundle_rows_and_metrics_come_over_https(
    https_sim, tls_cert, cli, load, tiny_profile, tmp_path
) -> None:
    out = tmp_path / "run"
    res = cli(*_args(https_sim, tiny_profile, out, "--ca-bundle", str(tls_cert[0]), "--collect",
                     "--interval", "0.5"))
    assert res.returncode == 0, res.stderr
    df, manifest = load(out)
    assert len(df) > 0 and (df["status"] == "ok").all()
    assert manifest["target"]["tls"] == {"verify": True, "ca_bundle": str(tls_cert[0])}
    scrapes = pq.read_table(out / "scrapes.parquet").to_pandas()
    assert len(scrapes) > 0 and scrapes["error"].isna().all()
    assert "verification is OFF" not in res.stderr


def test_a_self_signed_server_is_refused_without_the_bundle(
    https_sim, cli, tiny_profile, tmp_path
) -> None:
    out = tmp_path / "run"
    res = cli(*_args(https_sim, tiny_profile, out))
    assert res.returncode == 2, res.stderr
    line = res.stderr.strip()
    assert "\n" not in line and line.startswith("loadlab: error: --ca-bundle:"), line
    assert https_sim in line and "self-signed certificate" in line
    assert "--ca-bundle FILE" in line and "--insecure" in line
    assert not out.exists()


def test_insecure_runs_with_a_warning_recorded_in_the_manifest(
    https_sim, cli, load, tiny_profile, tmp_path
) -> None:
    out = tmp_path / "run"
    res = cli(*_args(https_sim, tiny_profile, out, "--insecure"))
    assert res.returncode == 0, res.stderr
    assert "TLS certificate verification is OFF (--insecure)" in res.stderr
    df, manifest = load(out)
    assert len(df) > 0 and (df["status"] == "ok").all()
    assert manifest["target"]["tls"] == {"verify": False, "ca_bundle": None}


@pytest.mark.parametrize("extra,needle", [
    (("--ca-bundle", "missing.pem"), "--ca-bundle: CA bundle: no file 'missing.pem'"),
    (("--insecure",), "--insecure: only an https:// url is verified"),
])
def test_bad_tls_flags_exit_2_naming_the_flag(cli, tiny_profile, tmp_path, extra, needle) -> None:
    target = "https://127.0.0.1:1" if extra[0] == "--ca-bundle" else "http://127.0.0.1:1"
    res = cli(*_args(target, tiny_profile, tmp_path / "run", *extra))
    assert res.returncode == 2, res.stderr
    assert needle in res.stderr
