"""What ``loadlab tune`` may change: ``--search FLAG=VALUES``, the user's limits, the grid.

The searchable flags are the scheduler and cache knobs that move a knee in vLLM
(vllm/config/scheduler.py, vllm/config/cache.py): ``max_num_seqs``,
``max_num_batched_tokens``, ``block_size``, ``enable_chunked_prefill``,
``enable_prefix_caching``, ``gpu_memory_utilization`` and ``max_model_len``. A grid is
the product of the values given; configurations equal to the current one are dropped,
and more than the cap are cut (the count says so).

Limits refuse what the user's server could not run or serve, before any replay:
``gpu_memory_utilization`` above ``--memory``, a ``max_model_len`` that cannot hold the
longest prompt plus one output token, chunked prefill off with a token budget below that
prompt (vLLM cannot schedule a prompt over the budget without chunking), and a KV pool
(one block reserved: vLLM's null block) too small for that prompt.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from loadlab.errors import InputError

SEARCH_FIX = ("write FLAG=V1,V2,... with FLAG one of max-num-seqs, max-num-batched-tokens, "
              "block-size, enable-chunked-prefill, enable-prefix-caching, "
              "gpu-memory-utilization, max-model-len, e.g. --search max-num-seqs=8,16,32")


def _bool(text: str) -> bool:
    low = text.lower()
    if low in ("true", "on", "1", "yes"):
        return True
    if low in ("false", "off", "0", "no"):
        return False
    raise ValueError(text)


def _fraction(text: str) -> float:
    value = float(text)
    if not 0 < value <= 1:
        raise ValueError(text)
    return value


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(text)
    return value


SEARCHABLE: dict[str, Callable[[str], Any]] = {
    "max_num_seqs": _positive,
    "max_num_batched_tokens": _positive,
    "block_size": _positive,
    "enable_chunked_prefill": _bool,
    "enable_prefix_caching": _bool,
    "gpu_memory_utilization": _fraction,
    "max_model_len": _positive,
}


def parse_search(specs: tuple[str, ...] | list[str]) -> dict[str, list[Any]]:
    """``["max-num-seqs=8,16"]`` -> ``{"max_num_seqs": [8, 16]}``; InputError names the bad one."""
    if not specs:
        raise InputError("nothing to search", field="--search", fix=SEARCH_FIX)
    grid: dict[str, list[Any]] = {}
    for spec in specs:
        name, eq, values = spec.partition("=")
        flag = name.strip().lstrip("-").replace("-", "_")
        if not eq or flag not in SEARCHABLE:
            raise InputError(f"{spec!r} is not a searchable FLAG=VALUES", field="--search",
                             fix=SEARCH_FIX)
        try:
            parsed = [SEARCHABLE[flag](v.strip()) for v in values.split(",") if v.strip()]
        except ValueError:
            parsed = []
        if not parsed:
            kind = {"enable_chunked_prefill": "true/false", "enable_prefix_caching": "true/false",
                    "gpu_memory_utilization": "fractions in (0, 1]"}.get(flag, "positive integers")
            raise InputError(f"cannot read the values of {spec!r}", field=f"--search {name}",
                             fix=f"give {kind} separated by commas")
        grid[flag] = list(dict.fromkeys(grid.get(flag, []) + parsed))
    return grid


@dataclass(frozen=True)
class Limits:
    """What the user's server must stay within: a memory ceiling and a prompt to serve."""

    memory: float | None         # gpu_memory_utilization ceiling
    longest_prompt: int          # tokens


@dataclass(frozen=True)
class Candidate:
    """One configuration: the flags changed from the current one (empty: the current)."""

    name: str
    changes: dict[str, Any]


def candidates(grid: dict[str, list[Any]], current: dict[str, Any],
               cap: int) -> tuple[list[Candidate], int]:
    """The current configuration first, then the grid's other configurations (at most
    ``cap`` of them); and how many were cut."""
    flags = list(grid)
    seen: set[tuple[tuple[str, Any], ...]] = set()
    out = [Candidate("current", {})]
    for combo in itertools.product(*(grid[f] for f in flags)):
        changes = {f: v for f, v in zip(flags, combo) if current.get(f) != v}
        key = tuple(sorted(changes.items()))
        if changes and key not in seen:
            seen.add(key)
            out.append(Candidate(candidate_name(changes), changes))
    return out[:cap + 1], max(0, len(out) - 1 - cap)


def candidate_name(changes: dict[str, Any]) -> str:
    """``{"max_num_seqs": 16}`` -> ``max-num-seqs-16`` (a folder and arm name)."""
    def text(v: Any) -> str:
        return ("on" if v else "off") if isinstance(v, bool) else f"{v:g}" if isinstance(
            v, float) else str(v)
    return "_".join(f"{k.replace('_', '-')}-{text(v)}" for k, v in changes.items())


def refusal(resolved: dict[str, Any], limits: Limits) -> str | None:
    """Why a configuration (its resolved flags) cannot serve within ``limits``; None if it can."""
    prompt = limits.longest_prompt
    gmu = resolved.get("gpu_memory_utilization")
    if limits.memory is not None and gmu is not None and gmu > limits.memory + 1e-9:
        return f"gpu_memory_utilization {gmu:g} is above the --memory ceiling {limits.memory:g}"
    if resolved["max_model_len"] < prompt + 1:
        return (f"max_model_len {resolved['max_model_len']} cannot hold the longest prompt "
                f"({prompt} tokens) and one output token")
    if not resolved["enable_chunked_prefill"] and resolved["max_num_batched_tokens"] < prompt:
        return (f"chunked prefill off with max_num_batched_tokens "
                f"{resolved['max_num_batched_tokens']} below the longest prompt ({prompt})")
    usable = (resolved["num_gpu_blocks"] - 1) * resolved["block_size"]
    if usable < prompt + 1:
        return (f"the KV pool ({resolved['num_gpu_blocks']} blocks of {resolved['block_size']}) "
                f"holds {usable} tokens, less than the longest prompt ({prompt})")
    return None


def scaled_pool(blocks: int, current: dict[str, Any], changes: dict[str, Any]) -> int:
    """The KV pool in blocks after ``changes``: it scales with gpu_memory_utilization (the
    memory left for KV grows with the fraction vLLM may use; weights and activations are
    taken as a fixed share) and holds the same tokens at another block size."""
    gmu = changes.get("gpu_memory_utilization", current["gpu_memory_utilization"])
    size = changes.get("block_size", current["block_size"])
    tokens = blocks * current["block_size"] * gmu / current["gpu_memory_utilization"]
    return max(1, math.floor(tokens / size))
