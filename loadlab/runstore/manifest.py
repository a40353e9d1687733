"""manifest.json: what a run folder holds and how it was produced.

Written atomically (temporary file, then rename) and updated at step boundaries,
so a crashed run still says which steps finished. Keys used across stages:

- ``kind``: "run" | "sim-replay" | "sweep-point"; ``point``; ``created``; ``finished``
- ``status``: "running" | "complete" | "interrupted" | "failed"; ``error``
- ``target``: {"base_url", "model", "api", "launch": {argv, flags}}; never an API key
- ``server``: {"max_num_seqs", "max_num_batched_tokens", "block_size", ...} as known
- ``metrics``: {"names_found", "cache_config_info", "v1"|"v0"} (collector)
- ``steps``: [{"step", "concurrency" | "target_rate", "t_start", "t_end", "warmup_s"}]
- ``workload``: {"profile", "seed", ...}; ``host``: {"hostname", "cpus", "python"}
- ``versions``: {"loadlab", "locust", "vllm" (if known)}
- ``owner``: {"pid", "hostname"} of the process writing the folder (see
  :mod:`loadlab.runstore.claim`); ``stop_reason``: why a run stopped early, or null
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

from loadlab.errors import InputError

MANIFEST = "manifest.json"
_lock = threading.Lock()


def write_manifest(run_dir: str | Path, data: dict[str, Any]) -> Path:
    """Replace the manifest atomically."""
    path = Path(run_dir) / MANIFEST
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{MANIFEST}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
    os.replace(tmp, path)
    return path


def read_manifest(run_dir: str | Path) -> dict[str, Any]:
    """The manifest ({} when there is none); InputError when it is not a JSON object."""
    path = Path(run_dir) / MANIFEST
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise InputError(f"not valid JSON ({exc})", source=path,
                         fix="restore it, or rerun: the manifest is written by the run itself") from None
    if not isinstance(data, dict):
        raise InputError(f"holds a {type(data).__name__}, not a JSON object", source=path,
                         fix="restore it, or rerun: the manifest is written by the run itself")
    return data


def update_manifest(run_dir: str | Path, **patch: Any) -> dict[str, Any]:
    """Merge top-level keys into the manifest (dicts merged one level deep)."""
    with _lock:
        data = read_manifest(run_dir)
        for key, value in patch.items():
            if isinstance(value, dict) and isinstance(data.get(key), dict):
                data[key] = {**data[key], **value}
            else:
                data[key] = value
        write_manifest(run_dir, data)
        return data
