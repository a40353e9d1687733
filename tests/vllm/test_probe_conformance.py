"""loadlab_probe on vLLM's real scheduler: it changes no step, and it names each refused
step's reason as loadlab's simulator does.

tools/vllm_sched_trace.py drives vLLM's ``Scheduler`` over the cases of sched_cases.py
twice in the vLLM venv, once as is and once as ``loadlab_probe.ProbeScheduler`` (the class
a server loads with ``--scheduler-cls``). The two traces must be equal step for step; the
probe's refusal of every step (reason, blocks the failed check asked for, free blocks,
running) must equal the simulator's (:class:`loadlab.sim.engine.core.Engine`).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from sched_cases import CASES, EXERCISES, REFUSALS
from test_scheduler_conformance import run_trace, sim_trace

pytestmark = pytest.mark.vllm
# everything the plain trace records: the probe must leave all of it as vLLM has it
UNCHANGED = ("scheduled", "new", "resumed", "preempted", "finished", "running", "waiting",
             "num_running", "num_waiting", "kv_usage", "prefix_queries", "prefix_hits")


@pytest.fixture(scope="module")
def traces(require_vllm, tmp_path_factory) -> tuple[dict[str, Any], dict[str, Any]]:
    """(plain, probed) traces of every case; one vLLM process each (its import is ~10 s)."""
    path = tmp_path_factory.mktemp("probe") / "cases.json"
    path.write_text(json.dumps({"cases": {name: make() for name, make in CASES.items()}}))
    return run_trace(require_vllm, path), run_trace(require_vllm, path, "--probe")


def _reasons(trace: list[dict[str, Any]]) -> set[str]:
    return {r["refusal"]["reason"] for r in trace if r["refusal"]}


@pytest.mark.parametrize("name", list(CASES))
def test_probe_schedules_what_vllm_schedules(name: str, traces) -> None:
    plain, probed = traces
    assert len(probed[name]) == len(plain[name])
    for a, b in zip(plain[name], probed[name]):
        assert {k: a[k] for k in UNCHANGED} == {k: b[k] for k in UNCHANGED}, f"step {a['step']}"
    refused = [r for r in probed[name] if r["refusal"]]
    assert all(r["num_waiting"] > 0 for r in refused)
    assert all(r["refusal"] is None for r in probed[name] if r["num_waiting"] == 0)


@pytest.mark.parametrize("name", list(REFUSALS))
def test_each_reason_is_seen_where_its_case_builds_it(name: str, traces) -> None:
    _, probed = traces
    what, shows = EXERCISES[name]
    assert shows(probed[name], CASES[name]()), f"{name} no longer exercises: {what}"
    assert _reasons(probed[name]) == REFUSALS[name]


@pytest.mark.parametrize("name", list(CASES))
def test_probe_refusals_equal_the_simulators(name: str, traces) -> None:
    _, probed = traces
    vllm = probed[name]
    sim = sim_trace(CASES[name](), len(vllm))
    diffs = [f"step {v['step']}: vllm={v['refusal']} sim={s['refusal']}"
             for v, s in zip(vllm, sim) if v["refusal"] != s["refusal"]]
    assert not diffs, f"{name}: {len(diffs)} steps differ, first:\n" + "\n".join(diffs[:12])
