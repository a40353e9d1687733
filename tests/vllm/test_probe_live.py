"""loadlab_probe in a REAL ``vllm serve`` changes no output: the same greedy requests to the
tiny model with and without the probe come back token for token the same, while the probe
counts the steps that served them. (Where its series land when ``loadlab run --probe``
launches the server: test_measured_vllm.py, on its seq-cap run.)
"""

from __future__ import annotations

import httpx
import pytest
from realvllm import SEQ_CAP

pytestmark = pytest.mark.vllm
PROMPTS = ["The capital of France is", "1, 2, 3, 4,", "def fib(n):", "Once upon a time"]


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
    """The plain server is the session's (the analyzer, calibration and real-vLLM tests'
    flags: in a whole-suite run it is already up); the probed one is started beside it."""
    plain = vllm_server(**SEQ_CAP)
    expected = _greedy(plain.base_url, plain.model)
    probed = vllm_server(probe=True, **SEQ_CAP)
    got = _greedy(probed.base_url, probed.model)
    text = httpx.get(f"{probed.metrics_endpoints[0]}/metrics", timeout=5).text
    assert got == expected
    steps = next(line for line in text.splitlines()
                 if line.startswith("loadlab:scheduler_steps_total{"))
    assert 'model_name="tiny"' in steps and float(steps.rsplit(" ", 1)[1]) >= 4 * 24
