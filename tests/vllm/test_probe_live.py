"""loadlab_probe in a REAL ``vllm serve``: launched by ``loadlab run --probe``, its series
land in metrics.parquet beside vLLM's, and it changes no output.

A seq-cap load (two seats, six users, a roomy pool) must show the probe counting steps and
naming seq_cap as the reason for most refused ones; the same greedy requests to the tiny
model with and without the probe must come back token for token the same.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from loadrun import PROFILES
from realvllm import BASE_FLAGS, VLLM_ENV, isolation_flags, tiny_model_dir
from test_analyzer_vllm import SEQ_CAP as ANALYZER_SEQ_CAP

from loadlab.analyze.windows import counter_windows
from loadlab.experiment.server_flags import to_argv
from loadlab.probe import SCHEDULER_CLS
from loadlab.runstore import read_table
from loadlab.runstore.schema import METRICS

pytestmark = pytest.mark.vllm
SEQ_CAP = {**BASE_FLAGS, "max_num_seqs": 2, "num_gpu_blocks_override": 512}
PROMPTS = ["The capital of France is", "1, 2, 3, 4,", "def fib(n):", "Once upon a time"]


def test_run_probe_collects_refusals_and_seq_cap_dominates(require_vllm, tmp_path: Path):
    out = tmp_path / "run"
    argv = [sys.executable, "-m", "loadlab", "run", "--launch", "vllm", "--probe",
            "--model", str(tiny_model_dir()), "--profile", str(PROFILES / "tiny-short.yaml"),
            "--concurrency", "6", "--step-duration", "15", "--warmup", "2", "--workers", "0",
            "--drain", "20", "--collect", "--interval", "0.5", "--out", str(out),
            *isolation_flags(), "--", *to_argv(SEQ_CAP)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False,
                          env={**os.environ, **VLLM_ENV})
    assert proc.returncode == 0, f"{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    launch = json.loads((out / "manifest.json").read_text())["target"]["launch"]
    assert launch["flags"]["scheduler_cls"] == SCHEDULER_CLS
    metrics = read_table(out / "metrics.parquet", METRICS)
    probe = metrics[metrics.endpoint == launch["probe"]]
    assert set(probe.family) >= {"loadlab:scheduler_steps", "loadlab:scheduler_refused_steps",
                                 "loadlab:scheduler_head_running"}
    assert {"vllm:num_requests_running"} <= set(metrics.family)  # vLLM's own, beside them
    t0, t1 = metrics.t.min(), metrics.t.max()
    steps = counter_windows(metrics, "loadlab:scheduler_steps", [(t0, t1)])["delta"].sum()
    refused = metrics[metrics.family == "loadlab:scheduler_refused_steps"]
    by_reason = {json.loads(labels)["reason"]: rows.value.max() - rows.value.min()
                 for labels, rows in refused.groupby("labels")}
    assert set(by_reason) == {"preempted", "token_budget", "seq_cap", "kv_blocks", "other"}
    assert steps > 100 and by_reason["seq_cap"] > 0.5 * steps, (steps, by_reason)
    assert by_reason["seq_cap"] > 10 * sum(n for r, n in by_reason.items() if r != "seq_cap")
    running = metrics[metrics.family == "loadlab:scheduler_head_running"].value
    assert running.max() == 2


def _greedy(base_url: str, model: str) -> list[list[str]]:
    outs = []
    with httpx.Client(timeout=120) as client:
        for prompt in PROMPTS:
            body = {"model": model, "prompt": prompt, "max_tokens": 24, "temperature": 0,
                    "logprobs": 1}
            res = client.post(f"{base_url}/v1/completions", json=body)
            res.raise_for_status()
            outs.append(res.json()["choices"][0]["logprobs"]["tokens"])
    return outs


def test_probe_changes_no_greedy_output(vllm_server):
    """The plain server is the session's (the analyzer and calibration tests' flags: in a
    whole-suite run it is already up); asking the factory for the probed one stops it
    first, so the two never share the host's memory."""
    plain = vllm_server(**ANALYZER_SEQ_CAP)
    expected = _greedy(plain.base_url, plain.model)
    probed = vllm_server(probe=True, **ANALYZER_SEQ_CAP)
    got = _greedy(probed.base_url, probed.model)
    text = httpx.get(f"{probed.metrics_endpoints[0]}/metrics", timeout=5).text
    assert got == expected
    steps = next(line for line in text.splitlines()
                 if line.startswith("loadlab:scheduler_steps_total{"))
    assert 'model_name="tiny"' in steps and float(steps.rsplit(" ", 1)[1]) >= 4 * 24
