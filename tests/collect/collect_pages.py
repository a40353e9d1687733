"""Paths and series keys of the real vLLM 0.32 pages the collector tests serve."""

from __future__ import annotations

from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-0.32-cpu"
LOAD_PAGE = FIXTURES / "metrics_under_load_tinypool_seqbound.txt"
IDLE_PAGE = FIXTURES / "metrics_idle_fresh.txt"
RUNNING = 'vllm:num_requests_running{engine="0",model_name="tiny"}'
GENERATED = 'vllm:generation_tokens_total{engine="0",model_name="tiny"}'
