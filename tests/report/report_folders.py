"""Run and sweep folders for the report and compare tests, made by the simulator.

Each run folder is a real ``sim replay`` (virtual time, seconds of wall time); its
analysis.json holds the analyzer's per-step table and a verdict written here, so a
test controls the knee, the cause and the SLO level it then looks for in the report.
Sweep folders follow the sweep runner's layout (../shared contracts): a manifest of
kind "sweep" listing points, each point a run folder in a sub-directory.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from loadlab.analyze.steps import step_table
from loadlab.replay.driver import ReplayOptions, run_replay
from loadlab.runstore import read_manifest, write_manifest
from loadlab.sim.engine.config import SimConfig
from loadlab.spec.plan import LoadPlan
from loadlab.spec.scenario import Workload


def replay(out: Path, *, levels: tuple[int, ...] = (2, 4, 8, 16, 32), point: str = "",
           profile: str = "sharegpt", step_s: float = 30.0, seed: int = 0, **sim: Any) -> Path:
    """A closed-loop step load through the simulator into ``out``."""
    plan = LoadPlan(concurrency=list(levels), step_duration_s=step_s, warmup_s=5.0)
    run_replay(
        SimConfig(**sim),
        plan,
        Workload(profile=profile, seed=seed),
        out,
        ReplayOptions(point=point),
    )
    return out


def write_verdict(
    run_dir: Path,
    *,
    lower: float | None,
    upper: float | None,
    cause: str = "seq_cap",
    confidence: str = "high",
    slo_level: float | None = None,
    knob: str = "raise --max-num-seqs",
    warnings: tuple[str, ...] = (),
) -> dict:
    """analysis.json of ``run_dir``: its real per-step table and the verdict given here."""
    steps = json.loads(step_table(run_dir).to_json(orient="records"))
    server = read_manifest(run_dir).get("server") or {}
    blocks = server.get("num_gpu_blocks") or 0
    formula = math.floor(blocks * 0.99) / math.ceil(600 / int(server.get("block_size") or 16))
    analysis = {
        "schema": 1,
        "steps": steps,
        "knee": {
            "found": upper is not None,
            "unit": "concurrency",
            "lower": lower,
            "upper": upper,
            "confidence": confidence,
            "reasons": ["waiting >= 1 in most scrapes from the knee on"],
            "detectors": {},
        },
        "slo": {
            "targets": {"ttft_p99_ms": 2000.0} if slo_level is not None else {},
            "max_level_meeting": slo_level,
        },
        "cause": {
            "name": cause,
            "knob": knob,
            "ranked": [{"name": cause, "score": 0.9}],
            "facts": {
                "cap": server.get("max_num_seqs"),
                "kv_max": max(s["kv_max"] for s in steps),
                "waiting_excess": 0.0,
            },
            "evidence": [
                {
                    "what": "running held at max_num_seqs",
                    "value": server.get("max_num_seqs"),
                    "step": 3,
                }
            ],
        },
        "capacity": {
            "formula_max_concurrency": formula,
            "practical_range": [0.6 * formula, 0.7 * formula],
            "vllm_kv_cache_max_concurrency": server.get("kv_cache_max_concurrency"),
            "measured_knee": {"lower": lower, "upper": upper},
        },
        "warnings": list(warnings),
    }
    (run_dir / "analysis.json").write_text(json.dumps(analysis, indent=2))
    return analysis


def sweep(root: Path, points: list[dict[str, Any]], *, mode: str = "matrix",
          baseline: str | None = None, status: str = "complete", name: str = "test sweep") -> Path:
    """A sweep manifest over point folders already under ``root`` (``dir`` relative)."""
    write_manifest(root, {
        "kind": "sweep", "status": status, "created": 1.8e9, "finished": 1.8e9 + 60,
        "scenario": {"name": name, "workload": {"profile": "sharegpt"}},
        "sweep": {"mode": mode, "baseline": baseline},
        "points": [{"status": "complete", "error": None, "flags": {}, "what_if": False, **p}
                   for p in points],
    })
    return root
