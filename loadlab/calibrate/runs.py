"""A real run folder as the calibration sees it: the server's settings and, per closed-loop
level, vLLM's own histogram means and the client's records.

The histograms are vLLM's, stamped in the engine core (vllm/v1/metrics/loggers.py and
vllm/v1/metrics/stats.py): queue = scheduled - queued, prefill = first token - scheduled,
decode = last token - first token, ITL between consecutive tokens; their means come from
the ``_sum``/``_count`` increase over each step window (exact whatever the buckets). What
lies outside the engine comes from the client records: the front end (client TTFT less
queue and prefill) and the closed loop's turnaround (a user's cycle less the front end and
the engine's time).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from loadlab.analyze.windows import counter_windows, histogram_windows
from loadlab.errors import InputError
from loadlab.runstore import METRICS, REQUESTS, read_manifest, read_table
from loadlab.runstore.layout import METRICS_TABLE, REQUESTS_TABLE
from loadlab.sim.engine.types import SchedulerSettings

# key -> vLLM family names (V1 first, then the V0-era name where one differs)
HISTOGRAMS = {
    "ttft_s": ("vllm:time_to_first_token_seconds",),
    "queue_s": ("vllm:request_queue_time_seconds",),
    "prefill_s": ("vllm:request_prefill_time_seconds",),
    "decode_s": ("vllm:request_decode_time_seconds",),
    "itl_s": ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
    "e2e_s": ("vllm:e2e_request_latency_seconds",),
}
ITERATION_TOKENS = "vllm:iteration_tokens_total"
CACHE_INFO = "vllm:cache_config_info"
COLLECT_FIX = ("record the run with `loadlab run ... --collect` (or --launch vllm --collect) "
               "against a vLLM V1 server, so its /metrics are sampled into the run folder")


@dataclass(frozen=True)
class Level:
    """One closed-loop step of a run, after its warm-up."""

    run: str
    profile: str
    concurrency: int
    t_start: float                      # the measured window's start (epoch s, after warm-up)
    duration_s: float
    hist: dict[str, float]              # HISTOGRAMS keys -> mean seconds
    engine_steps: float                 # vllm:iteration_tokens_total observations
    client: dict[str, float]            # ttft/itl/e2e p50, cycle and request rate
    lengths: list[tuple[int, int]]      # (prompt, output) of the step's requests, in send order

    @property
    def front_s(self) -> float:
        """Client TTFT less the engine's queue and prefill: the API server and the wire."""
        # the client's share over the requests the TTFT histogram counted, plus the API
        # server's (its TTFT less the engine's queue and prefill, which vLLM observes at
        # the finish, so over slightly other requests: never below zero)
        server = max(0.0, self.hist["ttft_s"] - self.hist["queue_s"] - self.hist["prefill_s"])
        return max(0.0, self.client["ttft_mean_s"] - self.hist["ttft_s"] + server)

    @property
    def turnaround_s(self) -> float:
        """A user's cycle less the front end and the engine's time: end to next arrival."""
        engine = self.hist["queue_s"] + self.hist["prefill_s"] + self.hist["decode_s"]
        return max(0.0, self.client["cycle_s"] - self.front_s - engine)


@dataclass(frozen=True)
class Run:
    """A run folder: its scheduler settings, the flags a replay needs, its levels."""

    path: Path
    settings: SchedulerSettings
    server: dict[str, Any]              # SimConfig names: the pool and flags of the server
    levels: list[Level]


def read_run(path: str | Path) -> Run:
    """The run folder at ``path``; InputError naming what is missing and how to get it."""
    path = Path(path)
    manifest = read_manifest(path)
    if not manifest.get("steps"):
        raise InputError("no run manifest with load steps here", source=path / "manifest.json",
                         field="steps", fix="point at a run folder written by `loadlab run`")
    for table in (METRICS_TABLE, REQUESTS_TABLE):
        if not (path / table).exists():
            raise InputError(f"{table} is missing", source=path, field=table, fix=COLLECT_FIX)
    metrics = read_table(path / METRICS_TABLE, METRICS)
    have = set(metrics.family.unique())
    families = {key: _first_present(names, have, path) for key, names in HISTOGRAMS.items()}
    if ITERATION_TOKENS not in have:
        raise InputError(f"no {ITERATION_TOKENS} series", source=path / METRICS_TABLE,
                         field=ITERATION_TOKENS, fix=COLLECT_FIX)
    settings, server = _settings(path, manifest, metrics)
    steps = pd.DataFrame(manifest["steps"])
    if "concurrency" not in steps or steps["concurrency"].isna().any():
        raise InputError("calibration needs closed-loop steps (--concurrency)",
                         source=path / "manifest.json", field="steps.concurrency",
                         fix="record the run with `loadlab run --concurrency 1,2,4 ...`")
    steps["t_start"] = steps["t_start"] + steps.get("warmup_s", 0.0)
    windows = steps[["t_start", "t_end"]]
    means = {key: histogram_windows(metrics, fam, windows, quantiles=())["mean"].to_numpy()
             for key, fam in families.items()}
    iters = counter_windows(metrics, ITERATION_TOKENS, windows, metric=ITERATION_TOKENS + "_count")
    requests = read_table(path / REQUESTS_TABLE, REQUESTS)
    requests = requests[requests.status == "ok"].sort_values("t_sent")
    profile = str((manifest.get("workload") or {}).get("profile", ""))
    levels = []
    for i, step in enumerate(steps.itertuples()):
        mine = requests[(requests.step == step.step) & (requests.t_sent >= step.t_start)]
        hist = {key: float(m[i]) for key, m in means.items()}
        if mine.empty or any(np.isnan(v) for v in hist.values()):
            continue  # a step without finished requests says nothing about step times
        levels.append(Level(run=str(path), profile=Path(profile).stem,
                            concurrency=int(step.concurrency), t_start=float(step.t_start),
                            duration_s=float(step.t_end - step.t_start), hist=hist,
                            engine_steps=float(iters["delta"].iloc[i]),
                            client=_client(mine, requests, step),
                            lengths=list(zip(mine.prompt_tokens.astype(int),
                                             mine.output_tokens.astype(int)))))
    if not levels:
        raise InputError("no step has finished requests with histogram samples",
                         source=path, field="steps", fix=COLLECT_FIX)
    return Run(path=path, settings=settings, server=server, levels=levels)


def _first_present(names: tuple[str, ...], have: set[str], path: Path) -> str:
    for name in names:
        if name in have:
            return name
    raise InputError(f"no {names[0]} series", source=path / METRICS_TABLE, field=names[0],
                     fix=COLLECT_FIX)


def _client(mine: pd.DataFrame, requests: pd.DataFrame, step: Any) -> dict[str, float]:
    """Client-side figures of one step: latency medians of the requests sent in it, the
    TTFT mean of those whose first token came inside it (the requests vLLM's TTFT
    histogram counted there) and the mean cycle of a user (one send to its next)."""
    whole_step = requests[requests.step == step.step]
    users = whole_step.groupby(["worker", "user"], sort=False).t_sent
    cycles = users.diff().dropna()
    cycles = cycles[whole_step.loc[cycles.index, "t_sent"] >= step.t_start]
    first_t = requests.t_first_token
    first = requests[(first_t >= step.t_start) & (first_t < step.t_end)]
    return {"ttft_p50_s": float(mine.ttft_s.median()), "ttft_mean_s": float(first.ttft_s.mean()),
            "itl_p50_s": float(mine.itl_p50_s.median()), "e2e_p50_s": float(mine.e2e_s.median()),
            "cycle_s": float(cycles.mean()) if len(cycles) else float(mine.e2e_s.mean())}


def _settings(path: Path, manifest: dict[str, Any],
              metrics: pd.DataFrame) -> tuple[SchedulerSettings, dict[str, Any]]:
    """The scheduler settings (the manifest's ``server`` block; the KV pool from vLLM's
    ``cache_config_info``, else from the flags) and the replay flags that reproduce them."""
    server = dict(manifest.get("server") or {})
    for knob in ("max_num_seqs", "max_num_batched_tokens"):
        if server.get(knob) is None:
            raise InputError(
                f"the run does not record the server's {knob}: /metrics never shows it",
                source=path / "manifest.json", field=f"server.{knob}",
                fix="record the run with `loadlab run --launch vllm ... -- <flags>`, or, for a "
                    "--target run, add the server's flags under \"server\" in manifest.json "
                    "(e.g. \"max_num_seqs\": 256, \"max_num_batched_tokens\": 8192)")
    info = metrics[metrics.family == CACHE_INFO]
    labels = json.loads(info.labels.iloc[-1]) if len(info) else {}
    blocks = labels.get("num_gpu_blocks") or server.get("num_gpu_blocks_override")
    block_size = labels.get("block_size") or server.get("block_size")
    if blocks in (None, "None") or block_size in (None, "None"):
        raise InputError("the KV pool size is unknown", source=path / METRICS_TABLE,
                         field=CACHE_INFO,
                         fix="collect /metrics (vLLM publishes num_gpu_blocks there), or "
                             "record --num-gpu-blocks-override and --block-size in the manifest")
    prefix = server.get("enable_prefix_caching", labels.get("enable_prefix_caching", True))
    flags: dict[str, Any] = {
        "max_num_seqs": int(server["max_num_seqs"]),
        "max_num_batched_tokens": int(server["max_num_batched_tokens"]),
        "block_size": int(block_size),
        "num_gpu_blocks_override": int(blocks),
        "max_model_len": int(server.get("max_model_len") or (int(blocks) - 1) * int(block_size)),
        "enable_prefix_caching": str(prefix) not in ("False", "false", "0"),
        "enable_chunked_prefill": bool(server.get("enable_chunked_prefill", True)),
        "long_prefill_token_threshold": int(server.get("long_prefill_token_threshold") or 0),
    }
    settings = SchedulerSettings(
        max_num_seqs=flags["max_num_seqs"], max_num_batched_tokens=flags["max_num_batched_tokens"],
        block_size=flags["block_size"], num_gpu_blocks=flags["num_gpu_blocks_override"],
        max_model_len=flags["max_model_len"], enable_prefix_caching=flags["enable_prefix_caching"],
        enable_chunked_prefill=flags["enable_chunked_prefill"],
        long_prefill_token_threshold=flags["long_prefill_token_threshold"],
        scheduler_reserve_full_isl=True)
    return settings, flags
