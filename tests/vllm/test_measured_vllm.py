"""The measured verdict on a REAL vLLM with loadlab's probe agrees with the inferred one.

``loadlab run --launch vllm --probe`` starts the tiny model with ``loadlab_probe`` as its
scheduler class and samples the probe's ``loadlab:`` series beside vLLM's own; the
analyzer puts ``knee.measured`` / ``cause.measured`` (read from the scheduler's refusals)
beside the inferred verdict (read from what any vLLM exports). The loads are those of
test_analyzer_vllm.py, the seq-cap one and the KV-bound one, once each in the suite and
``LOADLAB_VLLM_REPEATS`` times each for the record (three: a server per run, loadlab
launches it). In every run the measured cause must exist and carry the
inferred cause's name, and the measured knee must sit within one level of the inferred.
The first seq-cap run also shows where the probe's series land: in metrics.parquet, from the
probe's own endpoint, beside vLLM's, with seq_cap the reason for nearly every refused step at
the top level. Server and load generator run on CPUs of their own (realvllm.isolation_flags).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from realvllm import BASE_FLAGS, SEQ_CAP, SMALL_POOL, VLLM_ENV, isolation_flags, tiny_model_dir
from test_analyzer_vllm import LEVELS, run_load, step_flags

from loadlab.analyze.analysis import analyze_run
from loadlab.analyze.steps import step_table
from loadlab.analyze.windows import counter_windows, gauge_windows
from loadlab.experiment.server_flags import to_argv
from loadlab.probe import SCHEDULER_CLS
from loadlab.runstore import read_table
from loadlab.runstore.schema import METRICS

pytestmark = pytest.mark.vllm
STARTUP_S = 300
REPEATS = int(os.environ.get("LOADLAB_VLLM_REPEATS", "1"))
# (server flags, profile, levels, step seconds, warm-up seconds): test_analyzer_vllm's loads
LOADS: dict[str, tuple[dict[str, object], str, list[int], float, float]] = {
    "seq_cap": (SEQ_CAP, "tiny-short", LEVELS, 5.0, 1.5),
    "kv_bound": (SMALL_POOL, "tiny-long", [1, 2, 4, 8], 8.0, 2.0),
}


def probed_run(out: Path, flags: dict[str, object], profile: str, levels: list[int],
               step_s: float, warmup_s: float) -> dict[str, Any]:
    """One collected step load on a vLLM that loadlab launches with the probe; its analysis."""
    argv = [sys.executable, "-m", "loadlab", "run", "--launch", "vllm", "--probe", "--model",
            str(tiny_model_dir()), *step_flags(out, profile, levels, step_s, warmup_s),
            *isolation_flags(), "--", *to_argv({**BASE_FLAGS, **flags})]
    run_load(argv, out, STARTUP_S + step_s * len(levels) + 180, env={**os.environ, **VLLM_ENV})
    return analyze_run(out).as_json()


def summary(a: dict[str, Any]) -> str:
    """Both verdicts and the gauges the measured cause was split by, for the log."""
    knee, cause = a["knee"], a["cause"]
    mk, mc = knee.get("measured") or {}, cause.get("measured") or {}
    return (f"inferred knee ({knee['lower']}, {knee['upper']}] cause {cause['name']} | "
            f"measured knee ({mk.get('lower')}, {mk.get('upper')}] cause {mc.get('name')} "
            f"reason {mc.get('reason')} shares {mc.get('reason_share')} "
            f"head needed {mc.get('head_blocks_needed')} free {mc.get('head_free_blocks')} "
            f"running {mc.get('head_running')} kv {mc.get('kv_usage')} "
            f"typical fits {mc.get('typical_fits_share')} | "
            f"refused share {mk.get('refused_share')}")


Runs = Callable[[str, int], tuple[Path, dict[str, Any]]]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    """``runs(name, i)``: the run folder and analysis of LOADS[name]'s i-th run, made once."""
    done: dict[tuple[str, int], tuple[Path, dict[str, Any]]] = {}

    def get(name: str, run: int) -> tuple[Path, dict[str, Any]]:
        if (name, run) not in done:
            out = tmp_path_factory.mktemp(f"{name}-{run}") / "run"
            done[(name, run)] = (out, probed_run(out, *LOADS[name]))
        return done[(name, run)]

    return get


@pytest.mark.parametrize("run", range(REPEATS))
@pytest.mark.parametrize("name", list(LOADS))
def test_measured_verdict_equals_the_inferred(name: str, run: int, runs: Runs) -> None:
    levels = LOADS[name][2]
    _, a = runs(name, run)
    print(f"\n{name} run {run}: {summary(a)}")
    knee, cause = a["knee"], a["cause"]
    assert cause.get("measured"), f"no measured cause: {a['verdict']}"
    assert cause["measured"]["name"] == cause["name"], summary(a)
    measured = knee["measured"]
    assert knee["found"] and measured["found"], summary(a)
    assert abs(levels.index(measured["upper"]) - levels.index(knee["upper"])) <= 1, summary(a)


def test_probe_series_land_beside_vllms_and_name_the_cap(runs: Runs) -> None:
    """The launch loads the probe, the collector samples its endpoint beside vLLM's, and at
    12 users on 4 seats nearly every engine step refuses the queue's head for the cap."""
    out, _ = runs("seq_cap", 0)
    launch = json.loads((out / "manifest.json").read_text())["target"]["launch"]
    assert launch["flags"]["scheduler_cls"] == SCHEDULER_CLS
    metrics = read_table(out / "metrics.parquet", METRICS)
    probe = metrics[metrics.endpoint == launch["probe"]]
    assert set(probe.family) >= {"loadlab:scheduler_steps", "loadlab:scheduler_refused_steps",
                                 "loadlab:scheduler_head_running"}
    assert {"vllm:num_requests_running"} <= set(metrics.family)  # vLLM's own, beside them
    top = step_table(out).iloc[-1]
    assert top.concurrency == LEVELS[-1]
    window = [(top.t_start, top.t_end)]
    steps = counter_windows(probe, "loadlab:scheduler_steps", window)["delta"].sum()
    refused = counter_windows(probe, "loadlab:scheduler_refused_steps", window, by=("reason",))
    by_reason = dict(zip(refused.reason, refused.delta, strict=True))
    assert set(by_reason) == {"preempted", "token_budget", "seq_cap", "kv_blocks", "other"}
    assert steps > 100 and by_reason["seq_cap"] > 0.5 * steps, (steps, by_reason)
    assert by_reason["seq_cap"] > 10 * sum(n for r, n in by_reason.items() if r != "seq_cap")
    running = gauge_windows(probe, "loadlab:scheduler_head_running", window)
    assert running["max"].iloc[0] == SEQ_CAP["max_num_seqs"]
