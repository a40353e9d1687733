"""``loadlab diagnose`` against a live simulator: under a seq-capped load, and idle."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from loadlab.collect.fetch import MetricsFetcher
from loadlab.collect.parse import parse_text
from loadlab.sim.serve.testing import running_sim

PROFILE = Path(__file__).parents[1] / "vllm" / "profiles" / "tiny-short.yaml"


def waiting_now(url: str) -> float:
    page = MetricsFetcher(f"{url}/metrics", timeout_s=5).fetch()
    rows = parse_text(page.body.decode(), t=0.0, endpoint=url)
    return sum(r["value"] for r in rows if r["family"] == "vllm:num_requests_waiting")


def diagnose(url: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "loadlab", "diagnose", "--target", url,
                           "--duration", "4", "--interval", "0.5", *extra],
                          check=False, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def sim_url():
    with running_sim(max_num_seqs=4, seed=0) as url:
        yield url


def test_idle_server_has_no_queue(sim_url):
    proc = diagnose(sim_url)
    assert proc.returncode == 0, proc.stderr
    assert "no persistent queue" in proc.stdout and "cause: none" in proc.stdout
    assert "KV usage is block-level" in proc.stdout


def test_capped_server_under_load_names_the_sequence_cap(sim_url, tmp_path):
    model = httpx.get(f"{sim_url}/v1/models", timeout=10).json()["data"][0]["id"]
    load = subprocess.Popen(
        [sys.executable, "-m", "loadlab", "run", "--target", sim_url, "--model", model,
         "--profile", str(PROFILE), "--concurrency", "12", "--step-duration", "60",
         "--warmup", "0", "--workers", "0", "--drain", "1", "--out", str(tmp_path / "load")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while waiting_now(sim_url) < 4:  # synchronise on the queue forming
            with pytest.raises(subprocess.TimeoutExpired):
                load.wait(timeout=0.2)  # the load must still be running
        proc = diagnose(sim_url)
    finally:
        load.terminate()
        load.wait(timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "requests are queueing" in out, out
    assert "sequence cap — running held at 4" in out, out
    assert "cap 4 (inferred from a plateau across windows)" in out, out
    assert "raise --max-num-seqs" in out


@pytest.mark.parametrize("flag", ["--target", "--url"])
def test_unreachable_url_is_an_input_error(flag):
    proc = subprocess.run([sys.executable, "-m", "loadlab", "diagnose", flag, "http://127.0.0.1:9",
                           "--duration", "1"],
                          check=False, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    lines = proc.stderr.splitlines()
    assert lines[-1].startswith("loadlab: error: --target: no vLLM metrics"), proc.stderr
    assert "Traceback" not in proc.stderr
    deprecation = ["loadlab: --url is deprecated, use --target (the old spelling goes in the next "
                   "release)"]
    assert lines[:-1] == (deprecation if flag == "--url" else [])


def test_a_budget_bound_queue_is_not_called_a_sequence_cap(tmp_path):
    """3k-token prompts through a 512-token budget: requests wait while running wanders
    under its max. One window's running max is no cap; the probe says token_budget."""
    profile = Path(__file__).parent / "profiles" / "long-prompt.yaml"
    with running_sim(max_num_seqs=256, max_num_batched_tokens=512, max_model_len=4096,
                     seed=0) as url:
        model = httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]["id"]
        load = subprocess.Popen(
            [sys.executable, "-m", "loadlab", "run", "--target", url, "--model", model,
             "--profile", str(profile), "--concurrency", "16", "--step-duration", "60",
             "--warmup", "0", "--workers", "0", "--drain", "1", "--out", str(tmp_path / "load")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            while waiting_now(url) < 4:  # synchronise on the queue forming
                with pytest.raises(subprocess.TimeoutExpired):
                    load.wait(timeout=0.2)
            proc = diagnose(url, "--duration", "6")
        finally:
            load.terminate()
            load.wait(timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    verdict = out.splitlines()[-1]
    assert verdict.startswith("requests are queueing"), out
    assert "sequence cap —" not in verdict and "raise --max-num-seqs" not in verdict, out
    assert "cap unknown" in out and "in 3 window(s)" in out, out
    assert "confidence)" in verdict or "undetermined" in verdict, out
    probe = next(line for line in out.splitlines() if line.startswith("  probe"))
    assert "measured cause token_budget" in probe, out
    assert "DISAGREES" in probe or "agrees" in probe or "settles" in probe, out
