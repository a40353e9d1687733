"""The seed's capacity formula against what was measured.

- Pool: ``num_gpu_blocks`` and ``block_size`` from vLLM's ``cache_config_info`` labels
  (metrics.parquet, else the collector's copy in the manifest), else the server flags
  in the manifest (launcher or simulator).
- usable_blocks = num_gpu_blocks x (1 - watermark) - null blocks: V1 keeps block 0 as a
  null block and no watermark; V0 (its metric names) kept a 1% watermark.
- blocks_per_request = mean over the run's successful requests of
  ceil((prompt + output tokens) / block_size): a request's blocks at its end.
- formula_max_concurrency = usable_blocks / blocks_per_request; practical_range =
  PRACTICAL (60-70%) of it, as operators see in practice.
- vllm_kv_cache_max_concurrency: vLLM's own figure from ``cache_config_info`` (for
  requests of max_model_len, so usually far lower).
- measured_knee: the knee's first stalled level (or the highest level when none).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from loadlab.analyze.windows import resolve_family
from loadlab.collect.parse import cache_config

PRACTICAL = (0.6, 0.7)
V0_WATERMARK = 0.01


def pool_config(metrics: pd.DataFrame, manifest: dict[str, Any]) -> dict[str, Any]:
    """vLLM's cache config as typed values, merged over what the manifest knows."""
    config: dict[str, Any] = {}
    server = manifest.get("server") or {}
    for key in (
        "num_gpu_blocks",
        "block_size",
        "enable_prefix_caching",
        "kv_cache_max_concurrency",
    ):
        if server.get(key) is not None:
            config[key] = server[key]
    config.update((manifest.get("metrics") or {}).get("cache_config_info") or {})
    family = resolve_family(metrics, "cache_config") if not metrics.empty else None
    if family:
        labels = metrics.loc[metrics["family"] == family, "labels"].unique().tolist()
        config.update(cache_config(labels))
    return config


def capacity(config: dict[str, Any], requests: pd.DataFrame, v0: bool,
             measured: float | None) -> dict[str, Any]:
    """The capacity block of analysis.json (None where the pool or the lengths are unknown)."""
    blocks = as_int(config.get("num_gpu_blocks"))
    size = as_int(config.get("block_size"))
    ok = requests[requests["status"] == "ok"] if not requests.empty else requests
    lengths = (ok["prompt_tokens"].fillna(ok["target_prompt_tokens"]).astype(float)
               + ok["output_tokens"].fillna(0).astype(float)).dropna() if len(ok) else pd.Series([])
    out: dict[str, Any] = {
        "num_gpu_blocks": blocks, "block_size": size,
        "usable_blocks": None, "blocks_per_request": None,
        "formula_max_concurrency": None, "practical_range": None,
        "vllm_kv_cache_max_concurrency": _float(config.get("kv_cache_max_concurrency")),
        "measured_knee": measured,
    }
    if blocks is None or size is None or size <= 0:
        return out
    usable = blocks * (1 - V0_WATERMARK) if v0 else blocks - 1
    out["usable_blocks"] = round(usable, 1)
    if len(lengths) == 0:
        return out
    per_request = float(np.mean(np.ceil(lengths.to_numpy() / size)))
    formula = usable / per_request
    out.update(blocks_per_request=round(per_request, 2), formula_max_concurrency=round(formula, 1),
               practical_range=[round(formula * PRACTICAL[0], 1), round(formula * PRACTICAL[1], 1)])
    return out


def token_fill(table: pd.DataFrame, config: dict[str, Any]) -> np.ndarray:
    """Per step: token-level KV usage from client lengths / the block-level gauge.

    Token-level usage = running requests (counter-based when available) x their mean
    tokens held (prompt + half the output, mid-decode on average) / pool tokens.
    """
    blocks, size = as_int(config.get("num_gpu_blocks")), as_int(config.get("block_size"))
    n = len(table)
    if not blocks or not size or "kv_mean" not in table:
        return np.full(n, np.nan)
    running = table["running_itl"] if "running_itl" in table else table["running_mean"]
    running = running.where(running.notna(), table.get("running_mean"))
    held = table["prompt_tokens_mean"] + table["output_tokens_mean"] / 2
    tokens = running.astype(float) * held.astype(float) / ((blocks - 1) * size)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (tokens / table["kv_mean"].astype(float)).to_numpy(dtype=float)


def as_int(v: Any) -> int | None:
    """An int from a flag or label value (``"64"``, 64.0), None when absent or not a number."""
    try:
        return int(v) if v is not None and not (isinstance(v, float) and math.isnan(v)) else None
    except (TypeError, ValueError):
        return None


def _float(v: Any) -> float | None:
    try:
        return float(v) if v is not None else None
    except (TypeError, ValueError):
        return None
