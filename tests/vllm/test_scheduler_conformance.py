"""loadlab's simulated V1 scheduler against vLLM's real one, step by step.

tools/vllm_sched_trace.py drives vLLM's own ``Scheduler`` + ``KVCacheManager`` in the vLLM
venv (no model, no server) over the cases in sched_cases.py; the same request streams go
through :class:`loadlab.sim.engine.core.Engine`. Per step we compare what was scheduled (ids
and token counts), preemptions, finishes, running/waiting counts, KV usage and the
prefix-cache query/hit tokens. A mismatch fails the case naming the first differing steps.

Known differences are listed in KNOWN_DIFFERENCES with the vLLM source that explains them;
such a case xfails while it still differs and fails once the simulator matches (then
remove the entry).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from realvllm import REPO_ROOT, tiny_model_dir
from sched_cases import CASES, EXERCISES

from loadlab.sim.engine.core import Engine
from loadlab.sim.engine.types import BatchShape, EngineRequest, SchedulerSettings, StepOutput

pytestmark = pytest.mark.vllm
TRACE_TOOL = REPO_ROOT / "tools" / "vllm_sched_trace.py"
FIELDS = ("scheduled", "preempted", "finished", "num_running", "num_waiting", "kv_usage",
          "prefix_queries", "prefix_hits")
KNOWN_DIFFERENCES: dict[str, str] = {}  # none left: every case matches step by step


def run_trace(python: Path, cases: Path, *flags: str) -> dict[str, list[dict[str, Any]]]:
    """Every case of the ``cases`` file through vLLM's scheduler in one process (its import
    costs ~10 s): per case, its steps' records."""
    proc = subprocess.run([str(python), str(TRACE_TOOL), str(cases), "--model",
                           str(tiny_model_dir()), *flags],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    traces: dict[str, list[dict[str, Any]]] = {name: [] for name in CASES}
    for line in proc.stdout.splitlines():
        record = json.loads(line)
        traces[record.pop("case")].append(record)
    return traces


@pytest.fixture(scope="module")
def vllm_traces(require_vllm, tmp_path_factory) -> dict[str, list[dict[str, Any]]]:
    path = tmp_path_factory.mktemp("sched") / "cases.json"
    path.write_text(json.dumps({"cases": {name: make() for name, make in CASES.items()}}))
    return run_trace(require_vllm, path)


def _record(step: int, out: StepOutput | None, engine: Engine) -> dict[str, Any]:
    if out is None:
        return {"step": step, "scheduled": {}, "preempted": [], "finished": [],
                "num_running": engine.num_running, "num_waiting": engine.num_waiting,
                "kv_usage": engine.kv_usage, "prefix_queries": 0, "prefix_hits": 0,
                "refusal": None}
    return {"step": step, "scheduled": dict(out.scheduled), "preempted": sorted(out.preempted),
            "finished": sorted(f.request_id for f in out.finished),
            "num_running": out.num_running, "num_waiting": out.num_waiting,
            "kv_usage": out.kv_usage, "prefix_queries": out.prefix_queries_tokens,
            "prefix_hits": out.prefix_hits_tokens,
            "refusal": out.refusal._asdict() if out.refusal else None}


def sim_trace(case: dict[str, Any], num_steps: int) -> list[dict[str, Any]]:
    """The same case through loadlab's Engine, one record per step index."""
    sched, cache = case["scheduler"], case["cache"]
    cfg = SchedulerSettings(max_num_seqs=sched["max_num_seqs"],
              max_num_batched_tokens=sched["max_num_batched_tokens"],
              block_size=cache["block_size"], num_gpu_blocks=cache["num_gpu_blocks"],
              max_model_len=case["max_model_len"],
              enable_prefix_caching=cache["enable_prefix_caching"],
              enable_chunked_prefill=sched["enable_chunked_prefill"],
              long_prefill_token_threshold=sched["long_prefill_token_threshold"],
              scheduler_reserve_full_isl=sched["scheduler_reserve_full_isl"])

    def unit_step(batch: BatchShape) -> float:
        return 1.0

    engine = Engine(cfg, unit_step)  # type: ignore[arg-type]
    pending = sorted(case["requests"], key=lambda r: r["arrival_step"])
    records = []
    for step in range(num_steps):
        while pending and pending[0]["arrival_step"] <= step:
            r = pending.pop(0)
            engine.add_request(EngineRequest(r["id"], list(r["prompt_token_ids"]),
                                             r["output_len"], r["output_len"], float(step)))
        records.append(_record(step, engine.step(float(step)), engine))
    return records


def differences(vllm: list[dict[str, Any]], sim: list[dict[str, Any]]) -> list[str]:
    out = []
    for v, s in zip(vllm, sim):
        for name in FIELDS:
            a, b = v[name], s[name]
            if name in ("preempted", "finished"):
                a, b = sorted(a), sorted(b)
            same = abs(a - b) < 1e-9 if name == "kv_usage" else a == b
            if not same:
                out.append(f"step {v['step']}: {name}: vllm={a} sim={b}")
    return out


@pytest.mark.parametrize("name", list(CASES))
def test_step_by_step(name: str, vllm_traces) -> None:
    case = CASES[name]()
    vllm = vllm_traces[name]
    assert sum(len(r["finished"]) for r in vllm) == len(case["requests"]), "not all finished"
    what, shows = EXERCISES[name]
    assert shows(vllm, case), f"{name} no longer exercises: {what}"
    sim = sim_trace(case, len(vllm))
    diffs = differences(vllm, sim)
    if name in KNOWN_DIFFERENCES:
        assert diffs, f"{name} now matches vLLM: remove it from KNOWN_DIFFERENCES"
        pytest.xfail(KNOWN_DIFFERENCES[name] + "; first: " + diffs[0])
    assert not diffs, f"{name}: {len(diffs)} differences, first:\n" + "\n".join(diffs[:12])
