"""``loadlab tune --confirm`` on a REAL vLLM: does the recommended flag move the measured knee
the way the what-if said?

Needs ``bash tools/install_vllm.sh``; about 9 minutes on 2 cores (three servers). Steps:

1. ``poor``: a deliberately poor server: the tiny model with tests/vllm's flags (a 512-block
   pool pinned with ``--num-gpu-blocks-override``, room for ~170 requests of the load,
   ``--max-num-batched-tokens 256`` explicit, since calibrate reads it from the manifest)
   and ``--max-num-seqs 2``; a closed-loop step load of 1, 2, 4, 8, 16 users, 15 s each
   (tiny-short: 64-token prompts, 32-token outputs), /metrics collected every 0.5 s, server
   and client on CPUs of their own (tests/vllm/realvllm.py ISOLATION); analysed with
   ``ttft_p99_ms=1000``, the SLO tune then ranks under.
2. ``tune``: ``loadlab sim calibrate POOR --out cal.yaml`` fits this server's step times from
   the poor run itself, then ``loadlab tune POOR --calibration cal.yaml --search
   max-num-seqs=4,8,16 --max-level 32 --confirm``: the calibrated what-if of every cap, then
   one real A/B of the current cap against the best on fresh servers, levels 1-32.

``python benchmarks/tune_tiny_vllm.py WORK [poor|tune]`` runs one stage (both by default; an
existing WORK/poor is reused), so each can hold the real-vLLM lock on its own. Prints the
calibration's fit, the tune's ranked table and the predicted-against-measured table.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "vllm"))  # reuse the e2e tests' server settings

from realvllm import BASE_FLAGS, VLLM_ENV, isolation_flags, missing_reason, tiny_model_dir

from loadlab.experiment.server_flags import to_argv

PROFILE = ROOT / "tests" / "vllm" / "profiles" / "tiny-short.yaml"
POOR = {**BASE_FLAGS, "num_gpu_blocks_override": 512, "max_num_batched_tokens": 256,
        "max_num_seqs": 2}


def loadlab(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "loadlab", *args], check=True,
                   env={**os.environ, **VLLM_ENV})


def main() -> None:
    reason = missing_reason()
    if reason:
        sys.exit(reason)
    work = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="tune-"))
    stages = sys.argv[2:] or ["poor", "tune"]
    run = work / "poor"
    if "poor" in stages and not (run / "manifest.json").exists():
        loadlab("run", "--launch", "vllm", "--model", str(tiny_model_dir()), "--profile",
                str(PROFILE), "--concurrency", "1,2,4,8,16", "--step-duration", "15",
                "--warmup", "3", "--workers", "0", "--drain", "20", "--collect", "--interval",
                "0.5", *isolation_flags(), "--out", str(run), "--", *to_argv(POOR))
        loadlab("analyze", str(run), "--slo", "ttft_p99_ms=1000")
    if "tune" in stages:
        loadlab("sim", "calibrate", str(run), "--out", str(work / "cal.yaml"))
        loadlab("tune", str(run), "--calibration", str(work / "cal.yaml"), "--search",
                "max-num-seqs=4,8,16", "--max-level", "32", "--confirm",
                "--out", str(work / "tune"))


if __name__ == "__main__":
    main()
