"""Collect the real-vLLM run folders that calibrate_tiny_vllm.py fits and checks.

Two servers of the tiny model, started one after the other (each ``tiny_vllm``: vLLM on the
server CPUs, the load generator and its /metrics scraper on the client CPU):

- server 1, ``--max-num-seqs 4``, 512 blocks: the FIT loads, ``tiny-prefill`` at 1 user
  and ``tiny-short`` at 1, 2, 4 users;
- server 2, ``--max-num-seqs 32 --num-gpu-blocks-override 64``, no prefix caching: the
  CHECK load ``tiny-check`` at 4, 12, 16 users (past 9 the 7-block requests no longer fit
  the pool: a KV-bound knee), then the fit loads again, so the two servers can be compared
  on the same load.

Each load is one ``loadlab run --target URL --collect`` run folder under OUT/<server>/. A
``--target`` run cannot see the server's flags, so its manifest's ``server`` block is filled
with the launch flags afterwards, as ``loadlab sim calibrate``'s refusal tells a user to do.

    flock /tmp/realvllm.lock python3 benchmarks/calibrate_collect.py /tmp/caldata
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "vllm"))  # reuse the e2e tests' launch helper

from realvllm import ISOLATION, missing_reason, tiny_vllm

from loadlab.experiment.cpus import format_cpu_list

PROFILES = ROOT / "tests" / "vllm" / "profiles"
STEP_S, WARMUP_S = 15.0, 2.0
SERVERS: dict[str, tuple[dict[str, object], list[tuple[str, str]]]] = {
    "s1": ({"max_num_seqs": 4, "num_gpu_blocks_override": 512},
           [("tiny-prefill", "1"), ("tiny-short", "1,2,4")]),
    "s2": ({"max_num_seqs": 32, "num_gpu_blocks_override": 64, "enable_prefix_caching": False},
           [("tiny-check", "4,12,16"), ("tiny-short", "1,2,4"), ("tiny-prefill", "1")]),
}


def run_load(url: str, out: Path, profile: str, levels: str, server: dict[str, object]) -> None:
    """One closed-loop step load with /metrics sampled into the same run folder."""
    argv = [sys.executable, "-m", "loadlab", "run", "--target", url, "--model", "tiny",
            "--profile", str(PROFILES / f"{profile}.yaml"), "--concurrency", levels,
            "--step-duration", str(STEP_S), "--warmup", str(WARMUP_S), "--workers", "0",
            "--drain", "20", "--collect", "--interval", "0.5", "--out", str(out), "--overwrite"]
    if ISOLATION.client_cpus is not None:
        argv += ["--client-cpus", format_cpu_list(ISOLATION.client_cpus)]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    print(f"{out}: exit {proc.returncode}\n{proc.stdout[-600:]}{proc.stderr[-1500:]}", flush=True)
    manifest_path = out / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["server"] = server
    manifest_path.write_text(json.dumps(manifest, indent=2))


def main(out: Path) -> None:
    reason = missing_reason()
    if reason:
        sys.exit(reason)
    for name, (flags, loads) in SERVERS.items():
        with tiny_vllm(out / name / "server", **flags) as target:
            for profile, levels in loads:
                run_load(target.base_url, out / name / profile, profile, levels,
                         target.server_settings())


if __name__ == "__main__":
    main(Path(sys.argv[1]))
