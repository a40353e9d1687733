"""The built-in vLLM V1 scheduling simulator: a model of vLLM's V1 scheduler
(vllm/v1/core/sched/scheduler.py) and KV block pool (vllm/v1/core/kv_cache_manager.py)
stepped in virtual time (engine), behind an OpenAI-compatible HTTP front (serve)."""
