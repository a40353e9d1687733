"""`loadlab sweep` A/B on a REAL vLLM: prefix caching on and off, shared-prefix workload.

Each arm gets a fresh `vllm serve` of the tiny model (the sweep starts and stops them);
server and load generator on separate CPUs. Every prompt of tiny-shared starts with the
same 256 of its 320 tokens, so with caching on most prompt tokens hit the cache and the
first token comes sooner; with caching off nothing hits. What the report shows, the
analysis of each point shows too: the hit rate per step and the TTFT of each arm.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import yaml
from loadrun import PROFILES
from realvllm import BASE_FLAGS, VLLM_ENV, tiny_model_dir

from loadlab.experiment.cpus import default_split, format_cpu_list
from loadlab.runstore.manifest import SweepManifest, load_manifest

pytestmark = pytest.mark.vllm


def test_prefix_caching_ab_sweep(require_vllm, tmp_path):
    split = default_split()
    scenario = {
        "name": "tiny-prefix-caching-ab",
        "description": "prefix caching on/off on the tiny model, shared 256-token prefix",
        "target": {"launch": "vllm", "model": str(tiny_model_dir()), "startup_timeout_s": 300},
        "flags": {**BASE_FLAGS, "max_num_seqs": 4, "num_gpu_blocks_override": 512},
        "workload": {"profile": str(PROFILES / "tiny-shared.yaml"), "seed": 0},
        "load": {"concurrency": [2], "step_duration_s": 8, "warmup_s": 1},
        "loadgen": {"workers": 0, "drain_s": 10, "collect_interval_s": 0.5},
        "sweep": {"baseline": "caching-off", "arms": {
            "caching-off": {"enable_prefix_caching": False},
            "caching-on": {"enable_prefix_caching": True}}},
    }
    if split.server_cpus and split.client_cpus:
        scenario["isolation"] = {"server_cpus": format_cpu_list(split.server_cpus),
                                 "client_cpus": format_cpu_list(split.client_cpus)}
    path = tmp_path / "ab.yaml"
    path.write_text(yaml.safe_dump(scenario))
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "loadlab", "sweep", str(path), "--out", str(out)],
                          check=False, capture_output=True, text=True, timeout=900,
                          env={**os.environ, **VLLM_ENV})
    assert proc.returncode == 0, proc.stderr[-4000:]
    manifest = load_manifest(out)
    assert isinstance(manifest, SweepManifest) and manifest.sweep.baseline == "caching-off"
    assert [(p.name, p.status) for p in manifest.points] == [("caching-off", "complete"),
                                                            ("caching-on", "complete")]
    steps = {p.name: json.loads((out / p.dir / "analysis.json").read_text())["steps"][0]
             for p in manifest.points}
    print(
        "\nprefix caching A/B:",
        {
            name: {k: s.get(k) for k in ("prefix_hit_rate", "ttft_p50_ms", "n_ok")}
            for name, s in steps.items()
        },
    )
    assert steps["caching-on"]["prefix_hit_rate"] > 0.5      # 256 of 320 prompt tokens shared
    assert not steps["caching-off"]["prefix_hit_rate"]       # 0 or no queries counted
    assert steps["caching-on"]["ttft_p50_ms"] < steps["caching-off"]["ttft_p50_ms"]
    for point in manifest.points:
        assert (out / point.dir / "vllm-server.log").exists()
    # the report's A/B section: the TTFT change of caching-on against caching-off, and hit rates
    report = (out / "report.html").read_text()
    section = report[report.index('<section id="ab"'):]
    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", section[:section.index("</section>")]))
    assert "caching-on vs caching-off" in text and "TTFT p50" in text, text
    ttft_change = re.search(r"TTFT p50 .*? \d+ (?:/ \d+ )?[\d.]+ → [\d.]+ ([+-][\d.]+)%", text)
    assert ttft_change and float(ttft_change.group(1)) < 0, text
    hit = re.search(r"— → (\d+)%", text)
    assert hit and int(hit.group(1)) > 50, text
